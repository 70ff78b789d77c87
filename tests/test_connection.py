"""The framing client against hostile peers, without a real capsule (catalogue G and H).

The test plays the capsule: it owns the other ends of two ``os.pipe()`` pairs, reads the
frames the host writes and writes whatever it likes back. Every breach of the wire rules
must end in ``on_violation`` and ``CapsuleCrashed`` for the calls in flight; a reply that
matches no waiting call is dropped and can never complete another call.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import pytest

from capsule.protocol import HEADER, FrameDecoder, decode, encode, frame
from host import (
    CapsuleCrashed,
    Event,
    LimitExceeded,
    NotSerializable,
    ProtocolError,
    ToolError,
    ToolTimeout,
)
from host._events import EventBus
from host.capsules._transport import Connection

pytestmark = pytest.mark.anyio

GENEROUS = 20.0
"""Seconds to wait for something that should happen at once (a loaded machine)."""


class Peer:
    """The capsule's ends of the pipes, driven by the test."""

    def __init__(self) -> None:
        self.from_host, self.host_writes = os.pipe()
        self.host_reads, self.to_host = os.pipe()
        os.set_blocking(self.from_host, False)
        self._decoder = FrameDecoder()
        self._inbox: list[dict[str, Any]] = []

    def send(self, value: Any) -> None:
        self.send_raw(frame(value))

    def send_raw(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.to_host, view) :]

    async def recv(self) -> dict[str, Any]:
        """The next frame the host wrote."""
        with anyio.fail_after(GENEROUS):
            while not self._inbox:
                try:
                    data = os.read(self.from_host, 1 << 16)
                except BlockingIOError:
                    await anyio.wait_readable(self.from_host)
                    continue
                assert data, "the host closed its end"
                self._inbox.extend(decode(body) for body in self._decoder.feed(data))
            return self._inbox.pop(0)

    def close_output(self) -> None:
        """The capsule's output ends (it died, or closed fd 1)."""
        if self.to_host >= 0:
            os.close(self.to_host)
            self.to_host = -1

    def close(self) -> None:
        self.close_output()
        with contextlib.suppress(OSError):
            os.close(self.from_host)


@dataclass
class Harness:
    conn: Connection
    peer: Peer
    events: EventBus
    tg: anyio.abc.TaskGroup
    violations: list[str] = field(default_factory=list[str])
    finished: anyio.Event = field(default_factory=anyio.Event)

    def kinds(self, kind: str) -> list[Event]:
        return [e for e in self.events.recent if e.kind == kind]

    async def wait_for(self, kind: str, count: int = 1) -> list[Event]:
        """Wait until ``count`` events of ``kind`` were emitted; return them."""
        enough = anyio.Event()

        def check(_: Event | None = None) -> None:
            if len(self.kinds(kind)) >= count:
                enough.set()

        unsubscribe = self.events.subscribe(check)
        try:
            check()
            with anyio.fail_after(GENEROUS):
                await enough.wait()
        finally:
            unsubscribe()
        return self.kinds(kind)

    async def wait_finished(self) -> None:
        """Wait for ``conn.run()`` to return (the pipes ended or the peer broke the rules)."""
        with anyio.fail_after(GENEROUS):
            await self.finished.wait()


@contextlib.asynccontextmanager
async def harness() -> AsyncIterator[Harness]:
    peer = Peer()
    events = EventBus()
    violations: list[str] = []
    conn = Connection(
        peer.host_writes,
        peer.host_reads,
        events=events,
        session="s",
        on_violation=violations.append,
    )
    try:
        async with anyio.create_task_group() as tg:
            h = Harness(conn, peer, events, tg, violations)

            async def run() -> None:
                try:
                    await conn.run()
                finally:
                    h.finished.set()

            tg.start_soon(run)
            try:
                yield h
            finally:
                tg.cancel_scope.cancel()
    finally:
        conn.close()  # after run() ended, as the subprocess transport does
        peer.close()


@dataclass
class Outcome:
    value: Any = None
    error: BaseException | None = None
    done: anyio.Event = field(default_factory=anyio.Event)

    async def wait(self) -> Outcome:
        with anyio.fail_after(GENEROUS):
            await self.done.wait()
        return self


def start_call(
    h: Harness, call_id: int, tool: str = "t", args: bytes = b"\x80", timeout: float = 60.0
) -> Outcome:
    """Start ``conn.call`` in the background; its value or error lands in the outcome."""
    outcome = Outcome()

    async def run() -> None:
        try:
            outcome.value = await h.conn.call(call_id, tool, args, timeout)
        except Exception as exc:
            outcome.error = exc
        finally:
            outcome.done.set()

    h.tg.start_soon(run)
    return outcome


def ok(call_id: Any, value: Any = None) -> dict[str, Any]:
    return {"k": "ok", "id": call_id, "value": value}


def err(call_id: Any, kind: str = "tool_error", **fields: Any) -> dict[str, Any]:
    error = {"kind": kind, "type": "ValueError", "message": "m", "traceback": "tb", "path": ""}
    error.update(fields)
    return {"k": "err", "id": call_id, "error": error}


# -- replies find their calls ---------------------------------------------------------------


async def test_a_call_sends_one_call_frame_and_returns_the_value() -> None:
    async with harness() as h:
        outcome = start_call(h, 1, "kanban.add", encode({"title": "x"}))
        sent = await h.peer.recv()
        assert sent == {"k": "call", "id": 1, "tool": "kanban.add", "args": encode({"title": "x"})}
        h.peer.send(ok(1, {"id": "x", "tags": [1, 2.5, None, b"raw"]}))
        assert (await outcome.wait()).value == {"id": "x", "tags": [1, 2.5, None, b"raw"]}
        assert h.violations == []


async def test_replies_out_of_order_complete_the_right_calls() -> None:
    async with harness() as h:
        outcomes = {i: start_call(h, i, f"tool{i}") for i in (1, 2, 3, 4)}
        sent = [await h.peer.recv() for _ in outcomes]
        assert sorted((f["id"], f["tool"]) for f in sent) == [(i, f"tool{i}") for i in (1, 2, 3, 4)]
        h.peer.send(ok(3, "three"))
        h.peer.send(err(1, message="one failed"))
        # Two replies in one write, the second split across two writes.
        data = frame(ok(4, "four")) + frame(ok(2, "two"))
        h.peer.send_raw(data[:-3])
        assert (await outcomes[4].wait()).value == "four"
        assert not outcomes[2].done.is_set()
        h.peer.send_raw(data[-3:])
        assert (await outcomes[3].wait()).value == "three"
        assert (await outcomes[2].wait()).value == "two"
        error = (await outcomes[1].wait()).error
        assert isinstance(error, ToolError) and error.tool == "tool1"
        assert (error.type_name, error.error_message, error.traceback) == (
            "ValueError",
            "one failed",
            "tb",
        )


async def test_a_reply_for_an_unknown_id_is_dropped_and_completes_nothing() -> None:
    async with harness() as h:
        outcome = start_call(h, 5)
        await h.peer.recv()
        for stray in (99, 0, -1, 2**64 - 1, -(2**63)):
            h.peer.send(ok(stray, "stolen"))
        h.peer.send(err(6))
        h.peer.send({"k": "console", "stream": "stdout", "data": "sync"})
        await h.wait_for("console")
        assert not outcome.done.is_set()
        dropped = [e.data["call_id"] for e in h.kinds("reply_dropped")]
        assert dropped == [99, 0, -1, 2**64 - 1, -(2**63), 6]
        assert all(e.session == "s" for e in h.kinds("reply_dropped"))
        h.peer.send(ok(5, "mine"))
        assert (await outcome.wait()).value == "mine"
        assert h.violations == []


def test_an_id_beyond_64_bits_cannot_even_be_encoded() -> None:
    with pytest.raises(OverflowError):
        frame(ok(2**70))


async def test_a_duplicate_reply_is_dropped() -> None:
    async with harness() as h:
        first = start_call(h, 1)
        await h.peer.recv()
        h.peer.send(ok(1, "first"))
        assert (await first.wait()).value == "first"
        second = start_call(h, 2)
        await h.peer.recv()
        h.peer.send(ok(1, "duplicate"))
        h.peer.send(err(1))
        await h.wait_for("reply_dropped", 2)
        assert not second.done.is_set()
        h.peer.send(ok(2, "second"))
        assert (await second.wait()).value == "second"
        assert first.value == "first"


async def test_a_call_times_out_and_its_late_reply_is_dropped() -> None:
    async with harness() as h:
        slow = start_call(h, 1, "slow", timeout=0.2)
        other = start_call(h, 2, "other")
        await h.peer.recv()
        await h.peer.recv()
        start = anyio.current_time()
        error = (await slow.wait()).error
        elapsed = anyio.current_time() - start
        assert isinstance(error, ToolTimeout) and error.tool == "slow" and error.timeout == 0.2
        assert error.may_have_executed
        assert 0.15 <= elapsed < GENEROUS
        h.peer.send(ok(1, "late"))
        await h.wait_for("reply_dropped")
        assert not other.done.is_set()  # the late reply completed nothing else
        h.peer.send(ok(2, "fine"))
        assert (await other.wait()).value == "fine"
        assert slow.value is None


async def test_g05_half_a_reply_then_silence_ends_at_the_deadline() -> None:
    async with harness() as h:
        outcome = start_call(h, 1, timeout=0.2)
        await h.peer.recv()
        h.peer.send_raw(frame(ok(1, "x" * 100))[:20])
        assert isinstance((await outcome.wait()).error, ToolTimeout)


async def test_cancelling_a_waiting_caller_sends_a_cancel_frame() -> None:
    async with harness() as h:
        cancelled = anyio.Event()

        async def caller(scope_box: list[anyio.CancelScope]) -> None:
            with anyio.CancelScope() as scope:
                scope_box.append(scope)
                await h.conn.call(7, "t", b"\x80", 60.0)
            cancelled.set()

        box: list[anyio.CancelScope] = []
        h.tg.start_soon(caller, box)
        assert (await h.peer.recv())["k"] == "call"
        box[0].cancel()
        assert await h.peer.recv() == {"k": "cancel", "id": 7}
        with anyio.fail_after(GENEROUS):
            await cancelled.wait()
        h.peer.send(ok(7, "too late"))  # the capsule may still answer: dropped
        await h.wait_for("reply_dropped")
        later = start_call(h, 8)
        await h.peer.recv()
        h.peer.send(ok(8, 8))
        assert (await later.wait()).value == 8
        assert h.violations == []


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (err(1, "not_serializable", type="set", path="result['x']"), NotSerializable),
        (err(1, "too_large", message="big"), LimitExceeded),
        (err(1, "bad_call", message="no tool"), ProtocolError),
    ],
)
async def test_error_replies_become_typed_errors(error: dict[str, Any], expected: type) -> None:
    async with harness() as h:
        outcome = start_call(h, 1)
        await h.peer.recv()
        h.peer.send(error)
        raised = (await outcome.wait()).error
        assert type(raised) is expected
        if isinstance(raised, NotSerializable):
            assert (raised.type_name, raised.path) == ("set", "result['x']")
        if isinstance(raised, LimitExceeded):
            assert raised.limit == "max_frame"


async def test_console_frames_become_events() -> None:
    async with harness() as h:
        h.peer.send({"k": "console", "stream": "stderr", "data": "careful\n"})
        await h.wait_for("console")
        (event,) = h.kinds("console")
        assert (event.session, event.data["stream"], event.data["data"]) == (
            "s",
            "stderr",
            "careful\n",
        )


# -- breaches of the wire rules ------------------------------------------------------------


def nest(depth: int) -> Any:
    value: Any = None
    for _ in range(depth):
        value = [value]
    return value


BAD_ENVELOPES: dict[str, bytes] = {
    "id_str": frame(ok("1")),
    "id_float": frame(ok(1.0)),
    "id_bool": frame(ok(True)),
    "id_none": frame(ok(None)),
    "id_missing": frame({"k": "ok", "value": 1}),
    "id_list": frame(ok([1])),
    "kind_unknown": frame({"k": "nope", "id": 1}),
    "kind_missing": frame({"id": 1, "value": 1}),
    "kind_list": frame({"k": ["ok"], "id": 1}),
    "err_unknown_kind": frame(err(1, "worse_error")),
    "err_not_a_map": frame({"k": "err", "id": 1, "error": "boom"}),
    "err_message_not_str": frame(err(1, message=["m"])),
    "err_traceback_not_str": frame(err(1, traceback=b"tb")),
    "not_a_map": frame([1, 2, 3]),
    "scalar": frame(42),
    "bytes_keys": HEADER.pack(9) + b"\x81\xc4\x01k\xa2ok" + b"\x00\x00",
    "value_bytes_keys": frame(ok(1, [1]))[:-1] + b"\x81\xc4\x01k\x01",
    "value_timestamp": frame(ok(1, [1]))[:-1] + bytes.fromhex("d6ff00000000"),
    "ext_type": frame(ok(1, [1]))[:-1] + b"\xd4\x05\x00",
    "invalid_utf8": frame(ok(1, [1]))[:-1] + b"\xa2\xff\xfe",
    "trailing_bytes": HEADER.pack(len(encode(ok(1)) + b"\xc0")) + encode(ok(1)) + b"\xc0",
    "truncated_body": HEADER.pack(3) + b"\x83\xa1k",
    "deep": HEADER.pack(2000) + b"\x91" * 1999 + b"\xc0",
    # G04: as deep as the decoder allows, where the host reads before any depth check.
    "kind_deep": frame({"k": nest(1022), "id": 1}),
    "id_deep": frame(ok(nest(1022))),
    "err_deep": frame({"k": "err", "id": 1, "error": nest(1022)}),
    "err_kind_deep": frame(err(1, nest(1021))),  # pyright: ignore[reportArgumentType]
    "err_message_deep": frame(err(1, message=nest(1021))),
    "console_deep": frame({"k": "console", "stream": nest(1022), "data": nest(1022)}),
    "console_bad_stream": frame({"k": "console", "stream": "fd3", "data": "x"}),
    "console_bytes": frame({"k": "console", "stream": "stdout", "data": b"x"}),
    # A tool context's frames and a result's files, checked as strictly as the rest.
    "ctx_op_unknown": frame({"k": "ctx", "id": 1, "req": 1, "op": "exec", "args": {}}),
    "ctx_req_str": frame({"k": "ctx", "id": 1, "req": "1", "op": "env", "args": {}}),
    "ctx_req_zero": frame({"k": "ctx", "id": 1, "req": 0, "op": "env", "args": {}}),
    "ctx_args_list": frame({"k": "ctx", "id": 1, "req": 1, "op": "env", "args": []}),
    "ctx_args_deep": frame({"k": "ctx", "id": 1, "req": 1, "op": "env", "args": {"a": nest(600)}}),
    "event_op_is_a_request": frame({"k": "event", "id": 1, "op": "call", "args": {}}),
    "files_not_a_list": frame({**ok(1), "files": "x", "as": "result"}),
    "files_bad_mime": frame({**ok(1), "files": [["a", "nope", b"", None, None]], "as": "result"}),
    "files_data_str": frame(
        {**ok(1), "files": [["a", "text/plain", "x", None, None]], "as": "result"}
    ),
    "files_as_unknown": frame({**ok(1), "files": [], "as": "tuple"}),
    "files_alone_with_value": frame(
        {**ok(1, 5), "files": [["a", "text/plain", b"x", None, None]], "as": "file"}
    ),
    "oversize_header": b"\xff\xff\xff\xff",
    "stray_print": b"hello\n",  # G13: looks like a 1.7 GB header
}


def _fix_lengths() -> None:
    """Frames edited after ``frame()`` need their length prefix recomputed."""
    for name in ("value_bytes_keys", "value_timestamp", "ext_type", "invalid_utf8"):
        body = BAD_ENVELOPES[name][4:]
        BAD_ENVELOPES[name] = HEADER.pack(len(body)) + body
    body = b"\x81\xc4\x01k\xa2ok"
    BAD_ENVELOPES["bytes_keys"] = HEADER.pack(len(body)) + body


_fix_lengths()


@pytest.mark.parametrize("name", sorted(BAD_ENVELOPES))
async def test_a_breach_of_the_wire_rules_is_a_violation_and_fails_calls_in_flight(
    name: str,
) -> None:
    async with harness() as h:
        first = start_call(h, 1)
        second = start_call(h, 2)
        await h.peer.recv()
        await h.peer.recv()
        h.peer.send_raw(BAD_ENVELOPES[name])
        await h.wait_finished()
        assert len(h.violations) == 1
        assert h.violations[0].startswith("it broke the wire protocol")
        assert [e.session for e in h.kinds("protocol_error")] == ["s"]
        for outcome in (first, second):
            error = (await outcome.wait()).error
            assert isinstance(error, CapsuleCrashed), error
            assert error.may_have_executed
            assert "broke the wire protocol" in error.reason
        assert h.conn.dead is not None
        with pytest.raises(CapsuleCrashed) as info:
            await h.conn.call(3, "t", b"\x80", 60.0)
        assert not info.value.may_have_executed  # never sent


async def test_a_context_request_for_a_call_without_one_is_refused_not_served() -> None:
    async with harness() as h:
        call = start_call(h, 1)
        await h.peer.recv()
        for call_id in (1, 99):  # in flight without a context; not in flight at all
            h.peer.send({"k": "ctx", "id": call_id, "req": 7, "op": "get", "args": {"key": "k"}})
            answer = await h.peer.recv()
            assert answer["k"] == "answer" and answer["req"] == 7 and answer["ok"] is False
            assert answer["error"]["kind"] == "context_closed"
        h.peer.send({"k": "event", "id": 1, "op": "emit", "args": {"event": "x"}})
        h.peer.send(ok(1, "done"))
        assert (await call.wait()).value == "done"
        refused = await h.wait_for("context_refused", 3)  # no handler here: counted, not audited
        assert [e.data["op"] for e in refused] == ["get", "get", "emit"]
        assert not h.violations


async def test_a_violation_with_no_call_in_flight_still_reports() -> None:
    async with harness() as h:
        h.peer.send({"k": "ok", "id": "x"})
        await h.wait_finished()
        assert len(h.violations) == 1


# -- the capsule's output ends ----------------------------------------------------------------


async def test_eof_fails_every_call_in_flight() -> None:
    async with harness() as h:
        outcomes = [start_call(h, i) for i in (1, 2, 3)]
        for _ in outcomes:
            await h.peer.recv()
        h.peer.close_output()
        await h.wait_finished()
        for outcome in outcomes:
            error = (await outcome.wait()).error
            assert isinstance(error, CapsuleCrashed) and error.may_have_executed
            assert error.reason == "the capsule closed its output"
        assert h.violations == []  # dying is not a protocol violation
        with pytest.raises(CapsuleCrashed) as info:
            await h.conn.call(4, "t", b"\x80", 60.0)
        assert not info.value.may_have_executed


async def test_g06_half_a_reply_then_eof_delivers_nothing() -> None:
    async with harness() as h:
        outcome = start_call(h, 1)
        await h.peer.recv()
        h.peer.send_raw(frame(ok(1, "partial result"))[:-4])
        h.peer.close_output()
        error = (await outcome.wait()).error
        assert isinstance(error, CapsuleCrashed) and outcome.value is None


async def test_closing_while_running_ends_run_quietly() -> None:
    async with harness() as h:
        outcome = start_call(h, 1)
        await h.peer.recv()
        h.conn.close()
        await h.wait_finished()
        error = (await outcome.wait()).error
        assert isinstance(error, CapsuleCrashed) and error.may_have_executed
        assert h.violations == []


async def test_a_call_after_close_did_not_run() -> None:
    async with harness() as h:
        h.conn.close()
        with pytest.raises(CapsuleCrashed) as info:
            await h.conn.call(1, "t", b"\x80", 60.0)
        assert not info.value.may_have_executed
