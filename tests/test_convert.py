"""Conversion of tool results to plain data, inside the capsule (DESIGN.md section 6)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import decimal
import enum
import math
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, ClassVar, NamedTuple, TypedDict

import pydantic
import pytest

from capsule._convert import NotPlainData, to_plain
from capsule.protocol import MAX_DEPTH, check_plain, decode, encode

# -- what is converted ------------------------------------------------------------------------


@dataclasses.dataclass
class Point:
    x: int
    y: int
    label: str = "p"
    tags: list[str] = dataclasses.field(default_factory=list)
    kind: ClassVar[str] = "point"  # not a field


@dataclasses.dataclass(frozen=True, slots=True)
class Box:
    corner: Point
    size: tuple[int, int]


class Pair(NamedTuple):
    left: int
    right: Any


class Task(TypedDict):
    id: str
    done: bool


class Color(enum.Enum):
    RED = "red"
    NESTED = (1, (2, 3))


class Level(enum.IntEnum):
    HIGH = 3


class Mode(enum.StrEnum):
    FAST = "fast"


class Flag(enum.Flag):
    A = 1
    B = 2


class User(pydantic.BaseModel):
    name: str
    born: datetime.date
    roles: list[Color] = []


class Team(pydantic.BaseModel):
    lead: User
    members: list[User]


def test_plain_data_passes_unchanged() -> None:
    value = {"s": "x", "i": -1, "f": 1.5, "b": True, "n": None, "raw": b"\x00", "l": [1, [2]]}
    assert to_plain(value) == value
    for scalar in ("x", 0, 1.5, True, None, b"", 2**64 - 1, -(2**63)):
        assert to_plain(scalar) == scalar and type(to_plain(scalar)) is type(scalar)
    for odd in (math.inf, -math.inf, -0.0):
        assert to_plain(odd) == odd
    assert math.isnan(to_plain(math.nan))


def test_plain_containers_are_returned_as_they_are_and_the_rest_still_walked() -> None:
    flat = {"id": "t1", "n": 2**64 - 1, "f": 0.5, "ok": True, "b": b"x", "no": None}
    nested = {"rows": [flat, [1, [2, {"x": []}]]], "deep": nest(20)}
    assert to_plain(flat) is flat
    assert to_plain(nested) is nested
    assert to_plain(nest(40)) == nest(40)  # past the fast check's depth: walked, copied
    mixed: dict[str, Any] = {"a": [1, {"b": (2, 3)}]}
    assert to_plain(mixed) == {"a": [1, {"b": [2, 3]}]}
    assert refused({"a": [{"b": 2**64}]}).path == "result['a'][0]['b']"
    assert refused({"a": [{1: 2}]}).path == "result['a'][0][1]"
    loop: list[Any] = [1]
    loop.append({"again": loop})
    assert refused({"x": loop}).why == "it contains itself"


def test_dataclasses_become_dicts_of_their_fields() -> None:
    box = Box(Point(1, 2, tags=["a"]), (3, 4))
    assert to_plain(box) == {
        "corner": {"x": 1, "y": 2, "label": "p", "tags": ["a"]},
        "size": [3, 4],
    }


def test_pydantic_models_become_dicts_of_their_fields() -> None:
    ada = User(name="Ada", born=datetime.date(1815, 12, 10), roles=[Color.RED])
    team = Team(lead=ada, members=[ada, User(name="Bo", born=datetime.date(2000, 1, 1))])
    assert to_plain(team) == {
        "lead": {"name": "Ada", "born": "1815-12-10", "roles": ["red"]},
        "members": [
            {"name": "Ada", "born": "1815-12-10", "roles": ["red"]},
            {"name": "Bo", "born": "2000-01-01", "roles": []},
        ],
    }


def test_namedtuples_typeddicts_and_tuples() -> None:
    task: Task = {"id": "t1", "done": False}
    assert to_plain(Pair(1, Pair(2, (3, task)))) == {
        "left": 1,
        "right": {"left": 2, "right": [3, {"id": "t1", "done": False}]},
    }
    assert to_plain(((1,), ())) == [[1], []]
    assert type(to_plain((1, 2))) is list


def test_enums_become_their_values() -> None:
    assert to_plain(Color.RED) == "red"
    assert to_plain(Color.NESTED) == [1, [2, 3]]
    assert to_plain(Level.HIGH) == 3 and type(to_plain(Level.HIGH)) is int
    assert to_plain(Mode.FAST) == "fast" and type(to_plain(Mode.FAST)) is str
    assert to_plain(Flag.A | Flag.B) == 3
    assert to_plain({Color.RED: 1, Mode.FAST: 2}) == {"red": 1, "fast": 2}


def test_dates_and_times_become_iso_8601() -> None:
    utc = datetime.UTC
    moment = datetime.datetime(2026, 11, 30, 13, 40, 5, 123, tzinfo=utc)
    assert to_plain(moment) == "2026-11-30T13:40:05.000123+00:00"
    assert to_plain(datetime.datetime(2026, 1, 2, 3, 4)) == "2026-01-02T03:04:00"
    assert to_plain(datetime.date(2026, 1, 2)) == "2026-01-02"
    assert to_plain(datetime.time(3, 4, 5)) == "03:04:05"
    offset = datetime.timezone(datetime.timedelta(hours=-5, minutes=-30))
    assert to_plain(datetime.time(3, 4, tzinfo=offset)) == "03:04:00-05:30"


def test_decimals_uuids_and_paths_become_strings() -> None:
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert to_plain(decimal.Decimal("1.10")) == "1.10"
    assert to_plain(decimal.Decimal("-Infinity")) == "-Infinity"
    assert to_plain(ident) == "12345678-1234-5678-1234-567812345678"
    assert to_plain(Path("/tmp/x")) == "/tmp/x"
    assert to_plain(PurePosixPath("a/b")) == "a/b"
    assert to_plain(PureWindowsPath("C:/a")) == "C:\\a"


class Name(str):
    pass


class Count(int):
    pass


class Ratio(float):
    pass


class Blob(bytes):
    pass


def test_subclasses_of_scalars_and_containers_become_the_base_type() -> None:
    class Items(list[Any]):
        pass

    class Table(dict[str, Any]):
        pass

    value = Table(n=Name("x"), c=Count(3), r=Ratio(0.5), b=Blob(b"z"), items=Items([Count(1)]))
    value["ba"] = bytearray(b"ab")
    value["mv"] = memoryview(b"cd")
    out = to_plain(value)
    assert out == {"n": "x", "c": 3, "r": 0.5, "b": b"z", "items": [1], "ba": b"ab", "mv": b"cd"}
    assert [type(out[k]) for k in out] == [str, int, float, bytes, list, bytes, bytes]
    assert type(out) is dict
    assert to_plain({Name("k"): 1}) == {"k": 1}
    assert type(next(iter(to_plain({Name("k"): 1})))) is str


def test_shared_references_are_not_cycles() -> None:
    shared = [1, {"a": 2}]
    out = to_plain({"one": shared, "two": shared, "list": [shared, shared]})
    assert out == {"one": shared, "two": shared, "list": [shared, shared]}
    walked = to_plain({"one": shared, "two": shared, "list": [shared, shared], "t": (1,)})
    assert walked == {"one": shared, "two": shared, "list": [shared, shared], "t": [1]}
    assert walked["one"] is not shared  # the full walk copies


def test_converted_values_always_cross_the_wire() -> None:
    """What the capsule produces, the host's decoder and checker accept."""
    value = {
        "box": Box(Point(1, 2), (3, 4)),
        "when": datetime.datetime(2026, 1, 1),
        "deep": nest(MAX_DEPTH - 1),
        "big": 2**64 - 1,
        "small": -(2**63),
        "team": [Pair(1, Color.NESTED)],
    }
    plain = to_plain(value)
    frame = decode(encode({"k": "ok", "id": 1, "value": plain}))
    check_plain(frame["value"])
    assert frame["value"] == plain
    deepest = decode(encode({"k": "ok", "id": 1, "value": to_plain(nest(MAX_DEPTH))}))
    check_plain(deepest["value"])


# -- what is refused --------------------------------------------------------------------------


def nest(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def refused(value: object, path: str = "result") -> NotPlainData:
    with pytest.raises(NotPlainData) as info, armed():
        to_plain(value, path)
    return info.value


def gen() -> Iterator[int]:
    yield 1


@pytest.mark.parametrize(
    ("value", "type_name", "where"),
    [
        ({1, 2}, "set", "result"),
        ([0, frozenset()], "frozenset", "result[1]"),
        ({"items": [1, 2, 3, {"bad": {1}}]}, "set", "result['items'][3]['bad']"),
        ({"g": gen()}, "generator", "result['g']"),
        ((lambda: 1), "function", "result"),
        ([len], "builtin_function_or_method", "result[0]"),
        (object(), "object", "result"),
        ({"t": Point}, "type", "result['t']"),
        (1j, "complex", "result"),
        (datetime.timedelta(1), "datetime.timedelta", "result"),
        (range(3), "range", "result"),
        ({"m": sys}, "module", "result['m']"),
        (Exception("x"), "Exception", "result"),
        (Point(1, {2}), "set", "result['y']"),  # type: ignore[arg-type]
        (Pair(1, [object()]), "object", "result['right'][0]"),
        (iter([1]), "list_iterator", "result"),
    ],
)
def test_values_that_are_not_plain_data_name_type_and_path(
    value: object, type_name: str, where: str
) -> None:
    error = refused(value)
    assert (error.type_name, error.path) == (type_name, where)
    assert str(error).startswith(f"{type_name} at {where}")


def test_an_open_file_is_refused(tmp_path: Path) -> None:
    with open(tmp_path / "f", "w") as handle:
        error = refused({"file": handle})
    assert (error.type_name, error.path) == ("_io.TextIOWrapper", "result['file']")


def test_an_unawaited_coroutine_is_refused() -> None:
    async def work() -> None: ...

    coro = work()
    try:
        assert refused([coro]).type_name == "coroutine"
    finally:
        coro.close()


def test_an_object_of_a_user_class_names_its_module() -> None:
    class Local:
        pass

    error = refused({"x": Local()})
    assert error.type_name == (
        "tests.test_convert.test_an_object_of_a_user_class_names_its_module.<locals>.Local"
    )


def test_the_path_prefix_is_the_callers() -> None:
    assert refused({"a": {1}}, path="value").path == "value['a']"


def test_cycles_are_refused() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    error = refused({"l": loop})
    assert (error.type_name, error.path, error.why) == (
        "list",
        "result['l'][1]",
        "it contains itself",
    )
    table: dict[str, Any] = {"a": 1}
    table["self"] = table
    error = refused([table])
    assert (error.type_name, error.path, error.why) == (
        "dict",
        "result[0]['self']",
        "it contains itself",
    )
    box: dict[str, Any] = {}
    point = Point(1, 2, tags=[box])  # type: ignore[list-item]
    box["p"] = point
    error = refused(point)
    assert (error.type_name, error.path) == ("tests.test_convert.Point", "result['tags'][0]['p']")


def test_nesting_deeper_than_the_cap_is_refused() -> None:
    assert to_plain(nest(MAX_DEPTH)) == nest(MAX_DEPTH)
    error = refused(nest(MAX_DEPTH + 1))
    assert error.type_name == "list"
    assert error.path == "result" + "[0]" * MAX_DEPTH
    assert error.why == f"nested deeper than {MAX_DEPTH}"
    assert refused(nest(100_000)).why == f"nested deeper than {MAX_DEPTH}"
    deep_dicts: Any = 0
    for _ in range(MAX_DEPTH + 1):
        deep_dicts = {"k": deep_dicts}
    assert refused(deep_dicts).type_name == "dict"


def test_conversion_is_iterative() -> None:
    """A tool already deep in its stack still gets its deep result converted."""

    def recurse(n: int) -> Any:
        return to_plain(nest(MAX_DEPTH)) if n == 0 else recurse(n - 1)

    assert recurse(sys.getrecursionlimit() - 200) == nest(MAX_DEPTH)


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**100, Count(2**64)])
def test_integers_beyond_64_bits_are_refused(value: int) -> None:
    error = refused({"n": [value]})
    assert (error.type_name, error.path, error.why) == (
        "int",
        "result['n'][0]",
        "does not fit in 64 bits",
    )


@pytest.mark.parametrize(
    ("key", "type_name", "where"),
    [
        (1, "int", "result['d'][1]"),
        (b"k", "bytes", "result['d'][b'k']"),
        (None, "NoneType", "result['d'][None]"),
        (1.5, "float", "result['d'][1.5]"),
        ((1, 2), "tuple", "result['d'] (a key)"),
        (Level.HIGH, "tests.test_convert.Level", "result['d'] (a key)"),
        (frozenset(), "frozenset", "result['d'] (a key)"),
    ],
)
def test_dict_keys_must_be_str(key: object, type_name: str, where: str) -> None:
    error = refused({"d": {"ok": 1, key: 2}})
    assert (error.type_name, error.path, error.why) == (type_name, where, "dict keys must be str")


def test_an_unset_dataclass_field_is_refused() -> None:
    @dataclasses.dataclass
    class Lazy:
        ready: int = dataclasses.field(init=False)

    error = refused(Lazy())
    assert error.why == "its field 'ready' is not set"


# -- no user code runs -----------------------------------------------------------------------

CALLS: list[str] = []
ARMED = False
"""Hostile methods raise only while armed, so the test can build its values first."""


class Called(BaseException):
    """Raised by every hostile method; a BaseException so no ``except Exception`` hides it."""


def hostile(name: str, base: type = object) -> Any:
    method_name = name.rsplit(".", 1)[-1]

    def method(*args: Any, **kwargs: Any) -> Any:
        if ARMED:
            CALLS.append(name)
            raise Called(name)
        if method_name == "__class__":
            return type(args[0])
        original = getattr(base, method_name, None)
        if original is None:
            raise AttributeError(args[1] if len(args) > 1 else method_name)
        return original(*args, **kwargs)

    return method


@contextlib.contextmanager
def armed() -> Iterator[None]:
    global ARMED
    ARMED = True
    try:
        yield
    finally:
        ARMED = False


def converted(value: object) -> Any:
    with armed():
        return to_plain(value)


DUNDERS = [
    "__repr__",
    "__str__",
    "__format__",
    "__eq__",
    "__ne__",
    "__lt__",
    "__le__",
    "__hash__",
    "__iter__",
    "__len__",
    "__getitem__",
    "__contains__",
    "__bool__",
    "__getattr__",
    "__getattribute__",
    "__int__",
    "__index__",
    "__float__",
    "__bytes__",
    "__fspath__",
    "__reduce__",
    "__reduce_ex__",
    "__copy__",
    "__deepcopy__",
    "__instancecheck__",
    "__subclasscheck__",
    "keys",
    "items",
    "values",
    "isoformat",
    "model_dump",
    "_asdict",
]


def with_hostile_dunders(base: type, name: str = "Hostile", **extra: Any) -> type:
    namespace: dict[str, Any] = {d: hostile(f"{name}.{d}", base) for d in DUNDERS}
    namespace["__class__"] = property(hostile(f"{name}.__class__", base))
    namespace.update(extra)
    return type(name, (base,), namespace)


class HostileMeta(type):
    __getattribute__ = hostile("Meta.__getattribute__", type)
    __instancecheck__ = hostile("Meta.__instancecheck__", type)
    __subclasscheck__ = hostile("Meta.__subclasscheck__", type)
    __repr__ = hostile("Meta.__repr__", type)
    __eq__ = hostile("Meta.__eq__", type)
    __hash__ = hostile("Meta.__hash__", type)


@pytest.fixture(autouse=True)
def _no_calls() -> Iterator[None]:
    CALLS.clear()
    yield
    assert CALLS == [], f"user code ran while converting: {CALLS}"


def test_an_object_whose_dunders_raise_is_refused_without_calling_them() -> None:
    cls = with_hostile_dunders(object)
    error = refused({"x": [cls()]})
    assert error.type_name.endswith("Hostile") and error.path == "result['x'][0]"


def test_a_class_lying_about_its_class_is_not_believed() -> None:
    # ``isinstance(liar, dict)`` would ask this property and believe it.
    liar = type("Liar", (), {"__class__": property(lambda self: dict)})()
    assert isinstance(liar, dict)
    assert refused(liar).type_name.endswith("Liar")


def test_a_hostile_metaclass_is_never_asked() -> None:
    cls = HostileMeta("Sneaky", (), {})
    error = refused([cls()])
    assert error.type_name == "tests.test_convert.Sneaky" or error.type_name.endswith("Sneaky")


def test_hostile_scalar_and_container_subclasses_convert_without_their_methods() -> None:
    value = {
        "s": with_hostile_dunders(str, "S")("text"),
        "i": with_hostile_dunders(int, "I")(7),
        "f": with_hostile_dunders(float, "F")(0.5),
        "b": with_hostile_dunders(bytes, "B")(b"raw"),
        "ba": with_hostile_dunders(bytearray, "BA")(b"arr"),
        "l": with_hostile_dunders(list, "L")([1, 2]),
        "t": with_hostile_dunders(tuple, "T")((3, 4)),
        "d": with_hostile_dunders(dict, "D")(k=5),
    }
    key = with_hostile_dunders(str, "K")("key")
    value["keyed"] = {key: 1}
    assert converted(value) == {
        "s": "text",
        "i": 7,
        "f": 0.5,
        "b": b"raw",
        "ba": b"arr",
        "l": [1, 2],
        "t": [3, 4],
        "d": {"k": 5},
        "keyed": {"key": 1},
    }


def test_hostile_rich_types_convert_through_their_base_methods() -> None:
    # C-implemented methods read the value's own fields: the overrides never run.
    when = with_hostile_dunders(datetime.datetime, "When")(2026, 1, 2, 3, 4)
    day = with_hostile_dunders(datetime.date, "Day")(2026, 1, 2)
    clock = with_hostile_dunders(datetime.time, "Clock")(5, 6)
    money = with_hostile_dunders(decimal.Decimal, "Money")("1.5")
    pair = with_hostile_dunders(Pair, "HPair")(1, 2)
    assert converted([when, day, clock, money, pair]) == [
        "2026-01-02T03:04:00",
        "2026-01-02",
        "05:06:00",
        "1.5",
        {"left": 1, "right": 2},
    ]


def test_rich_types_whose_python_code_would_call_overrides_are_refused() -> None:
    # PurePath.__str__ and UUID.__str__ are Python code reading attributes of the value.
    path = with_hostile_dunders(PurePosixPath, "P")("/a/b")
    ident = with_hostile_dunders(uuid.UUID, "U")(int=5)
    for value in (path, ident):
        error = refused({"v": value})
        assert error.path == "result['v']"
        assert "that converting would call" in error.why

    class Sneaky(PurePosixPath):
        def as_posix(self) -> str:  # any name PurePath defines may be what __str__ uses
            CALLS.append("Sneaky.as_posix")
            raise Called("as_posix")

    assert "overrides methods of pathlib.PurePath" in refused(Sneaky("/x")).why

    class Friendly(PurePosixPath):
        """Adds a method and overrides nothing: converted as a path."""

        __slots__ = ()

        def shout(self) -> str:
            return "!"

    class Tagged(uuid.UUID):
        def describe(self) -> str:
            return "id"

    assert converted([Friendly("/x"), Tagged(int=1)]) == [
        "/x",
        "00000000-0000-0000-0000-000000000001",
    ]


def test_hostile_dataclasses_enums_and_models_are_read_by_their_fields() -> None:
    @dataclasses.dataclass
    class Plain:
        a: int
        b: list[int]

    HostilePlain = with_hostile_dunders(Plain, "HostilePlain")
    assert converted(HostilePlain(1, [2])) == {"a": 1, "b": [2]}

    class Shade(enum.Enum):
        DARK = "dark"

        @property
        def value(self) -> str:  # type: ignore[override]
            return hostile("Shade.value")(self) if ARMED else self._value_

        def __repr__(self) -> str:
            return hostile("Shade.__repr__")(self) if ARMED else "Shade.DARK"

    value = {"shade": Shade.DARK, "keyed": {Shade.DARK: 1}}
    assert converted(value) == {
        "shade": "dark",
        "keyed": {"dark": 1},
    }

    class Model(pydantic.BaseModel):
        a: int

        def __getattr__(self, name: str) -> Any:
            if ARMED:
                return hostile(f"Model.__getattr__({name})")(self)
            return super().__getattr__(name)  # type: ignore[misc]

        def __iter__(self) -> Any:  # type: ignore[override]
            return hostile("Model.__iter__")(self) if ARMED else super().__iter__()

        def model_dump(self, **kwargs: Any) -> Any:  # type: ignore[override]
            return hostile("Model.model_dump")(self) if ARMED else super().model_dump(**kwargs)

    assert converted([Model(a=1)]) == [{"a": 1}]


def test_a_fake_model_is_not_a_model() -> None:
    class Fake:
        model_fields: ClassVar[dict[str, Any]] = {"secret": None}
        __pydantic_fields__: ClassVar[dict[str, Any]] = {"secret": None}
        secret = "looks like a field"

        def model_dump(self) -> dict[str, Any]:
            return hostile("Fake.model_dump")(self)  # type: ignore[no-any-return]

    assert refused(Fake()).type_name.endswith("Fake")
