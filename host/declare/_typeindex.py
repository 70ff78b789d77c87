"""An ``ast`` index of the tools folder: where a name a declaration mentions is defined.

Pyright prints bare class names (``Task``), and source annotations reach types through
imports (``from ._models import Task``, ``import typing as t``). This index reads every
file of the tools folder once (no user code runs) and answers what a name is bound to in
a module, following sibling imports to the defining statement. Top-level ``if`` and
``try`` blocks are read too (``if TYPE_CHECKING:`` imports); as at run time, the last
statement that binds a name wins.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from host.errors import DeclarationError

__all__ = ["Ref", "External", "Local", "ModuleIndex", "TypeIndex", "parse", "parse_type"]

Local = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef | ast.Assign | ast.AnnAssign
"""A statement of the tools folder that binds a name."""


@dataclass(frozen=True, slots=True, order=True)
class Ref:
    """A top-level name defined in a file of the tools folder."""

    module: str
    name: str


@dataclass(frozen=True, slots=True)
class External:
    """A name bound to something outside the tools folder (``typing.Literal``)."""

    module: str
    name: str | None
    """None when the name is the module itself (``import typing as t``)."""


@dataclass(frozen=True, slots=True)
class _Import:
    module: str
    """An absolute module, or for a sibling the tool file's module name."""
    name: str | None
    """None when the binding is the module itself."""
    sibling: bool


@dataclass(slots=True)
class ModuleIndex:
    """The top-level bindings of one file."""

    name: str
    path: Path
    tree: ast.Module
    bindings: dict[str, Local | _Import] = field(default_factory=dict[str, "Local | _Import"])
    functions: dict[int, str] = field(default_factory=dict[int, str])
    """Line of a top-level ``def`` -> its name."""


def _statements(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    for node in body:
        if isinstance(node, ast.If):
            yield from _statements(node.body)
            yield from _statements(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _statements(node.body)
            for handler in node.handlers:
                yield from _statements(handler.body)
            yield from _statements(node.orelse)
            yield from _statements(node.finalbody)
        else:
            yield node


def _import_from(node: ast.ImportFrom) -> Iterator[tuple[str, _Import]]:
    module = node.module or ""
    for alias in node.names:
        local = alias.asname or alias.name
        if node.level == 1 and module:  # from ._b import X
            yield local, _Import(module, alias.name, True)
        elif node.level == 1 or (node.level == 0 and module == "tools"):  # from . import _b
            yield local, _Import(alias.name, None, True)
        elif node.level == 0 and module.startswith("tools."):  # from tools._b import X
            yield local, _Import(module.removeprefix("tools."), alias.name, True)
        elif node.level == 0:
            yield local, _Import(module, alias.name, False)


def parse(source: str, filename: str = "<type>", mode: str = "exec") -> ast.AST:
    """``ast.parse``, retried when CPython 3.11 fails it spuriously under threads.

    3.11 keeps the AST builder's recursion counter per interpreter, so a parse racing
    another thread's can fail with "AST constructor recursion depth mismatch"
    (python/cpython#106905); scopes are built on worker threads, so parse again.
    """
    for attempt in range(3):
        try:
            return ast.parse(source, filename=filename, mode=mode)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc) or attempt == 2:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def parse_type(text: str) -> ast.expr:
    """A type expression's ``ast``. Raises SyntaxError."""
    tree = parse(text, mode="eval")
    assert isinstance(tree, ast.Expression)
    return tree.body


def _index(name: str, path: Path) -> ModuleIndex:
    try:
        tree = parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, SystemError) as exc:
        raise DeclarationError(f"cannot read tool file: {exc}", file=str(path)) from exc
    assert isinstance(tree, ast.Module)
    mod = ModuleIndex(name, path, tree)
    bind = mod.bindings
    for node in _statements(tree.body):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            bind[node.name] = node
            if not isinstance(node, ast.ClassDef):
                mod.functions[node.lineno] = node.name
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    bind[target.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            bind[node.target.id] = node
        elif isinstance(node, ast.ImportFrom):
            bind.update(_import_from(node))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname is not None:
                    bind[alias.asname] = _Import(alias.name, None, alias.name == "tools")
                else:
                    head = alias.name.split(".")[0]
                    bind[head] = _Import(head, None, head == "tools")
    return mod


class TypeIndex:
    """Every file of one tools folder, indexed by module name, each parsed when first needed."""

    def __init__(self, tools_dir: Path) -> None:
        self.tools_dir = tools_dir
        self.paths: dict[str, Path] = {p.stem: p for p in sorted(tools_dir.glob("*.py"))}
        self._parsed: dict[str, ModuleIndex] = {}

    def module(self, name: str) -> ModuleIndex | None:
        parsed = self._parsed.get(name)
        if parsed is None and name in self.paths:
            parsed = self._parsed[name] = _index(name, self.paths[name])
        return parsed

    @property
    def modules(self) -> list[ModuleIndex]:
        """Every module, parsed."""
        return [m for name in self.paths if (m := self.module(name)) is not None]

    def module_of(self, path: Path) -> str:
        """The module name of a file of the tools folder."""
        return path.stem

    def definition(self, ref: Ref) -> Local:
        mod = self.module(ref.module)
        assert mod is not None
        node = mod.bindings[ref.name]
        assert not isinstance(node, _Import)
        return node

    def lookup(self, module: str, name: str, depth: int = 0) -> Ref | External | None:
        """What ``name`` is bound to in ``module``, following sibling imports."""
        mod = self.module(module)
        if mod is None or depth > 50:
            return None
        bound = mod.bindings.get(name)
        if bound is None:
            return None
        if not isinstance(bound, _Import):
            return Ref(module, name)
        if not bound.sibling:
            return External(bound.module, bound.name)
        if bound.name is None:
            return External("tools." + bound.module if bound.module != "tools" else "tools", None)
        return self.lookup(bound.module, bound.name, depth + 1)

    def resolve(self, module: str, parts: list[str]) -> Ref | External | None:
        """What a dotted name (``t.Optional``, ``_models.Task``) means in ``module``."""
        bound = self.lookup(module, parts[0])
        rest = parts[1:]
        while rest:
            if not isinstance(bound, External):
                return None  # an attribute of a class or value: not a type we follow
            base = bound.module if bound.name is None else f"{bound.module}.{bound.name}"
            attr, rest = rest[0], rest[1:]
            if base == "tools":
                bound = External(f"tools.{attr}", None)
            elif base.startswith("tools."):
                bound = self.lookup(base.removeprefix("tools."), attr)
            elif not rest:
                bound = External(base, attr)
            else:
                bound = External(f"{base}.{attr}", None)
        return bound

    def anywhere(self, name: str) -> list[Ref]:
        """Every top-level definition (not import) of ``name`` in the tools folder."""
        return [
            Ref(mod.name, name)
            for mod in self.modules
            if name in mod.bindings and not isinstance(mod.bindings[name], _Import)
        ]

    def imported_anywhere(self, name: str) -> External | None:
        """``name`` as imported by name from outside the tools folder by any file."""
        for mod in self.modules:
            bound = mod.bindings.get(name)
            if isinstance(bound, _Import) and not bound.sibling and bound.name is not None:
                return External(bound.module, bound.name)
        return None
