"""Renderings of the scope: the model block, the ``.pyi`` stub and the JSON manifest.

All three are views of one :class:`ScopeModel`, so they cannot disagree. Every tool is
declared ``async def`` (every call is awaited, whatever the tool's body), with defaults
as written in the source and the docstring verbatim. Classes with a data shape are
declared as TypedDicts and Enums as the ``Literal`` of their values: that is what the
agent sends and receives. Where pyright's answer is weak the declaration says so in a
``# toolhost:`` comment above the tool instead of guessing.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable, Iterator
from typing import Any, Final

from ._model import ParamDecl, ScopeModel, ToolDecl, TypeDecl

__all__ = ["HEADER", "render_model", "render_pyi", "manifest", "render_type"]

HEADER: Final = (
    "# Every tool call must be awaited: `x = await add(2, 3)`, even for tools that do no I/O.",
    "# Results are plain data (dict, list, str, int, float, bool, None, bytes): "
    "a returned class arrives as a dict of its fields, a tuple as a list.",
)
"""The two lines that head the model block."""

_TYPING: Final = ("Any", "Generic", "Literal", "NoReturn", "NotRequired", "TypedDict", "TypeVar")
_KINDS: Final = {
    0: "positional_only",
    1: "positional_or_keyword",
    2: "var_positional",
    3: "keyword_only",
    4: "var_keyword",
}


def _docstring(text: str, indent: str) -> list[str]:
    body = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    if body.endswith('"'):
        body += " "
    lines = body.splitlines() or [""]
    if len(lines) == 1:
        return [f'{indent}"""{lines[0]}"""']
    out = [f'{indent}"""{lines[0]}']
    out += [f"{indent}{line}" if line.strip() else "" for line in lines[1:]]
    out.append(f'{indent}"""')
    return out


def _comments(notes: Iterable[str], indent: str) -> list[str]:
    return [f"{indent}# toolhost: {note}" for note in notes]


def _param(p: ParamDecl) -> str:
    star = "*" if p.kind == 2 else "**" if p.kind == 4 else ""
    text = f"{star}{p.name}: {p.type}"
    if p.default is not None:
        default = p.default if "\n" not in p.default else "..."
        text += f" = {default}"
    return text


def signature(tool: ToolDecl, name: str) -> str:
    parts: list[str] = []
    params = tool.params
    for i, p in enumerate(params):
        if p.kind == 3 and not any(q.kind in (2, 3) for q in params[:i]):
            parts.append("*")
        parts.append(_param(p))
        if p.kind == 0 and (i + 1 == len(params) or params[i + 1].kind != 0):
            parts.append("/")
    return f"async def {name}({', '.join(parts)}) -> {tool.returns}:"


def _tool(tool: ToolDecl, name: str, indent: str, *, static: bool, doc: bool = True) -> list[str]:
    out = _comments(tool.notes, indent)
    if static:
        out.append(f"{indent}@staticmethod")
    head = f"{indent}{signature(tool, name)}"
    if doc and tool.docstring:
        return [*out, head, *_docstring(tool.docstring, indent + "    ")]
    return [*out, f"{head} ..."]


def render_type(decl: TypeDecl) -> list[str]:
    """One referenced type as stub lines."""
    out = _comments(decl.notes, "")
    if decl.kind == "typevar":
        args = [repr(decl.name), *decl.constraints]
        if decl.value:
            args.append(f"bound={decl.value}")
        return [*out, f"{decl.name} = TypeVar({', '.join(args)})"]
    if not decl.is_class:
        if decl.docstring:
            out += [f"# {line}".rstrip() for line in decl.docstring.splitlines()]
        return [*out, f"{decl.name} = {decl.value or 'Any'}"]
    bases = "TypedDict" + (f", Generic[{', '.join(decl.params)}]" if decl.params else "")
    if any(not f.name.isidentifier() or keyword.iskeyword(f.name) for f in decl.fields):
        items = ", ".join(
            f"{f.name!r}: {f.type if f.required else f'NotRequired[{f.type}]'}" for f in decl.fields
        )
        return [*out, f"{decl.name} = TypedDict({decl.name!r}, {{{items}}})"]
    out.append(f"class {decl.name}({bases}):")
    body: list[str] = _docstring(decl.docstring, "    ") if decl.docstring else []
    for f in decl.fields:
        body.append(f"    {f.name}: {f.type if f.required else f'NotRequired[{f.type}]'}")
    return out + (body or ["    ..."])


def _types(scope: ScopeModel) -> Iterator[str]:
    for decl in scope.types:
        yield from render_type(decl)
        yield ""


def _globals(scope: ScopeModel, *, static: bool) -> Iterator[str]:
    """Installed tools as globals; an object export's methods under a class of its name."""
    objects: dict[str, list[ToolDecl]] = {}
    for tool in scope.tools:
        if not tool.installed:
            continue
        if tool.member is None:
            yield from _tool(tool, tool.export, "", static=False)
            yield ""
        else:
            objects.setdefault(tool.export, []).append(tool)
    for export, members in objects.items():
        yield f"class {export}:"
        for tool in members:
            assert tool.member is not None
            yield from _tool(tool, tool.member, "    ", static=static)
        yield ""


def _tree(tools: Iterable[ToolDecl], *, static: bool, doc: bool) -> Iterator[str]:
    """``class tools:`` with ``tools.FILE.EXPORT[.MEMBER]`` for ``tools``."""
    files: dict[str, dict[str, list[ToolDecl]]] = {}
    for tool in tools:
        files.setdefault(tool.file, {}).setdefault(tool.export, []).append(tool)
    if not files:
        return
    yield "class tools:"
    for file, exports in files.items():
        yield f"    class {file}:"
        for export, members in exports.items():
            for tool in members:
                if tool.member is None:
                    yield from _tool(tool, export, "        ", static=static, doc=doc)
            methods = [t for t in members if t.member is not None]
            if methods:
                yield f"        class {export}:"
                for tool in methods:
                    assert tool.member is not None
                    yield from _tool(tool, tool.member, "            ", static=static, doc=doc)
    yield ""


def render_model(scope: ScopeModel) -> str:
    """The model block: two header lines, the types, then every tool (``async def``)."""
    lines = [*HEADER, ""]
    lines += _types(scope)
    lines += _globals(scope, static=False)
    lines += _tree((t for t in scope.tools if not t.installed), static=False, doc=True)
    return "\n".join(lines).rstrip() + "\n"


def render_pyi(scope: ScopeModel) -> str:
    """``tool_globals.pyi``: a stub that type-checks, for editors and scripts."""
    from host import errors

    body = [*_types(scope), *_globals(scope, static=True)]
    body += _tree(scope.tools, static=True, doc=False)
    used = {w for line in body for w in re.findall(r"\b[A-Za-z]\w*\b", line)}
    typing = ", ".join(name for name in _TYPING if name in used)
    lines = ["# Generated by `toolhost prepare`: do not edit.", *HEADER, ""]
    lines += ["import asyncio as asyncio", *([f"from typing import {typing}"] if typing else [])]
    lines += [f"from host.errors import {name} as {name}" for name in errors.__all__]
    return "\n".join([*lines, "", *body]).rstrip() + "\n"


def manifest(scope: ScopeModel) -> dict[str, Any]:
    """The whole scope as JSON: tools with their schemas, and the referenced types."""
    from ._schema import tool_schemas

    tools: list[dict[str, Any]] = []
    for tool in scope.tools:
        schemas = tool_schemas(scope, tool)
        tools.append(
            {
                "name": tool.name,
                "qualified": tool.qualified,
                "installed": tool.installed,
                "source": tool.source,
                "line": tool.line,
                "declaration": signature(tool, tool.name),
                "params": [
                    {
                        "name": p.name,
                        "kind": _KINDS[p.kind],
                        "type": p.type,
                        "default": p.default,
                        "required": p.required,
                        "description": p.description,
                    }
                    for p in tool.params
                ],
                "returns": tool.returns,
                "docstring": tool.docstring,
                "inferred": tool.inferred,
                "notes": list(tool.notes),
                "uses": None if tool.uses is None else list(tool.uses),
                "input_schema": schemas["input"],
                "output_schema": schemas["output"],
            }
        )
    types = [
        {
            "name": t.name,
            "kind": t.kind,
            "source": t.source,
            "line": t.line,
            "declaration": "\n".join(render_type(t)),
        }
        for t in scope.types
    ]
    return {
        "toolhost": 1,
        "pyright": scope.pyright,
        "key": scope.key,
        "header": list(HEADER),
        "tools": tools,
        "types": types,
    }
