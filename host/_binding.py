"""Bind a call's arguments to the tool's signature and freeze them as canonical bytes.

The signature comes from discovery (the host never imports tool modules). Binding maps
positional arguments to names and applies literal defaults, so policy and approvers see
every value the tool will receive by name. Each value must be plain data (docs/tools.md,
"What crosses the boundary"); the bound map is encoded once, and those bytes are what the
capsule receives.

A default is applied here only when it is a literal the wire carries unchanged; any other
default (``os.sep``, a tuple, a set) is left out and the tool applies it itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from capsule.protocol import MAX_DEPTH, encode

from .declare import (
    NO_DEFAULT,
    POSITIONAL_ONLY,
    POSITIONAL_OR_KEYWORD,
    VAR_KEYWORD,
    VAR_POSITIONAL,
    Param,
    ToolSpec,
)
from .errors import InvalidArguments

__all__ = ["BoundCall", "bind", "check_value"]

_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1
_SCALARS: Final = (str, float, bool, bytes, type(None))


@dataclass(frozen=True, slots=True)
class BoundCall:
    """Arguments bound by parameter name, and their frozen canonical encoding."""

    arguments: Mapping[str, Any]
    """Parameter name -> value, in signature order (a private copy)."""
    encoded: bytes
    """The canonical msgpack bytes of ``arguments``: what the capsule executes."""


def check_value(tool: str, param: str, value: Any, path: str = "") -> Any:
    """Return a private plain-data copy of ``value`` (tuples become lists), or raise.

    The walk is iterative, so nesting up to ``MAX_DEPTH`` never meets Python's recursion
    limit, whatever the caller's stack depth. ``path`` locates ``value`` inside ``param``.
    """
    cls = cast("type[Any]", type(value))
    if cls in _SCALARS or (cls is int and _INT_MIN <= value <= _INT_MAX):
        return value  # most arguments: nothing to walk or copy
    root: list[Any] = [None]
    # (value, container to store the copy in, key there, path, depth), depth first and
    # left to right, so the first offending element is the one reported.
    stack: list[tuple[Any, Any, Any, str, int]] = [(value, root, 0, path, 0)]
    while stack:
        item, parent, key, where, depth = stack.pop()
        parent[key] = _copy_one(tool, param, item, where, depth, stack)
    return root[0]


def _invalid(tool: str, param: str, path: str, problem: str) -> InvalidArguments:
    return InvalidArguments(tool, f"{param}{path}: {problem}", parameter=param)


def _copy_one(
    tool: str,
    param: str,
    value: Any,
    path: str,
    depth: int,
    stack: list[tuple[Any, Any, Any, str, int]],
) -> Any:
    """The copy of one value; containers come back empty and their items go on ``stack``."""
    cls = cast("type[Any]", type(value))
    if cls in _SCALARS:
        return value
    if cls is int:
        if _INT_MIN <= value <= _INT_MAX:
            return value
        raise _invalid(tool, param, path, "integer does not fit in 64 bits")
    if cls is list or cls is tuple or cls is dict:
        if depth >= MAX_DEPTH:
            raise _invalid(tool, param, path, f"nested deeper than {MAX_DEPTH}")
        if cls is dict:
            items = cast("dict[Any, Any]", value)
            out: dict[str, Any] = {}
            for k in items:
                if type(k) is not str:
                    raise _invalid(
                        tool, param, path, f"dict keys must be str, not {type(k).__name__}"
                    )
                out[k] = None  # keeps the key order; the value is filled in below
            stack.extend((items[k], out, k, f"{path}[{k!r}]", depth + 1) for k in reversed(out))
            return out
        seq = cast("list[Any] | tuple[Any, ...]", value)
        copy: list[Any] = [None] * len(seq)
        stack.extend(
            (seq[i], copy, i, f"{path}[{i}]", depth + 1) for i in reversed(range(len(seq)))
        )
        return copy
    # Subclasses of the scalars become the base type (an IntEnum member becomes its int).
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return _copy_one(tool, param, int(value), path, depth, stack)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)  # pyright: ignore[reportUnknownArgumentType]
    raise _invalid(
        tool,
        param,
        path,
        f"{cls.__name__} is not plain data "
        "(pass None, bool, int, float, str, bytes, list or dict with str keys)",
    )


def _literal_default(tool: str, param: Param) -> tuple[bool, Any]:
    """``(True, copy)`` when the default can be sent as it is, else ``(False, None)``.

    A default the wire would change (a tuple would arrive as a list, a set not at all) is
    left for the tool to apply itself, so the tool sees exactly its own default.
    """
    if param.value is NO_DEFAULT:
        return False, None
    try:
        copy = check_value(tool, param.name, param.value)
    except InvalidArguments:
        return False, None
    return copy == param.value, copy


def bind(spec: ToolSpec, args: Sequence[Any], kwargs: Mapping[str, Any]) -> BoundCall:
    """Bind ``args``/``kwargs`` to ``spec``'s signature. Raises :class:`InvalidArguments`."""
    tool = spec.name
    if spec.context is not None and spec.context in kwargs:
        raise InvalidArguments(
            tool,
            f"{spec.context!r} is the tool's context: the host fills it in for each call, "
            "and no caller can pass it",
            parameter=spec.context,
        )
    bound: dict[str, Any] = {}
    params = spec.params
    remaining = dict(kwargs)
    has_var_kw = any(p.kind == VAR_KEYWORD for p in params)
    i = 0
    var_kw: str | None = None
    gap = False  # a positional parameter was left to its (non-literal) default
    for param in params:
        kind = param.kind
        name = param.name
        if kind == VAR_POSITIONAL:
            extra = args[i:]
            i = len(args)
            bound[name] = [check_value(tool, name, v, f"[{n}]") for n, v in enumerate(extra)]
            continue
        if kind == VAR_KEYWORD:
            var_kw = name
            continue
        if kind in (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD) and i < len(args):
            if name in remaining and kind == POSITIONAL_OR_KEYWORD:
                raise InvalidArguments(tool, f"got multiple values for {name!r}", parameter=name)
            bound[name] = check_value(tool, name, args[i])
            i += 1
            continue
        if kind != POSITIONAL_ONLY and name in remaining:
            bound[name] = check_value(tool, name, remaining.pop(name))
            continue
        if param.default is None:
            if kind == POSITIONAL_ONLY and name in remaining and not has_var_kw:
                problem = f"{name!r} is positional-only; pass it by position"
            else:
                problem = f"missing required argument {name!r}"
            raise InvalidArguments(tool, problem, parameter=name)
        # A positional-only parameter after a gap cannot be passed at all: the capsule
        # would have to pass it by position, in the gap's place.
        applied, value = (
            (False, None) if gap and kind == POSITIONAL_ONLY else _literal_default(tool, param)
        )
        if applied:
            bound[name] = value
        elif kind in (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD):
            gap = True
        # A default not applied here is applied by the tool itself, in the capsule.
    if i < len(args):
        takes = sum(p.kind in (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD) for p in params)
        raise InvalidArguments(
            tool, f"takes {takes} positional arguments but {len(args)} were given"
        )
    if var_kw is not None:
        bound[var_kw] = {}  # always present, like ``*args``: policy sees every parameter
    if remaining:
        if var_kw is None:
            name = next(iter(remaining))
            positional_only = any(p.name == name and p.kind == POSITIONAL_ONLY for p in params)
            problem = (
                f"{name!r} is positional-only; pass it by position"
                if positional_only
                else f"unexpected keyword argument {name!r}"
            )
            raise InvalidArguments(tool, problem, parameter=name)
        extra_kw: dict[str, Any] = {}
        for key, value in remaining.items():
            if type(key) is not str:  # pyright: ignore[reportUnnecessaryComparison]
                raise InvalidArguments(tool, "keyword names must be str", parameter=var_kw)
            extra_kw[key] = check_value(tool, key, value)
        bound[var_kw] = extra_kw
    try:
        encoded = encode(bound)
    except (TypeError, ValueError, OverflowError) as exc:  # pragma: no cover - check_value guards
        raise InvalidArguments(tool, f"cannot encode arguments: {exc}") from exc
    return BoundCall(bound, encoded)
