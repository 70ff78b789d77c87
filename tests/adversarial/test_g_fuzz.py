"""G. Framing fuzz at every frame reader, up to the frames' kinds and fields (G09, G11).

``tests/test_protocol.py`` and ``tests/test_wire.py`` fuzz the codecs themselves. Here
the fuzz goes one level up, to what reads a stream of frames and acts on them:

* the host's reader of a subprocess capsule (:class:`Connection`, with calls in flight);
* the host's reader of the code sandbox (:class:`Guest`) and its checks of ``use`` and
  ``done`` frames;
* the capsule's reader of the host (:class:`capsule._serve.Capsule`, its serve loop);
* the guest's reader of the host (``capsule._guest._Frames``).

Each gets arbitrary bytes, frames of known kinds with fields of any type, unknown kinds,
truncation, bit flips, huge declared lengths, deep nesting and invalid UTF-8; each must
end in the typed error its code defines (``BadFrame``; the guest's ``_HostBroke``) or
read on, never another exception and never a hang, and calls in flight end with a typed
host error. Memory stays flat over hundreds of inputs, and a host whose capsule writes
garbage keeps serving (end to end, with a real capsule process).

Bounded for CI: a few hundred examples each, a few seconds each on a loaded machine.
"""

from __future__ import annotations

import asyncio  # the capsule's own loop is asyncio (capsule/_serve.py)
import contextlib
import gc
import logging
import os
import random
import tracemalloc
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capsule import _guest
from capsule import protocol as p
from capsule._serve import Capsule
from host import Host, HostError
from host._events import EventBus
from host.audit._reading import read_audit
from host.capsules._code_results import check_done
from host.capsules._guest_pipe import Guest
from host.capsules._sandbox import CodeSandbox, _Run  # pyright: ignore[reportPrivateUsage]
from host.capsules._transport import Connection

pytestmark = pytest.mark.anyio

FUZZ = settings(
    max_examples=60,
    deadline=None,  # a loaded 2-core machine: no per-example timing
    database=None,  # leave no .hypothesis folder in the shared tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
GENEROUS = 20.0
"""Seconds for what should end at once (a loaded machine); a hang fails the example."""

# -- what the fuzz sends -------------------------------------------------------------------

KINDS = [
    p.K_LOAD,
    p.K_CALL,
    p.K_CANCEL,
    p.K_ANSWER,
    p.K_LOADING,
    p.K_LOADED,
    p.K_FAILED,
    p.K_READY,
    p.K_OK,
    p.K_ERR,
    p.K_CONSOLE,
    p.K_CTX,
    p.K_EVENT,
    p.K_SETUP,
    p.K_RUN,
    p.K_USE,
    p.K_DROP,
    p.K_DONE,
]
FIELDS = [
    "id",
    "req",
    "run",
    "tool",
    "args",
    "kwargs",
    "value",
    "error",
    "op",
    "stream",
    "data",
    "files",
    "as",
    "ok",
    "wait",
    "source",
    "stdout",
    "warnings",
    "ctx",
    "file",
    "exports",
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.sampled_from([0, 1, 2, 3, -1])  # ids of calls in flight, and near them
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.sampled_from(["tool_error", "cancelled", "stdout", "emit", "get", "result", "file"])
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)
ERROR_FIELDS = ["type", "message", "traceback", "path", "limit"]
kinds = st.sampled_from(KINDS) | st.text(max_size=8) | scalars | st.lists(scalars, max_size=2)


@st.composite
def envelopes(draw: st.DrawFn) -> bytes:
    """One frame of a known (or unknown) kind whose fields have any type."""
    msg: dict[str, Any] = {"k": draw(kinds)}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=6, unique=True)):
        msg[name] = draw(values)
    if draw(st.booleans()):
        error: dict[str, Any] = {"kind": draw(st.sampled_from(sorted(p.ERROR_KINDS)) | scalars)}
        for name in draw(st.lists(st.sampled_from(ERROR_FIELDS), max_size=5, unique=True)):
            error[name] = draw(values)
        msg["error"] = error
    return p.frame(msg)


DEEP = [
    b"\x91" * 600 + b"\xc0",  # deeper than the checks allow
    b"\x91" * 2000 + b"\xc0",  # deeper than msgpack's own stack
    b"\x81\xa1k" + b"\x91" * 1100 + b"\xc0",  # a kind nested 1,100 deep
    b"\x82\xa1k\xa2ok\xa5value" + b"\x81\xa1a" * 700 + b"\xc0",  # a value of nested maps
]
ODD = [
    b"\x81\xa1k\xa2\xff\xfe",  # a kind in invalid UTF-8
    b"\x81\xa1k\xa3\xed\xa0\x80",  # an encoded lone surrogate
    b"\x82\xa1k\xa2ok\xa2id\xd4\x05\x00",  # an ext type as the id
    b"\x82\xa1k\xa2ok\xa2id\xd6\xff\x00\x00\x00\x01",  # a timestamp as the id
    b"\x81\xc4\x01k\xa2ok",  # a bytes key
    b"\xdd\x7f\xff\xff\xff",  # an array declaring two billion items
    b"\xc0\xc0",  # two values in one frame
    b"",  # an empty frame
]


@st.composite
def pieces(draw: st.DrawFn) -> bytes:
    """One piece of a stream: a frame of any sort, whole or damaged, or raw bytes."""
    choice = draw(st.integers(0, 9))
    if choice <= 4:
        piece = draw(envelopes())
    elif choice == 5:
        body = draw(st.sampled_from(DEEP + ODD))
        piece = p.HEADER.pack(len(body)) + body
    elif choice == 6:  # a huge declared length, then whatever
        size = draw(st.sampled_from([p.MAX_FRAME + 1, 0xFFFFFFFF, 1 << 31]))
        piece = p.HEADER.pack(size) + draw(st.binary(max_size=16))
    elif choice == 7:
        piece = draw(st.binary(max_size=64))
    else:
        piece = draw(envelopes())
        body = bytearray(piece)
        for at, bit in draw(st.lists(st.tuples(st.integers(0), st.integers(0, 7)), max_size=4)):
            body[at % len(body)] ^= 1 << bit
        piece = bytes(body)
    if draw(st.integers(0, 5)) == 0:  # truncated
        piece = piece[: draw(st.integers(0, len(piece)))]
    return piece


streams = st.lists(pieces(), min_size=1, max_size=6).map(b"".join)
chunkings = st.lists(st.integers(1, 64), max_size=6)


def chunked(data: bytes, sizes: list[int]) -> Iterator[bytes]:
    """``data`` in pieces of these sizes, then the rest."""
    at = 0
    for size in sizes:
        if at >= len(data):
            return
        yield data[at : at + size]
        at += size
    if at < len(data):
        yield data[at:]


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# -- the host's reader of a subprocess capsule ---------------------------------------------


async def host_reads(data: bytes) -> tuple[list[str], list[object]]:
    """Play a capsule that writes ``data`` and closes its output, with calls 1 and 2 in
    flight: (the violations reported, the calls' outcomes)."""
    to_capsule_r, to_capsule_w = os.pipe()
    from_capsule_r, from_capsule_w = os.pipe()
    violations: list[str] = []
    conn = Connection(
        to_capsule_w,
        from_capsule_r,
        events=EventBus(),
        session="s",
        on_violation=violations.append,
    )
    outcomes: list[object] = []
    try:
        async with anyio.create_task_group() as tg:

            async def call(call_id: int, *, task_status: anyio.abc.TaskStatus[None]) -> None:
                task_status.started()  # the call below is registered before it awaits
                try:
                    outcomes.append(await conn.call(call_id, "t", b"\x80", 60.0))
                except HostError as exc:
                    outcomes.append(exc)

            for call_id in (1, 2):
                await tg.start(call, call_id)
            write_all(from_capsule_w, data)  # at most a few KiB: the pipe holds it
            os.close(from_capsule_w)
            from_capsule_w = -1
            with anyio.fail_after(GENEROUS):  # a reader that hangs fails here
                await conn.run()  # any exception but a handled BadFrame escapes here
    finally:
        conn.close()
        for fd in (to_capsule_r, from_capsule_w):
            if fd >= 0:
                os.close(fd)
    return violations, outcomes


@FUZZ
@given(data=streams)
async def test_fuzz_the_hosts_capsule_reader_ends_in_a_violation_or_reads_on(data: bytes) -> None:
    violations, outcomes = await host_reads(data)
    assert len(violations) <= 1
    assert len(outcomes) == 2  # every call in flight ended, with a value or a typed error
    for outcome in outcomes:
        assert not isinstance(outcome, BaseException) or isinstance(outcome, HostError)


async def test_the_hosts_capsule_reader_on_each_odd_frame() -> None:
    """Every hand-made odd frame, alone: a violation, and the calls fail typed."""
    for body in DEEP + ODD:
        violations, outcomes = await host_reads(p.HEADER.pack(len(body)) + body)
        assert len(violations) == 1, body[:20]
        assert all(isinstance(o, HostError) for o in outcomes)


# -- the host's reader of the code sandbox -------------------------------------------------


class _Process:
    """What :class:`Guest` asks of its process here (never killed: there is none)."""

    pid = -1
    returncode: int | None = None


async def guest_frames(data: bytes, sizes: list[int]) -> list[dict[str, Any]]:
    """The frames :class:`Guest` reads from a guest that writes ``data`` in these pieces
    and closes its output. Raises ``BadFrame`` as ``Guest.next`` does."""
    to_guest_r, to_guest_w = os.pipe()
    from_guest_r, from_guest_w = os.pipe()
    guest = Guest(cast(Any, _Process()), to_guest_w, from_guest_r)
    frames: list[dict[str, Any]] = []
    try:
        for piece in chunked(data, sizes):
            write_all(from_guest_w, piece)
        os.close(from_guest_w)
        from_guest_w = -1
        with anyio.fail_after(GENEROUS):
            while (msg := await guest.next()) is not None:
                frames.append(msg)
    finally:
        guest.close()
        for fd in (to_guest_r, from_guest_w):
            if fd >= 0:
                os.close(fd)
    return frames


def sandbox_checks(msg: dict[str, Any]) -> None:
    """What the sandbox's run loop checks of each frame (``CodeSandbox._serve``)."""
    kind = msg.get("k")
    if kind == p.K_USE:
        CodeSandbox._check_use(msg, _Run(1))  # pyright: ignore[reportPrivateUsage]
    elif kind == p.K_DROP:
        if type(msg.get("id")) is not int:
            raise p.BadFrame("drop frames carry the int id of a call")
    elif kind == p.K_DONE:
        check_done(msg, 1, 1024)
    else:
        raise p.BadFrame(f"unexpected frame {kind!r} from the sandbox")


@FUZZ
@given(data=streams, sizes=chunkings)
async def test_fuzz_the_hosts_sandbox_reader_raises_only_bad_frame(
    data: bytes, sizes: list[int]
) -> None:
    try:
        frames = await guest_frames(data, sizes)
    except p.BadFrame:
        return
    for msg in frames:
        try:
            sandbox_checks(msg)
        except p.BadFrame:
            return


@FUZZ
@given(msg=values, kind=st.sampled_from([p.K_USE, p.K_DONE, p.K_DROP]), run=st.integers(0, 2))
def test_fuzz_use_and_done_frames_with_any_fields_raise_only_bad_frame(
    msg: Any, kind: str, run: int
) -> None:
    frame: dict[str, Any] = dict(msg) if isinstance(msg, dict) else {"value": msg}  # pyright: ignore[reportUnknownArgumentType]
    frame["k"] = kind
    frame.setdefault("run", run)
    with contextlib.suppress(p.BadFrame):
        sandbox_checks(p.as_map(p.decode(p.encode(frame))))  # as it comes off the wire


# -- the capsule's reader of the host ------------------------------------------------------


def capsule_reads(data: bytes, sizes: list[int]) -> BaseException | None:
    """Run a capsule's serve loop on ``data`` (then EOF); what it ended with."""
    from_host_r, from_host_w = os.pipe()
    null = os.open(os.devnull, os.O_WRONLY)  # its replies go nowhere
    capsule = Capsule(from_host_r, null)
    try:
        for piece in chunked(data, sizes):
            write_all(from_host_w, piece)
        os.close(from_host_w)
        from_host_w = -1

        logged: list[dict[str, Any]] = []

        async def serve() -> None:
            # An exception in a loop callback is only logged by asyncio: caught here.
            asyncio.get_running_loop().set_exception_handler(lambda _, c: logged.append(c))
            await asyncio.wait_for(capsule.serve(), GENEROUS)  # a hang fails here

        try:
            asyncio.run(serve())
        except p.BadFrame as exc:
            return exc
        finally:
            assert not logged, logged
        return None
    finally:
        for fd in (from_host_r, from_host_w, null):
            if fd >= 0:
                os.close(fd)


@FUZZ
@given(data=streams, sizes=chunkings)
def test_fuzz_the_capsules_reader_ends_in_bad_frame_or_reads_on(
    data: bytes, sizes: list[int]
) -> None:
    capsule_reads(data, sizes)  # anything but BadFrame (or a hang) fails the example


def test_the_capsule_stops_at_a_frame_that_breaks_the_rules() -> None:
    """The host's stream is broken from that frame on: the capsule ends there (an error
    its caller sees) instead of reading on out of step."""
    well = p.frame({"k": p.K_CANCEL, "id": 5})
    for bad in (
        p.HEADER.pack(p.MAX_FRAME + 1),
        p.frame([1, 2]),
        p.frame({"k": p.K_CALL, "id": "x", "tool": "t", "args": b"\x80"}),
        p.frame({"k": p.K_CALL, "id": 1}),
        p.frame({"k": p.K_CANCEL, "id": [1]}),
        p.frame({"k": "boo"}),
    ):
        assert isinstance(capsule_reads(well + bad + well, []), p.BadFrame), bad
    assert (
        capsule_reads(well + p.frame({"k": p.K_CALL, "id": 1, "tool": "t", "args": b"\x80"}), [])
        is None
    )


# -- the guest's reader of the host --------------------------------------------------------


def guest_reads(data: bytes, sizes: list[int]) -> list[dict[str, Any]]:
    frames = _guest._Frames(-1)  # pyright: ignore[reportPrivateUsage]
    out: list[dict[str, Any]] = []
    for piece in chunked(data, sizes):
        frames.feed(piece)
        while frames.pending:
            out.append(_guest._frame_map(frames.next_body()))  # pyright: ignore[reportPrivateUsage]
    return out


@FUZZ
@given(data=streams, sizes=chunkings)
def test_fuzz_the_guests_reader_raises_only_host_broke(data: bytes, sizes: list[int]) -> None:
    try:
        for msg in guest_reads(data, sizes):
            assert type(msg) is dict
    except _guest._HostBroke:  # pyright: ignore[reportPrivateUsage]
        pass


# -- memory stays flat ---------------------------------------------------------------------


def corpus(count: int, seed: int) -> list[bytes]:
    """``count`` streams, the same every run: frames, damaged frames and noise."""
    rng = random.Random(seed)
    out: list[bytes] = []
    for _ in range(count):
        parts: list[bytes] = []
        for _ in range(rng.randint(1, 4)):
            roll = rng.random()
            if roll < 0.5:
                some: list[Any] = [1, 2, "x", None, [1]]
                msg: dict[str, Any] = {"k": rng.choice(KINDS), "id": rng.choice(some)}
                some = [None, 1, "s" * rng.randint(0, 200), b"\x00" * rng.randint(0, 200), {}, []]
                msg[rng.choice(FIELDS)] = rng.choice(some)
                parts.append(p.frame(msg))
            elif roll < 0.7:
                body = rng.choice(DEEP + ODD)
                parts.append(p.HEADER.pack(len(body)) + body)
            elif roll < 0.8:
                parts.append(p.HEADER.pack(rng.choice([p.MAX_FRAME + 1, 0xFFFFFFFF])))
            else:
                parts.append(rng.randbytes(rng.randint(0, 80)))
        out.append(b"".join(parts))
    return out


@contextmanager
def traced() -> Generator[Callable[[], int]]:
    """``measure()``: the bytes Python holds now, after a full collection."""
    logging.disable(logging.CRITICAL)  # pytest keeps every log record it captures
    tracemalloc.start()

    def measure() -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    try:
        yield measure
    finally:
        tracemalloc.stop()
        logging.disable(logging.NOTSET)


def sync_readers(data: bytes) -> None:
    """The synchronous readers, each on ``data``, each ending as it may."""
    capsule_reads(data, [7])
    with contextlib.suppress(_guest._HostBroke):  # pyright: ignore[reportPrivateUsage]
        guest_reads(data, [5, 9])


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_memory_stays_flat_over_hundreds_of_hostile_streams() -> None:
    """After a warm-up, 300 more streams through every reader leave Python's heap within
    1 MiB of where it was (a leak of a few kilobytes per stream would show), and the
    process's resident size within a generous 32 MiB."""
    warm, run = corpus(60, seed=1), corpus(300, seed=2)
    rss = psutil.Process().memory_info().rss

    async def each(streams: list[bytes]) -> None:
        for data in streams:
            await host_reads(data)
            try:
                for msg in await guest_frames(data, [11]):
                    sandbox_checks(msg)
            except p.BadFrame:
                pass
            await anyio.to_thread.run_sync(sync_readers, data)

    with traced() as measure:
        await each(warm)
        before = measure()
        await each(run)
        after = measure()
    grown = psutil.Process().memory_info().rss - rss
    assert after - before < 1 << 20, f"the heap grew by {after - before} bytes"
    assert grown < 32 << 20, f"the resident size grew by {grown >> 20} MiB"


# -- end to end: a capsule that writes garbage, and a host that keeps serving --------------

GARBAGE: dict[str, bytes] = {
    "a huge declared length": p.HEADER.pack(0xFFFFFFFF) + b"x" * 8,
    "noise": b"hello\n" * 4,
    "nesting 2,000 deep": p.HEADER.pack(2001) + b"\x91" * 2000 + b"\xc0",
    "invalid UTF-8": p.HEADER.pack(6) + b"\x81\xa1k\xa2\xff\xfe",
    "an unknown kind": p.frame({"k": "boo", "id": 1}),
    "a reply whose id is a string": p.frame({"k": "ok", "id": "1", "value": 1}),
    "an error of an unknown kind": p.frame({"k": "err", "id": 1, "error": {"kind": "x"}}),
    "an ext type": p.HEADER.pack(10) + b"\x82\xa1k\xa2ok\xa2id\xd4\x05\x00",
}

SPEW_TOOLS = {
    "spew": '''
        import gc


        def _protocol_fd() -> int:
            """The capsule's own pipe to the host (a compromised tool can find it)."""
            for obj in gc.get_objects():
                if type(obj).__name__ == "Capsule" and type(obj).__module__ == "capsule._serve":
                    return obj._out
            raise RuntimeError("no capsule found")


        def spew(garbage: bytes) -> str:
            """Writes garbage on the protocol pipe, then returns as usual."""
            import os

            os.write(_protocol_fd(), garbage)
            return "spewed"


        def add(a: int, b: int) -> int:
            return a + b
    ''',
}


async def test_a_capsule_that_writes_garbage_ends_typed_and_the_host_keeps_serving(
    make_project: Callable[..., Path],
) -> None:
    """A real capsule process whose tool writes garbage on the protocol pipe: the call
    ends with a typed error, a ``protocol_error`` event says why, the audit closes the
    call, and the next call runs in a fresh capsule."""
    root = make_project(
        SPEW_TOOLS,
        policy=(
            'version = 1\n[defaults]\napp = "allow"\n'
            '[limits]\ncall_timeout = "20s"\nmax_restarts = 50\n'
        ),
    )
    async with Host.open(root) as host:
        for what, garbage in GARBAGE.items():
            before = len([e for e in host.events.recent if e.kind == "protocol_error"])
            with pytest.raises(HostError) as caught:
                await host.call("spew", garbage)
            assert caught.value.kind in ("capsule_crashed", "protocol_error"), (what, caught.value)
            errors = [e for e in host.events.recent if e.kind == "protocol_error"]
            assert len(errors) == before + 1, what
            assert await host.call("add", 2, 3) == 5, what
        records = read_audit(root / ".agent" / "state.db", 100)
    spews = [r for r in records if r.tool == "spew"]
    assert len(spews) == len(GARBAGE)
    assert all(r.outcome in ("failed", "unknown") for r in spews), [r.outcome for r in spews]
    assert sum(r.tool == "add" and r.outcome == "ok" for r in records) == len(GARBAGE)
