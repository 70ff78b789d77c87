"""A real subprocess capsule: module state, concurrency, results, and its output channel.

Every test here starts real ``python -m capsule`` processes on the lab project
(``tests/fixtures/e2e/lab``) and runs under asyncio and trio.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from host import Host, LimitExceeded, NotSerializable, ToolError

from .fixtures.e2e.helpers import (
    LAB,
    Recorder,
    calls_in_flight,
    capsule_pids,
    policy,
    wait_until,
)
from .test_wasm import wasm_prepared

pytestmark = [pytest.mark.anyio, pytest.mark.subprocess]
__all__ = ["wasm_prepared"]


# -- module state and concurrency ----------------------------------------------------------


async def test_module_state_persists_across_calls_in_a_session() -> None:
    async with Host.open(LAB) as host:
        assert [await host.call("bump") for _ in range(3)] == [1, 2, 3]
        assert await host.tools.state.bump() == 4
        assert await host.call("tools.state.bump") == 5


async def test_each_session_has_its_own_capsule_and_state() -> None:
    async with Host.open(LAB) as host:
        await host.call("bump")
        await host.call("bump")
        async with host.session() as other:
            assert await other.call("bump") == 1
            assert await other.call("pid") != await host.call("pid")
        assert await host.call("bump") == 3


async def test_async_tools_run_concurrently() -> None:
    async with Host.open(LAB) as host:
        results: list[float] = []

        async def one() -> None:
            results.append(await host.call("nap", 0.5))

        start = time.monotonic()
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(one)
        elapsed = time.monotonic() - start
        assert results == [0.5] * 10
        assert elapsed < 4.0, f"10 concurrent naps of 0.5 s took {elapsed:.2f} s"


async def test_a_slow_sync_tool_does_not_stall_a_fast_call() -> None:
    async with Host.open(LAB) as host, anyio.create_task_group() as tg:
        slow_done = anyio.Event()

        async def slow() -> None:
            await host.call("block", 60.0)
            slow_done.set()

        tg.start_soon(slow)
        # Handed to the capsule first: it reads its frames in order, so the blocking call
        # is on its worker thread before the calls below are read.
        await wait_until(lambda: calls_in_flight(host) == 1, what="the blocking call sent")
        start = time.monotonic()
        assert await host.call("quick") == "quick"
        assert await host.call("block", 0.01) == 0.01
        assert await host.call("nap", 0.01) == 0.01
        assert time.monotonic() - start < 10.0
        assert not slow_done.is_set(), "the slow call is still running"
        tg.cancel_scope.cancel()


async def test_many_calls_in_flight_each_get_their_own_reply() -> None:
    async with Host.open(LAB) as host:
        replies: dict[float, float] = {}

        async def one(seconds: float) -> None:
            replies[seconds] = await host.call("nap", seconds)

        async with anyio.create_task_group() as tg:
            for i in range(20, 0, -1):  # the first sent finishes last
                tg.start_soon(one, i / 40)
        assert replies == {i / 40: i / 40 for i in range(1, 21)}


# -- results -------------------------------------------------------------------------------


async def test_rich_results_convert_to_plain_data() -> None:
    async with Host.open(LAB) as host:
        assert await host.call("point") == {"x": 1, "y": 2}
        assert await host.call("movie") == {"title": "Alien", "year": 1979}
        assert await host.call("color") == "red"
        assert await host.call("when") == "2026-11-30T13:40:00+00:00"
        assert await host.call("everything") == {
            "point": {"x": 3, "y": 4},
            "colors": ["red"],
            "day": "2026-01-02",
            "pair": {"left": 1, "right": "a"},
            "tuple": [1, 2],
        }


@pytest.mark.parametrize(
    ("tool", "type_name", "path"),
    [
        ("a_set", "set", "result"),
        ("generator", "generator", "result"),
        ("nested_set", "frozenset", "result['items'][3]['bad']"),
    ],
)
async def test_values_that_are_not_plain_data_are_refused(
    tool: str, type_name: str, path: str
) -> None:
    async with Host.open(LAB) as host:
        with pytest.raises(NotSerializable) as info:
            await host.call(tool)
        assert info.value.type_name == type_name
        assert info.value.path == path
        assert type_name in str(info.value) and path in str(info.value)
        assert await host.call("bump") == 1, "the capsule stays healthy"


async def test_a_raising_tool_is_a_tool_error_with_its_own_traceback() -> None:
    async with Host.open(LAB) as host:
        with pytest.raises(ToolError) as info:
            await host.call("boom", 7)
        error = info.value
        assert error.type_name == "ValueError"
        assert error.error_message == "bad value 7"
        assert error.traceback.startswith("Traceback (most recent call last):")
        assert "results.py" in error.traceback
        assert "in boom" in error.traceback and "in _inner" in error.traceback
        assert error.traceback.rstrip().endswith("ValueError: bad value 7")
        for internal in ("capsule/", "_serve.py", "_registry.py", "asyncio", "threading"):
            assert internal not in error.traceback, error.traceback
        with pytest.raises(ToolError) as info:
            await host.call("aboom")
        assert info.value.type_name == "LookupError"
        assert "in aboom" in info.value.traceback
        assert "capsule/" not in info.value.traceback
        assert await host.call("quick") == "quick"


async def test_a_result_over_the_frame_cap_is_limit_exceeded() -> None:
    async with Host.open(LAB, limits={"max_frame": "1MiB"}) as host:
        with pytest.raises(LimitExceeded) as info:
            await host.call("big", 2 * 1024 * 1024)
        assert info.value.limit == "max_frame"
        assert await host.call("big", 10) == "x" * 10
        assert await host.call("bump") == 1, "the same capsule goes on serving"


async def test_a_tool_raising_cancelled_error_is_a_tool_error() -> None:
    async with Host.open(LAB, policy=policy("timeout")) as host:
        await host.call("bump")
        with pytest.raises(ToolError) as info:
            await host.call("cancels_itself")
        assert info.value.type_name == "CancelledError"
        assert await host.call("bump") == 2, "the capsule was not restarted"


@pytest.mark.parametrize("tool", ["leave", "aleave"])
async def test_sys_exit_in_a_tool_is_a_tool_error(tool: str) -> None:
    async with Host.open(LAB) as host:
        before = capsule_pids(host)[0]
        await host.call("bump")
        with pytest.raises(ToolError) as info:
            await host.call(tool, 3)
        assert info.value.type_name == "SystemExit"
        assert info.value.error_message == "3"
        assert await host.call("bump") == 2, "same capsule, same state"
        assert capsule_pids(host)[0] == before


# -- the output channel --------------------------------------------------------------------


async def test_every_kind_of_output_becomes_console_events() -> None:
    async with Host.open(LAB) as host:
        recorder = Recorder(host)
        assert await host.call("talk") == "intact"
        expected = [
            "hi from print",
            "raw fd write",
            "c-level",
            "from-child",
            "logged to stderr",
            "explicit stderr",
        ]
        await wait_until(
            lambda: all(line in recorder.console() for line in expected),
            what="console events",
        )
        streams = {
            line: {e.data["stream"] for e in recorder.of("console") if line in e.data["data"]}
            for line in expected
        }
        assert streams["hi from print"] == {"stdout"}
        assert streams["c-level"] == {"stdout"}
        assert streams["logged to stderr"] == {"stderr"}
        assert await host.call("bump") == 1, "the protocol channel is intact"


async def test_what_a_tool_printed_arrives_before_its_result(
    make_project: Callable[..., Path],
) -> None:
    """A result never overtakes the output printed before it (``toolhost call`` exits on
    the result: a line still in the capsule's console pipe was lost). 200 KB of lines
    fill the pipe several times over, so the last ones are still in it as the tool returns."""
    project = make_project(
        {
            "chatter": """
                import os


                def chatter(n: int) -> int:
                    for i in range(2000):
                        print(f"{n}:{i:04d} " + "x" * 90)
                    os.write(1, f"last line of {n}\\n".encode())
                    return n
            """
        }
    )
    async with Host.open(project) as host:
        recorder = Recorder(host)
        for n in range(5):
            assert await host.call("chatter", n) == n
            assert f"last line of {n}" in recorder.console()  # at once: no wait
        async with Host.open(LAB) as lab:
            recorder = Recorder(lab)
            assert await lab.call("talk") == "intact"
            shown = recorder.console()
            assert all(line in shown for line in ("hi from print", "raw fd write", "c-level"))


async def test_output_without_a_newline_is_not_held_back() -> None:
    async with Host.open(LAB) as host:
        recorder = Recorder(host)
        assert await host.call("partial") == "partial"
        await wait_until(
            lambda: (
                "no newline on stdout" in recorder.console()
                and "no newline on stderr" in recorder.console()
            ),
            what="partial lines",
        )


async def test_stdin_is_empty() -> None:
    async with Host.open(LAB) as host:
        assert await host.call("read_stdin") == ["", b""]


async def test_a_flood_of_output_is_dropped_and_the_host_stays_small() -> None:
    async with Host.open(LAB) as host:
        recorder = Recorder(host)
        me = psutil.Process()
        await host.call("quick")
        before = me.memory_info().rss
        start = time.monotonic()
        assert await host.call("flood", 25) == 25  # 25 MB to stdout and 25 MB to stderr
        await wait_until(lambda: recorder.of("console_dropped"), what="console_dropped")
        # Every byte written is accounted for, delivered or dropped: the drain caught up.
        gate: Any = host.default_session.supervisor.transport._gate  # pyright: ignore
        written = 2 * 25 * 16 * ((1 << 16) + 1)  # flood(25): both streams

        def accounted() -> int:
            delivered = sum(len(e.data["data"]) for e in recorder.of("console"))
            return delivered + gate._total  # every byte dropped so far

        await wait_until(lambda: accounted() >= written, what="the stderr drain to catch up")
        elapsed = time.monotonic() - start
        grown = me.memory_info().rss - before
        delivered = sum(len(e.data["data"]) for e in recorder.of("console"))
        dropped = sum(e.data["dropped_bytes"] for e in recorder.of("console_dropped"))
        # The budget is a 1 MiB burst plus 256 KiB/s: far below the 50 MB written.
        assert delivered <= 1024 * 1024 + 256 * 1024 * elapsed + 65536
        assert dropped > 10 * 1024 * 1024
        assert grown < 40 * 1024 * 1024, f"host memory grew by {grown / 1e6:.1f} MB"
        assert await host.call("bump") == 1
        assert await host.call("quick") == "quick"


async def test_a_flood_of_lines_shows_whole_lines_and_says_what_it_dropped() -> None:
    count = 40_000  # 6.4 MB in 80,000 lines, printed in two writes each
    async with Host.open(LAB) as host:
        recorder = Recorder(host)
        assert await host.call("flood_lines", count) == count
    # The host is closed: its capsule has exited, so every run of dropped output is said.
    shown = recorder.console()
    for stream, head in (("stdout", "out "), ("stderr", "err ")):
        text = "".join(e.data["data"] for e in recorder.of("console") if e.data["stream"] == stream)
        lines = text.splitlines()
        assert text.endswith("\n") and lines
        odd = [line for line in lines if len(line) != 80 or not line.startswith(head)]
        assert odd == [], odd[:3]
    dropped = recorder.of("console_dropped")
    assert dropped, "a flood over the budget drops output and says so"
    assert all(e.data["dropped_bytes"] > 0 for e in dropped)
    # Every byte shown or dropped is counted once (exactly, on a fake clock, in
    # test_console.py); here the capsule may stop before forwarding its last output.
    counted = len(shown) + sum(e.data["dropped_bytes"] for e in dropped)
    assert counted <= 2 * count * 81
    assert dropped[-1].data["total_bytes"] == counted - len(shown)


# -- a big project ---------------------------------------------------------------------------


def _wide_tools(count: int = 80, params: int = 40) -> str:
    """Tools with many parameters each: their load frame (every tool's parameters) is over
    the pipe's 64 KiB."""
    names = ", ".join(f"parameter_number_{i:02d}_of_the_tool: int = 0" for i in range(params))
    return "\n\n".join(
        f"def wide_{t:03d}({names}) -> int:\n"
        f"    '''Tool {t}.'''\n"
        f"    return parameter_number_00_of_the_tool + {t}\n"
        for t in range(count)
    )


@pytest.mark.parametrize("kind", ["subprocess", pytest.param("wasm", marks=pytest.mark.wasm)])
async def test_a_tool_list_bigger_than_the_pipe_loads(
    make_project: Callable[..., Path], request: pytest.FixtureRequest, kind: str
) -> None:
    """The load frame is written whole before the capsule serves (it waited, unsent past
    the pipe's 64 KiB, until the load timed out)."""
    if kind == "wasm":
        request.getfixturevalue("wasm_prepared")
    extra = '[capsules]\ndefault = "wasm"\n' if kind == "wasm" else ""
    project = make_project(
        tools={"wide": _wide_tools()},
        policy=f'version = 1\n[defaults]\napp = "allow"\n[limits]\nload_timeout = 10\n{extra}',
    )
    async with Host.open(project) as host:
        assert await host.call("wide_079", parameter_number_00_of_the_tool=1) == 80
        assert await host.call("wide_000") == 0
