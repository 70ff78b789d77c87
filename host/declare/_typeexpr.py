"""Canonical type text: one spelling for every type a declaration mentions.

Types reach the declarations from two places: pyright's printed types (tool signatures)
and source annotations (fields of TypedDicts and dataclasses, type aliases). Both are
parsed as Python expressions and rewritten into one small vocabulary that the renderers
and the schema builder understand::

    int  float  str  bool  bytes  None  object  Any  NoReturn
    list[X]  dict[K, V]  tuple[X, Y]  tuple[X, ...]  Literal[...]  X | Y
    NAME, NAME[X]   (a type declared beside the tools)

The vocabulary is what crosses the wire (docs/tools.md, "What crosses the boundary"): a
``Sequence[int]`` parameter receives a list, a returned ``datetime`` arrives as an ISO 8601
string. What has no plain-data form (a callable, a class object, a generator, a type
pyright could not infer) becomes ``Any`` with a note saying why, so the declaration says
where it is weak instead of guessing.
"""

from __future__ import annotations

import ast
import builtins
import collections
import collections.abc
import datetime
import decimal
import enum
import functools
import pathlib
import types
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from ._typeindex import External, Ref, parse_type

__all__ = [
    "Opaque",
    "Dangling",
    "Canonical",
    "canonicalise",
    "STDLIB_NAMES",
    "VOCABULARY",
    "FILES_NOTE",
    "ATTACHMENT_INFO",
]

FILES_NOTE: Final = "may return files (attachments)"
"""The note of a tool that returns ``capsule.context.Result`` or ``Attachment``."""
ATTACHMENT_INFO: Final = "AttachmentInfo"
"""What a lone ``Attachment`` is declared as: the metadata agent code receives."""
_CONTEXT_MODULE: Final = "capsule.context"


@dataclass(frozen=True, slots=True)
class Opaque:
    """A name that has no plain-data form, and why."""

    reason: str


class Dangling(Exception):
    """A name with no definition anywhere toolhost can see."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


@dataclass(slots=True)
class Canonical:
    text: str
    notes: list[str] = field(default_factory=list[str])


Resolver = Callable[[list[str]], "Ref | External | None"]
Declarer = Callable[[Ref], "str | Opaque"]

VOCABULARY: Final = frozenset(
    {"int", "float", "str", "bool", "bytes", "None", "object", "Any", "NoReturn"}
    | {"list", "dict", "tuple", "Literal"}
)
"""Every name canonical text uses, besides the names of declared types."""

_STDLIB_MODULES: Final = (
    builtins, typing, collections.abc, collections, types, datetime, decimal, uuid, pathlib,
    enum, functools,
)  # fmt: skip
STDLIB_NAMES: Final[dict[str, str]] = {}
"""Bare names pyright may print for standard-library types -> their module."""
for _module in reversed(_STDLIB_MODULES):
    STDLIB_NAMES.update(
        dict.fromkeys((n for n in dir(_module) if not n.startswith("__")), _module.__name__)
    )
STDLIB_NAMES["Unknown"] = "pyright"
_KNOWN_MODULES: Final = frozenset(
    {m.__name__ for m in _STDLIB_MODULES} | {"typing_extensions", "pyright"}
)

_SCALARS: Final = {
    "int": "int", "float": "float", "str": "str", "bool": "bool", "bytes": "bytes",
    "bytearray": "bytes", "memoryview": "bytes", "object": "object", "LiteralString": "str",
    "Any": "Any", "Never": "NoReturn", "NoReturn": "NoReturn",
    # converted to strings at the boundary (ISO 8601, str())
    "datetime": "str", "date": "str", "time": "str", "Decimal": "str", "UUID": "str",
    "Path": "str", "PurePath": "str", "PosixPath": "str", "PurePosixPath": "str",
    "WindowsPath": "str", "PureWindowsPath": "str",
}  # fmt: skip
_LISTS: Final = frozenset(
    {"list", "List", "Sequence", "MutableSequence", "Collection", "Iterable", "deque"}
)
_SETS: Final = frozenset({"set", "Set", "frozenset", "FrozenSet", "AbstractSet", "MutableSet"})
_DICTS: Final = frozenset(
    {"dict", "Dict", "Mapping", "MutableMapping", "OrderedDict", "defaultdict", "Counter"}
)
_WRAPPERS: Final = frozenset(
    {"Annotated", "Final", "Required", "NotRequired", "ReadOnly", "ClassVar", "InitVar"}
)
_UNKNOWN: Final = (
    "pyright cannot infer part of this type (a recursive function, or a value without an "
    "annotation?): annotate it"
)


def dotted_parts(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; ``None`` for anything but names and attributes."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        head = dotted_parts(node.value)
        return None if head is None else [*head, node.attr]
    return None


def _union(items: list[ast.expr]) -> ast.expr:
    seen: dict[str, ast.expr] = {}
    for item in items:
        seen.setdefault(ast.unparse(item), item)
    nodes = list(seen.values())
    out = nodes[0]
    for node in nodes[1:]:
        out = ast.BinOp(out, ast.BitOr(), node)
    return out


_ANY: Final = ast.Name("Any")


def _subscript(name: str, args: list[ast.expr]) -> ast.expr:
    if not args:
        return ast.Name(name)
    return ast.Subscript(ast.Name(name), args[0] if len(args) == 1 else ast.Tuple(args))


class _Canon:
    def __init__(self, resolve: Resolver, declare: Declarer, returning: bool) -> None:
        self.resolve = resolve
        self.declare = declare
        self.returning = returning
        self.notes: list[str] = []

    def opaque(self, reason: str) -> ast.expr:
        if reason not in self.notes:
            self.notes.append(reason)
        return ast.Name("Any")

    def expr(self, node: ast.expr) -> ast.expr:
        if isinstance(node, ast.Constant):
            if node.value is None:
                return ast.Constant(None)
            if isinstance(node.value, str):  # a forward reference
                try:
                    return self.expr(parse_type(node.value.strip()))
                except SyntaxError:
                    return self.opaque(f"cannot read the annotation {node.value!r}")
            return self.opaque(f"{ast.unparse(node)} is not a type")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return _union([self.expr(node.left), self.expr(node.right)])
        if isinstance(node, ast.Subscript):
            parts = dotted_parts(node.value)
            if parts is None:
                return self.opaque(f"cannot read the type {ast.unparse(node)}")
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return self.named(parts, elts)
        parts = dotted_parts(node)
        if parts is None:
            return self.opaque(f"cannot read the type {ast.unparse(node)}")
        return self.named(parts, None)

    def named(self, parts: list[str], args: list[ast.expr] | None) -> ast.expr:
        found = self.resolve(parts)
        if found is None:
            raise Dangling(".".join(parts))
        if isinstance(found, Ref):
            declared = self.declare(found)
            if isinstance(declared, Opaque):
                return self.opaque(declared.reason)
            return _subscript(declared, [self.expr(a) for a in args or []])
        if found.name is None:
            return self.opaque(f"{'.'.join(parts)} is a module, not a type")
        if found.module == _CONTEXT_MODULE and found.name in ("Result", "Attachment"):
            return self.files(found.name, args)
        if found.module not in _KNOWN_MODULES:
            return self.opaque(
                f"{found.name} (from {found.module}) is defined outside the tools folder: "
                "toolhost declares only plain data and types defined in the tools folder"
            )
        return self.known(found.name, args)

    def files(self, name: str, args: list[ast.expr] | None) -> ast.expr:
        """A result with files: its value's type (the files come along beside it), or
        for an attachment alone the metadata agent code receives."""
        if not self.returning:
            return self.opaque(f"{name} (from {_CONTEXT_MODULE}) is what a tool returns")
        if FILES_NOTE not in self.notes:
            self.notes.append(FILES_NOTE)
        if name == "Attachment":
            return ast.Name(ATTACHMENT_INFO)
        return self.expr(args[0]) if args else ast.Name("Any")

    def known(self, name: str, args: list[ast.expr] | None) -> ast.expr:
        if name == "Unknown":
            return self.opaque(_UNKNOWN)
        if name in _SCALARS:
            return ast.Name(_SCALARS[name])
        if name in _WRAPPERS and args:
            return self.expr(args[0])
        if name == "Optional" and args:
            return _union([self.expr(args[0]), ast.Constant(None)])
        if name == "Union" and args:
            return _union([self.expr(a) for a in args])
        if name == "Literal" and args:
            return self.literal(args)
        if name in _SETS and not self.returning:
            # A weak spot, said: a set crosses as a list (an argument arrives as one, and a
            # result holding a set fails), so it is declared as a list, with a note.
            note = (
                "a set is not plain data: declared as a list (a tool receives a list; "
                "a result holding a set fails with NotSerializable)"
            )
            if note not in self.notes:
                self.notes.append(note)
        if name in _LISTS or (name in _SETS and not self.returning):
            # A bare ``list`` is ``list[Any]``: ``Any`` is ours, not a name to resolve in
            # the tool file (which need not import it).
            return _subscript("list", [self.expr(a) for a in args[:1]] if args else [_ANY])
        if name in _DICTS:
            given = [self.expr(a) for a in args or []]
            return _subscript(
                "dict", given if len(given) == 2 else [ast.Name("str"), ast.Name("Any")]
            )
        if name in ("tuple", "Tuple"):
            if not args:
                return _subscript("tuple", [ast.Name("Any"), ast.Constant(...)])
            return _subscript("tuple", [a if _is_ellipsis(a) else self.expr(a) for a in args])
        if name in _SETS:
            return self.opaque(
                "a set is not plain data: calls returning one fail with NotSerializable"
            )
        return self.opaque(f"{name} is not plain data")

    def literal(self, args: list[ast.expr]) -> ast.expr:
        values: list[ast.expr] = []
        extra: list[ast.expr] = []
        for arg in args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, (str, int, bytes)):
                values.append(ast.Constant(arg.value))
            elif isinstance(arg, ast.Constant) and arg.value is None:
                extra.append(ast.Constant(None))
            elif (
                isinstance(arg, ast.UnaryOp)
                and isinstance(arg.op, ast.USub)
                and isinstance(arg.operand, ast.Constant)
                and type(arg.operand.value) is int
            ):
                values.append(ast.Constant(-arg.operand.value))
            elif isinstance(arg, ast.Subscript):  # Literal[Literal[...], ...]
                extra.append(self.expr(arg))
            else:
                return self.opaque(f"Literal[{ast.unparse(arg)}] has no plain-data form")
        parts = ([_subscript("Literal", values)] if values else []) + extra
        return _union(parts) if parts else ast.Name("NoReturn")


def _is_ellipsis(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is Ellipsis


def canonicalise(
    source: str | ast.expr, resolve: Resolver, declare: Declarer, *, returning: bool = False
) -> Canonical:
    """Rewrite a type expression into canonical text. Raises :class:`Dangling`."""
    canon = _Canon(resolve, declare, returning)
    if isinstance(source, str):
        try:
            node = parse_type(source.strip())
        except SyntaxError:
            canon.opaque(f"the type {source} has no plain-data form")
            return Canonical("Any", canon.notes)
    else:
        node = source
    return Canonical(ast.unparse(canon.expr(node)), canon.notes)
