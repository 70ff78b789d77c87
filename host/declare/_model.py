"""The scope model: the declarations of every tool, as plain data.

One model, many renderings: the model block the LLM reads, the ``.pyi`` stub for editors,
the JSON manifest and the JSON Schemas all come from this, so they cannot disagree. It is
built from discovery and one pyright run (``_build``), kept by the cache (``_cache``),
and is plain data all the way down so it round-trips through JSON. The renderers
(``_render``, ``_schema``) read this model; :class:`~._scope.Scope` adds them as methods,
so the model never imports a renderer.

Types are canonical text (see ``_typeexpr``): a small vocabulary of builtins plus the
names of the referenced types in :attr:`Scope.types`, which come in dependency order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Self, cast

__all__ = ["ParamDecl", "ToolDecl", "FieldDecl", "TypeDecl", "ScopeModel", "TypeKind"]

TypeKind = Literal["typeddict", "dataclass", "pydantic", "namedtuple", "enum", "alias", "typevar"]
_CLASS_KINDS = frozenset({"typeddict", "dataclass", "pydantic", "namedtuple"})


@dataclass(frozen=True, slots=True)
class ParamDecl:
    """One parameter the caller can pass (hidden context parameters never appear)."""

    name: str
    kind: int
    """An ``inspect.Parameter`` kind value (0 positional-only ... 4 ``**kwargs``)."""
    type: str
    """Canonical type text, as pyright infers it (``Any`` where it cannot)."""
    default: str | None = None
    """The default as written in the source; ``...`` when it is not a literal."""
    description: str | None = None
    """From the docstring's parameter section (Google, NumPy or Sphinx style)."""

    @property
    def required(self) -> bool:
        return self.default is None and self.kind not in (2, 4)


@dataclass(frozen=True, slots=True)
class ToolDecl:
    """One tool as the agent calls it: always ``async def``, every call awaited."""

    name: str
    qualified: str
    """``tools.FILE.EXPORT[.MEMBER]``."""
    file: str
    export: str
    member: str | None
    installed: bool
    """False when only ``tools.FILE.EXPORT`` reaches it (its name shadows a builtin)."""
    source: str
    """The defining file, relative to the tools folder."""
    line: int
    params: tuple[ParamDecl, ...]
    returns: str
    """Canonical text of the inferred return type, coroutines unwrapped."""
    docstring: str | None
    """Verbatim (cleaned of indentation) from the source."""
    inferred: str
    """Pyright's own text for the tool's type, for the manifest and for debugging."""
    notes: tuple[str, ...] = ()
    """Where pyright's answer is weak, said plainly (overloads, wrappers, Unknown)."""
    summary: str | None = None
    """The docstring without its parameter and return sections."""
    returns_description: str | None = None
    uses: tuple[str, ...] | None = None
    """The tools it may call through its context (its file's ``__uses__``); None: the
    file declares nothing for it."""

    @property
    def path(self) -> tuple[str, ...]:
        return (
            (self.file, self.export)
            if self.member is None
            else (self.file, self.export, self.member)
        )


@dataclass(frozen=True, slots=True)
class FieldDecl:
    """One key of a declared data shape."""

    name: str
    type: str
    required: bool = True


@dataclass(frozen=True, slots=True)
class TypeDecl:
    """A user-declared type a signature mentions, directly or through another type.

    Classes with a data shape (TypedDict, dataclass, pydantic model, NamedTuple) are all
    declared as a TypedDict: the agent only ever receives their fields as a dict.
    An Enum is declared as the ``Literal`` of its values, which is what crosses.
    """

    name: str
    kind: TypeKind
    source: str
    """The defining file, relative to the tools folder."""
    line: int
    docstring: str | None = None
    fields: tuple[FieldDecl, ...] = ()
    value: str | None = None
    """An alias's (or enum's ``Literal[...]``) canonical text; a TypeVar's bound."""
    constraints: tuple[str, ...] = ()
    """A TypeVar's constraints."""
    params: tuple[str, ...] = ()
    """Type parameters of a generic class (``Generic[T]``)."""
    notes: tuple[str, ...] = ()

    @property
    def shape(self) -> tuple[Any, ...]:
        """What two same-named copies must share to merge into one declaration."""
        kind = "class" if self.kind in _CLASS_KINDS else self.kind
        return (kind, self.fields, self.value, self.constraints, self.params)

    @property
    def is_class(self) -> bool:
        return self.kind in _CLASS_KINDS


@dataclass(frozen=True, slots=True)
class ScopeModel:
    """The declarations of all tools: tools in discovery order, types in dependency order."""

    tools: tuple[ToolDecl, ...]
    types: tuple[TypeDecl, ...]
    pyright: str
    """The pyright version that inferred them."""
    key: str = ""
    """The cache key it was built for."""
    _by_name: dict[str, ToolDecl] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {t.name: t for t in self.tools})

    def __repr__(self) -> str:
        return f"<Scope tools={len(self.tools)} types={len(self.types)} pyright={self.pyright}>"

    def tool(self, name: str) -> ToolDecl:
        """The declaration of the tool with this canonical name. Raises KeyError."""
        return self._by_name[name]

    def type(self, name: str) -> TypeDecl:
        for decl in self.types:
            if decl.name == name:
                return decl
        raise KeyError(name)

    # -- plain data (the cache) ---------------------------------------------------------

    def to_data(self) -> dict[str, Any]:
        """Plain JSON data (``dataclasses.asdict`` deep-copies: too slow for big scopes)."""

        def plain(decl: Any) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for f in fields(decl):
                name = f.name
                value = getattr(decl, name)
                if isinstance(value, tuple):
                    items = cast("tuple[Any, ...]", value)
                    value = [plain(v) if hasattr(v, "__dataclass_fields__") else v for v in items]
                out[name] = value
            return out

        return {
            "tools": [plain(t) for t in self.tools],
            "types": [plain(t) for t in self.types],
            "pyright": self.pyright,
            "key": self.key,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Self:
        """Rebuild a scope from :meth:`to_data`. Raises on any malformed part.

        Positional construction: a warm start rebuilds thousands of these.
        """
        tools = tuple(
            ToolDecl(
                t["name"],
                t["qualified"],
                t["file"],
                t["export"],
                t["member"],
                t["installed"],
                t["source"],
                t["line"],
                tuple(
                    ParamDecl(p["name"], p["kind"], p["type"], p["default"], p["description"])
                    for p in t["params"]
                ),
                t["returns"],
                t["docstring"],
                t["inferred"],
                tuple(t["notes"]),
                t["summary"],
                t["returns_description"],
                None if t.get("uses") is None else tuple(t["uses"]),
            )
            for t in data["tools"]
        )
        types = tuple(
            TypeDecl(
                t["name"],
                t["kind"],
                t["source"],
                t["line"],
                t["docstring"],
                tuple(FieldDecl(f["name"], f["type"], f["required"]) for f in t["fields"]),
                t["value"],
                tuple(t["constraints"]),
                tuple(t["params"]),
                tuple(t["notes"]),
            )
            for t in data["types"]
        )
        return cls(tools, types, str(data["pyright"]), str(data["key"]))
