"""The declarations as MCP tools, MCP arguments as a call, and results as MCP results.

Pure functions over the scope: nothing here talks to a client or starts a capsule.

* A tool's MCP name is one every model API accepts (``kanban_add`` for ``kanban.add``,
  :func:`mcp_name`), or its canonical name with ``names="dotted"``; its description the
  docstring, its input schema the declarations' schema of
  the bound arguments, as is. MCP wants an object at the root of an output schema: a
  result declared as a TypedDict (or other object) is described as it is and sent as
  the structured content; any other result (``int``, ``list[Task]``, a union) is
  wrapped as ``{"result": value}``, the convention FastMCP uses too.
* Bytes cross JSON as base64 strings (the schemas say ``contentEncoding: base64``):
  a parameter declared ``bytes`` takes one, and bytes in a result become one.
* An error is a result with ``isError``, its kind and message as text content and no
  structured content (which must conform to the output schema); the host's own error
  data (``{"kind": ..., "message": ..., ...}``) rides in ``_meta["toolhost/error"]``
  (the tool's traceback stays in the audit; secrets are replaced). A failed
  ``run_code`` run is the exception: its structured content is its result, which its
  output schema describes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, cast
from urllib.parse import quote

import mcp.types as types

from capsule.context import Attachment, Result
from host.capsules import CodeResult
from host.check import check_lines
from host.declare import (
    HELPERS,
    MAX_QUERY,
    MAX_RESULTS,
    POSITIONAL_ONLY,
    POSITIONAL_OR_KEYWORD,
    VAR_KEYWORD,
    VAR_POSITIONAL,
    Scope,
    ToolSpec,
    prose,
)
from host.errors import DeclarationError, HostError, InvalidArguments, NotSerializable

__all__ = [
    "ERROR_META",
    "portable",
    "NameStyle",
    "mcp_name",
    "RUN_CODE",
    "SEARCH_TOOLS",
    "READ_DECLARATION",
    "Expose",
    "Listing",
    "ToolEntry",
    "call_arguments",
    "error_result",
    "listing",
    "code_result",
    "value_result",
]

RUN_CODE: Final = "run_code"
"""The one tool that is not a tool file's: code mode over MCP."""

_MAX_DEPTH: Final = 200
"""Nesting a result may have over MCP: the SDK's serialiser stops at about 250 levels."""
_TEXT_LIMIT: Final = 64 * 1024
"""Characters of the text rendering of a result (the structured content is whole)."""

_RUN_CODE_HEAD: Final = """\
Run Python code in this session's sandbox (code mode). Every tool is an awaitable \
global: `x = await add(2, 3)`. Top-level `await` works; variables and imports persist \
across run_code calls of this session. The result: ok; value (of the last expression); \
stdout (print); error (kind, type, message, traceback); calls (each tool call, with what \
policy decided); warnings; check (what checking the code against the declarations \
found). A call that needs a person's approval waits until they answer, then the code \
goes on.

"""

_JSON_TYPES: Final = ("object", "array", "string", "number", "boolean", "null")
_RUN_CODE_OUTPUT: Final[dict[str, Any]] = {
    # What a client validates; the run's parts are described in run_code's description and
    # the docs (mcp.md), not here: every agent's context pays for this schema.
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "value": {"anyOf": [{"type": t} for t in _JSON_TYPES]},
        "stdout": {"type": "string"},
        "error": {
            "anyOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "properties": {"kind": {"type": "string"}, "message": {"type": "string"}},
                    "required": ["kind", "message"],
                },
            ]
        },
        "calls": {"type": "array", "items": {"type": "object"}},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "check": {"anyOf": [{"type": "null"}, {"type": "object"}]},
    },
    "required": ["ok", "value", "stdout", "error", "calls", "warnings"],
}

RUN_CODE_OPTIONS: Final = ("modules", "globals", "execute", "memory_limit", "filename", "check")
"""The arguments of ``run_code`` beside ``code``, passed to ``Session.run_code`` as named."""

_RUN_CODE_INPUT: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "code": {
            "type": "string",
            "description": "Python source; the last expression is the value.",
        },
        "modules": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": 'Modules the code can import, {"helpers.py": "def f(): ..."}: '
            "kept in the sandbox only; names may not shadow the standard library or tools.",
        },
        "globals": {
            "type": "object",
            "description": "Plain data bound as global variables before the code runs.",
        },
        "execute": {
            "type": "object",
            "properties": {
                "fn": {"type": "string"},
                "args": {"type": "array"},
                "kwargs": {"type": "object"},
            },
            "required": ["fn"],
            "description": "Call this function of the code (sync or async) once the code "
            "has loaded; its return value is the result's value.",
        },
        "memory_limit": {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "description": 'Memory for this run, in bytes or like "64MiB"; at most the '
            "policy's code_memory. A new limit restarts the sandbox (variables are lost).",
        },
        "filename": {"type": "string", "description": "The file name tracebacks show."},
        "check": {
            "enum": ["warn", "refuse", "off"],
            "description": "Type-check the code against the tools before it runs: warn "
            "(report and run), refuse (do not run code with errors) or off.",
        },
    },
    "required": ["code"],
    "additionalProperties": False,
}


NameStyle = Literal["safe", "dotted"]
"""How tools are named over MCP: ``safe`` (the default) as every model's function-name rule
accepts (``^[a-zA-Z0-9_-]{1,64}$``: ``kanban.add`` is ``kanban_add``), or ``dotted``, the
canonical names as they are (valid MCP names, but some model APIs refuse the dots)."""

_SAFE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_UNSAFE_CHAR: Final = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME: Final = 64


def mcp_name(canonical: str, style: NameStyle = "safe") -> str:
    """The MCP name of the tool ``canonical`` (``kanban.add``): stable, and in the ``safe``
    style one that the model APIs' function-name rule accepts. Dots (and any character
    the rule refuses) become ``_``; a name longer than 64 characters keeps its first 55
    and ends in ``_`` and 8 hex digits of its canonical name's SHA-256."""
    if style == "dotted" or _SAFE.fullmatch(canonical):
        return canonical
    name = _UNSAFE_CHAR.sub("_", canonical)
    if len(name) > _MAX_NAME:
        digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:8]
        name = f"{name[: _MAX_NAME - 9]}_{digest}"
    return name


Expose = Literal["all", "tools", "code"]
"""What a server lists: ``all`` (every tool, and ``run_code``), ``tools`` (every tool) or
``code`` (``run_code`` with the declarations' index, and the tools that search and read
the declarations: a big project costs the model little)."""

SEARCH_TOOLS: Final = "search_tools"
READ_DECLARATION: Final = "read_declaration"
MODEL_BUDGET: Final = 6000
"""Characters of declarations ``run_code``'s description holds: a bigger model block is
replaced by the index (``Scope.render_model(max_chars=...)``)."""

_SEARCH_INPUT: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "description": "What you want to do, in plain words.",
            "maxLength": MAX_QUERY,
        },
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS, "default": 5},
    },
    "required": ["query"],
    "additionalProperties": False,
}
_SEARCH_OUTPUT: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "result": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "declaration": {"type": "string"},
                    "summary": {"type": "string"},
                },
                "required": ["name", "declaration", "summary"],
            },
        }
    },
    "required": ["result"],
}
_DECLARATION_INPUT: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "description": "A tool's name as search_tools gives it, or a tool file's name.",
        }
    },
    "required": ["name"],
    "additionalProperties": False,
}


@dataclass(frozen=True, slots=True)
class ToolEntry:
    """One tool as MCP sees it, with what is needed to call it."""

    tool: types.Tool
    spec: ToolSpec | None
    """None for ``run_code`` and the declarations' tools."""
    wrapped: bool
    """The result is sent as ``{"result": value}`` (its schema is not an object)."""
    bytes_params: frozenset[str]
    helper: str | None = None
    """The code-mode helper (``toolhost.search``, ...) a declarations' tool answers with."""


@dataclass(frozen=True, slots=True)
class Listing:
    """Every MCP tool of one version of the declarations."""

    key: str
    tools: list[types.Tool]
    entries: Mapping[str, ToolEntry]


def _is_object(schema: Mapping[str, Any]) -> bool:
    if schema.get("type") == "object":
        return True
    ref = schema.get("$ref")
    defs = cast("Mapping[str, Any]", schema.get("$defs") or {})
    rest = set(schema) - {"$schema", "$defs", "$ref", "title", "description"}
    if isinstance(ref, str) and ref.startswith("#/$defs/") and not rest:
        target = defs.get(ref.removeprefix("#/$defs/"))
        return isinstance(target, Mapping) and cast("Mapping[str, Any]", target).get("type") == (
            "object"
        )
    return False


_ANNOTATIONS: Final = frozenset({"title", "description", "default", "examples", "$comment"})
_SUBSCHEMA: Final = ("items", "additionalProperties", "not", "contains", "propertyNames")
_SUBSCHEMAS: Final = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS: Final = ("properties", "$defs", "patternProperties")


def portable(schema: Any) -> Any:
    """``schema`` as strict clients and checkers take it without a warning (Ajv's strict
    mode, the MCP Inspector's ``--strict``), meaning the same: a ``type`` array becomes an
    ``anyOf`` of single types, and a schema with no keyword that validates (any value, as
    ``object`` or ``Any`` declare it) names every JSON type. Returns a new schema."""
    if not isinstance(schema, dict):
        return schema
    src = cast("dict[str, Any]", schema)
    out: dict[str, Any] = {}
    for key, value in src.items():
        if key in _SUBSCHEMA and isinstance(value, dict):
            out[key] = portable(value)
        elif key in _SUBSCHEMAS and isinstance(value, list):
            out[key] = [portable(v) for v in cast("list[Any]", value)]
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: portable(v) for k, v in cast("dict[str, Any]", value).items()}
        else:
            out[key] = value
    types_ = out.get("type")
    if isinstance(types_, list):
        del out["type"]
        branches = [{"type": t} for t in cast("list[Any]", types_)]
        if "anyOf" in out:  # both: each must hold
            out["allOf"] = [*out.get("allOf", []), {"anyOf": branches}]
        else:
            out["anyOf"] = branches
    if set(out) <= _ANNOTATIONS | {"$schema", "$id"}:  # validates nothing: any value
        out["anyOf"] = [{"type": t} for t in _JSON_TYPES]
    return out


def lean(schema: Any, description: str = "") -> Any:
    """``schema`` without what no client needs, which every agent's context pays for:
    ``$schema`` (MCP's default is 2020-12, the dialect these are), the root's ``title``
    (the tool's name), a root ``description`` the tool's description already holds, and
    each ``$defs`` entry's ``title`` that only repeats its key, and an empty root
    ``required``. Returns a new schema."""
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in cast("dict[str, Any]", schema).items() if k not in ("$schema", "title")}
    if out.get("required") == []:
        del out["required"]
    said = out.get("description")
    if isinstance(said, str) and said.strip() and said.strip() in description:
        del out["description"]
    defs = out.get("$defs")
    if isinstance(defs, dict):
        lean_defs: dict[str, Any] = {}
        for key, value in cast("dict[str, Any]", defs).items():
            if isinstance(value, dict) and cast("dict[str, Any]", value).get("title") == key:
                value = {k: v for k, v in cast("dict[str, Any]", value).items() if k != "title"}
            lean_defs[key] = value
        out["$defs"] = lean_defs
    return out


def _output_schema(schema: dict[str, Any] | None) -> tuple[dict[str, Any] | None, bool]:
    """The MCP output schema (root: an object) and whether the result is wrapped."""
    if schema is None:
        return None, False
    if _is_object(schema):
        return {**schema, "type": "object"}, False
    inner = {k: v for k, v in schema.items() if k not in ("$schema", "$defs")}
    wrapped: dict[str, Any] = {
        "$schema": schema.get("$schema", "https://json-schema.org/draft/2020-12/schema"),
        "type": "object",
        "properties": {"result": inner},
        "required": ["result"],
    }
    if "$defs" in schema:
        wrapped["$defs"] = schema["$defs"]
    return wrapped, True


def listing(
    scope: Scope,
    specs: Mapping[str, ToolSpec],
    names: NameStyle = "safe",
    expose: Expose = "all",
) -> Listing:
    """The MCP tools of ``scope``: every declared tool, then ``run_code`` (``expose``
    ``all``); only the tools (``tools``); or ``run_code``, ``search_tools`` and
    ``read_declaration`` (``code``).

    Raises :class:`DeclarationError` when two tools (``run_code`` included) would have
    one MCP name, naming both.
    """
    tools: list[types.Tool] = []
    entries: dict[str, ToolEntry] = {}
    if expose != "code":
        _list_tools(scope, specs, names, expose, tools, entries)
    if expose != "tools":
        code = types.Tool(
            name=RUN_CODE,
            description=_RUN_CODE_HEAD + scope.render_model(max_chars=MODEL_BUDGET),
            input_schema=_RUN_CODE_INPUT,
            output_schema=_RUN_CODE_OUTPUT,
        )
        tools.append(code)
        entries[RUN_CODE] = ToolEntry(code, None, False, frozenset())
    if expose == "code":
        search = types.Tool(
            name=SEARCH_TOOLS,
            description="Find the tools run_code can call: the best matches for what you "
            "want to do (names, docstrings, parameters), each with how to call it, its "
            "signature and a summary. In run_code: await toolhost.search(query).",
            input_schema=_SEARCH_INPUT,
            output_schema=_SEARCH_OUTPUT,
            annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
        )
        read = types.Tool(
            name=READ_DECLARATION,
            description="The full declarations (signatures, docstrings, the types they "
            "use) of one tool, or of every tool in one tool file. In run_code: await "
            "toolhost.declaration(name).",
            input_schema=_DECLARATION_INPUT,
            annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
        )
        for tool, helper in ((search, HELPERS[0]), (read, HELPERS[1])):
            tools.append(tool)
            entries[tool.name] = ToolEntry(tool, None, helper == HELPERS[0], frozenset(), helper)
    return Listing(scope.key, tools, entries)


def _list_tools(
    scope: Scope,
    specs: Mapping[str, ToolSpec],
    names: NameStyle,
    expose: Expose,
    tools: list[types.Tool],
    entries: dict[str, ToolEntry],
) -> None:
    """Every declared tool, into ``tools`` and ``entries``."""
    schemas = scope.schemas()
    owner: dict[str, str] = {} if expose == "tools" else {RUN_CODE: RUN_CODE}
    for decl in scope.tools:
        name = mcp_name(decl.name, names)
        other = owner.setdefault(name, decl.name)
        if other != decl.name:
            raise DeclarationError(
                f"the tools {other} and {decl.name} would both be called {name!r} over MCP; "
                "rename one of them, or serve the canonical names (toolhost serve "
                "--names dotted)"
            )
        schema = schemas[decl.name]
        output, wrapped = _output_schema(schema["output"])
        # The docstring without its Args and Returns sections: the schemas hold those.
        description = prose(decl.docstring) or f"The tool {decl.name}."
        if output is None and decl.returns_description:
            description += f"\n\nReturns: {decl.returns_description}"
        tool = types.Tool(
            name=name,
            description=description,
            input_schema=lean(portable(schema["input"]), description),
            output_schema=lean(portable(output), description) if output is not None else None,
        )
        tools.append(tool)
        entries[name] = ToolEntry(
            tool,
            specs.get(decl.name),
            wrapped,
            frozenset(p.name for p in decl.params if p.type == "bytes"),
        )


# -- arguments ------------------------------------------------------------------------------


def call_arguments(
    entry: ToolEntry, arguments: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """MCP arguments (the bound form: one key per parameter) as a call's args and kwargs.

    Positional-only parameters and ``*args`` go by position, ``**kwargs`` is spread;
    the mediator binds and validates the rest (unknown names included).
    """
    spec = entry.spec
    assert spec is not None
    name = spec.name
    remaining = dict(arguments)
    for param in entry.bytes_params:
        value = remaining.get(param)
        if isinstance(value, str):
            try:
                remaining[param] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidArguments(
                    name, f"{param!r} takes bytes as a base64 string", parameter=param
                ) from None
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    star = next((p.name for p in spec.params if p.kind == VAR_POSITIONAL), None)
    given: Any = remaining.pop(star, []) if star is not None else []
    if not isinstance(given, list):
        raise InvalidArguments(name, f"{star!r} takes an array", parameter=star)
    extra = cast("list[Any]", given)
    by_position = len(extra) > 0
    for param in spec.params:
        if param.kind == POSITIONAL_ONLY or (param.kind == POSITIONAL_OR_KEYWORD and by_position):
            if param.name not in remaining:
                break  # what follows cannot be passed by position: binding says why
            args.append(remaining.pop(param.name))
    args.extend(extra)
    spread = next((p.name for p in spec.params if p.kind == VAR_KEYWORD), None)
    if spread is not None and spread in remaining:
        more = remaining.pop(spread)
        if not isinstance(more, dict):
            raise InvalidArguments(name, f"{spread!r} takes an object", parameter=spread)
        for key, value in cast("dict[str, Any]", more).items():
            if key in remaining:
                raise InvalidArguments(name, f"got multiple values for {key!r}", parameter=key)
            kwargs[key] = value
    kwargs.update(remaining)
    return tuple(args), kwargs


# -- results --------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """``value`` with bytes as base64 strings; raises ValueError on what JSON cannot hold."""
    # Iterative: a result may nest 512 deep (the wire's cap).
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 0)]
    while stack:
        item, into, key, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise ValueError(f"value nested deeper than {_MAX_DEPTH} levels")
        cls: type[Any] = type(item)  # pyright: ignore[reportUnknownVariableType]
        if cls is bytes:
            into[key] = base64.b64encode(item).decode("ascii")
        elif cls is float and not math.isfinite(item):
            raise ValueError(f"the float {item!r} has no JSON form")
        elif cls is list:
            items = cast("list[Any]", item)
            copy: list[Any] = [None] * len(items)
            into[key] = copy
            stack.extend((v, copy, i, depth + 1) for i, v in enumerate(items))
        elif cls is dict:
            mapping = cast("dict[Any, Any]", item)
            out: dict[str, Any] = {}
            into[key] = out
            for k, v in mapping.items():
                if type(k) is not str:
                    raise ValueError(f"a map key of type {type(k).__name__}")
                out[k] = None
                stack.append((v, out, k, depth + 1))
        elif item is None or cls in (str, int, float, bool):
            into[key] = item
        else:
            raise ValueError(f"a {cls.__name__}")
    return root[0]


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(text) > _TEXT_LIMIT:
        text = text[:_TEXT_LIMIT] + f"… ({len(text)} characters; the whole value is structured)"
    return text


def _text_content(text: str) -> list[types.ContentBlock]:
    return [types.TextContent(type="text", text=text)]


ERROR_META: Final = "toolhost/error"
"""The ``_meta`` key of an error result: the host's error data, for clients that want it."""


def error_result(exc: HostError, redact: Callable[[str], str]) -> types.CallToolResult:
    """A failed call as MCP sees it: ``isError``, and its kind and message as text.

    No structured content: the spec wants structured content to conform to the tool's
    output schema, which describes the value, and strict clients (the TypeScript SDK's)
    throw on an error result whose structured content does not. The error's data (kind,
    message, rule, ...; never the tool's traceback) rides in ``_meta`` under
    :data:`ERROR_META`, which every client may ignore.
    """
    data = exc.to_data()
    data.pop("traceback", None)  # the tool's own frames: kept in the host, not sent
    clean: dict[str, Any] = {
        k: redact(v) if isinstance(v, str) else v
        for k, v in data.items()
        if v is None or isinstance(v, (str, int, float, bool))
    }
    text = f"{clean['kind']}: {clean['message']}"
    meta: dict[str, Any] = {"_meta": {ERROR_META: clean}}  # the field's name on the wire
    return types.CallToolResult(content=_text_content(text), is_error=True, **meta)


def _file_content(files: Sequence[Attachment]) -> list[types.ContentBlock]:
    """Files a tool returned, by kind: ``image/*`` as image content, ``audio/*`` as audio
    content, anything else as an embedded resource (its bytes base64, named by a
    ``toolhost-file:`` URI of its kept name)."""
    blocks: list[types.ContentBlock] = []
    for f in files:
        data = base64.b64encode(f.data).decode("ascii")
        if f.mime_type.startswith("image/"):
            blocks.append(types.ImageContent(type="image", data=data, mime_type=f.mime_type))
        elif f.mime_type.startswith("audio/"):
            blocks.append(types.AudioContent(type="audio", data=data, mime_type=f.mime_type))
        else:
            name = os.path.basename(f.path) if f.path else f.name
            blocks.append(
                types.EmbeddedResource(
                    type="resource",
                    resource=types.BlobResourceContents(
                        uri=f"toolhost-file:{quote(name)}", mime_type=f.mime_type, blob=data
                    ),
                )
            )
    return blocks


def value_result(
    entry: ToolEntry, value: Any, redact: Callable[[str], str]
) -> types.CallToolResult:
    """A tool's value as structured content plus a text rendering.

    A value JSON cannot hold (a NaN, say) is a ``not_serializable`` error, never an
    empty success. Files the tool returned follow as content blocks; the structured
    content is the value (an attachment alone: its metadata), as the declarations say.
    """
    files: Sequence[Attachment] = ()
    if isinstance(value, Result):
        result: Result[Any] = value  # pyright: ignore[reportUnknownVariableType]
        value, files = result.value, result.attachments
    elif isinstance(value, Attachment):
        value, files = value.info(), (value,)
    try:
        plain = _jsonable(value)
        text = _text(plain)
    except (ValueError, RecursionError) as exc:
        name = entry.tool.name
        return error_result(
            NotSerializable(name, type_name=str(exc).removeprefix("a ") or "value", path="result"),
            redact,
        )
    structured: dict[str, Any]
    if entry.wrapped or not isinstance(plain, dict):
        structured = {"result": plain}
    else:
        structured = cast("dict[str, Any]", plain)
    return types.CallToolResult(
        content=_text_content(text) + _file_content(files), structured_content=structured
    )


def code_result(result: CodeResult) -> types.CallToolResult:
    """A ``run_code`` result: its data structured, and a text rendering to read."""
    error = result.error.model_dump() if result.error is not None else None
    calls = [
        {"tool": c.tool, "decision": c.decision, "ok": c.ok, "error": c.error} for c in result.calls
    ]
    try:
        value = _jsonable(result.value)
    except (ValueError, RecursionError) as exc:
        value = None
        result = result.model_copy(
            update={"warnings": [*result.warnings, f"the value has no JSON form ({exc})"]}
        )
    data: dict[str, Any] = {
        "ok": result.ok,
        "value": value,
        "stdout": result.stdout,
        "error": error,
        "calls": calls,
        "warnings": list(result.warnings),
        "check": result.check.model_dump() if result.check is not None else None,
    }
    lines: list[str] = []
    if result.stdout:
        lines.append(result.stdout.rstrip("\n"))
    if result.ok:
        lines.append(f"value: {_text(value)}")
    elif result.error is not None:
        e = result.error
        lines.append(e.traceback.rstrip("\n") if e.traceback else f"{e.type}: {e.message}")
        if e.kind == "limit_exceeded" or not e.traceback:
            lines.append(f"error ({e.kind}): {e.message}")
    if calls:
        made = "; ".join(
            f"{c['tool']} ({c['decision'] or 'not decided'}, "
            f"{'ok' if c['ok'] else c['error'] or 'failed'})"
            for c in calls
        )
        lines.append(f"calls: {made}")
    lines.extend(f"warning: {w}" for w in result.warnings)
    refused = result.error is not None and result.error.kind == "check_failed"
    if result.check is not None and not refused:  # a refusal's message lists them already
        lines.extend(check_lines(result.check))
    if result.attachments:
        data["attachments"] = [f.info() for f in result.attachments]
    return types.CallToolResult(
        content=_text_content("\n".join(lines)) + _file_content(result.attachments),
        structured_content=data,
        is_error=not result.ok,
    )
