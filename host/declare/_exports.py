"""Which top-level names of a tool file are tools, and what each tool is called.

This applies the export rules listed in ``_discovery`` (and mirrored at run time by
``capsule._registry``) to the bindings ``_reading`` found: ``__all__`` or the public
names, functions as tools, objects as their methods or members, the hidden
``ToolContext`` parameter, and the tool name (``tools.FILE.EXPORT`` for an export that
shadows a builtin or host global).
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from typing import Final

from host.errors import DeclarationError

from ._reading import Finder, Fn, Module, params_of
from ._specs import POSITIONAL_OR_KEYWORD, VAR_KEYWORD, VAR_POSITIONAL, Param, ToolSpec

__all__ = ["HOST_GLOBALS", "exports_of"]

HOST_GLOBALS: Final = frozenset(
    {
        "tools",
        "toolhost",  # code mode's helpers (search, declaration)
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
    context_at = (0, POSITIONAL_OR_KEYWORD)
    for at, param in enumerate(params):
        if param.name == context:
            if param.kind in (VAR_POSITIONAL, VAR_KEYWORD):
                raise DeclarationError(
                    f"{name}: the ToolContext parameter {'*' * (param.kind - 1)}{context} "
                    "must be a single parameter (the capsule passes one context)",
                    file=str(owner.path),
                    line=fn.lineno,
                )
            context_at = (at, param.kind)
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
        context_at=context_at,
    )


def exports_of(finder: Finder, mod: Module) -> Iterator[ToolSpec]:
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
