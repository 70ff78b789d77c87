"""The capsule's serve loop on the wire: a real ``python -m capsule`` driven frame by frame.

No host code runs here: the test writes ``load``, ``call`` and ``cancel`` frames to the
capsule's stdin and reads its frames from stdout, so what is checked is the capsule's own
contract under its fast paths (a call's first step runs at once, replies of one read go
out together): tools still run inside a real task of their own, with their own context,
concurrently, cancellable, and sync tools on worker threads.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capsule.protocol import FrameDecoder, decode, encode, frame

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parent.parent
GENEROUS = 20.0

TOOLS = """\
import asyncio
import contextvars
import threading
import time

_var: contextvars.ContextVar[int] = contextvars.ContextVar("var", default=0)


async def in_task() -> bool:
    return asyncio.current_task() is not None


async def timeout_now() -> str:
    async with asyncio.timeout(5):
        return "ok"


async def timeout_later(seconds: float) -> str:
    async with asyncio.timeout(5):
        await asyncio.sleep(seconds)
    return "ok"


async def timed_out() -> str:
    try:
        async with asyncio.timeout(0.05):
            await asyncio.sleep(30)
    except TimeoutError:
        return "timed out"
    return "no"


async def group() -> int:
    async with asyncio.TaskGroup() as tg:
        first = tg.create_task(asyncio.sleep(0, 1))
        second = tg.create_task(asyncio.sleep(0.01, 2))
    return first.result() + second.result()


async def swap(value: int) -> int:
    old = _var.get()
    _var.set(value)
    return old


async def swap_later(value: int) -> int:
    await asyncio.sleep(0)
    old = _var.get()
    _var.set(value)
    return old


async def nap(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


async def add(a: int, b: int) -> int:
    return a + b


def add_sync(a: int, b: int) -> int:
    return a + b


def thread_name() -> str:
    return threading.current_thread().name


def block(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


async def loud(text: str) -> None:
    print(text)


async def bad() -> set[int]:
    return {1}


async def huge() -> int:
    return 2**70
"""

_NAMES = [
    "in_task",
    "timeout_now",
    "timeout_later",
    "timed_out",
    "group",
    "swap",
    "swap_later",
    "nap",
    "add",
    "add_sync",
    "thread_name",
    "block",
    "loud",
    "bad",
    "huge",
]
_PARAMS: dict[str, list[list[Any]]] = {
    "timeout_later": [["seconds", 1]],
    "swap": [["value", 1]],
    "swap_later": [["value", 1]],
    "nap": [["seconds", 1]],
    "add": [["a", 1], ["b", 1]],
    "add_sync": [["a", 1], ["b", 1]],
    "block": [["seconds", 1]],
    "loud": [["text", 1]],
}


class Capsule:
    """A capsule process and blocking ends of its pipes."""

    def __init__(self, project: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "capsule"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=project,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.wfd = self.process.stdin.fileno()
        self.rfd = self.process.stdout.fileno()
        self.decoder = FrameDecoder()
        self.inbox: list[dict[str, Any]] = []
        self.reads: list[int] = []  # frames per read, for the batching check
        tools = {n: ["bench", [n], _PARAMS.get(n, [])] for n in _NAMES}
        self.send({"k": "load", "dir": str(project / "tools"), "files": ["bench"], "tools": tools})
        while (msg := self.recv())["k"] != "ready":
            assert msg["k"] in ("loading", "loaded"), msg

    def send_raw(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.wfd, view) :]

    def send(self, value: dict[str, Any]) -> None:
        self.send_raw(frame(value))

    def call(self, call_id: int, tool: str, **args: Any) -> None:
        self.send({"k": "call", "id": call_id, "tool": tool, "args": encode(args)})

    def recv(self, timeout: float = GENEROUS) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self.inbox:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
                raise TimeoutError(f"no frame from the capsule (had {self.reads})")
            data = os.read(self.rfd, 1 << 16)
            if not data:
                raise EOFError("the capsule closed its output")
            bodies = self.decoder.feed(data)
            self.reads.append(len(bodies))
            self.inbox.extend(decode(b) for b in bodies)
        return self.inbox.pop(0)

    def reply(self, call_id: int) -> dict[str, Any]:
        """The reply to ``call_id`` (console frames are skipped)."""
        while True:
            msg = self.recv()
            if msg["k"] in ("ok", "err"):
                assert msg["id"] == call_id, msg
                return msg

    def value(self, call_id: int, tool: str, **args: Any) -> Any:
        self.call(call_id, tool, **args)
        msg = self.reply(call_id)
        assert msg["k"] == "ok", msg
        return msg["value"]

    def close(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        try:
            self.process.wait(GENEROUS)
        finally:
            self.process.stdout.close()
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def capsule(tmp_path: Path) -> Iterator[Capsule]:
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "bench.py").write_text(TOOLS, encoding="utf-8")
    running = Capsule(tmp_path)
    try:
        yield running
    finally:
        running.close()


def test_a_tool_that_does_not_wait_still_runs_in_a_task_of_its_own(capsule: Capsule) -> None:
    assert capsule.value(1, "in_task") is True
    assert capsule.value(2, "timeout_now") == "ok"  # asyncio.timeout needs current_task()
    assert capsule.value(3, "timeout_later", seconds=0.01) == "ok"
    assert capsule.value(4, "timed_out") == "timed out"
    assert capsule.value(5, "group") == 3


def test_each_call_has_its_own_context(capsule: Capsule) -> None:
    assert [capsule.value(i, "swap", value=i) for i in range(1, 4)] == [0, 0, 0]
    assert [capsule.value(i, "swap_later", value=i) for i in range(4, 7)] == [0, 0, 0]


def test_a_cancelled_call_gets_no_reply_and_the_rest_are_answered(capsule: Capsule) -> None:
    capsule.call(1, "nap", seconds=30.0)
    capsule.call(2, "nap", seconds=0.01)
    assert capsule.reply(2)["value"] == 0.01
    capsule.send({"k": "cancel", "id": 1})
    assert capsule.value(3, "add", a=1, b=2) == 3
    with pytest.raises(TimeoutError):
        capsule.recv(timeout=0.3)


def test_calls_in_one_write_are_answered_in_one_write(capsule: Capsule) -> None:
    capsule.value(1, "add", a=0, b=0)
    capsule.reads.clear()
    batch = b"".join(
        frame({"k": "call", "id": i, "tool": "add", "args": encode({"a": i, "b": 1})})
        for i in range(100, 164)
    )
    capsule.send_raw(batch)
    values: dict[int, int] = {}
    while len(values) < 64:
        msg = capsule.recv()
        values[msg["id"]] = msg["value"]
    assert values == {i: i + 1 for i in range(100, 164)}
    assert capsule.reads == [64], "replies of one read went out in several writes"


def test_concurrent_async_calls_overlap(capsule: Capsule) -> None:
    start = time.monotonic()
    for i in range(10):
        capsule.call(i, "nap", seconds=0.5)
    got = sorted(capsule.recv()["id"] for _ in range(10))
    assert got == list(range(10))
    assert time.monotonic() - start < 4.0


def test_sync_tools_run_on_worker_threads_and_a_slow_one_stalls_nothing(
    capsule: Capsule,
) -> None:
    assert capsule.value(1, "thread_name") == "tool"
    capsule.call(2, "block", seconds=30.0)
    assert capsule.value(3, "add_sync", a=2, b=3) == 5
    assert capsule.value(4, "add", a=2, b=3) == 5
    assert capsule.value(5, "thread_name") == "tool"


def test_output_errors_and_bad_calls_stay_data(capsule: Capsule) -> None:
    capsule.call(1, "loud", text="hello")
    printed = ""
    answered = False
    while not answered or "\n" not in printed:  # the console thread writes its own frames
        msg = capsule.recv()
        if msg["k"] == "console":
            printed += msg["data"]
        else:
            assert msg == {"k": "ok", "id": 1, "value": None}
            answered = True
    assert printed == "hello\n"
    capsule.call(2, "bad")
    error = capsule.reply(2)["error"]
    assert (error["kind"], error["type"], error["path"]) == ("not_serializable", "set", "result")
    capsule.call(3, "huge")
    assert capsule.reply(3)["error"]["kind"] == "not_serializable"
    capsule.call(4, "nope")
    assert capsule.reply(4)["error"]["kind"] == "bad_call"
    capsule.call(5, "add", a=1)
    error = capsule.reply(5)["error"]
    assert (error["kind"], error["type"]) == ("tool_error", "TypeError")
    capsule.send({"k": "call", "id": 6, "tool": "add", "args": b"\xc1"})
    assert capsule.reply(6)["error"]["kind"] == "bad_call"
    assert capsule.value(7, "add", a=1, b=2) == 3


def test_a_result_too_dense_for_the_host_to_decode_is_an_error_the_capsule_reports() -> None:
    from capsule._serve import Capsule as Serving

    serving = Serving(-1, -1)
    dense = encode({"k": "ok", "id": 1, "value": [[]] * 1_500_000})  # 1.5 MB, ~90 MB decoded
    error = decode(serving._checked(1, dense))["error"]  # pyright: ignore[reportPrivateUsage]
    assert error["kind"] == "too_large"
    assert "too dense" in error["message"]
    plain = encode({"k": "ok", "id": 2, "value": ["x" * 100] * 20_000})  # 2 MB of text
    assert serving._checked(2, plain) is plain  # pyright: ignore[reportPrivateUsage]
