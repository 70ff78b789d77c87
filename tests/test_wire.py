"""The code sandbox's own msgpack subset (``capsule._wire``) against the real msgpack."""

from __future__ import annotations

import enum
import random
import struct
from collections import OrderedDict
from typing import Any

import msgpack  # pyright: ignore[reportMissingTypeStubs]
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capsule import _guest, _wire, protocol


def packb(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # pyright: ignore


EDGES: list[Any] = [
    None,
    True,
    False,
    0,
    127,
    128,
    255,
    256,
    65535,
    65536,
    2**32 - 1,
    2**32,
    2**64 - 1,
    -1,
    -32,
    -33,
    -128,
    -129,
    -32768,
    -32769,
    -(2**31),
    -(2**31) - 1,
    -(2**63),
    0.0,
    -0.0,
    1.5,
    float("inf"),
    1e300,
    "",
    "x" * 31,
    "x" * 32,
    "x" * 255,
    "x" * 256,
    "x" * 65536,
    "é€😀",
    b"",
    b"\x00" * 255,
    b"\x00" * 256,
    b"\xff" * 65536,
    [],
    list(range(15)),
    list(range(16)),
    list(range(65536)),
    {},
    {str(i): i for i in range(15)},
    {str(i): i for i in range(16)},
    {"nested": [{"a": [1, [2, [3, {"b": None}]]]}]},
]


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.5:
        return rng.choice([*EDGES[:40], rng.randint(-(2**63), 2**64 - 1), rng.random()])
    if roll < 0.75:
        return [_random_value(rng, depth + 1) for _ in range(rng.choice([0, 1, 15, 16, 17]))]
    return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.choice([0, 1, 15, 16, 17]))}


@pytest.mark.parametrize("value", EDGES, ids=range(len(EDGES)))
def test_same_bytes_as_msgpack_and_back(value: Any) -> None:
    assert _wire.encode(value) == packb(value)
    assert _wire.decode(packb(value)) == value


def test_random_values_agree_with_msgpack() -> None:
    rng = random.Random(5)
    for _ in range(500):
        value = _random_value(rng)
        data = packb(value)
        assert _wire.encode(value) == data
        assert _wire.decode(data) == protocol.decode(data)


def test_subclasses_and_tuples_encode_as_their_base_type() -> None:
    class Level(enum.IntEnum):
        HIGH = 3

    class Name(str):
        pass

    value = (Level.HIGH, Name("n"), OrderedDict(a=1), bytearray(b"ab"), memoryview(b"c"))
    assert _wire.encode(value) == packb([3, "n", {"a": 1}, b"ab", b"c"])
    assert _wire.encode({Name("k"): 1}) == packb({"k": 1})


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (2**64, OverflowError),
        (-(2**63) - 1, OverflowError),
        ({1: 2}, TypeError),
        (object(), TypeError),
        ({1, 2}, TypeError),
        ("\ud800", ValueError),
    ],
)
def test_what_is_not_plain_data_is_refused(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        _wire.encode(value)


def test_self_containing_values_stop_at_the_depth_limit() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="recursion"):
        _wire.encode(loop)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never used
        bytes.fromhex("d40500"),  # fixext 1
        bytes.fromhex("c70105ff"),  # ext 8
        b"\xc0\xc0",  # trailing bytes
        b"\xa5abc",  # truncated str
        b"\x92\x01",  # truncated array
        b"\xdd\x05\xf5\xe1\x00",  # an array of 100M items with none there
        b"\x81\x01\x02",  # an int key
        b"\x81\xc4\x01k\x02",  # a bytes key
        b"\xa2\xff\xfe",  # not UTF-8
        b"\x91" * 600 + b"\xc0",  # too deep
        b"\xcd\x01",  # truncated uint16
    ],
)
def test_decode_refuses_what_is_not_plain_msgpack(data: bytes) -> None:
    with pytest.raises(_wire.WireError):
        _wire.decode(data)


def test_float32_from_other_encoders() -> None:
    assert _wire.decode(b"\xca" + struct.pack(">f", 0.5)) == 0.5


def test_the_guest_speaks_the_protocols_frame_kinds() -> None:
    for name in ("SETUP", "READY", "RUN", "USE", "DROP", "DONE", "OK", "ERR"):
        assert getattr(_guest, f"K_{name}") == getattr(protocol, f"K_{name}")
    assert protocol.MAX_FRAME == _guest.MAX_FRAME
    import ast

    assert (ast.PyCF_ONLY_AST, ast.PyCF_ALLOW_TOP_LEVEL_AWAIT) == (
        _guest.PyCF_ONLY_AST,
        _guest.PyCF_ALLOW_TOP_LEVEL_AWAIT,
    )


# -- the fast paths: the same bytes and the same errors as the general one ----------------

FUZZ = settings(
    max_examples=300,
    deadline=None,  # a loaded 2-core machine: no per-example timing
    database=None,  # leave no .hypothesis folder in the shared tree
    suppress_health_check=[HealthCheck.too_slow],
)

_item = (
    st.integers(min_value=-(2**64), max_value=2**65)  # also just outside what fits
    | st.sampled_from([-33, -32, -1, 0, 127, 128, 255, 256, 65535, 65536, 2**64 - 1, 2**64])
    | st.text(max_size=40)  # around 31 and 32 bytes of UTF-8, surrogates included
    | st.text(alphabet="x\u00e9\u20ac", min_size=8, max_size=34)
    | st.none()
    | st.booleans()
    | st.floats(allow_nan=False)
    | st.binary(max_size=40)
    | st.lists(st.integers(min_value=-1000, max_value=1000), max_size=3)
    | st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2)
    | st.sampled_from([object(), {1: 2}, {1, 2}])
)


def _outcome(encode: Any, value: Any) -> Any:
    try:
        return encode(value)
    except (TypeError, ValueError, OverflowError) as exc:
        return type(exc)


@FUZZ
@given(args=st.lists(_item, max_size=18).map(tuple))
def test_encode_args_is_encode(args: tuple[Any, ...]) -> None:
    expected = _outcome(_wire.encode, args)
    assert _outcome(_wire.encode_args, args) == expected
    if isinstance(expected, bytes):
        assert expected == packb(args)


@FUZZ
@given(value=st.integers(min_value=-(2**64), max_value=2**65))
def test_encode_int_is_encode(value: int) -> None:
    assert _outcome(_wire.encode_int, value) == _outcome(_wire.encode, value)
    if -(2**63) <= value < 2**64:
        assert _wire.encode_int(value) == packb(value)


def test_encode_args_takes_subclasses_as_their_base_type() -> None:
    class Level(enum.IntEnum):
        HIGH = 3

    class Name(str):
        pass

    args = (True, Level.HIGH, Name("n"), "\ud800")
    assert _outcome(_wire.encode_args, args[:3]) == packb([True, 3, "n"])
    assert _outcome(_wire.encode_args, args) is UnicodeEncodeError
