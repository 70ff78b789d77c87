"""The supervisor against real capsules: timeouts, crashes, crash loops and load failures."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from host import (
    CapsuleCrashed,
    DeclarationError,
    Host,
    ToolError,
    ToolTimeout,
    ToolUnavailable,
)
from host.capsules._transport import Connection  # pyright: ignore[reportPrivateUsage]

from .fixtures.e2e.helpers import (
    LAB,
    Recorder,
    alive,
    calls_in_flight,
    capsule_pids,
    policy,
    wait_gone,
    wait_until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.subprocess]

MakeProject = Callable[..., Path]


# -- timeouts (C08, H11) -------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["hang", "ahang", "spin"])
async def test_a_hanging_call_times_out_and_the_capsule_is_replaced(tool: str) -> None:
    async with Host.open(LAB, policy=policy("timeout")) as host:
        recorder = Recorder(host)
        assert await host.call("bump") == 1
        old = capsule_pids(host)
        start = time.monotonic()
        with pytest.raises(ToolTimeout) as info:
            await host.call(tool)
        elapsed = time.monotonic() - start
        assert 0.9 <= elapsed < 8.0, f"the 1 s deadline fired after {elapsed:.2f} s"
        assert info.value.timeout == 1.0
        assert info.value.to_data()["may_have_executed"] is True
        await wait_gone(old)
        assert [e.data["tool"] for e in recorder.of("call_timed_out")] == [tool]
        assert await host.call("bump") == 1, "module state was lost with the old capsule"
        assert capsule_pids(host)[0] not in old
        started = recorder.of("capsule_started")
        assert started and started[-1].data["state_lost"] is True
        assert started[-1].data["restart"] is True


async def test_other_calls_in_flight_fail_when_a_call_times_out() -> None:
    async with Host.open(LAB, policy=policy("timeout"), limits={"call_timeout": 2.0}) as host:
        outcomes: dict[str, BaseException] = {}

        async def run(name: str, *args: object) -> None:
            try:
                await host.call(name, *args)
            except Exception as exc:
                outcomes[name] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "hang")
            await wait_until(lambda: calls_in_flight(host) == 1, what="hang in the capsule")
            # Not a wait for another task: the two deadlines must fall in different ticks
            # of the connection's watchdog, so that hang's expires while nap is in flight.
            await anyio.sleep(4 * Connection.TICK)
            tg.start_soon(run, "nap", 100)
        assert isinstance(outcomes["hang"], ToolTimeout)
        assert isinstance(outcomes["nap"], CapsuleCrashed)
        assert outcomes["nap"].may_have_executed is True
        assert await host.call("quick") == "quick"


# -- crashes (H01, H02, H06) ---------------------------------------------------------------


@pytest.mark.parametrize("tool", ["exit_now", "kill_self"])
async def test_a_crash_fails_every_call_in_flight(tool: str) -> None:
    async with Host.open(LAB) as host:
        recorder = Recorder(host)
        await host.call("bump")
        old = capsule_pids(host)
        failures: list[BaseException] = []

        async def doomed(name: str, *args: object) -> None:
            with pytest.raises(CapsuleCrashed) as info:
                await host.call(name, *args)
            failures.append(info.value)

        start = time.monotonic()
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(doomed, "nap", 60)
            tg.start_soon(doomed, "block", 60)
            await wait_until(lambda: calls_in_flight(host) == 6, what="six calls in the capsule")
            tg.start_soon(doomed, tool)
        assert time.monotonic() - start < 15, "a crash must fail calls promptly"
        assert len(failures) == 7
        assert all(f.may_have_executed for f in failures)
        await wait_gone(old)
        assert recorder.of("capsule_crashed")
        assert await host.call("bump") == 1, "a new capsule, with fresh state"
        assert capsule_pids(host)[0] not in old
        assert recorder.of("capsule_started")[-1].data["state_lost"] is True


def capsule_processes(me: psutil.Process, before: set[int]) -> list[psutil.Process]:
    """This process's capsules started since ``before`` (the pids below it then: another
    test's helpers may still run in this process): its children but the audit writer and
    the keeper, and the keeper's children (a capsule forked from the keeper's zygote has
    its command line)."""
    found: list[psutil.Process] = []
    for child in me.children():
        with contextlib.suppress(psutil.Error):
            line = " ".join(child.cmdline())
            if "_journal.py" in line:
                continue
            if "_keeper_child.py" in line:
                found.extend(child.children(recursive=True))
                continue
            found.append(child)
    return [p for p in found if p.pid not in before]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_crash_looping_tool_becomes_unavailable_then_retries() -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    async with Host.open(LAB, policy=policy("crashloop")) as host:
        recorder = Recorder(host)
        for _ in range(3):
            with pytest.raises(CapsuleCrashed):
                await host.call("exit_now")
        # max_restarts = 3: the circuit is open, calls fail fast, nothing restarts.
        started = len(recorder.of("capsule_started"))
        me = psutil.Process()
        cpu = sum(me.cpu_times()[:2])
        start = time.monotonic()
        with pytest.raises(ToolUnavailable) as info:
            await host.call("quick")
        assert time.monotonic() - start < 0.5, "an unavailable tool fails fast"
        assert "crashed 3 times" in info.value.reason
        assert recorder.of("capsule_unavailable")
        await anyio.sleep(1.0)  # a window to measure CPU in, not a wait for another task
        with pytest.raises(ToolUnavailable):
            await host.call("bump")
        assert sum(me.cpu_times()[:2]) - cpu < 0.5, "no busy loop while unavailable"
        assert len(recorder.of("capsule_started")) == started
        assert not capsule_processes(me, before), "no capsule runs while the circuit is open"
        supervisor: Any = host.default_session.supervisor
        await wait_until(
            lambda: time.monotonic() >= supervisor._open_until, what="the circuit to close"
        )
        assert await host.call("bump") == 1
        assert len(recorder.of("capsule_started")) == started + 1


# -- load failures (C09) -------------------------------------------------------------------

GOOD = """
def ok() -> str:
    return "ok"
"""


async def test_a_file_raising_at_import_is_isolated(make_project: MakeProject) -> None:
    project = make_project(
        {
            "good": GOOD,
            "bad": """
            def broken() -> None: ...

            def _fail() -> None:
                raise RuntimeError("import-time boom")

            _fail()
            """,
        }
    )
    async with Host.open(project) as host:
        assert await host.call("ok") == "ok"
        with pytest.raises(ToolUnavailable) as info:
            await host.call("broken")
        reason = info.value.reason
        assert "bad.py" in reason and "RuntimeError: import-time boom" in reason
        assert "Traceback" in reason and "in _fail" in reason
        assert set(host.default_session.failed_files) == {"bad"}
        assert await host.call("ok") == "ok"


async def test_a_file_hanging_at_import_is_isolated(make_project: MakeProject) -> None:
    project = make_project(
        {
            "good": GOOD,
            "slow": """
            import time

            def never() -> None: ...

            time.sleep(1000)
            """,
        },
        policy="""
        version = 1
        [limits]
        load_timeout = "2s"
        """,
    )
    start = time.monotonic()
    async with Host.open(project) as host:
        assert time.monotonic() - start < 15
        assert await host.call("ok") == "ok"
        with pytest.raises(ToolUnavailable) as info:
            await host.call("never")
        assert "did not finish within 2 s" in info.value.reason
        assert "slow.py" in info.value.reason


async def test_a_file_that_exits_at_import_is_isolated(make_project: MakeProject) -> None:
    project = make_project(
        {
            "good": GOOD,
            "quitter": """
            import os

            def gone() -> None: ...

            os._exit(7)
            """,
        }
    )
    async with Host.open(project) as host:
        assert await host.call("ok") == "ok"
        with pytest.raises(ToolUnavailable) as info:
            await host.call("gone")
        assert "status 7" in info.value.reason or "closed its output" in info.value.reason
        assert "quitter.py" in info.value.reason
        assert await host.call("ok") == "ok"
        kinds = [e.kind for e in host.events.recent]
        assert "tool_file_failed" in kinds
        assert "capsule_crashed" not in kinds, "a load failure is not a crash"


async def test_a_syntax_error_is_a_declaration_error_with_file_and_line(
    make_project: MakeProject,
) -> None:
    project = make_project({"good": GOOD, "typo": "def f(:\n    pass\n"})
    with pytest.raises(DeclarationError) as info:
        async with Host.open(project):
            pass  # pragma: no cover - Host.open refuses the project
    assert info.value.file is not None and info.value.file.endswith("typo.py")
    assert info.value.line == 1
    assert "typo.py:1" in str(info.value)


async def test_a_file_whose_run_time_exports_differ_is_refused(
    make_project: MakeProject,
) -> None:
    project = make_project(
        {
            "good": GOOD,
            "tricky": """
            def _replace(fn):
                return 42

            def kept() -> str:
                return "kept"

            @_replace
            def replaced() -> str:
                return "never"
            """,
        }
    )
    async with Host.open(project) as host:
        assert await host.call("ok") == "ok"
        for name in ("kept", "replaced"):
            with pytest.raises(ToolUnavailable) as info:
                await host.call(name)
            reason = info.value.reason
            assert "tricky.py" in reason
            assert "['kept', 'replaced']" in reason, reason  # what discovery declared
            assert "['kept']" in reason, reason  # what the file exports at run time


async def test_a_tool_error_does_not_count_as_a_crash() -> None:
    async with Host.open(LAB, policy=policy("crashloop")) as host:
        recorder = Recorder(host)
        pid = capsule_pids(host)[0]
        for _ in range(5):
            with pytest.raises(ToolError):
                await host.call("boom", 1)
        assert await host.call("quick") == "quick"
        assert capsule_pids(host)[0] == pid and alive(pid)
        assert not recorder.of("capsule_crashed")
