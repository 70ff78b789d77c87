"""The pieces of the declarations that need no pyright run: printed types, docstrings,
canonical types, schemas and validation over a hand-made scope."""

from __future__ import annotations

from typing import Any

import pytest

from host import InvalidArguments
from host.declare._docstrings import parse_docstring
from host.declare._model import FieldDecl, ParamDecl, ToolDecl, TypeDecl
from host.declare._pyright import (
    Diagnostic,
    declared_type,
    is_fatal,
    overloads,
    parse_signature,
    python_text,
    unwrap_coroutine,
    wrapped_return,
)
from host.declare._schema import ArgumentValidator, input_schema
from host.declare._scope import Scope
from host.declare._typeexpr import Canonical, Opaque, canonicalise
from host.declare._typeindex import External, Ref

# -- what pyright prints ---------------------------------------------------------------


def test_declared_type_reads_the_probe_error() -> None:
    message = 'Type "(a: int) -> str" is not assignable to declared type "None"\n  "F" is not ...'
    assert declared_type(message) == "(a: int) -> str"
    assert declared_type('Type of "x" is "int"') is None


def test_signature_kinds_and_defaults() -> None:
    sig = parse_signature(
        '(a: int, /, b: str = "x, y", *args: int, key: bool, r: float = 2, **kw: str)'
        " -> (int | None)"
    )
    assert sig is not None
    assert [(p.name, p.kind, p.type, p.has_default) for p in sig.params] == [
        ("a", 0, "int", False),
        ("b", 1, "str", True),
        ("args", 2, "int", False),
        ("key", 3, "bool", False),
        ("r", 3, "float", True),
        ("kw", 4, "str", False),
    ]
    assert python_text(sig.returns) == "int | None"


def test_signature_of_callable_params_and_keyword_marker() -> None:
    sig = parse_signature("(f: (x: int) -> int, *, k: dict[str, list[int]]) -> None")
    assert sig is not None
    assert [(p.name, p.kind, p.type) for p in sig.params] == [
        ("f", 1, "(x: int) -> int"),
        ("k", 3, "dict[str, list[int]]"),
    ]
    assert parse_signature("_lru_cache_wrapper[int]") is None
    erased = parse_signature("(...) -> int")
    assert erased is not None and [p.kind for p in erased.params] == [2, 4]


def test_weak_forms() -> None:
    assert overloads("Overload[(x: int) -> int, (x: str) -> str]") == [
        "(x: int) -> int",
        "(x: str) -> str",
    ]
    assert wrapped_return("_lru_cache_wrapper[int]") == ("_lru_cache_wrapper", "int")
    assert wrapped_return("_Wrapped[..., int, (x: int), str]") == ("_Wrapped", "str")
    assert unwrap_coroutine("CoroutineType[Any, Any, dict[str, int]]") == "dict[str, int]"
    assert unwrap_coroutine("list[int]") is None
    assert python_text("(list[T@first] | T@first)") == "list[T] | T"


def test_only_unconditional_errors_are_fatal() -> None:
    assert is_fatal(Diagnostic("a.py", 1, "error", '"return" can be used only within a function'))
    assert not is_fatal(Diagnostic("a.py", 1, "error", "x", "reportArgumentType"))
    assert not is_fatal(Diagnostic("a.py", 1, "warning", "x"))


# -- docstrings --------------------------------------------------------------------------


def test_google_docstring() -> None:
    doc = parse_docstring(
        "Roll dice.\n\nArgs:\n    count (int): how many,\n        1 to 100.\n"
        "    sides: per die.\n\nReturns:\n    the roll.\n\nRaises:\n    ValueError: bad."
    )
    assert doc.summary == "Roll dice."
    assert doc.params == {"count": "how many, 1 to 100.", "sides": "per die."}
    assert doc.returns == "the roll."


def test_numpy_docstring() -> None:
    doc = parse_docstring(
        "Mean.\n\nParameters\n----------\nvalues : list of float\n    the numbers\n"
        "x, y : int\n    coordinates\n\nReturns\n-------\nfloat\n    the mean"
    )
    assert doc.summary == "Mean."
    assert doc.params == {"values": "the numbers", "x": "coordinates", "y": "coordinates"}
    assert doc.returns is not None and "the mean" in doc.returns


def test_sphinx_docstring() -> None:
    doc = parse_docstring(
        "Fetch.\n\n:param path: where\n    it is.\n:param int retries: how often.\n"
        ":type path: str\n:returns: bytes."
    )
    assert doc.summary == "Fetch."
    assert doc.params == {"path": "where it is.", "retries": "how often."}
    assert doc.returns == "bytes."


def test_plain_docstring_is_all_summary() -> None:
    assert parse_docstring("Just text.\n\nMore text.").summary == "Just text.\n\nMore text."
    assert parse_docstring(None).params == {}


# -- canonical types ---------------------------------------------------------------------

_NAMES: dict[str, Ref | External] = {
    "Optional": External("typing", "Optional"),
    "List": External("typing", "List"),
    "Sequence": External("collections.abc", "Sequence"),
    "Mapping": External("typing", "Mapping"),
    "Literal": External("typing", "Literal"),
    "datetime": External("datetime", "datetime"),
    "Callable": External("collections.abc", "Callable"),
    "Task": Ref("kanban", "Task"),
    "Board": Ref("kanban", "Board"),
    "Unknown": External("pyright", "Unknown"),
    "Response": External("httpx", "Response"),
    "int": External("builtins", "int"),
    "str": External("builtins", "str"),
    "set": External("builtins", "set"),
    "list": External("builtins", "list"),
    "tuple": External("builtins", "tuple"),
}


def _canon(text: str, *, returning: bool = False) -> Canonical:
    def resolve(parts: list[str]) -> Ref | External | None:
        return _NAMES.get(".".join(parts))

    def declare(ref: Ref) -> str | Opaque:
        return Opaque("Board is not plain data") if ref.name == "Board" else ref.name

    return canonicalise(text, resolve, declare, returning=returning)


@pytest.mark.parametrize(
    ("source", "canonical"),
    [
        ("Optional[List[int]]", "list[int] | None"),
        ("Sequence[Task]", "list[Task]"),
        ("Mapping[str, int]", "dict[str, int]"),
        ("'Task'", "Task"),
        ("Literal['a', 1, -2]", "Literal['a', 1, -2]"),
        ("Literal['a', None]", "Literal['a'] | None"),
        ("datetime | None", "str | None"),
        ("tuple[int, ...]", "tuple[int, ...]"),
        ("list", "list[Any]"),  # ``Any`` is ours: the tool file need not import it
        ("Sequence", "list[Any]"),
    ],
)
def test_canonical_spelling(source: str, canonical: str) -> None:
    got = _canon(source)
    assert (got.text, got.notes) == (canonical, [])


@pytest.mark.parametrize(
    ("source", "note"),
    [
        ("Callable[[int], int]", "Callable is not plain data"),
        ("Unknown | int", "pyright cannot infer"),
        ("Board", "Board is not plain data"),
        ("Response", "defined outside the tools folder"),
        ("(x: int) -> int", "no plain-data form"),
    ],
)
def test_weak_types_become_any_with_a_note(source: str, note: str) -> None:
    got = _canon(source)
    assert "Any" in got.text
    assert any(note in n for n in got.notes), got.notes


def test_a_set_is_declared_as_a_list_and_said() -> None:
    got = _canon("set[int]")
    assert got.text == "list[int]"
    assert got.notes == [
        "a set is not plain data: declared as a list (a tool receives a list; a result "
        "holding a set fails with NotSerializable)"
    ]


def test_results_with_files_declare_their_value() -> None:
    files = {
        "Result": External("capsule.context", "Result"),
        "Attachment": External("capsule.context", "Attachment"),
        "Task": Ref("kanban", "Task"),
    }

    def canon(text: str, returning: bool) -> Canonical:
        return canonicalise(
            text, lambda parts: files.get(".".join(parts)), lambda r: r.name, returning=returning
        )

    note = "may return files (attachments)"
    assert (canon("Result[Task]", True).text, canon("Result[Task]", True).notes) == ("Task", [note])
    assert canon("Result[Task] | None", True).text == "Task | None"
    assert (canon("Attachment", True).text, canon("Attachment", True).notes) == (
        "AttachmentInfo",
        [note],
    )
    assert canon("Result", True).text == "Any"
    assert canon("Attachment", False).text == "Any"  # not something a caller passes


def test_a_returned_set_is_flagged() -> None:
    assert _canon("set[int]", returning=True).notes == [
        "a set is not plain data: calls returning one fail with NotSerializable"
    ]


# -- schemas and validation over a hand-made scope ---------------------------------------


def _scope() -> Scope:
    status = TypeDecl("Status", "alias", "k.py", 1, value="Literal['open', 'closed']")
    task = TypeDecl(
        "Task",
        "typeddict",
        "k.py",
        2,
        fields=(
            FieldDecl("id", "str"),
            FieldDecl("status", "Status"),
            FieldDecl("n", "int", False),
        ),
    )
    tool = ToolDecl(
        name="put",
        qualified="tools.k.put",
        file="k",
        export="put",
        member=None,
        installed=True,
        source="k.py",
        line=5,
        params=(
            ParamDecl("task", 1, "Task"),
            ParamDecl("count", 1, "int", "1"),
            ParamDecl("ratio", 1, "float", "0.5"),
            ParamDecl("blob", 1, "bytes | None", "None"),
            ParamDecl("rest", 2, "str"),
            ParamDecl("extra", 4, "bool"),
        ),
        returns="list[Task]",
        docstring=None,
        inferred="",
    )
    return Scope((tool,), (status, task), "test")


def test_input_schema_shape() -> None:
    scope = _scope()
    schema = input_schema(scope, scope.tool("put"))
    assert schema["required"] == ["task"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["count"] == {"type": "integer", "default": 1}
    assert schema["properties"]["rest"] == {"type": "array", "items": {"type": "string"}}
    assert schema["properties"]["extra"] == {
        "type": "object",
        "additionalProperties": {"type": "boolean"},
    }
    task = schema["$defs"]["Task"]
    assert task["required"] == ["id", "status"] and task["additionalProperties"] is False
    assert schema["$defs"]["Status"]["enum"] == ["open", "closed"]


def _problem(arguments: dict[str, Any]) -> tuple[str | None, str]:
    with pytest.raises(InvalidArguments) as info:
        ArgumentValidator(_scope()).check("put", arguments)
    return info.value.parameter, info.value.problem


def test_validation_accepts_plain_data_that_fits() -> None:
    validator = ArgumentValidator(_scope())
    validator.check("put", {"task": {"id": "a", "status": "open"}, "count": 2, "ratio": 1})
    validator.check("put", {"task": {"id": "a", "status": "open", "n": 1}, "blob": b"\x00"})
    validator.check("unknown-tool", {"anything": object()})  # not declared: binding alone


def test_validation_names_the_parameter_and_the_problem() -> None:
    ok = {"id": "a", "status": "open"}
    assert _problem({"task": {"id": "a", "status": "done"}}) == (
        "task",
        "task['status']: 'done' is not one of ['open', 'closed']",
    )
    parameter, problem = _problem({"task": ok, "count": True})  # bool is not an integer
    assert parameter == "count" and "not of type 'integer'" in problem
    parameter, problem = _problem({"task": ok, "count": 1.0})  # nor is a float
    assert parameter == "count"
    parameter, problem = _problem({"task": {**ok, "typo": 1}})
    assert parameter == "task" and "typo" in problem
    parameter, problem = _problem({"task": ok, "rest": ["a", 2]})
    assert parameter == "rest" and problem.startswith("rest[1]:")
    parameter, _ = _problem({"task": ok, "blob": "text"})  # str where bytes are declared
    assert parameter == "blob"


_FAST_SCHEMAS: list[dict[str, Any]] = [
    {},
    {"description": "anything"},
    {"type": "integer"},
    {"type": "number", "default": 1},
    {"type": "string"},
    {"type": "boolean"},
    {"type": "null"},
    {"type": "string", "contentEncoding": "base64"},
    {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    {"type": "array", "items": {"type": "number"}},
    {"type": "array", "items": {}},
    {"type": "object"},
    {"type": "object", "additionalProperties": {"type": "string"}},
    {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "integer"}}},
]
_VALUES: list[Any] = [
    None, True, 0, -3, 2**63, 1.0, 2.5, "", "x", b"", b"\x00", [], [1], [1.5, 2], ["a"],
    [None], {}, {"k": "v"}, {"k": 1}, {"k": [1, 2]}, {"k": [1.5]}, (1, 2),
]  # fmt: skip


@pytest.mark.parametrize("schema", _FAST_SCHEMAS)
def test_the_fast_path_accepts_exactly_what_jsonschema_accepts(schema: dict[str, Any]) -> None:
    from host.declare._schema import _fast, _Validator  # pyright: ignore[reportPrivateUsage]

    fast = _fast(schema)
    assert fast is not None
    for value in _VALUES:
        assert fast(value) == _Validator(schema).is_valid(value), (schema, value)
