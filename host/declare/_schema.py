"""JSON Schemas from the scope model, and the validator every call passes.

Schemas are built from the scope's canonical types (pyright's view), not by importing the
tools: the host process never imports tool modules, no helper process is started, and
the schema agrees with the declaration by construction. docs/tools.md "Declarations" has the
measurements behind that choice.

An input schema describes the *bound* arguments: an object with one property per
parameter the caller can pass (``*args`` as an array, ``**kwargs`` as an object). The
host validates every call against it before policy sees the call, with ``jsonschema``
(Draft 2020-12) and a type checker that matches plain data exactly: an ``int`` is not a
``float``'s only form, ``True`` is not an integer, and ``bytes`` fit a string schema only
where it says ``contentEncoding: base64``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

import jsonschema
import jsonschema.exceptions
import jsonschema.validators
from jsonschema import Draft202012Validator, TypeChecker

from host.errors import InvalidArguments

from ._model import ScopeModel, ToolDecl, TypeDecl
from ._typeindex import parse_type

__all__ = ["type_schema", "input_schema", "output_schema", "tool_schemas", "ArgumentValidator"]

_SCALARS: Final[Mapping[str, dict[str, Any]]] = {
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "str": {"type": "string"},
    "bool": {"type": "boolean"},
    "bytes": {"type": "string", "contentEncoding": "base64"},
    "object": {},
    "Any": {},
    "NoReturn": {"not": {}},
}


class _Builder:
    def __init__(self, types: Mapping[str, TypeDecl]) -> None:
        self.types = types
        self.defs: dict[str, dict[str, Any]] = {}

    def text(self, text: str) -> dict[str, Any]:
        return self.node(parse_type(text))

    def node(self, node: ast.expr) -> dict[str, Any]:
        if isinstance(node, ast.Constant) and node.value is None:
            return {"type": "null"}
        if isinstance(node, ast.BinOp):
            return {"anyOf": [*self._union(node.left), *self._union(node.right)]}
        if isinstance(node, ast.Name):
            if node.id in _SCALARS:
                return dict(_SCALARS[node.id])
            return self.ref(node.id)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            name = node.value.id
            args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if name == "list":
                return {"type": "array", "items": self.node(args[0])}
            if name == "dict":
                values = self.node(args[-1])
                return {"type": "object", **({"additionalProperties": values} if values else {})}
            if name == "tuple":
                if len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is ...:
                    return {"type": "array", "items": self.node(args[0])}
                items = [self.node(a) for a in args]
                n = len(items)
                return {
                    "type": "array",
                    "prefixItems": items,
                    "minItems": n,
                    "maxItems": n,
                    "items": False,
                }
            if name == "Literal":
                values = [ast.literal_eval(a) for a in args]
                plain = [v.decode("latin-1") if isinstance(v, bytes) else v for v in values]
                return {"const": plain[0]} if len(plain) == 1 else {"enum": plain}
            return self.ref(name)  # a generic declared type: its parameters are not expanded
        return {}

    def _union(self, node: ast.expr) -> list[dict[str, Any]]:
        got = self.node(node)
        return list(got["anyOf"]) if list(got) == ["anyOf"] else [got]

    def ref(self, name: str) -> dict[str, Any]:
        decl = self.types.get(name)
        if decl is None:
            return {}
        if name not in self.defs:
            self.defs[name] = {}  # placeholder: recursive types refer to themselves
            self.defs[name] = self.declared(decl)
        return {"$ref": f"#/$defs/{name}"}

    def declared(self, decl: TypeDecl) -> dict[str, Any]:
        out: dict[str, Any] = {"title": decl.name}
        if decl.docstring:
            out["description"] = decl.docstring
        if decl.is_class:
            out |= {
                "type": "object",
                "properties": {f.name: self.text(f.type) for f in decl.fields},
                "required": [f.name for f in decl.fields if f.required],
                "additionalProperties": False,
            }
        elif decl.kind == "typevar":
            if decl.constraints:
                out["anyOf"] = [self.text(c) for c in decl.constraints]
            elif decl.value:
                out |= self.text(decl.value)
        elif decl.value:
            out |= self.text(decl.value)
        return out

    def finish(self, schema: dict[str, Any]) -> dict[str, Any]:
        if self.defs:
            schema["$defs"] = dict(sorted(self.defs.items()))
        return schema


def _types(scope: ScopeModel) -> dict[str, TypeDecl]:
    return {t.name: t for t in scope.types}


def type_schema(scope: ScopeModel, text: str) -> dict[str, Any]:
    """The JSON Schema of one canonical type text, with the ``$defs`` it needs."""
    builder = _Builder(_types(scope))
    return builder.finish(
        {"$schema": Draft202012Validator.META_SCHEMA["$schema"], **builder.text(text)}
    )


def _default(text: str | None) -> tuple[bool, Any]:
    if text is None or text == "...":
        return False, None
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None
    plain: Any = list(cast("tuple[Any, ...]", value)) if isinstance(value, tuple) else value
    ok = plain is None or isinstance(plain, (str, int, float, bool, list, dict))
    return ok, cast(Any, plain)


def input_schema(
    scope: ScopeModel, tool: ToolDecl, types: Mapping[str, TypeDecl] | None = None
) -> dict[str, Any]:
    """The schema of a call's bound arguments: one property per visible parameter."""
    builder = _Builder(types if types is not None else _types(scope))
    properties: dict[str, Any] = {}
    for p in tool.params:
        schema = builder.text(p.type)
        if p.kind == 2:
            schema = {"type": "array", "items": schema}
        elif p.kind == 4:
            schema = {"type": "object", "additionalProperties": schema}
        if p.description:
            schema = {**schema, "description": p.description}
        has_default, value = _default(p.default)
        if has_default:
            schema = {**schema, "default": value}
        properties[p.name] = schema
    out: dict[str, Any] = {
        "$schema": Draft202012Validator.META_SCHEMA["$schema"],
        "title": tool.name,
        "type": "object",
        "properties": properties,
        "required": [p.name for p in tool.params if p.required],
        "additionalProperties": False,
    }
    if tool.summary:
        out["description"] = tool.summary
    return builder.finish(out)


def output_schema(
    scope: ScopeModel, tool: ToolDecl, types: Mapping[str, TypeDecl] | None = None
) -> dict[str, Any] | None:
    """The schema of the tool's result, or None where the return type is not expressible."""
    weak = any(n.startswith("returns:") for n in tool.notes)
    if weak or tool.returns in ("Any", "NoReturn"):
        return None
    builder = _Builder(types if types is not None else _types(scope))
    out = {"$schema": Draft202012Validator.META_SCHEMA["$schema"], **builder.text(tool.returns)}
    if tool.returns_description:
        out["description"] = tool.returns_description
    return builder.finish(out)


def tool_schemas(scope: ScopeModel, tool: ToolDecl) -> dict[str, Any]:
    types = _types(scope)
    return {"input": input_schema(scope, tool, types), "output": output_schema(scope, tool, types)}


# -- validation -------------------------------------------------------------------------
# jsonschema ships partial type information; its objects are handled as ``Any`` here.


def _exact(*classes: type) -> Callable[[Any, object], bool]:
    return lambda _checker, instance: type(instance) in classes


_CHECKER: Final[Any] = TypeChecker().redefine_many(  # pyright: ignore[reportUnknownMemberType]
    {
        "null": _exact(type(None)),
        "boolean": _exact(bool),
        "integer": _exact(int),
        "number": _exact(int, float),
        "string": _exact(str),
        "array": _exact(list),
        "object": _exact(dict),
    }
)
_TYPE: Final[Any] = Draft202012Validator.VALIDATORS["type"]


def _type(validator: Any, types: Any, instance: Any, schema: Mapping[str, Any]) -> Any:
    if schema.get("contentEncoding") == "base64" and "string" in types:
        # Declared bytes: JSON clients would send base64 text, but nothing decodes it on
        # the way to the tool, so from Python only bytes fit.
        if type(instance) is not bytes:
            yield jsonschema.exceptions.ValidationError(f"{instance!r} is not bytes")
        return
    yield from _TYPE(validator, types, instance, schema)


_extend: Any = jsonschema.validators.extend  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
_Validator: Final[Any] = _extend(
    Draft202012Validator, validators={"type": _type}, type_checker=_CHECKER
)
_best_match: Any = jsonschema.exceptions.best_match  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]


def _where(path: list[Any]) -> str:
    if not path:
        return ""
    out = str(path[0])
    for part in path[1:]:
        out += f"[{part}]" if isinstance(part, int) else f"[{part!r}]"
    return out


_Check = Callable[[Any], bool]
_ANNOTATIONS: Final = frozenset({"description", "default", "title"})
_EXACT: Final[Mapping[str, tuple[type, ...]]] = {
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "boolean": (bool,),
    "null": (type(None),),
}


def _classes(schema: Mapping[str, Any]) -> tuple[type, ...] | None:
    """The exact classes a scalar schema (or an ``anyOf`` of them) admits, else None."""
    keys = schema.keys() - _ANNOTATIONS
    if keys == {"type"} and schema["type"] in _EXACT:
        return _EXACT[schema["type"]]
    if keys == {"type", "contentEncoding"} and schema["contentEncoding"] == "base64":
        return (bytes,)
    if keys == {"anyOf"}:
        parts = [_classes(part) for part in schema["anyOf"]]
        if all(p is not None for p in parts):
            return tuple(c for p in parts if p is not None for c in p)
    return None


def _fast(schema: Mapping[str, Any]) -> _Check | None:
    """A plain-Python check that accepts exactly what jsonschema accepts, for the simple
    schemas most parameters have; None for anything else (jsonschema decides)."""
    keys = schema.keys() - _ANNOTATIONS
    if not keys:
        return lambda _value: True
    exact = _classes(schema)
    if exact is not None:
        return lambda value: type(value) in exact
    if schema.get("type") == "array" and keys == {"type", "items"}:
        item = _fast(schema["items"])
        if item is not None:
            return lambda value: type(value) is list and all(map(item, cast("list[Any]", value)))
    if schema.get("type") == "object" and keys <= {"type", "additionalProperties"}:
        entry = _fast(schema.get("additionalProperties", {}))
        if entry is not None:
            return lambda value: (
                type(value) is dict and all(map(entry, cast("dict[str, Any]", value).values()))
            )
    return None


def _fast_arguments(schema: Mapping[str, Any]) -> _Check | None:
    checks: dict[str, _Check] = {}
    for name, part in schema["properties"].items():
        check = _fast(part)
        if check is None:
            return None
        checks[name] = check
    required = frozenset(schema["required"])

    def valid(arguments: Any) -> bool:
        return required <= arguments.keys() <= checks.keys() and all(
            checks[k](v) for k, v in arguments.items()
        )

    return valid


class ArgumentValidator:
    """Checks bound arguments against each tool's input schema; compiled once per tool.

    Most parameters are scalars or lists and dicts of them: those are checked by a plain
    Python predicate that accepts exactly what the schema accepts (a call costs about a
    microsecond, not jsonschema's tens); anything else, and every rejection (for its
    message), goes through jsonschema.
    """

    def __init__(self, scope: ScopeModel) -> None:
        self._scope = scope
        self._types = _types(scope)
        self._compiled: dict[str, tuple[_Check | None, Any]] = {}

    def _validator(self, name: str) -> tuple[_Check | None, Any]:
        try:
            return self._compiled[name]
        except KeyError:
            pass
        compiled: tuple[_Check | None, Any] = (None, None)
        try:
            tool = self._scope.tool(name)
        except KeyError:
            pass  # not declared (the scope predates the tool): binding alone applies
        else:
            schema = input_schema(self._scope, tool, self._types)
            compiled = (_fast_arguments(schema), _Validator(schema))
        self._compiled[name] = compiled
        return compiled

    def check(self, tool: str, arguments: Mapping[str, Any]) -> None:
        """Raise :class:`InvalidArguments` naming the parameter and what was wrong."""
        fast, validator = self._validator(tool)
        if (fast is not None and fast(arguments)) or validator is None:
            return
        try:
            if validator.is_valid(arguments):
                return
            error: Any = _best_match(validator.iter_errors(arguments))
        except RecursionError:  # jsonschema recurses a few frames per level of a value
            raise InvalidArguments(
                tool, "the arguments are nested too deeply to check against their types"
            ) from None
        path: list[Any] = list(error.absolute_path)
        message = str(error.message)
        where = _where(path)
        raise InvalidArguments(
            tool,
            f"{where}: {message}" if where else message,
            parameter=str(path[0]) if path else None,
        )
