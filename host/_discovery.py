"""Find the tool files and what they export, by reading them with ``ast``.

No user code runs in the host process: every fact here comes from parsing the source.
The rules (mirrored at run time by ``capsule._registry``, and checked against it when a
capsule loads) are:

* every ``tools/NAME.py`` is a tool file; files whose name starts with ``_`` are private
  helpers: importable by siblings, exporting nothing;
* with ``__all__`` (a literal list or tuple of strings), the file exports the names it
  lists; without it, every public top-level name it defines;
* a function (``def`` or ``async def``) is one tool. A name imported from a sibling file
  is followed to its definition when ``__all__`` lists it;
* an object (``name = SomeClass(...)`` for a class defined in the tools package, or
  ``name = SimpleNamespace(a=f, ...)``) exports its public methods (members) as tools
  named ``name.method``;
* classes, constants and other data are not tools.

A tool's name is how the agent writes the call: ``now``, ``kanban.add``. An export whose
name shadows a Python builtin or a host global is not installed as a global; its tool name
is ``tools.FILE.EXPORT``. Two files exporting the same global name is an error naming both.
"""

from __future__ import annotations

import ast
import builtins
import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from .errors import DeclarationError

__all__ = [
    "NO_DEFAULT",
    "HOST_GLOBALS",
    "Param",
    "ToolSpec",
    "ToolFile",
    "Discovery",
    "discover",
]

POSITIONAL_ONLY: Final = int(inspect.Parameter.POSITIONAL_ONLY)
POSITIONAL_OR_KEYWORD: Final = int(inspect.Parameter.POSITIONAL_OR_KEYWORD)
VAR_POSITIONAL: Final = int(inspect.Parameter.VAR_POSITIONAL)
KEYWORD_ONLY: Final = int(inspect.Parameter.KEYWORD_ONLY)
VAR_KEYWORD: Final = int(inspect.Parameter.VAR_KEYWORD)


class _NoDefault:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Final = _NoDefault()
"""Marks a parameter without a default, or whose default is not a literal."""

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


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of a tool, as written in the source."""

    name: str
    kind: int
    """An ``inspect.Parameter`` kind value (0 positional-only ... 4 ``**kwargs``)."""
    annotation: str | None = None
    """The annotation's source text, if any."""
    default: str | None = None
    """The default's source text, if any."""
    value: Any = NO_DEFAULT
    """The default's value when it is a literal (``ast.literal_eval``), else NO_DEFAULT."""

    @property
    def required(self) -> bool:
        return self.default is None and self.kind not in (VAR_POSITIONAL, VAR_KEYWORD)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool: where it is defined and how it is called."""

    name: str
    """The canonical tool name: ``now``, ``kanban.add``, ``tools.math.print``."""
    file: str
    """The tool file's module name (``kanban`` for ``tools/kanban.py``)."""
    export: str
    """The top-level name in that file."""
    member: str | None
    """For an object export's method, the method's name."""
    params: tuple[Param, ...]
    is_async: bool
    source: Path
    """The file that defines the function (a sibling, when re-exported via ``__all__``)."""
    line: int
    docstring: str | None = None
    returns: str | None = None
    """The return annotation's source text, if any."""
    installed: bool = True
    """False when the export shadows a builtin or host global (only ``tools.F.E`` works)."""

    @property
    def path(self) -> tuple[str, ...]:
        """``(FILE, EXPORT[, MEMBER])``: the explicit path under ``tools``."""
        return (
            (self.file, self.export)
            if self.member is None
            else (
                self.file,
                self.export,
                self.member,
            )
        )

    @property
    def qualified(self) -> str:
        """``tools.FILE.EXPORT[.MEMBER]``, which always reaches this tool."""
        return "tools." + ".".join(self.path)

    @property
    def param_kinds(self) -> list[tuple[str, int]]:
        return [(p.name, p.kind) for p in self.params]


@dataclass(frozen=True, slots=True)
class ToolFile:
    """One file in the tools folder."""

    module: str
    path: Path
    private: bool
    exports: tuple[str, ...] = ()
    """Canonical names of the tools this file exports."""


@dataclass(frozen=True, slots=True)
class Discovery:
    """Everything discovery found in a tools folder."""

    tools_dir: Path
    files: tuple[ToolFile, ...]
    tools: Mapping[str, ToolSpec] = field(default_factory=dict[str, ToolSpec])

    def runtime_names(self, module: str) -> list[str]:
        """What the capsule will report for ``module``: ``EXPORT[.MEMBER]``, sorted."""
        return sorted(
            ".".join(spec.path[1:]) for spec in self.tools.values() if spec.file == module
        )


# -- parsing -------------------------------------------------------------------------------


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
    """local name -> (sibling module or None when not a sibling, imported name, line)."""
    all_names: list[str] | None = None
    namespace_names: set[str] = field(default_factory=set[str])
    """Local names that refer to ``types.SimpleNamespace``."""
    types_modules: set[str] = field(default_factory=set[str])


def _parse(name: str, path: Path) -> _Module:
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DeclarationError(f"cannot read tool file: {exc}", file=str(path)) from exc
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        raise DeclarationError(f"syntax error: {exc.msg}", file=str(path), line=exc.lineno) from exc
    mod = _Module(name, path, tree)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            mod.defs[node.name] = node
            mod.assigns.pop(node.name, None)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    if target.id == "__all__":
                        mod.all_names = _literal_names(node.value, path)
                    else:
                        mod.assigns[target.id] = (node.value, node.lineno)
                        mod.defs.pop(target.id, None)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.value is not None:
                if node.target.id == "__all__":
                    mod.all_names = _literal_names(node.value, path)
                else:
                    mod.assigns[node.target.id] = (node.value, node.lineno)
                    mod.defs.pop(node.target.id, None)
        elif isinstance(node, ast.ImportFrom):
            sibling = node.module if node.level == 1 else None
            if node.level == 1 and node.module is None:
                sibling = ""  # from . import x
            for alias in node.names:
                local = alias.asname or alias.name
                if node.level == 0 and node.module == "types" and alias.name == "SimpleNamespace":
                    mod.namespace_names.add(local)
                    continue
                mod.imports[local] = (sibling, alias.name, node.lineno)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "types":
                    mod.types_modules.add(alias.asname or "types")
    return mod


def _literal_names(node: ast.expr, path: Path) -> list[str]:
    try:
        value = ast.literal_eval(node)
    except ValueError as exc:
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


def _decorators(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names: set[str] = set()
    for deco in fn.decorator_list:
        if isinstance(deco, ast.Name):
            names.add(deco.id)
        elif isinstance(deco, ast.Attribute):
            names.add(deco.attr)
    return names


class _Finder:
    """Resolves exports across the files of one tools folder."""

    def __init__(self, modules: dict[str, _Module]) -> None:
        self.modules = modules

    def follow(
        self, mod: _Module, name: str, seen: frozenset[tuple[str, str]] = frozenset()
    ) -> (
        tuple[_Module, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.expr, int] | None
    ):
        """Find what ``name`` is bound to in ``mod``, following sibling imports."""
        if (mod.name, name) in seen:
            return None
        seen = seen | {(mod.name, name)}
        if name in mod.defs:
            node = mod.defs[name]
            return mod, node, node.lineno
        if name in mod.assigns:
            value, line = mod.assigns[name]
            return mod, value, line
        if name in mod.imports:
            sibling, imported, _line = mod.imports[name]
            if sibling is None:
                return None
            if sibling == "":
                return None  # ``from . import module``: a module, never a tool
            target = self.modules.get(sibling)
            if target is None:
                return None
            return self.follow(target, imported, seen)
        return None

    def project_class(self, mod: _Module, expr: ast.expr) -> tuple[_Module, ast.ClassDef] | None:
        if not isinstance(expr, ast.Name):
            return None
        found = self.follow(mod, expr.id)
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

    def class_methods(
        self, mod: _Module, cls: ast.ClassDef, depth: int = 0
    ) -> dict[str, tuple[_Module, ast.FunctionDef | ast.AsyncFunctionDef]]:
        """Public methods of a project class, bases first so subclasses override."""
        methods: dict[str, tuple[_Module, ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        if depth > 20:
            return methods
        for base in reversed(cls.bases):
            found = self.project_class(mod, base)
            if found is not None:
                methods.update(self.class_methods(found[0], found[1], depth + 1))
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("_"):
                    continue
                if "property" in _decorators(node) or any(
                    d.endswith((".setter", ".getter", ".deleter"))
                    for d in (ast.unparse(x) for x in node.decorator_list)
                ):
                    methods.pop(node.name, None)
                    continue
                methods[node.name] = (mod, node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        methods.pop(target.id, None)
        return methods


def _tool_name(file: str, export: str, member: str | None) -> tuple[str, bool]:
    if export in _SHADOWED:
        base = f"tools.{file}.{export}"
        return (base if member is None else f"{base}.{member}"), False
    return (export if member is None else f"{export}.{member}"), True


def _function_spec(
    file: str,
    export: str,
    member: str | None,
    owner: _Module,
    fn: ast.FunctionDef | ast.AsyncFunctionDef,
    *,
    method: bool,
) -> ToolSpec:
    decos = _decorators(fn)
    drop_first = method and "staticmethod" not in decos
    name, installed = _tool_name(file, export, member)
    return ToolSpec(
        name=name,
        file=file,
        export=export,
        member=member,
        params=_params(fn, drop_first=drop_first),
        is_async=isinstance(fn, ast.AsyncFunctionDef),
        source=owner.path,
        line=fn.lineno,
        docstring=ast.get_docstring(fn, clean=True),
        returns=ast.unparse(fn.returns) if fn.returns is not None else None,
        installed=installed,
    )


def _lambda_spec(file: str, export: str, member: str, owner: _Module, fn: ast.Lambda) -> ToolSpec:
    name, installed = _tool_name(file, export, member)
    return ToolSpec(
        name=name,
        file=file,
        export=export,
        member=member,
        params=_params(fn, drop_first=False),
        is_async=False,
        source=owner.path,
        line=fn.lineno,
        installed=installed,
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
                sibling, imported, line = mod.imports[export]
                if sibling is None:
                    raise DeclarationError(
                        f"__all__ lists {export!r}, imported from outside the tools folder: "
                        "toolhost cannot read its signature; wrap it in a function defined here",
                        file=str(mod.path),
                        line=line,
                    )
                del imported
            continue
        owner, node, _line = found
        if owner is not mod and mod.all_names is None:
            continue  # imported names are exports only when __all__ lists them
        if isinstance(node, ast.ClassDef):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield _function_spec(mod.name, export, None, owner, node, method=False)
            continue
        yield from _object_exports(finder, mod, export, owner, node)


def _object_exports(
    finder: _Finder, mod: _Module, export: str, owner: _Module, value: ast.expr
) -> Iterator[ToolSpec]:
    if not isinstance(value, ast.Call):
        return
    cls = finder.project_class(owner, value.func)
    if cls is not None:
        for member, (method_mod, fn) in sorted(finder.class_methods(cls[0], cls[1]).items()):
            yield _function_spec(mod.name, export, member, method_mod, fn, method=True)
        return
    if finder.is_namespace(owner, value.func):
        for kw in sorted(value.keywords, key=lambda k: k.arg or ""):
            if kw.arg is None or kw.arg.startswith("_"):
                continue
            if isinstance(kw.value, ast.Lambda):
                yield _lambda_spec(mod.name, export, kw.arg, owner, kw.value)
            elif isinstance(kw.value, ast.Name):
                target = finder.follow(owner, kw.value.id)
                if target is not None and isinstance(
                    target[1], (ast.FunctionDef, ast.AsyncFunctionDef)
                ):
                    yield _function_spec(
                        mod.name, export, kw.arg, target[0], target[1], method=False
                    )


def _tool_modules(tools_dir: Path) -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    for path in sorted(tools_dir.glob("*.py")):
        name = path.stem
        if not name.isidentifier():
            raise DeclarationError(
                f"tool file name {path.name!r} is not a Python identifier; rename it",
                file=str(path),
            )
        found.append((name, path))
    return found


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
                    f"{other.file}.py (line {other.line}) and {spec.file}.py (line {spec.line}); "
                    "rename one of them",
                    file=str(mod.path),
                    line=spec.line,
                )
            owners.setdefault(key, spec)
            tools[spec.name] = spec
        files.append(ToolFile(name, mod.path, False, tuple(s.name for s in specs)))
    return Discovery(tools_dir=tools_dir, files=tuple(files), tools=tools)
