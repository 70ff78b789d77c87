"""Read the tool files with ``ast``: what each top-level name is bound to, and where.

One file at a time, :func:`parse_module` records the last binding of every top-level name
(``def``, assignment, import, ``del``) as at run time, and ``__all__``; parameters are
read from the source as :class:`Param`s. :class:`Finder` then follows a name across the
files of one tools folder (aliases, sibling imports) to the definition it is bound to, and
lists a project class's methods. Which of those names are tools is ``_exports``' business.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from host.errors import DeclarationError

from ._specs import (
    KEYWORD_ONLY,
    NO_DEFAULT,
    POSITIONAL_ONLY,
    POSITIONAL_OR_KEYWORD,
    VAR_KEYWORD,
    VAR_POSITIONAL,
    Param,
)

__all__ = ["Fn", "Module", "parse_module", "params_of", "Finder"]

_MODULE: Final = "<module>"
"""The import source of ``import x``: the name is a module, never a tool."""


@dataclass(slots=True)
class Module:
    name: str
    path: Path
    tree: ast.Module
    defs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef] = field(
        default_factory=dict[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]
    )
    assigns: dict[str, tuple[ast.expr, int]] = field(
        default_factory=dict[str, tuple[ast.expr, int]]
    )
    imports: dict[str, tuple[str | None, str, int]] = field(
        default_factory=dict[str, tuple[str | None, str, int]]
    )
    """local name -> (sibling module, ``""`` for ``from . import``, ``_MODULE`` for
    ``import x``, or None when from outside the tools folder; imported name; line)."""
    all_names: list[str] | None = None
    namespace_names: set[str] = field(default_factory=set[str])
    """Local names that refer to ``types.SimpleNamespace``."""
    types_modules: set[str] = field(default_factory=set[str])

    # A top-level name is bound by its last binding statement, as at run time: each
    # binding forgets what the name was bound to before.

    def unbind(self, name: str) -> None:
        self.defs.pop(name, None)
        self.assigns.pop(name, None)
        self.imports.pop(name, None)

    def bind_def(
        self, name: str, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    ) -> None:
        self.unbind(name)
        self.defs[name] = node

    def bind_assign(self, name: str, value: ast.expr, line: int) -> None:
        self.unbind(name)
        self.assigns[name] = (value, line)

    def bind_opaque(self, name: str, line: int) -> None:
        """Bind ``name`` to a value discovery cannot see (never a tool)."""
        self.bind_assign(name, ast.Constant(value=None, lineno=line, col_offset=0), line)

    def bind_import(self, name: str, source: tuple[str | None, str, int]) -> None:
        self.unbind(name)
        self.imports[name] = source


def parse_module(name: str, path: Path) -> Module:
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DeclarationError(f"cannot read tool file: {exc}", file=str(path)) from exc
    tree = _ast_parse(source, path)
    mod = Module(name, path, tree)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            mod.bind_def(node.name, node)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                _assign(mod, target, node.value, node.lineno)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.value is not None:
                _assign(mod, node.target, node.value, node.lineno)
        elif isinstance(node, ast.AugAssign):
            # ``__all__ += [...]``: the one augmented form that changes what is exported.
            target = node.target
            if isinstance(target, ast.Name) and target.id == "__all__":
                mod.all_names = [*(mod.all_names or []), *_literal_names(node.value, path)]
            elif isinstance(target, ast.Name):
                mod.bind_opaque(target.id, node.lineno)
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    mod.unbind(target.id)
        elif isinstance(node, ast.ImportFrom):
            sibling = node.module if node.level == 1 else None
            if node.level == 1 and node.module is None:
                sibling = ""  # from . import x
            for alias in node.names:
                local = alias.asname or alias.name
                mod.bind_import(local, (sibling, alias.name, node.lineno))
                if node.level == 0 and node.module == "types" and alias.name == "SimpleNamespace":
                    mod.namespace_names.add(local)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                # ``import a.b`` binds ``a``: a module, never a tool.
                local = alias.asname or alias.name.split(".")[0]
                mod.bind_import(local, (_MODULE, alias.name, node.lineno))
                if alias.name == "types":
                    mod.types_modules.add(local)
    return mod


def _ast_parse(source: str, path: Path) -> ast.Module:
    """``ast.parse``, with every failure a :class:`DeclarationError` naming the file."""
    for attempt in range(3):
        try:
            return ast.parse(source, filename=str(path))
        except SyntaxError as exc:
            message = f"syntax error: {exc.msg}"
            raise DeclarationError(message, file=str(path), line=exc.lineno) from exc
        except SystemError as exc:
            # CPython 3.11 keeps the AST builder's recursion counter per interpreter, not
            # per thread: a parse that races another thread's fails spuriously with
            # "AST constructor recursion depth mismatch" (python/cpython#106905). Seen
            # here with the host's worker threads; parsing again is safe.
            if "recursion depth mismatch" in str(exc) and attempt < 2:
                continue
            raise DeclarationError(f"cannot parse tool file: {exc}", file=str(path)) from exc
        except (ValueError, MemoryError, RecursionError) as exc:  # NUL bytes, absurd nesting
            raise DeclarationError(f"cannot parse tool file: {exc}", file=str(path)) from exc
    raise AssertionError("unreachable")  # pragma: no cover


def _assign(mod: Module, target: ast.expr, value: ast.expr, line: int) -> None:
    """Record what an assignment binds; names it binds to unknown values bind opaquely."""
    if isinstance(target, ast.Name):
        if target.id == "__all__":
            mod.all_names = _literal_names(value, mod.path)
        else:
            mod.bind_assign(target.id, value, line)
    elif isinstance(target, (ast.Tuple, ast.List)):
        elts = target.elts
        if (
            isinstance(value, (ast.Tuple, ast.List))
            and len(value.elts) == len(elts)
            and not any(isinstance(e, ast.Starred) for e in (*elts, *value.elts))
        ):
            for sub_target, sub_value in zip(elts, value.elts, strict=True):
                _assign(mod, sub_target, sub_value, line)
            return
        for sub_target in elts:
            inner = sub_target.value if isinstance(sub_target, ast.Starred) else sub_target
            if isinstance(inner, ast.Name):
                mod.bind_opaque(inner.id, line)


def _literal_names(node: ast.expr, path: Path) -> list[str]:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise DeclarationError(
            "__all__ must be a literal list or tuple of strings", file=str(path), line=node.lineno
        ) from exc
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):  # pyright: ignore[reportUnknownVariableType]
        raise DeclarationError(
            "__all__ must be a literal list or tuple of strings", file=str(path), line=node.lineno
        )
    return [str(v) for v in value]  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]


def params_of(
    fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, *, drop_first: bool
) -> tuple[Param, ...]:
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(
        a.defaults
    )
    out: list[Param] = []
    for i, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        kind = POSITIONAL_ONLY if i < len(a.posonlyargs) else POSITIONAL_OR_KEYWORD
        out.append(_param(arg, kind, default))
    if drop_first and out:
        out.pop(0)
    if a.vararg is not None:
        out.append(_param(a.vararg, VAR_POSITIONAL, None))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        out.append(_param(arg, KEYWORD_ONLY, default))
    if a.kwarg is not None:
        out.append(_param(a.kwarg, VAR_KEYWORD, None))
    return tuple(out)


def _param(arg: ast.arg, kind: int, default: ast.expr | None) -> Param:
    annotation = ast.unparse(arg.annotation) if arg.annotation is not None else None
    if default is None:
        return Param(arg.arg, kind, annotation)
    try:
        value = ast.literal_eval(default)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        value = NO_DEFAULT
    return Param(arg.arg, kind, annotation, ast.unparse(default), value)


Fn = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
_Bound = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.expr

_PROPERTIES: Final = frozenset({"property", "cached_property"})
"""Decorators that make a method an attribute, not a tool (also ``x.setter`` and kin)."""


def _decorators(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names: set[str] = set()
    for deco in fn.decorator_list:
        if isinstance(deco, ast.Name):
            names.add(deco.id)
        elif isinstance(deco, ast.Attribute):
            names.add(deco.attr)
    return names


def _is_property(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return bool(_decorators(fn) & _PROPERTIES) or any(
        isinstance(d, ast.Attribute) and d.attr in ("setter", "getter", "deleter")
        for d in fn.decorator_list
    )


@dataclass(frozen=True, slots=True)
class _Method:
    owner: Module
    fn: Fn
    static: bool


class Finder:
    """Resolves exports across the files of one tools folder."""

    def __init__(self, modules: dict[str, Module]) -> None:
        self.modules = modules

    def follow(
        self, mod: Module, name: str, seen: frozenset[tuple[str, str]] = frozenset()
    ) -> tuple[Module, _Bound, int] | None:
        """Find what ``name`` is bound to in ``mod``, following aliases and sibling imports."""
        if (mod.name, name) in seen:
            return None
        seen = seen | {(mod.name, name)}
        if name in mod.defs:
            node = mod.defs[name]
            return mod, node, node.lineno
        if name in mod.assigns:
            value, line = mod.assigns[name]
            if isinstance(value, (ast.Name, ast.Attribute)):  # ``g = f``: an alias
                return self.resolve(mod, value, seen) or (mod, value, line)
            return mod, value, line
        if name in mod.imports:
            sibling, imported, _line = mod.imports[name]
            if sibling is None or sibling in ("", _MODULE):
                return None  # from outside the tools folder, or a module: never a tool
            target = self.modules.get(sibling)
            if target is None:
                return None
            return self.follow(target, imported, seen)
        return None

    def resolve(
        self, mod: Module, expr: ast.expr, seen: frozenset[tuple[str, str]] = frozenset()
    ) -> tuple[Module, _Bound, int] | None:
        """What ``name`` or ``sibling.name`` (after ``from . import sibling``) is bound to."""
        if isinstance(expr, ast.Name):
            return self.follow(mod, expr.id, seen)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            source = mod.imports.get(expr.value.id)
            if source is not None and source[0] == "":
                target = self.modules.get(source[1])
                if target is not None:
                    return self.follow(target, expr.attr, seen)
        return None

    def project_class(self, mod: Module, expr: ast.expr) -> tuple[Module, ast.ClassDef] | None:
        found = self.resolve(mod, expr)
        if found is None or not isinstance(found[1], ast.ClassDef):
            return None
        return found[0], found[1]

    def is_namespace(self, mod: Module, func: ast.expr) -> bool:
        if isinstance(func, ast.Name):
            return func.id in mod.namespace_names
        return (
            isinstance(func, ast.Attribute)
            and func.attr == "SimpleNamespace"
            and isinstance(func.value, ast.Name)
            and func.value.id in mod.types_modules
        )

    def class_methods(self, mod: Module, cls: ast.ClassDef, depth: int = 0) -> dict[str, _Method]:
        """Public methods of a project class, bases first so subclasses override.

        As at run time, a name bound in a class body to anything but a function (a
        property, a constant, a nested class) hides the base class's method of that name.
        """
        methods: dict[str, _Method] = {}
        if depth > 20:
            return methods
        for base in reversed(cls.bases):
            found = self.project_class(mod, base)
            if found is not None:
                methods.update(self.class_methods(found[0], found[1], depth + 1))
        local: dict[str, _Method] = {}
        for node in cls.body:
            bound: list[tuple[str, _Method | None]] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                method = (
                    None
                    if _is_property(node)
                    else _Method(mod, node, "staticmethod" in _decorators(node))
                )
                bound.append((node.name, method))
            elif isinstance(node, ast.ClassDef):
                bound.append((node.name, None))
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value
                method = None
                if isinstance(value, ast.Lambda):  # ``m = lambda self: ...``
                    method = _Method(mod, value, False)
                elif isinstance(value, ast.Name):  # ``alias = method``
                    method = local.get(value.id)
                bound.extend((t.id, method) for t in targets if isinstance(t, ast.Name))
            for name, method in bound:
                if method is None:
                    local.pop(name, None)
                    methods.pop(name, None)
                else:
                    local[name] = method
                    methods[name] = method
        return {name: m for name, m in methods.items() if not name.startswith("_")}
