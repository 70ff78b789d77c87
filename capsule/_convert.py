"""Turn a tool's return value into plain data, inside the capsule (DESIGN.md section 6).

Plain data is None, bool, int (64-bit), float, str, bytes, list, and dict with str keys.
Richer values with an obvious data shape are converted: dataclass, pydantic model,
NamedTuple and TypedDict become dicts; Enum becomes its value; tuple becomes a list;
datetime, date and time become ISO 8601 strings; Decimal, UUID and Path become strings.
Anything else raises :class:`NotPlainData` naming the type and where it sat, for example
``result["items"][3]``. User methods (``__repr__``, ``__iter__``, ``__eq__``...) are never
called: values are read through their declared fields only.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import pathlib
import uuid
from typing import Any, cast

from .protocol import MAX_DEPTH

__all__ = ["NotPlainData", "to_plain"]

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1


class NotPlainData(Exception):
    """A value that cannot cross the boundary."""

    def __init__(self, type_name: str, path: str, why: str = "") -> None:
        super().__init__(f"{type_name} at {path}" + (f" ({why})" if why else ""))
        self.type_name = type_name
        self.path = path
        self.why = why


def _type_name(value: object) -> str:
    cls = type(value)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "tools") else f"{module}.{cls.__qualname__}"


def _key_path(path: str, key: str | int) -> str:
    return f"{path}[{key!r}]" if isinstance(key, str) else f"{path}[{key}]"


def to_plain(value: Any, path: str = "result") -> Any:
    """Return ``value`` as plain data, or raise :class:`NotPlainData`."""
    return _convert(value, path, 0, set())


def _convert(value: Any, path: str, depth: int, active: set[int]) -> Any:
    cls = cast("type[Any]", type(value))
    # Fast path: exact plain scalars.
    if cls is str or cls is float or cls is bool or value is None or cls is bytes:
        return value
    if cls is int:
        if _INT_MIN <= value <= _INT_MAX:
            return value
        raise NotPlainData("int", path, "does not fit in 64 bits")
    if depth >= MAX_DEPTH:
        raise NotPlainData(_type_name(value), path, f"nested deeper than {MAX_DEPTH}")
    if cls is list or cls is tuple:
        return _sequence(value, path, depth, active)
    if cls is dict:
        return _mapping(value, path, depth, active)
    if isinstance(value, enum.Enum):
        return _convert(value.value, path, depth + 1, active)
    # Subclasses of the scalars (not Enum members, handled above) become the base type.
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return _convert(int(value), path, depth, active)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)  # pyright: ignore[reportUnknownArgumentType]
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID, pathlib.PurePath)):
        return str(value)
    if isinstance(value, tuple) and hasattr(cls, "_fields"):  # NamedTuple
        fields: tuple[str, ...] = cls._fields
        items = cast("tuple[Any, ...]", value)
        pairs: dict[str, Any] = {name: items[i] for i, name in enumerate(fields)}
        return _mapping(pairs, path, depth, active)
    if isinstance(value, (list, tuple)):
        return _sequence(value, path, depth, active)  # pyright: ignore[reportUnknownArgumentType]
    if isinstance(value, dict):
        mapping: dict[Any, Any] = value  # pyright: ignore[reportUnknownVariableType]
        return _mapping(mapping, path, depth, active)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        pairs = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return _mapping(pairs, path, depth, active, owner=value)
    model_fields = getattr(cls, "model_fields", None)
    if isinstance(model_fields, dict) and hasattr(value, "model_dump"):  # pydantic v2 model
        names: list[str] = list(model_fields)  # pyright: ignore[reportUnknownArgumentType]
        pairs = {name: getattr(value, name) for name in names}
        return _mapping(pairs, path, depth, active, owner=value)
    raise NotPlainData(_type_name(value), path)


def _enter(container: object, path: str, active: set[int]) -> int:
    ident = id(container)
    if ident in active:
        raise NotPlainData(_type_name(container), path, "it contains itself")
    active.add(ident)
    return ident


def _sequence(value: list[Any] | tuple[Any, ...], path: str, depth: int, active: set[int]) -> Any:
    ident = _enter(value, path, active)
    try:
        return [_convert(item, f"{path}[{i}]", depth + 1, active) for i, item in enumerate(value)]
    finally:
        active.discard(ident)


def _mapping(
    value: dict[Any, Any],
    path: str,
    depth: int,
    active: set[int],
    owner: object | None = None,
) -> dict[str, Any]:
    ident = _enter(value if owner is None else owner, path, active)
    try:
        out: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                if isinstance(key, enum.Enum) and isinstance(key.value, str):
                    key = key.value
                elif isinstance(key, str):
                    key = str(key)
                else:
                    raise NotPlainData(_type_name(key), f"{path} (a key)", "dict keys must be str")
            out[key] = _convert(item, _key_path(path, key), depth + 1, active)
        return out
    finally:
        active.discard(ident)
