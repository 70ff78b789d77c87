"""Turn a tool's return value into plain data, inside the capsule.

Plain data is None, bool, int (64-bit), float, str, bytes, list, and dict with str keys.
Richer values with an obvious data shape are converted: dataclass, pydantic model,
NamedTuple and TypedDict become dicts; Enum becomes its value; tuple becomes a list;
datetime, date and time become ISO 8601 strings; Decimal, UUID and Path become strings.
Anything else raises :class:`NotPlainData` naming the type and where it sat, for example
``result["items"][3]``.

No user method is called while converting (``__repr__``, ``__iter__``, ``__eq__``,
``__getattribute__``, an overridden ``__str__`` or ``isoformat``...): types are told by
their MRO, read straight from ``type``'s own slots (``isinstance`` would consult a
``__class__`` property), containers are read through the base type's methods, fields
through ``object.__getattribute__``. The walk is iterative, so nesting up to
``MAX_DEPTH`` never meets Python's recursion limit.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import pathlib
import sys
import types
import uuid
from typing import Any, Final, cast

from .protocol import MAX_DEPTH

__all__ = ["NotPlainData", "to_plain"]

_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1
_SAFE_KEYS: Final = (int, float, bool, bytes, type(None))
"""Key types whose ``repr`` is ours to call (to name a bad key in the path)."""

# ``type``'s own getters, which no metaclass can override.
_type_mro: Final = type.__dict__["__mro__"].__get__
_type_dict: Final = type.__dict__["__dict__"].__get__
_type_module: Final = type.__dict__["__module__"].__get__
_type_qualname: Final = type.__dict__["__qualname__"].__get__


class NotPlainData(Exception):
    """A value that cannot cross the boundary."""

    def __init__(self, type_name: str, path: str, why: str = "") -> None:
        super().__init__(f"{type_name} at {path}" + (f" ({why})" if why else ""))
        self.type_name = type_name
        self.path = path
        self.why = why


def _mro(cls: type) -> tuple[type, ...]:
    """``cls.__mro__``, read past any metaclass override."""
    return cast("tuple[type, ...]", _type_mro(cls, type))


def _has(mro: tuple[type, ...], base: type) -> bool:
    return any(klass is base for klass in mro)


def _class_attr(mro: tuple[type, ...], name: str) -> Any:
    """A class attribute found in the MRO's own dicts (no descriptor runs), or None."""
    for klass in mro:
        namespace = _type_dict(klass, type)
        if name in namespace:
            return namespace[name]
    return None


def _type_name(value: object) -> str:
    return _type_name_of(type(value))


def _type_name_of(cls: type) -> str:
    module = _type_module(cls, type)
    qualname = cast("str", _type_qualname(cls, type))  # always a str
    if type(module) is not str or module in ("builtins", "tools"):
        return qualname
    return f"{module}.{qualname}"


_Path = Any
"""Where a value sits: the root's name, or ``(parent path, key)``; rendered on error only."""


def _render(path: _Path) -> str:
    keys: list[object] = []
    node: Any = path
    while type(node) is tuple:
        node, key = cast("tuple[Any, object]", node)
        keys.append(key)  # str, int, or one of _SAFE_KEYS: their repr is ours
    return cast(str, node) + "".join(f"[{key!r}]" for key in reversed(keys))


def _plain_scalar(value: Any) -> bool:
    cls = type(value)  # pyright: ignore[reportUnknownVariableType]
    return (
        cls is str
        or cls is float
        or cls is bool
        or value is None
        or cls is bytes
        or (cls is int and _INT_MIN <= value <= _INT_MAX)
    )


def to_plain(value: Any, path: str = "result") -> Any:
    """Return ``value`` as plain data, or raise :class:`NotPlainData`.

    A list or dict that already holds only plain data is returned as it is, not copied
    (callers encode the result at once).
    """
    cls: type[Any] = type(value)  # pyright: ignore[reportUnknownVariableType]  # _plain_scalar, inlined
    if cls is str or cls is float or cls is bool or value is None or cls is bytes:
        return value
    if cls is int and _INT_MIN <= value <= _INT_MAX:
        return value
    if (cls is dict or cls is list) and _is_plain(value, 0):
        return value  # already plain data (most results): no copy
    root: list[Any] = [None]
    stack: list[_Task] = [(value, root, 0, path, 0)]
    active: set[int] = set()  # ids of the containers being walked: a repeat is a cycle
    while stack:
        task = stack.pop()
        if task[0] is _LEAVE:
            active.discard(task[2])
            continue
        _convert_one(task, stack, active)
    return root[0]


_PLAIN_DEPTH: Final = 32
"""Nesting the fast check looks through; deeper values (and cycles) take the full walk."""


def _is_plain(value: Any, depth: int) -> bool:
    """Whether ``value``, an exact list or dict, holds only plain data as it is.

    Only exact built-in types are looked at (``type(x) is ...``), so no user code runs; a
    value that is not plain here (a tuple, a subclass, a big int, a cycle, deep nesting)
    is converted, or refused with its path, by the full walk.
    """
    if depth >= _PLAIN_DEPTH:
        return False
    if type(value) is dict:
        mapping: dict[Any, Any] = value  # pyright: ignore[reportUnknownVariableType]
        for key, item in mapping.items():
            if type(key) is not str:
                return False
            cls = type(item)  # pyright: ignore[reportUnknownVariableType]
            if cls is str or cls is float or cls is bool or item is None or cls is bytes:
                continue
            if cls is int:
                if not _INT_MIN <= item <= _INT_MAX:
                    return False
            elif not ((cls is dict or cls is list) and _is_plain(item, depth + 1)):
                return False
        return True
    items: list[Any] = value
    for item in items:
        cls = type(item)  # pyright: ignore[reportUnknownVariableType]
        if cls is str or cls is float or cls is bool or item is None or cls is bytes:
            continue
        if cls is int:
            if not _INT_MIN <= item <= _INT_MAX:
                return False
        elif not ((cls is dict or cls is list) and _is_plain(item, depth + 1)):
            return False
    return True


_Task = tuple[Any, Any, Any, _Path, int]
"""(value, container to store its plain form in, key there, path, depth)."""

_LEAVE: Final = object()
"""A task that marks the end of a container's walk: ``(_LEAVE, None, id, "", 0)``."""


def _convert_one(task: _Task, stack: list[_Task], active: set[int]) -> None:
    value, parent, key, path, depth = task
    cls: type[Any] = type(value)  # pyright: ignore[reportUnknownVariableType]
    # Fast path: exact plain scalars.
    if cls is str or cls is float or cls is bool or value is None or cls is bytes:
        parent[key] = value
        return
    if cls is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise NotPlainData("int", _render(path), "does not fit in 64 bits")
        parent[key] = value
        return
    if cls is list or cls is tuple:
        parent[key] = _sequence(value, value, path, depth, stack, active)
        return
    if cls is dict:
        parent[key] = _mapping(value, list(value.items()), path, depth, stack, active)
        return
    mro = _mro(cls)
    if _has(mro, enum.Enum):
        stack.append((object.__getattribute__(value, "_value_"), parent, key, path, depth + 1))
        return
    # Subclasses of the scalars become the base type, through the base type's own method.
    if _has(mro, int):
        stack.append((int.__int__(value), parent, key, path, depth))
        return
    if _has(mro, float):
        parent[key] = float.__float__(value)
    elif _has(mro, str):
        parent[key] = str.__str__(value)
    elif _has(mro, bytes):
        parent[key] = bytes.__getitem__(value, slice(None))
    elif _has(mro, bytearray):
        parent[key] = bytes(bytearray.__getitem__(value, slice(None)))
    elif cls is memoryview:
        parent[key] = memoryview.tobytes(value)
    elif (rich := _rich(mro)) is not None:
        base, method = rich
        if type(method) is types.FunctionType and _overrides(mro, base):
            why = f"it overrides methods of {_type_name_of(base)} that converting would call"
            raise NotPlainData(_type_name(value), _render(path), why)
        parent[key] = method(value)
    elif _has(mro, tuple):
        items = cast("tuple[Any, ...]", tuple.__getitem__(value, slice(None)))  # pyright: ignore[reportUnknownMemberType]
        fields = _class_attr(mro, "_fields")
        names = cast("tuple[Any, ...]", fields) if type(fields) is tuple else None
        if names is not None and all(type(f) is str for f in names):  # NamedTuple
            pairs: list[tuple[Any, Any]] = list(zip(names, items, strict=False))
            parent[key] = _mapping(value, pairs, path, depth, stack, active)
        else:
            parent[key] = _sequence(value, items, path, depth, stack, active)
    elif _has(mro, list):
        elements = cast("list[Any]", list.__getitem__(value, slice(None)))  # pyright: ignore[reportUnknownMemberType]
        parent[key] = _sequence(value, elements, path, depth, stack, active)
    elif _has(mro, dict):
        entries = cast("list[tuple[Any, Any]]", list(dict.items(value)))  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
        parent[key] = _mapping(value, entries, path, depth, stack, active)
    elif isinstance(_class_attr(mro, "__dataclass_fields__"), dict):
        pairs = [(f.name, _field(value, f.name, path)) for f in dataclasses.fields(cls)]
        parent[key] = _mapping(value, pairs, path, depth, stack, active)
    elif (names := _pydantic_fields(mro)) is not None:
        pairs = [(name, _field(value, name, path)) for name in names]
        parent[key] = _mapping(value, pairs, path, depth, stack, active)
    else:
        raise NotPlainData(_type_name(value), _render(path))


_RICH: Final[tuple[tuple[type, Any], ...]] = (
    (datetime.datetime, datetime.datetime.isoformat),
    (datetime.date, datetime.date.isoformat),
    (datetime.time, datetime.time.isoformat),
    (decimal.Decimal, decimal.Decimal.__str__),
    (uuid.UUID, uuid.UUID.__str__),
    (pathlib.PurePath, pathlib.PurePath.__str__),
)
"""Types that become strings, and the base type's method that makes the string."""


def _rich(mro: tuple[type, ...]) -> tuple[type, Any] | None:
    for base, method in _RICH:
        if _has(mro, base):
            return base, method
    return None


_HARMLESS: Final = frozenset(
    {
        "__module__",
        "__qualname__",
        "__doc__",
        "__dict__",
        "__weakref__",
        "__slots__",
        "__annotations__",
        "__init__",
        "__new__",
        "__init_subclass__",
        "__firstlineno__",
        "__static_attributes__",
        "__orig_bases__",
        "__parameters__",
    }
)
"""Names every class body defines, or that converting never reaches."""


def _overrides(mro: tuple[type, ...], base: type) -> bool:
    """Whether a user class before ``base`` in the MRO overrides what the base's code uses.

    The base's method is Python code (``PurePath.__str__``, ``UUID.__str__``): it reads
    attributes of the value, so a subclass that hooks attribute access or overrides any
    name of the standard library's classes would run its own code.
    """
    module = _type_module(base, type)
    library = [k for k in mro if k is not object and _type_module(k, type) == module]
    known: set[str] = set()
    for klass in library:
        known.update(_type_dict(klass, type))
    for klass in mro:
        if klass is base:
            return False
        if _type_module(klass, type) == module:
            continue
        names = set(_type_dict(klass, type)) - _HARMLESS
        if names & (known | {"__getattribute__", "__getattr__"}):
            return True
    return False


def _pydantic_fields(mro: tuple[type, ...]) -> list[str] | None:
    """The field names of a pydantic (v2) model class, or None if it is not one."""
    pydantic = sys.modules.get("pydantic")  # never imported here: only if the tool did
    base = getattr(pydantic, "BaseModel", None)
    if not isinstance(base, type) or not _has(mro, base):
        return None
    fields = _class_attr(mro, "__pydantic_fields__")  # pydantic >= 2.10
    if not isinstance(fields, dict):
        fields = _class_attr(mro, "model_fields")  # earlier 2.x
    return list(cast("dict[str, Any]", fields)) if isinstance(fields, dict) else None


def _field(value: object, name: str, path: _Path) -> Any:
    try:
        return object.__getattribute__(value, name)
    except AttributeError:
        why = f"its field {name!r} is not set"
        raise NotPlainData(_type_name(value), _render(path), why) from None


def _enter(
    container: object, path: _Path, depth: int, stack: list[_Task], active: set[int]
) -> None:
    """Start walking a container: check depth and cycles; its end is marked on the stack."""
    if depth >= MAX_DEPTH:
        why = f"nested deeper than {MAX_DEPTH}"
        raise NotPlainData(_type_name(container), _render(path), why)
    ident = id(container)
    if ident in active:
        raise NotPlainData(_type_name(container), _render(path), "it contains itself")
    active.add(ident)
    stack.append((_LEAVE, None, ident, "", 0))


def _sequence(
    owner: object,
    items: list[Any] | tuple[Any, ...],
    path: _Path,
    depth: int,
    stack: list[_Task],
    active: set[int],
) -> list[Any]:
    _enter(owner, path, depth, stack, active)
    out = list(items)
    # Plain scalars are taken as they are; the rest is walked in order (pushed reversed).
    for i in range(len(out) - 1, -1, -1):
        item = out[i]
        if not _plain_scalar(item):
            stack.append((item, out, i, (path, i), depth + 1))
    return out


def _mapping(
    owner: object,
    pairs: list[tuple[Any, Any]],
    path: _Path,
    depth: int,
    stack: list[_Task],
    active: set[int],
) -> dict[str, Any]:
    _enter(owner, path, depth, stack, active)
    out: dict[str, Any] = {}
    walk: list[tuple[str, Any]] = []
    for key, item in pairs:
        cls = cast("type[Any]", type(key))
        if cls is not str:
            mro = _mro(cls)
            if _has(mro, enum.Enum) and type(object.__getattribute__(key, "_value_")) is str:
                key = object.__getattribute__(key, "_value_")
            elif _has(mro, str):
                key = str.__str__(key)
            else:
                where = _render((path, key)) if cls in _SAFE_KEYS else f"{_render(path)} (a key)"
                raise NotPlainData(_type_name(key), where, "dict keys must be str")
        out[key] = item  # keeps the key order; a value that is not plain is replaced below
        if not _plain_scalar(item):
            walk.append((key, item))
    stack.extend((item, out, k, (path, k), depth + 1) for k, item in reversed(walk))
    return out
