"""The guest's quick path for one call driven by hand (``Sandbox._call_now``), against the
general one: the ``use`` frame it writes, and every way an answer can arrive."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import msgpack  # pyright: ignore[reportMissingTypeStubs]
import pytest

from capsule import _guest, protocol


def packb(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # pyright: ignore


def frame(value: Any) -> bytes:
    body = packb(value)
    return len(body).to_bytes(4, "big") + body


class Pipes:
    """A guest ``Sandbox`` in this process, with a run in progress, and the host's ends."""

    def __init__(self) -> None:
        self.to_guest_r, self.to_guest = os.pipe()
        self.from_guest, self.from_guest_w = os.pipe()
        self.sandbox = _guest.Sandbox(self.to_guest_r, self.from_guest_w)
        self.sandbox._run = 41  # pyright: ignore[reportPrivateUsage]
        self._buf = b""

    def close(self) -> None:
        for fd in (self.to_guest_r, self.to_guest, self.from_guest, self.from_guest_w):
            os.close(fd)

    def sent(self) -> dict[str, Any]:
        """The next frame the guest wrote, decoded as the host does."""
        while True:
            if len(self._buf) >= 4:
                size = int.from_bytes(self._buf[:4], "big")
                if len(self._buf) >= 4 + size:
                    body, self._buf = self._buf[4 : 4 + size], self._buf[4 + size :]
                    return protocol.as_map(protocol.decode(body))
            self._buf += os.read(self.from_guest, 1 << 16)

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """``await add(*args, **kwargs)`` as the driver makes it."""
        call = _guest.ToolCall("add", args, kwargs)
        call.awaited = True
        return self.sandbox._call_now(call)  # pyright: ignore[reportPrivateUsage]

    def next_id(self) -> int:
        return self.sandbox._next_id + 1  # pyright: ignore[reportPrivateUsage]


@pytest.fixture
def pipes() -> Iterator[Pipes]:
    made = Pipes()
    try:
        yield made
    finally:
        made.close()
        _guest._SANDBOX.calls.clear()  # pyright: ignore[reportPrivateUsage]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1, 2), {}), ((), {"b": [1, "x"]}), (("é" * 40, None, 2**40, -5, 1.5, b"\x00"), {"c": {}})],
)
def test_the_use_frame_has_the_contracts_fields(
    pipes: Pipes, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    for run in (41, 300, 2**20):
        pipes.sandbox._run = run  # pyright: ignore[reportPrivateUsage]
        call_id = pipes.next_id()
        os.write(pipes.to_guest, frame({"k": "ok", "id": call_id, "value": run}))
        assert pipes.call(*args, **kwargs) == run
        assert pipes.sent() == {
            "k": "use",
            "id": call_id,
            "run": run,
            "tool": "add",
            "args": list(args),
            "kwargs": kwargs,
            "wait": True,
        }


def test_a_use_frame_on_the_loop_does_not_wait(pipes: Pipes) -> None:
    packed_id = pipes.sandbox._use_frame("t", (1,), {}, False)  # pyright: ignore[reportPrivateUsage]
    msg = pipes.sent()
    assert msg == {"k": "use", "id": msg["id"], "run": 41, "tool": "t", "args": [1], "kwargs": {}}
    assert packb(msg["id"]) == packed_id


def test_ids_past_every_small_encoding(pipes: Pipes) -> None:
    for start in (126, 254, 65534):
        pipes.sandbox._next_id = start  # pyright: ignore[reportPrivateUsage]
        for _ in range(3):
            call_id = pipes.next_id()
            os.write(pipes.to_guest, frame({"k": "ok", "id": call_id, "value": [call_id]}))
            assert pipes.call(1) == [call_id]
            assert pipes.sent()["id"] == call_id


def test_a_late_answer_in_the_same_read_is_skipped(pipes: Pipes) -> None:
    call_id = pipes.next_id()
    late = frame({"k": "ok", "id": call_id - 1, "value": "late"})
    late_err = frame({"k": "err", "id": call_id + 7, "error": {"kind": "tool_error"}})
    os.write(pipes.to_guest, late + late_err + frame({"k": "ok", "id": call_id, "value": "ok"}))
    assert pipes.call() == "ok"


def test_an_answer_in_pieces(pipes: Pipes) -> None:
    call_id = pipes.next_id()
    data = frame({"k": "ok", "id": call_id, "value": "x" * 100_000})
    os.write(pipes.to_guest, data[:10])
    rest = threading.Timer(0.05, os.write, (pipes.to_guest, data[10:]))
    rest.start()
    try:
        assert pipes.call() == "x" * 100_000
    finally:
        rest.join()


def test_the_answer_and_the_next_frame_in_one_read(pipes: Pipes) -> None:
    call_id = pipes.next_id()
    os.write(
        pipes.to_guest,
        frame({"k": "ok", "id": call_id, "value": 1})
        + frame({"k": "ok", "id": call_id + 1, "value": 2}),
    )
    assert pipes.call() == 1
    assert pipes.call() == 2  # already read: taken from the buffer


def test_an_error_answer_is_raised(pipes: Pipes) -> None:
    call_id = pipes.next_id()
    error = {"kind": "policy_denied", "message": "no", "rule": "r1"}
    os.write(pipes.to_guest, frame({"k": "err", "id": call_id, "error": error}))
    with pytest.raises(_guest.PolicyDenied, match="no") as caught:
        pipes.call()
    assert vars(caught.value)["rule"] == "r1"


@pytest.mark.parametrize(
    "body",
    [
        # the id as a uint16 although it is small, and keys in another order
        b"\x83\xa1k\xa2ok\xa2id\xcd\x00\x01\xa5value\x07",
        b"\x83\xa2id\x01\xa1k\xa2ok\xa5value\x07",
        # one more key after the value
        b"\x84\xa1k\xa2ok\xa2id\x01\xa5value\x07\xa4more\xc0",
    ],
)
def test_other_encodings_of_the_answer(pipes: Pipes, body: bytes) -> None:
    pipes.sandbox._next_id = 0  # pyright: ignore[reportPrivateUsage]
    os.write(pipes.to_guest, len(body).to_bytes(4, "big") + body)
    assert pipes.call() == 7


@pytest.mark.parametrize(
    "body",
    [
        b"\x83\xa1k\xa2ok\xa2id\x01\xa5value\xc1",  # not msgpack
        b"\x83\xa1k\xa2ok\xa2id\x01\xa5value\x92\x01",  # truncated
        b"\x83\xa1k\xa3run\xa2id\x01\xa5value\x07",  # not an answer
    ],
)
def test_a_broken_answer_ends_the_guest(pipes: Pipes, body: bytes) -> None:
    pipes.sandbox._next_id = 0  # pyright: ignore[reportPrivateUsage]
    os.write(pipes.to_guest, len(body).to_bytes(4, "big") + body)
    with pytest.raises(_guest._HostBroke):  # pyright: ignore[reportPrivateUsage]
        pipes.call()


def test_the_host_gone_while_waiting(pipes: Pipes) -> None:
    os.close(pipes.to_guest)
    pipes.to_guest = os.open(os.devnull, os.O_RDONLY)  # closed by the fixture
    with pytest.raises(_guest._HostGone):  # pyright: ignore[reportPrivateUsage]
        pipes.call()


def test_invalid_and_oversize_arguments_send_nothing(pipes: Pipes) -> None:
    with pytest.raises(_guest.InvalidArguments, match="plain data"):
        pipes.call(object())
    with pytest.raises(_guest.InvalidArguments, match="plain data"):
        pipes.call("\ud800")
    pipes.sandbox.max_argument = 10
    with pytest.raises(_guest.InvalidArguments, match="over the limit of 10"):
        pipes.call("x" * 10)
    os.set_blocking(pipes.from_guest, False)
    with pytest.raises(BlockingIOError):
        os.read(pipes.from_guest, 1)


def test_a_call_remembers_the_agents_line() -> None:
    scope: dict[str, Any] = {"add": _guest.Tool("add")}
    code = compile("x = 1\ncall = add(1)\n", "<run 99>", "exec")
    _guest._SANDBOX.agent_files.add("<run 99>")  # pyright: ignore[reportPrivateUsage]  # as a run does
    try:
        exec(code, scope)
        assert scope["call"].line == 2
        assert _guest._SANDBOX.calls[-1] is scope["call"]  # pyright: ignore[reportPrivateUsage]
    finally:
        _guest._SANDBOX.calls.clear()  # pyright: ignore[reportPrivateUsage]


def test_on_the_loop_a_call_is_made_in_place_only_when_nothing_else_could_run(
    pipes: Pipes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On asyncio's loop, a call is made in place (one ``wait`` frame out, the answer
    read at once) only when no other call is in flight and no callback or timer is
    pending; otherwise it waits on a future, so the loop keeps running the rest."""
    import asyncio

    sandbox = pipes.sandbox
    monkeypatch.setattr(_guest, "_SANDBOX", sandbox)  # the one tool calls talk to
    loop = asyncio.new_event_loop()
    sandbox._loop = loop  # pyright: ignore[reportPrivateUsage]
    sandbox.loop_mode = True
    try:
        assert sandbox.alone()
        handle = loop.call_later(10, lambda: None)
        assert not sandbox.alone()  # a timer (a sleep, a wait_for) must still fire
        handle.cancel()
        loop.run_until_complete(asyncio.sleep(0))  # drops the cancelled timer
        assert sandbox.alone()
        loop.call_soon(lambda: None)
        assert not sandbox.alone()  # a ready callback (another task's step)
        loop.run_until_complete(asyncio.sleep(0))
        assert sandbox.alone()
        sandbox._waiting[7] = loop.create_future()  # pyright: ignore[reportPrivateUsage]
        assert not sandbox.alone()  # another call in flight: its answer must not be skipped
        sandbox._waiting.clear()  # pyright: ignore[reportPrivateUsage]

        async def code() -> Any:
            return await _guest.ToolCall("add", (2, 3), {})

        call_id = pipes.next_id()
        os.write(pipes.to_guest, frame({"k": "ok", "id": call_id, "value": 5}))
        assert loop.run_until_complete(code()) == 5
        msg = pipes.sent()
        assert msg["id"] == call_id and msg["wait"] is True  # made in place
        assert not sandbox._waiting  # pyright: ignore[reportPrivateUsage]
    finally:
        sandbox.loop_mode = False
        sandbox._loop = None  # pyright: ignore[reportPrivateUsage]
        loop.close()
