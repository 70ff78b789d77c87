"""Naming the nearest right word when a policy file has a wrong one.

A misspelled key (``decison``), tool name (``wipe_note``) or parameter (``when.day``) is
reported with the closest name that exists, found with ``difflib``. The parser
(``_files``) and the lint (``_lint``) both use it; it imports nothing of the policy wing.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

__all__ = ["nearest", "did_you_mean", "unknown_key"]


def nearest(word: str, options: Iterable[str]) -> str | None:
    """The option closest to ``word``, if one is close enough to be a likely typo."""
    found = difflib.get_close_matches(word, sorted(set(options)), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """``"; did you mean 'decision'?"``, or ``""`` when nothing is close."""
    match = nearest(word, options)
    return f"; did you mean {match!r}?" if match is not None else ""


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (``Rule`` in ``list[Rule]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = get_origin(annotation)
    if origin is None or origin is dict:
        return None  # a dict's keys are free (``when``, ``[env] set``)
    if origin in (Union, types.UnionType, list, tuple) or get_args(annotation):
        for arg in get_args(annotation):
            model = _model_in(arg)
            if model is not None:
                return model
    return None


def _keys(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


def unknown_key(root: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """The message for an unknown key at ``loc`` (pydantic's ``extra_forbidden``).

    ``unknown key 'decison' in rules.1; did you mean 'decision'?``
    """
    *parents, key = loc
    model: type[BaseModel] | None = root
    for part in parents:
        if isinstance(part, int) or model is None:
            continue
        field = next((f for name, f in model.model_fields.items() if part in (name, f.alias)), None)
        model = _model_in(field.annotation) if field is not None else None
    where = ".".join(str(p) for p in parents)
    text = f"unknown key {str(key)!r}" + (f" in {where}" if where else "")
    if model is None:
        return text
    hint = did_you_mean(str(key), _keys(model))
    return text + (hint or f" (the keys there are {', '.join(_keys(model))})")
