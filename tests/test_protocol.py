"""The wire: length-prefixed msgpack frames, decoded strictly (catalogue section G).

Everything a capsule sends is untrusted: whatever the bytes, the decoder and the checker
raise :class:`BadFrame` (the host then kills the capsule) and nothing else.
"""

from __future__ import annotations

import contextlib
import struct
import subprocess
import sys
import textwrap
from collections.abc import Generator
from pathlib import Path
from typing import Any
from unittest import mock

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capsule import protocol as p
from capsule.protocol import (
    HEADER,
    MAX_DEPTH,
    MAX_FRAME,
    BadFrame,
    FrameDecoder,
    FrameTooLarge,
    as_map,
    check_plain,
    decode,
    encode,
    frame,
    within_budget,
)

FUZZ = settings(
    max_examples=400,
    deadline=None,  # a loaded 2-core machine: no per-example timing
    database=None,  # leave no .hypothesis folder in the shared tree
    suppress_health_check=[HealthCheck.too_slow],
)
FUZZ_VALUES = settings(FUZZ, max_examples=120)  # generating nested values is the slow part

SAMPLE: dict[str, Any] = {
    "k": "ok",
    "id": 7,
    "value": {"s": "héllo", "i": -(2**63), "u": 2**64 - 1, "f": 1.5, "b": b"\x00\xff"},
    "more": [None, True, False, [], {}, "", b""],
}


def strict(body: bytes) -> Any:
    """What the host does with a frame body from a capsule."""
    value = decode(body)
    check_plain(value)
    return value


def nest(depth: int) -> Any:
    value: Any = None
    for _ in range(depth):
        value = [value]
    return value


# -- framing ----------------------------------------------------------------------------------


def test_a_frame_is_a_big_endian_length_and_a_msgpack_body() -> None:
    data = frame(SAMPLE)
    (size,) = struct.unpack(">I", data[:4])
    assert size == len(data) - 4 and data[4:] == encode(SAMPLE)
    assert decode(data[4:]) == SAMPLE
    decoder = FrameDecoder()
    assert decoder.feed(data) == [data[4:]] and decoder.pending == 0
    assert strict(data[4:]) == SAMPLE


def test_bytes_and_str_stay_distinct() -> None:
    assert decode(encode({"s": "x", "b": b"x"})) == {"s": "x", "b": b"x"}
    assert type(decode(encode(b"x"))) is bytes and type(decode(encode("x"))) is str


def test_frames_split_at_every_byte_boundary() -> None:
    values = [SAMPLE, {"k": "console", "data": "x" * 300}, {"k": "ok", "id": 1, "value": None}]
    stream = b"".join(frame(v) for v in values)
    bodies = [encode(v) for v in values]
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        got = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert got == bodies, cut
        assert decoder.pending == 0
    for second in range(0, len(stream), 7):  # three chunks
        for first in range(0, second + 1, 5):
            decoder = FrameDecoder()
            got = [*decoder.feed(stream[:first]), *decoder.feed(stream[first:second])]
            got += decoder.feed(stream[second:])
            assert got == bodies


def test_one_byte_at_a_time() -> None:
    frames = [frame(SAMPLE), frame([1, 2, 3])]
    stream = b"".join(frames)
    decoder = FrameDecoder()
    got: list[bytes] = []
    for i in range(len(stream)):
        got += decoder.feed(stream[i : i + 1])
        done = sum(len(f) for f in frames[: len(got)])
        assert decoder.pending == i + 1 - done  # held: only the incomplete frame
    assert [decode(b) for b in got] == [SAMPLE, [1, 2, 3]]
    assert decoder.pending == 0


def test_many_frames_in_one_chunk_and_a_partial_tail() -> None:
    frames = [frame({"k": "ok", "id": i, "value": "v" * (i % 13)}) for i in range(2000)]
    tail = frame({"k": "ok", "id": -1, "value": None})
    decoder = FrameDecoder()
    got = decoder.feed(b"".join(frames) + tail[:3])
    assert [decode(b)["id"] for b in got] == list(range(2000))
    assert decoder.pending == 3
    assert [decode(b) for b in decoder.feed(tail[3:])] == [{"k": "ok", "id": -1, "value": None}]


def test_an_empty_body_is_a_frame_that_does_not_decode() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(HEADER.pack(0) * 2) == [b"", b""]
    with pytest.raises(BadFrame):
        decode(b"")


def test_g01_a_length_over_the_cap_is_refused_before_the_body_arrives() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameTooLarge, match="4294967295 bytes is over the cap"):
        decoder.feed(b"\xff\xff\xff\xff")  # no body follows: nothing waits for it
    assert decoder.pending == 4
    small = FrameDecoder(max_frame=100)
    assert small.feed(HEADER.pack(100)) == [] and small.pending == 4  # at the cap: waits
    with pytest.raises(FrameTooLarge):
        FrameDecoder(max_frame=100).feed(HEADER.pack(101))
    split = FrameDecoder()
    assert split.feed(HEADER.pack(MAX_FRAME + 1)[:2]) == []
    with pytest.raises(FrameTooLarge):
        split.feed(HEADER.pack(MAX_FRAME + 1)[2:])
    # After good frames in the same chunk, the bad header is still caught.
    with pytest.raises(FrameTooLarge):
        FrameDecoder().feed(frame(1) + frame(2) + b"\xff\xff\xff\xff")
    assert issubclass(FrameTooLarge, BadFrame) and issubclass(BadFrame, ValueError)


@pytest.mark.parametrize(
    "body",
    [
        b"\xdd\x05\xf5\xe1\x00",  # array32 of 100M elements
        b"\xdf\x00\x0f\x42\x40",  # map32 of 1M pairs
        b"\xdb\xff\xff\xff\xff",  # str32 of 4 GiB
        b"\xc6\xff\xff\xff\xff",  # bin32 of 4 GiB
        b"\xc9\xff\xff\xff\xff\x01",  # ext32 of 4 GiB
        b"\xdc\xff\xff",  # array16 of 65535
        b"\x9f",  # fixarray of 15, empty
    ],
)
def test_g02_a_small_frame_declaring_a_huge_container_is_refused(body: bytes) -> None:
    decoder = FrameDecoder()
    (got,) = decoder.feed(HEADER.pack(len(body)) + body)
    with pytest.raises(BadFrame):
        decode(got)


def test_g04_deep_nesting_is_refused() -> None:
    for depth in (1025, 100_000):
        with pytest.raises(BadFrame, match="StackError"):
            decode(b"\x91" * depth + b"\xc0")
    # msgpack itself accepts 1024 levels; the checker caps every value at MAX_DEPTH.
    deep = decode(b"\x91" * 1024 + b"\xc0")
    with pytest.raises(BadFrame, match=f"nested deeper than {MAX_DEPTH}"):
        check_plain(deep)
    check_plain(nest(MAX_DEPTH))
    with pytest.raises(BadFrame):
        check_plain(nest(MAX_DEPTH + 1))
    with pytest.raises(BadFrame):
        check_plain({"a": [{"b": nest(MAX_DEPTH - 2)}]})
    check_plain({"a": [{"b": nest(MAX_DEPTH - 3)}]})
    with pytest.raises(BadFrame):
        check_plain(nest(11), max_depth=10)
    check_plain(nest(10), max_depth=10)


_PEAK = textwrap.dedent(
    """
    import resource, sys
    from capsule.protocol import BadFrame, decode
    size = int(sys.argv[1])
    body = b"\\xdd" + size.to_bytes(4, "big") + b"\\x80" * size  # array32 of empty maps
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        decode(body)
        outcome = "decoded"
    except BadFrame as exc:
        outcome = str(exc)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(grown * 1024, outcome)
    """
)


def test_g03_a_frame_of_empty_containers_is_refused_within_a_bounded_peak() -> None:
    # 6 MiB of empty maps: a gigabyte-class amplification (~72x, ~430 MiB here) before
    # the budget; now refused once the containers pass the floor of 64 MiB.
    size = 6 * 1024 * 1024
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, str(size)],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
        check=True,
    )
    grown, outcome = done.stdout.split(" ", 1)
    assert "decodes to more than" in outcome
    assert int(grown) < 24 * size, f"peak RSS grew by {int(grown) >> 20} MiB"


def test_g03_the_budget_scales_with_the_frame_and_spares_plain_data() -> None:
    dense = encode([{}] * 200_000)  # 200 KB of empty maps: ~13 MB decoded
    with mock.patch.object(p, "_UNCOUNTED", 0), mock.patch.object(p, "DECODE_FLOOR", 0):
        with pytest.raises(BadFrame, match="decodes to more than 16 times its size"):
            decode(dense)
        assert not within_budget(dense)
        rows = [{"id": i, "name": f"row {i}", "tags": ["a", "b"]} for i in range(2_000)]
        text = [{"id": i, "text": "漢字かなカナ" * 3} for i in range(2_000)]  # counted exactly
        for value in (rows, text, SAMPLE, [b"\x80\x90\xdc" * 1000] * 3):
            assert decode(encode(value)) == value
            assert within_budget(encode(value))
    assert decode(dense) == [{}] * 200_000  # small frames are never counted
    assert within_budget(dense)


@pytest.mark.parametrize(
    "body", [b"\xc0\xc0", encode({"k": "ok"}) + encode({"k": "ok"}), b"\x01\x00"]
)
def test_g08_trailing_bytes_are_refused(body: bytes) -> None:
    with pytest.raises(BadFrame, match="ExtraData"):
        decode(body)


@pytest.mark.parametrize(
    "body",
    [
        b"\xd4\x05\x00",  # fixext1, type 5
        b"\xd5\x00\x00\x00",  # fixext2, type 0
        b"\xc7\x00\x01",  # ext8 of length 0, type 1
        b"\x81\xa1v\xd4\x7f\x00",  # {"v": ext 127}
        msgpack.packb(msgpack.ExtType(42, b"pickle?")),
    ],
)
def test_g12_ext_types_are_refused(body: bytes) -> None:
    with pytest.raises(BadFrame, match="ext type"):
        decode(body)


@pytest.mark.parametrize(
    "body",
    [
        bytes.fromhex("d6ff00000000"),  # timestamp32: 1970
        bytes.fromhex("d7ff") + b"\x00" * 8,  # timestamp64
        bytes.fromhex("c70cff") + b"\x00" * 4 + (2**63 - 1).to_bytes(8, "big"),  # extreme
        bytes.fromhex("c70cff") + b"\x00" * 4 + (2**63).to_bytes(8, "big"),  # negative
    ],
)
def test_g12_the_timestamp_extension_is_caught_by_the_checker(body: bytes) -> None:
    # msgpack decodes ext -1 itself, without the ext hook: check_plain catches it.
    value = decode(body)
    assert type(value).__name__ == "Timestamp"
    with pytest.raises(BadFrame, match="Timestamp is not allowed"):
        check_plain(value)
    wrapped = decode(b"\x82\xa1k\xa2ok\xa5value\x91" + body)
    with pytest.raises(BadFrame, match="Timestamp"):
        check_plain(wrapped["value"])


def test_a_timestamp_with_impossible_nanoseconds_is_refused_by_the_decoder() -> None:
    with pytest.raises(BadFrame):
        decode(bytes.fromhex("d7ff") + b"\xff" * 8)


@pytest.mark.parametrize(
    "body",
    [
        b"\xa3\xa2\xff\xfe",  # fixstr of invalid UTF-8
        b"\xa3\xed\xa0\x80",  # an encoded surrogate (CESU-8), not UTF-8
        b"\x81\xa2\xc3\x28\x01",  # an invalid key
        b"\x91\xd9\x01\xff",  # str8 inside an array
    ],
)
def test_invalid_utf8_is_refused(body: bytes) -> None:
    with pytest.raises(BadFrame):
        decode(body)


def test_surrogates_cannot_be_encoded() -> None:
    with pytest.raises(UnicodeEncodeError):
        encode("\ud800")


@pytest.mark.parametrize(
    "body",
    [
        b"\x81\x01\x02",  # {1: 2}
        b"\x81\xc0\x02",  # {None: 2}
        b"\x81\xcb" + struct.pack(">d", 1.5) + b"\x02",  # {1.5: 2}
        b"\x81\x90\x02",  # {[]: 2}
        b"\x81\x80\x02",  # {{}: 2}
        b"\x81\xc3\x02",  # {True: 2}
    ],
)
def test_non_str_map_keys_are_refused_by_the_decoder(body: bytes) -> None:
    with pytest.raises(BadFrame):
        decode(body)


def test_bytes_map_keys_are_refused_by_the_checker() -> None:
    # strict_map_key admits bytes keys; the checker and as_map do not.
    top = decode(b"\x81\xc4\x01k\xa2ok")
    assert top == {b"k": "ok"}
    with pytest.raises(BadFrame, match="map keys must be str, not bytes"):
        as_map(top)
    with pytest.raises(BadFrame, match="map keys must be str, not bytes"):
        check_plain(top)
    nested = decode(encode({"k": "ok", "value": [{"fine": 1}]})[:-7] + b"\x81\xc4\x04fine\x01")
    assert nested["value"] == [{b"fine": 1}]
    with pytest.raises(BadFrame, match="map keys must be str"):
        check_plain(nested["value"])
    check_plain(decode(encode({"k": "ok", "value": [{"fine": 1}]}))["value"])


def test_as_map_wants_a_map() -> None:
    assert as_map({"k": "ok"}) == {"k": "ok"}
    for value in ([], "k", 1, None, b"map"):
        with pytest.raises(BadFrame, match="expected a map"):
            as_map(value)


def test_encode_takes_only_plain_data() -> None:
    with pytest.raises(TypeError):
        encode({1, 2})
    with pytest.raises(TypeError):
        encode(object())
    with pytest.raises(OverflowError):
        encode(2**64)
    assert decode(encode((1, 2))) == [1, 2]  # tuples arrive as lists


def test_error_kinds_and_frame_kinds_are_distinct_names() -> None:
    kinds = [v for k, v in vars(p).items() if k.startswith("K_")]
    assert len(kinds) == len(set(kinds)) and p.K_OK == "ok" and p.K_ERR == "err"
    errors = {p.E_TOOL, p.E_NOT_SERIALIZABLE, p.E_TOO_LARGE, p.E_BAD_CALL, p.E_CANCELLED}
    assert errors == p.ERROR_KINDS


# -- fuzzing (G09): whatever the bytes, only BadFrame --------------------------------------------


def only_bad_frames(stream: bytes, chunks: list[int], max_frame: int = 1 << 16) -> list[Any]:
    """Feed ``stream`` in chunks and decode every frame; return what passed."""
    decoder = FrameDecoder(max_frame)
    passed: list[Any] = []
    position = 0
    try:
        for size in [*chunks, len(stream)]:
            for body in decoder.feed(stream[position : position + size]):
                with contextlib.suppress(BadFrame):
                    passed.append(strict(body))
            position += size
    except BadFrame:
        pass
    return passed


def assert_plain(value: Any, depth: int = 0) -> None:
    assert depth <= MAX_DEPTH
    if isinstance(value, list):
        for item in value:  # pyright: ignore[reportUnknownVariableType]
            assert_plain(item, depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():  # pyright: ignore[reportUnknownVariableType]
            assert type(key) is str
            assert_plain(item, depth + 1)
    else:
        assert type(value) in (str, int, float, bool, bytes, type(None))


plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=5), children, max_size=5)
    ),
    max_leaves=20,
)


@FUZZ_VALUES
@given(value=plain_values, cut=st.integers(min_value=0, max_value=10_000))
def test_fuzz_plain_values_round_trip(value: Any, cut: int) -> None:
    data = frame(value)
    cut = cut % (len(data) + 1)
    decoder = FrameDecoder()
    (body,) = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
    assert strict(body) == value


@FUZZ
@given(data=st.binary(max_size=300), chunks=st.lists(st.integers(0, 50), max_size=8))
def test_fuzz_random_bytes_raise_only_bad_frame(data: bytes, chunks: list[int]) -> None:
    for value in only_bad_frames(data, chunks):
        assert_plain(value)


@FUZZ
@given(body=st.binary(max_size=200))
def test_fuzz_random_bodies_raise_only_bad_frame(body: bytes) -> None:
    try:
        value = strict(body)
    except BadFrame:
        return
    assert_plain(value)


@FUZZ_VALUES
@given(
    values=st.lists(plain_values, min_size=1, max_size=4),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 7)), min_size=1, max_size=6),
    chunks=st.lists(st.integers(0, 40), max_size=6),
)
def test_fuzz_bit_flips_of_valid_frames_raise_only_bad_frame(
    values: list[Any], flips: list[tuple[int, int]], chunks: list[int]
) -> None:
    stream = bytearray(b"".join(frame(v) for v in values))
    for position, bit in flips:
        stream[position % len(stream)] ^= 1 << bit
    for value in only_bad_frames(bytes(stream), chunks):
        assert_plain(value)


@FUZZ_VALUES
@given(
    value=plain_values,
    edit=st.sampled_from(["truncate", "duplicate", "splice", "insert"]),
    where=st.integers(0, 10_000),
    junk=st.binary(min_size=1, max_size=20),
)
def test_fuzz_truncated_duplicated_and_spliced_frames_raise_only_bad_frame(
    value: Any, edit: str, where: int, junk: bytes
) -> None:
    data = frame(value)
    body = data[4:]
    i = where % (len(body) + 1)
    if edit == "truncate":
        mangled = body[:i]
    elif edit == "duplicate":
        mangled = body + body
    elif edit == "splice":
        mangled = body[:i] + junk + body[i + len(junk) :]
    else:
        mangled = body[:i] + junk + body[i:]
    for value_out in only_bad_frames(HEADER.pack(len(mangled)) + mangled, []):
        assert_plain(value_out)


@contextlib.contextmanager
def counted(floor: int) -> Generator[None]:
    """Every frame decoded by counting its containers, with a budget of ``floor`` bytes."""
    with (
        mock.patch.object(p, "_UNCOUNTED", -1),
        mock.patch.object(p, "_CONTAINER_COST", 1 << 40),  # the C pre-count never vouches
        mock.patch.object(p, "DECODE_FLOOR", floor),
    ):
        yield


@FUZZ_VALUES
@given(value=plain_values)
def test_fuzz_plain_values_round_trip_through_the_counted_decoder(value: Any) -> None:
    with counted(floor=1 << 20):
        assert strict(encode(value)) == value


@FUZZ
@given(body=st.binary(max_size=200))
def test_fuzz_random_bodies_raise_only_bad_frame_in_the_counted_decoder(body: bytes) -> None:
    with counted(floor=64):
        try:
            value = strict(body)
        except BadFrame:
            return
    assert_plain(value)
