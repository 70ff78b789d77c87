"""Find the tool files and what they export, by reading them with ``ast``.

No user code runs in the host process: every fact here comes from parsing the source.
The rules (mirrored at run time by ``capsule._registry``, and checked against it when a
capsule loads) are:

* every ``tools/NAME.py`` is a tool file (NAME an NFKC-normalised identifier, not a
  keyword); files whose name starts with ``_`` are private helpers: importable by
  siblings, exporting nothing;
* with ``__all__`` (a literal list or tuple of strings, optionally extended with
  ``+=``), the file exports the names it lists; without it, every public top-level name
  it defines;
* a function (``def``, ``async def``, a top-level ``f = lambda ...``, or an alias
  ``g = f``) is one tool. A name imported from a sibling file is followed to its
  definition when ``__all__`` lists it;
* an object (``name = SomeClass(...)`` for a class defined in the tools package, or
  ``name = SimpleNamespace(a=f, ...)``) exports its public methods (members) as tools
  named ``name.method``; properties are not methods;
* classes, constants and other data are not tools.

Each top-level name is bound by the last statement that binds it (``def``, assignment,
import, ``del``), as at run time. Names bound only inside ``if``/``try`` blocks are not
seen; the load check then refuses the file, naming both lists.

A tool's name is how the agent writes the call: ``now``, ``kanban.add``. An export whose
name shadows a Python builtin or a host global is not installed as a global; its tool name
is ``tools.FILE.EXPORT``. Two files exporting the same global name is an error naming both.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import unicodedata
from collections.abc import Iterator
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
    Discovery,
    Param,
    ToolFile,
    ToolSpec,
)

__all__ = ["HOST_GLOBALS", "discover"]

HOST_GLOBALS: Final = frozenset(
    {
        "tools",
        "HostError",
        "CallError",
        "ToolError",
        "NotSerializable",
        "InvalidArguments",
        "UnknownTool",
        "PolicyDenied",
        "NotApproved",
        "ToolTimeout",
        "CapsuleCrashed",
        "ToolUnavailable",
        "LimitExceeded",
        "DeclarationError",
        "PolicyFileError",
        "ProtocolError",
        "asyncio",
    }
)
"""Names the agent's scope already holds; an export with one of these is not a global."""

_SHADOWED: Final = frozenset(dir(builtins)) | HOST_GLOBALS


# -- parsing -------------------------------------------------------------------------------


_MODULE: Final = "<module>"
"""The import source of ``import x``: the name is a module, never a tool."""


@dataclass(slots=True)
class _Module:
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


def _parse(name: str, path: Path) -> _Module:
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DeclarationError(f"cannot read tool file: {exc}", file=str(path)) from exc
    tree = _ast_parse(source, path)
    mod = _Module(name, path, tree)
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


def _assign(mod: _Module, target: ast.expr, value: ast.expr, line: int) -> None:
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


def _params(
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


_Fn = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
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
    owner: _Module
    fn: _Fn
    static: bool


class _Finder:
    """Resolves exports across the files of one tools folder."""

    def __init__(self, modules: dict[str, _Module]) -> None:
        self.modules = modules

    def follow(
        self, mod: _Module, name: str, seen: frozenset[tuple[str, str]] = frozenset()
    ) -> tuple[_Module, _Bound, int] | None:
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
        self, mod: _Module, expr: ast.expr, seen: frozenset[tuple[str, str]] = frozenset()
    ) -> tuple[_Module, _Bound, int] | None:
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

    def project_class(self, mod: _Module, expr: ast.expr) -> tuple[_Module, ast.ClassDef] | None:
        found = self.resolve(mod, expr)
        if found is None or not isinstance(found[1], ast.ClassDef):
            return None
        return found[0], found[1]

    def is_namespace(self, mod: _Module, func: ast.expr) -> bool:
        if isinstance(func, ast.Name):
            return func.id in mod.namespace_names
        return (
            isinstance(func, ast.Attribute)
            and func.attr == "SimpleNamespace"
            and isinstance(func.value, ast.Name)
            and func.value.id in mod.types_modules
        )

    def class_methods(self, mod: _Module, cls: ast.ClassDef, depth: int = 0) -> dict[str, _Method]:
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


def _tool_name(file: str, export: str, member: str | None) -> tuple[str, bool]:
    # Dunder names (``__builtins__``, ``__name__``) are the scope's own machinery.
    if export in _SHADOWED or (export.startswith("__") and export.endswith("__")):
        base = f"tools.{file}.{export}"
        return (base if member is None else f"{base}.{member}"), False
    return (export if member is None else f"{export}.{member}"), True


def _context_names(tree: ast.Module) -> set[str]:
    """How this module spells ``capsule.context.ToolContext`` (imports anywhere in it)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                local = alias.asname or alias.name
                if node.module == "capsule.context" and alias.name == "ToolContext":
                    names.add(local)
                elif node.module == "capsule" and alias.name == "context":
                    names.add(f"{local}.ToolContext")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "capsule.context":
                    names.add(f"{alias.asname or alias.name}.ToolContext")
    return names


def _context_param(params: tuple[Param, ...], tree: ast.Module) -> str | None:
    """The parameter annotated ``ToolContext`` (or ``ToolContext | None``), if any."""
    candidates = [p for p in params if p.annotation and "ToolContext" in p.annotation]
    if not candidates:
        return None  # the common case: no need to look at the imports
    names = _context_names(tree)
    for param in candidates:
        assert param.annotation is not None
        try:
            expr = ast.parse(param.annotation.strip(" '\""), mode="eval").body
        except SyntaxError:
            continue
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
            sides = [s for s in (expr.left, expr.right) if ast.unparse(s) != "None"]
            expr = sides[0] if len(sides) == 1 else expr
        elif isinstance(expr, ast.Subscript) and ast.unparse(expr.value) in (
            "Optional",
            "typing.Optional",
        ):
            expr = expr.slice
        if ast.unparse(expr) in names:
            return param.name
    return None


def _spec(
    file: str, export: str, member: str | None, owner: _Module, fn: _Fn, *, drop_first: bool
) -> ToolSpec:
    name, installed = _tool_name(file, export, member)
    is_def = not isinstance(fn, ast.Lambda)
    params = _params(fn, drop_first=drop_first)
    context = _context_param(params, owner.tree)
    return ToolSpec(
        name=name,
        file=file,
        export=export,
        member=member,
        params=tuple(p for p in params if p.name != context),
        is_async=isinstance(fn, ast.AsyncFunctionDef),
        source=owner.path,
        line=fn.lineno,
        docstring=ast.get_docstring(fn, clean=True) if is_def else None,
        returns=ast.unparse(fn.returns) if is_def and fn.returns is not None else None,
        installed=installed,
        context=context,
    )


def _exports_of(finder: _Finder, mod: _Module) -> Iterator[ToolSpec]:
    if mod.all_names is not None:
        names = list(dict.fromkeys(mod.all_names))
    else:
        names = [n for n in (*mod.defs, *mod.assigns) if not n.startswith("_")]
    for export in names:
        found = finder.follow(mod, export)
        if found is None:
            if mod.all_names is not None and export in mod.imports:
                sibling, _imported, line = mod.imports[export]
                if sibling is None:
                    raise DeclarationError(
                        f"__all__ lists {export!r}, imported from outside the tools folder: "
                        "toolhost cannot read its signature; wrap it in a function defined here",
                        file=str(mod.path),
                        line=line,
                    )
            continue
        owner, node, _line = found
        if owner is not mod and mod.all_names is None:
            continue  # imported names are exports only when __all__ lists them
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield _spec(mod.name, export, None, owner, node, drop_first=False)
        elif isinstance(node, ast.Call):
            yield from _object_exports(finder, mod, export, owner, node)


def _object_exports(
    finder: _Finder, mod: _Module, export: str, owner: _Module, value: ast.Call
) -> Iterator[ToolSpec]:
    cls = finder.project_class(owner, value.func)
    if cls is not None:
        for member, method in sorted(finder.class_methods(cls[0], cls[1]).items()):
            drop_first = not method.static
            yield _spec(mod.name, export, member, method.owner, method.fn, drop_first=drop_first)
        return
    if finder.is_namespace(owner, value.func):
        for kw in sorted(value.keywords, key=lambda k: k.arg or ""):
            if kw.arg is None or kw.arg.startswith("_"):
                continue
            if isinstance(kw.value, ast.Lambda):
                yield _spec(mod.name, export, kw.arg, owner, kw.value, drop_first=False)
                continue
            target = finder.resolve(owner, kw.value)
            if target is not None and isinstance(
                target[1], (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            ):
                yield _spec(mod.name, export, kw.arg, target[0], target[1], drop_first=False)


def _tool_modules(tools_dir: Path) -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    for path in sorted(tools_dir.glob("*.py")):
        name = path.stem
        if name.startswith(".") or not path.is_file():
            continue  # editor lock files and the like; Python cannot import them either
        problem = None
        if not name.isidentifier():
            problem = "is not a Python identifier"
        elif keyword.iskeyword(name):
            problem = "is a Python keyword, so ``tools.NAME`` cannot be written"
        elif unicodedata.normalize("NFKC", name) != name:
            # Python reads identifiers in code NFKC-normalised: ``tools.NAME`` would
            # name another file than this one.
            problem = "is not NFKC-normalised, so ``tools.NAME`` in code would mean another name"
        if problem is not None:
            raise DeclarationError(
                f"tool file name {path.name!r} {problem}; rename it", file=str(path)
            )
        found.append((name, path))
    return found


def _where(spec: ToolSpec) -> str:
    here = f"{spec.file}.py"
    if spec.source.name == here:
        return f"{here} (line {spec.line})"
    return f"{here} (from {spec.source.name} line {spec.line})"


def discover(tools_dir: Path) -> Discovery:
    """Read every tool file in ``tools_dir``. Raises :class:`DeclarationError`."""
    modules = {name: _parse(name, path) for name, path in _tool_modules(tools_dir)}
    finder = _Finder(modules)
    tools: dict[str, ToolSpec] = {}
    owners: dict[str, ToolSpec] = {}  # global (or tools.F.E) name -> first tool claiming it
    files: list[ToolFile] = []
    for name, mod in modules.items():
        private = name.startswith("_")
        if private:
            files.append(ToolFile(name, mod.path, True))
            continue
        specs = list(_exports_of(finder, mod))
        for spec in specs:
            key = spec.export if spec.installed else f"tools.{spec.file}.{spec.export}"
            other = owners.get(key)
            if other is not None and other.file != spec.file:
                raise DeclarationError(
                    f"{spec.export!r} is exported by two files: "
                    f"{_where(other)} and {_where(spec)}; rename one of them",
                    file=str(spec.source),
                    line=spec.line,
                )
            owners.setdefault(key, spec)
            tools[spec.name] = spec
        files.append(ToolFile(name, mod.path, False, tuple(s.name for s in specs)))
    return Discovery(tools_dir=tools_dir, files=tuple(files), tools=tools)
