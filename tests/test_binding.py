"""Binding: arguments to names, checked as plain data, frozen as the bytes the capsule runs."""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from capsule.protocol import MAX_DEPTH, decode, encode
from host import InvalidArguments, ToolSpec, discover
from host._binding import BoundCall, bind, check_value

SIGNATURES = """
import os

_X = object()

def basic(a, b, c=3): ...
def defaults(s="x", n=None, items=["a"], table={"k": [1]}, sep=os.sep, pair=(1, 2),
             tags={1}, huge=2**70, flag=True, neg=-5, blob=b"\\x00"): ...
def var(a, *rest, k=1, **extra): ...
def posonly(a, /, b): ...
def posonly_default(a=1, /): ...
def posonly_kwargs(a, /, **kw): ...
def kwonly(*, k, j=2): ...
def gap(a=_X, b=1, /): ...
def gap_keyword(a=_X, b=1): ...
def one(x): ...
def star(*args): ...
"""


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> Mapping[str, ToolSpec]:
    tools_dir = tmp_path_factory.mktemp("binding") / "tools"
    tools_dir.mkdir()
    (tools_dir / "sigs.py").write_text(SIGNATURES, encoding="utf-8")
    return discover(tools_dir).tools


@pytest.fixture
def call(specs: Mapping[str, ToolSpec]) -> Callable[..., BoundCall]:
    """``call("basic", 1, 2, c=3)``: bind those arguments to that tool."""

    def run(name: str, /, *args: Any, **kwargs: Any) -> BoundCall:
        return bind(specs[name], args, kwargs)

    return run


def invalid(call: Callable[..., BoundCall], name: str, /, *args: Any, **kwargs: Any) -> str:
    """Bind, expect InvalidArguments; return ``parameter: problem``."""
    with pytest.raises(InvalidArguments) as info:
        call(name, *args, **kwargs)
    error = info.value
    assert error.tool == name and error.kind == "invalid_arguments"
    assert error.to_data()["parameter"] == error.parameter
    return f"{error.parameter}: {error.problem}"


# -- names and defaults ---------------------------------------------------------------------


def test_positional_arguments_become_names_in_signature_order(
    call: Callable[..., BoundCall],
) -> None:
    bound = call("basic", 1, 2)
    assert list(bound.arguments.items()) == [("a", 1), ("b", 2), ("c", 3)]
    assert list(call("basic", c=30, b=20, a=10).arguments.items()) == [
        ("a", 10),
        ("b", 20),
        ("c", 30),
    ]
    assert dict(call("basic", 1, c=5, b=2).arguments) == {"a": 1, "b": 2, "c": 5}


def test_literal_defaults_are_applied_and_others_left_to_the_tool(
    call: Callable[..., BoundCall],
) -> None:
    bound = call("defaults")
    assert dict(bound.arguments) == {
        "s": "x",
        "n": None,
        "items": ["a"],
        "table": {"k": [1]},
        "flag": True,
        "neg": -5,
        "blob": b"\x00",
    }
    # Not literal (os.sep), or changed by the wire (a tuple would arrive as a list), or not
    # plain data at all (a set, an int over 64 bits): the tool applies its own default.
    for name in ("sep", "pair", "tags", "huge"):
        assert name not in bound.arguments
    assert dict(call("defaults", pair=[3], sep="/").arguments)["pair"] == [3]


def test_default_lists_are_fresh_copies(
    call: Callable[..., BoundCall], specs: Mapping[str, ToolSpec]
) -> None:
    first = call("defaults")
    first.arguments["items"].append("mutated")
    assert call("defaults").arguments["items"] == ["a"]
    items = next(p for p in specs["defaults"].params if p.name == "items")
    assert items.value == ["a"]


def test_var_positional_and_var_keyword(call: Callable[..., BoundCall]) -> None:
    assert dict(call("var", 1, 2, 3, z=4, k=5).arguments) == {
        "a": 1,
        "rest": [2, 3],
        "k": 5,
        "extra": {"z": 4},
    }
    # Both are always bound, so policy sees every parameter.
    assert dict(call("var", 1).arguments) == {"a": 1, "rest": [], "k": 1, "extra": {}}
    assert dict(call("star").arguments) == {"args": []}
    # A keyword named like the **kwargs parameter itself is just another extra keyword.
    assert call("var", 1, extra=9).arguments["extra"] == {"extra": 9}


def test_positional_only_parameters(call: Callable[..., BoundCall]) -> None:
    assert dict(call("posonly", 1, 2).arguments) == {"a": 1, "b": 2}
    assert dict(call("posonly", 1, b=2).arguments) == {"a": 1, "b": 2}
    assert invalid(call, "posonly", a=1, b=2) == "a: 'a' is positional-only; pass it by position"
    assert invalid(call, "posonly_default", a=2) == "a: 'a' is positional-only; pass it by position"
    # With **kwargs, a keyword of the same name is an extra keyword, as in Python.
    assert dict(call("posonly_kwargs", 1, a=2).arguments) == {"a": 1, "kw": {"a": 2}}


def test_a_positional_only_default_after_a_gap_is_left_to_the_tool(
    call: Callable[..., BoundCall],
) -> None:
    # ``a`` keeps its non-literal default; ``b`` cannot be sent without ``a`` before it.
    assert dict(call("gap").arguments) == {}
    assert dict(call("gap", 5).arguments) == {"a": 5, "b": 1}
    # Positional-or-keyword parameters after a gap are sent by name: no problem there.
    assert dict(call("gap_keyword").arguments) == {"b": 1}


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "expected"),
    [
        ("basic", (1,), {"a": 2}, "a: got multiple values for 'a'"),
        ("basic", (1,), {"b": 2, "a": 3}, "a: got multiple values for 'a'"),
        ("basic", (), {}, "a: missing required argument 'a'"),
        ("basic", (1,), {}, "b: missing required argument 'b'"),
        ("kwonly", (), {}, "k: missing required argument 'k'"),
        ("kwonly", (1,), {"k": 1}, "None: takes 0 positional arguments but 1 were given"),
        ("basic", (1, 2, 3, 4), {}, "None: takes 3 positional arguments but 4 were given"),
        ("one", (), {"x": 1, "y": 2}, "y: unexpected keyword argument 'y'"),
        ("star", (), {"args": 1}, "args: unexpected keyword argument 'args'"),
    ],
)
def test_signature_mismatches_name_the_parameter(
    call: Callable[..., BoundCall],
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[Any, Any],
    expected: str,
) -> None:
    assert invalid(call, name, *args, **kwargs) == expected


def test_keyword_names_must_be_str(specs: Mapping[str, ToolSpec]) -> None:
    with pytest.raises(InvalidArguments) as info:
        bind(specs["var"], (1,), {1: 2})  # only reachable through the API, not a call
    assert (info.value.parameter, info.value.problem) == ("extra", "keyword names must be str")
    with pytest.raises(InvalidArguments) as info:
        bind(specs["one"], (1,), {None: 2})
    assert info.value.problem == "unexpected keyword argument None"


# -- values ---------------------------------------------------------------------------------


class Color(enum.IntEnum):
    RED = 1


class Tag(str):
    pass


class Count(int):
    pass


def test_values_become_plain_private_copies() -> None:
    value = {"t": (1, (2, [3])), "s": Tag("x"), "n": Count(7), "e": Color.RED, "f": 1.5}
    value |= {"b": bytearray(b"ab"), "m": memoryview(b"cd"), "ok": True, "none": None}
    copy = check_value("tool", "p", value)
    assert copy == {
        "t": [1, [2, [3]]],
        "s": "x",
        "n": 7,
        "e": 1,
        "f": 1.5,
        "b": b"ab",
        "m": b"cd",
        "ok": True,
        "none": None,
    }
    assert [type(copy[k]) for k in ("s", "n", "e", "b", "m", "ok")] == [
        str,
        int,
        int,
        bytes,
        bytes,
        bool,
    ]
    assert type(copy["t"]) is list and type(copy["t"][1]) is list


def test_64_bit_integer_bounds(call: Callable[..., BoundCall]) -> None:
    for ok in (-(2**63), 2**63 - 1, 2**64 - 1, 0):
        assert call("one", ok).arguments["x"] == ok
        assert decode(call("one", ok).encoded) == {"x": ok}
    assert invalid(call, "one", -(2**63) - 1) == "x: x: integer does not fit in 64 bits"
    assert invalid(call, "one", 2**64) == "x: x: integer does not fit in 64 bits"
    assert invalid(call, "one", [0, {"deep": 2**100}]).startswith(
        "x: x[1]['deep']: integer does not fit"
    )
    assert invalid(call, "one", Count(2**64)).startswith("x: x: integer does not fit")


def test_dict_keys_must_be_str(call: Callable[..., BoundCall]) -> None:
    for key in (1, b"k", None, (1, 2), 1.5, Color.RED):
        problem = invalid(call, "one", {"ok": {key: 1}})
        assert problem == f"x: x['ok']: dict keys must be str, not {type(key).__name__}"


@pytest.mark.parametrize(
    ("value", "type_name", "where"),
    [
        ({1, 2}, "set", "x"),
        (frozenset(), "frozenset", "x"),
        ([0, 1, object()], "object", "x[2]"),
        ({"f": len}, "builtin_function_or_method", "x['f']"),
        ({"f": [lambda: 1]}, "function", "x['f'][0]"),
        ((i for i in range(3)), "generator", "x"),
        (1j, "complex", "x"),
        (Decimal("1.5"), "Decimal", "x"),
        (Path("/etc"), "PosixPath", "x"),
        ({"a": {"b": [None, {"c": {1}}]}}, "set", "x['a']['b'][1]['c']"),
        (enum.Enum("E", "A").A, "E", "x"),
    ],
)
def test_values_that_are_not_plain_data_are_refused_with_their_path(
    call: Callable[..., BoundCall], value: object, type_name: str, where: str
) -> None:
    problem = invalid(call, "one", value)
    assert problem.startswith(f"x: {where}: {type_name} is not plain data")


def test_the_first_bad_element_is_reported(call: Callable[..., BoundCall]) -> None:
    assert invalid(call, "one", [1, {2}, object()]).startswith("x: x[1]: set")
    assert invalid(call, "one", {"a": 1, "b": {3}, "c": object()}).startswith("x: x['b']: set")


def test_bad_values_in_args_and_kwargs_name_where_they_sat(
    call: Callable[..., BoundCall],
) -> None:
    assert invalid(call, "var", 1, 2, {3}).startswith("rest: rest[1]: set")
    assert invalid(call, "var", 1, z={3}).startswith("z: z: set")


def nest(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def test_nesting_is_capped_without_recursion_errors(call: Callable[..., BoundCall]) -> None:
    bound = call("one", nest(MAX_DEPTH))
    assert decode(bound.encoded) == {"x": nest(MAX_DEPTH)}
    problem = invalid(call, "one", nest(MAX_DEPTH + 1))
    assert problem.endswith(f"nested deeper than {MAX_DEPTH}")
    assert invalid(call, "one", nest(100_000)).endswith(f"nested deeper than {MAX_DEPTH}")


def test_binding_deep_values_from_a_deep_stack() -> None:
    """The walk is iterative: a caller already deep in its stack can still bind."""

    def recurse(n: int) -> Any:
        if n == 0:
            return check_value("tool", "p", nest(MAX_DEPTH))
        return recurse(n - 1)

    depth = sys.getrecursionlimit() - 200
    assert recurse(depth) == nest(MAX_DEPTH)


def test_cycles_are_refused(call: Callable[..., BoundCall]) -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    assert invalid(call, "one", loop).endswith(f"nested deeper than {MAX_DEPTH}")
    table: dict[str, Any] = {}
    table["self"] = table
    assert invalid(call, "one", table).endswith(f"nested deeper than {MAX_DEPTH}")


def test_subclasses_of_containers_are_not_plain_data(call: Callable[..., BoundCall]) -> None:
    from collections import OrderedDict, UserList

    assert "OrderedDict is not plain data" in invalid(call, "one", OrderedDict(a=1))
    assert "UserList is not plain data" in invalid(call, "one", UserList([1]))


# -- the frozen bytes -------------------------------------------------------------------------


def test_the_bound_map_is_a_private_copy(call: Callable[..., BoundCall]) -> None:
    items: list[Any] = [1, {"k": [2]}]
    bound = call("one", items)
    encoded = bound.encoded
    items.append(3)
    items[1]["k"].append(4)
    items[1]["new"] = 5
    assert bound.arguments == {"x": [1, {"k": [2]}]}
    assert bound.encoded == encoded
    assert decode(bound.encoded) == {"x": [1, {"k": [2]}]}


def test_encoded_bytes_decode_back_to_the_arguments(call: Callable[..., BoundCall]) -> None:
    bound = call("var", 1, (2, "two"), b"3", k={"nested": [None, 1.5, True]}, z="extra")
    assert decode(bound.encoded) == bound.arguments
    assert bound.encoded == encode(dict(bound.arguments))  # canonical: one encoding
    assert list(decode(bound.encoded)) == ["a", "rest", "k", "extra"]


def test_binding_the_same_call_twice_gives_the_same_bytes(
    call: Callable[..., BoundCall],
) -> None:
    one = call("basic", 1, c={"b": 1, "a": 2}, b=[1])
    two = call("basic", 1, [1], {"b": 1, "a": 2})
    assert one.encoded == two.encoded
