"""Read a referenced type's definition from the source: its kind and its data shape.

Given a name the index resolved to a statement of the tools folder, decide what it is
(TypedDict, dataclass, pydantic model, NamedTuple, Enum, type alias, TypeVar, or none of
those) and read its fields, values or target, canonicalising every annotation in the
defining module's own namespace. The names those annotations mention are handed to the
``declare`` callback, which is how referenced types are followed transitively.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable
from typing import Final

from ._model import FieldDecl, TypeDecl, TypeKind
from ._typeexpr import Canonical, Declarer, Opaque, canonicalise, dotted_parts
from ._typeindex import External, Ref, TypeIndex

__all__ = ["Shapes"]

_TYPING: Final = frozenset({"typing", "typing_extensions"})
_ENUMS: Final = frozenset({"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag", "ReprEnum"})
_PYDANTIC: Final = frozenset({"pydantic", "pydantic.main"})
_DATACLASS_MODULES: Final = frozenset({"dataclasses", "pydantic.dataclasses"})
_SKIPPED: Final = frozenset({"ClassVar", "InitVar", "KW_ONLY"})


def _base(node: ast.expr) -> ast.expr:
    return node.value if isinstance(node, ast.Subscript) else node


def _total(keywords: list[ast.keyword]) -> bool:
    for k in keywords:
        if k.arg == "total" and isinstance(k.value, ast.Constant):
            return bool(k.value.value)
    return True


class Shapes:
    """Kinds and shapes of the types in one tools folder."""

    def __init__(self, index: TypeIndex, declare: Declarer) -> None:
        self.index = index
        self.declare = declare
        self._kinds: dict[Ref, TypeKind | Opaque] = {}

    def external(self, module: str, node: ast.expr) -> External | None:
        parts = dotted_parts(node)
        found = self.index.resolve(module, parts) if parts else None
        return found if isinstance(found, External) else None

    def ref(self, module: str, node: ast.expr) -> Ref | None:
        parts = dotted_parts(node)
        found = self.index.resolve(module, parts) if parts else None
        return found if isinstance(found, Ref) else None

    def canonical(self, module: str, node: ast.expr | str) -> Canonical:
        def resolve(parts: list[str]) -> Ref | External | None:
            found = self.index.resolve(module, parts)
            if found is None and len(parts) == 1 and hasattr(builtins, parts[0]):
                return External("builtins", parts[0])
            return found

        return canonicalise(node, resolve, self.declare)

    # -- kinds -----------------------------------------------------------------------

    def kind(self, ref: Ref) -> TypeKind | Opaque:
        """What ``ref`` is, or why it is no declarable type."""
        if ref not in self._kinds:
            self._kinds[ref] = Opaque(f"{ref.name} refers to itself")  # cycle guard
            self._kinds[ref] = self._kind(ref)
        return self._kinds[ref]

    def _kind(self, ref: Ref) -> TypeKind | Opaque:
        node = self.index.definition(ref)
        if isinstance(node, ast.ClassDef):
            return self._class_kind(ref, node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return Opaque(f"{ref.name} is a function, not a data type")
        value = node.value
        if isinstance(node, ast.AnnAssign):
            ann = self.external(ref.module, node.annotation)
            if ann is not None and ann.name == "TypeAlias" and value is not None:
                return "alias"
        if isinstance(value, ast.Call):
            func = self.external(ref.module, value.func)
            name = func.name if func is not None else None
            if name == "TypeVar":
                return "typevar"
            if name == "NewType":
                return "alias"
            if name == "TypedDict":
                return "typeddict"
            if name == "NamedTuple":
                return "namedtuple"
            return Opaque(f"{ref.name} is a value, not a type")
        if isinstance(value, (ast.Subscript, ast.BinOp, ast.Name, ast.Attribute)) or (
            isinstance(value, ast.Constant)
            and (value.value is None or isinstance(value.value, str))
        ):
            return "alias"
        return Opaque(f"{ref.name} is a value, not a type")

    def _class_kind(self, ref: Ref, node: ast.ClassDef) -> TypeKind | Opaque:
        for deco in node.decorator_list:
            target = deco.func if isinstance(deco, ast.Call) else deco
            found = self.external(ref.module, target)
            if (
                found is not None
                and found.name == "dataclass"
                and found.module in _DATACLASS_MODULES
            ):
                return "dataclass"
        for base in node.bases:
            found = self.external(ref.module, _base(base))
            if found is not None:
                if found.module in _TYPING and found.name in ("TypedDict", "NamedTuple"):
                    return "typeddict" if found.name == "TypedDict" else "namedtuple"
                if found.module == "enum" and found.name in _ENUMS:
                    return "enum"
                if found.module in _PYDANTIC and found.name == "BaseModel":
                    return "pydantic"
                continue
            inner = self.ref(ref.module, _base(base))
            if inner is not None and isinstance(self.index.definition(inner), ast.ClassDef):
                kind = self.kind(inner)
                if not isinstance(kind, Opaque):
                    return kind
        return Opaque(
            f"{ref.name} is a class that is not plain data (not a TypedDict, dataclass, "
            "pydantic model, NamedTuple or Enum): calls returning it fail with NotSerializable"
        )

    # -- shapes ----------------------------------------------------------------------

    def read(self, ref: Ref, name: str, source: str) -> TypeDecl:
        """The declaration of ``ref`` (its kind must be a type kind)."""
        kind = self.kind(ref)
        assert not isinstance(kind, Opaque)
        node = self.index.definition(ref)
        notes: list[str] = []

        def canon(expr: ast.expr | str) -> str:
            got = self.canonical(ref.module, expr)
            notes.extend(n for n in got.notes if n not in notes)
            return got.text

        if isinstance(node, ast.ClassDef):
            fields = self._fields(ref, node, kind, notes, set())
            params = tuple(
                canon(arg)
                for base in node.bases
                if isinstance(base, ast.Subscript)
                and (ext := self.external(ref.module, base.value)) is not None
                and ext.name == "Generic"
                for arg in (base.slice.elts if isinstance(base.slice, ast.Tuple) else [base.slice])
            )
            value = None
            if kind == "enum":
                fields, value = (), self._enum(ref, node)
            return TypeDecl(
                name, kind, source, node.lineno, ast.get_docstring(node), fields, value,
                params=params, notes=tuple(notes),
            )  # fmt: skip
        assert isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
        value = node.value
        if kind == "typevar":
            assert isinstance(value, ast.Call)
            bound = next((k.value for k in value.keywords if k.arg == "bound"), None)
            constraints = tuple(canon(a) for a in value.args[1:])
            return TypeDecl(
                name, kind, source, node.lineno, None, (), canon(bound) if bound else None,
                constraints, notes=tuple(notes),
            )  # fmt: skip
        if kind in ("typeddict", "namedtuple"):
            assert isinstance(value, ast.Call)
            fields = self._functional_fields(value, kind, canon)
            return TypeDecl(name, kind, source, node.lineno, None, fields, notes=tuple(notes))
        if isinstance(value, ast.Call):  # NewType("Name", base)
            value = value.args[1] if len(value.args) > 1 else ast.Name("Any")
        return TypeDecl(
            name, "alias", source, node.lineno, None, (), canon(value), notes=tuple(notes)
        )

    def _fields(
        self, ref: Ref, node: ast.ClassDef, kind: TypeKind, notes: list[str], seen: set[Ref]
    ) -> tuple[FieldDecl, ...]:
        seen.add(ref)
        fields: dict[str, FieldDecl] = {}
        for base in node.bases:  # inherited fields first, as at run time
            inner = self.ref(ref.module, _base(base))
            if inner is None or inner in seen:
                continue
            base_node = self.index.definition(inner)
            if isinstance(base_node, ast.ClassDef) and self.kind(inner) == kind:
                for f in self._fields(inner, base_node, kind, notes, seen):
                    fields[f.name] = f
        total = _total(node.keywords)
        for stmt in node.body:
            if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                continue
            name = stmt.target.id
            wrapper = self.external(ref.module, _base(stmt.annotation))
            wrapped = wrapper.name if wrapper is not None else None
            if wrapped in _SKIPPED or (kind == "pydantic" and name.startswith("_")):
                continue
            required = True
            if kind == "typeddict":
                required = wrapped == "Required" or (wrapped != "NotRequired" and total)
            got = self.canonical(ref.module, stmt.annotation)
            notes.extend(f"{name}: {n}" for n in got.notes if f"{name}: {n}" not in notes)
            fields[name] = FieldDecl(name, got.text, required)
        return tuple(fields.values())

    def _functional_fields(
        self, call: ast.Call, kind: TypeKind, canon: Callable[[ast.expr | str], str]
    ) -> tuple[FieldDecl, ...]:
        total = _total(call.keywords)
        spec = call.args[1] if len(call.args) > 1 else None
        out: list[FieldDecl] = []
        if kind == "typeddict" and isinstance(spec, ast.Dict):
            for key, value in zip(spec.keys, spec.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    out.append(FieldDecl(key.value, canon(value), total))
        elif isinstance(spec, (ast.List, ast.Tuple)):
            for item in spec.elts:
                if isinstance(item, ast.Tuple) and len(item.elts) == 2:
                    key, value = item.elts
                    if isinstance(key, ast.Constant) and isinstance(key.value, str):
                        out.append(FieldDecl(key.value, canon(value)))
        return tuple(out)

    def _members(self, ref: Ref, node: ast.ClassDef) -> dict[str, object] | None:
        """An Enum's members and their values as written; ``None`` when one is not a
        literal (nor ``auto()``)."""
        strings = any(
            (ext := self.external(ref.module, _base(b))) is not None and ext.name == "StrEnum"
            for b in node.bases
        )
        members: dict[str, object] = {}
        for stmt in node.body:
            if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
                continue
            target = stmt.targets[0]
            if not isinstance(target, ast.Name) or target.id.startswith("_"):
                continue
            if isinstance(stmt.value, ast.Call) and dotted_parts(stmt.value.func) in (
                ["auto"],
                ["enum", "auto"],
            ):
                last = next((v for v in reversed(members.values()) if type(v) is int), 0)
                members[target.id] = target.id.lower() if strings else last + 1
                continue
            try:
                members[target.id] = ast.literal_eval(stmt.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
        return members

    def enum_value(self, module: str, text: str) -> tuple[bool, object]:
        """``(True, value)`` when ``text`` (a default as written in ``module``) names a
        member of an Enum of the tools folder, such as ``Color.RED``: the value it crosses
        the boundary as. Else ``(False, None)``."""
        try:
            node = ast.parse(text.strip(), mode="eval").body
        except SyntaxError:
            return False, None
        if not isinstance(node, ast.Attribute):
            return False, None
        ref = self.ref(module, node.value)
        if ref is None or self.kind(ref) != "enum":
            return False, None
        cls = self.index.definition(ref)
        members = self._members(ref, cls) if isinstance(cls, ast.ClassDef) else None
        if members is None or node.attr not in members:
            return False, None
        value = members[node.attr]
        return (
            (True, value)
            if isinstance(value, (str, int, bytes)) or value is None
            else (
                False,
                None,
            )
        )

    def _enum(self, ref: Ref, node: ast.ClassDef) -> str:
        """``Literal[...]`` of the members' values: what an Enum becomes at the boundary."""
        members = self._members(ref, node)
        if members is None:
            return "Any"
        values = list(members.values())
        plain = [v for v in values if isinstance(v, (str, int, bytes)) or v is None]
        if len(plain) != len(values) or not values:
            return "Any"
        return ast.unparse(
            ast.Subscript(ast.Name("Literal"), ast.Tuple([ast.Constant(v) for v in plain]))
        )
