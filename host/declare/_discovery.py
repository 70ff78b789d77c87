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
from pathlib import Path
from typing import Final

from host.errors import DeclarationError

from ._reading import Finder, Fn, Module, params_of, parse_module
from ._specs import Discovery, Param, ToolFile, ToolSpec

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
    file: str, export: str, member: str | None, owner: Module, fn: Fn, *, drop_first: bool
) -> ToolSpec:
    name, installed = _tool_name(file, export, member)
    is_def = not isinstance(fn, ast.Lambda)
    params = params_of(fn, drop_first=drop_first)
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


def _exports_of(finder: Finder, mod: Module) -> Iterator[ToolSpec]:
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
    finder: Finder, mod: Module, export: str, owner: Module, value: ast.Call
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
    modules = {name: parse_module(name, path) for name, path in _tool_modules(tools_dir)}
    finder = Finder(modules)
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
