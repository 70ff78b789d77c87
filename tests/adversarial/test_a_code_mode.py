"""A. Agent code against the sandbox's own rules: time, calls, and asyncio (issue 12,
findings 6, 8 and part of 9).

Each case runs on the real Wasm guest and on the labelled subprocess fallback, and asserts
on what is left afterwards: the run's result (its calls included), the audit, the guest
process gone or still serving, the next run.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

import host.capsules._sandbox as sandbox_module
from host import Host
from tests.fixtures.e2e.helpers import wait_gone, wait_until
from tests.test_wasm import wasm_data_prepared, wasm_prepared

from ._code import KINDS, TOOLS, guest_pid, ok, policy, project

pytestmark = pytest.mark.anyio
__all__ = ["wasm_data_prepared", "wasm_prepared"]  # session fixtures, used by project()

MakeProject = Callable[..., Path]


def calls_of(result: Any) -> list[tuple[str, str | None, bool, str | None]]:
    return [(c.tool, c.decision, c.ok, c.error) for c in result.calls]


# -- finding 6: computing while a call is pending counts against code_timeout -------------


SPIN_WITH_A_CALL_PENDING = """
    import asyncio
    pending = asyncio.create_task(gate({path!r}))
    await asyncio.sleep(0.2)  # the call is in flight now
    {spin}
"""

SPIN = {
    "loop": "while True:\n        pass",
    # In the fallback, a child process computes while the guest itself sleeps: the
    # child's CPU time is the guest's. (Without a fork, as an unprivileged user, the
    # guest computes itself.)
    "child": (
        "import os, time\n    try:\n        child = os.fork()\n    except OSError:\n"
        "        child = 0\n    if child == 0:\n        while True:\n            pass\n"
        "    time.sleep(3600)"
    ),
}


def group(leader: int) -> list[int]:
    """The living processes of ``leader``'s process group (a guest leads its own)."""
    found: list[int] = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == leader and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except OSError:
            continue
    return found


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("spin", ["loop", "child"])
async def test_computing_while_a_call_is_pending_counts(
    make_project: MakeProject,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    kind: str,
    spin: str,
) -> None:
    if spin == "child" and kind != "subprocess":
        pytest.skip("a Wasm guest cannot start processes")
    proj = project(make_project, kind, request)
    door = tmp_path / "door"
    code = textwrap.dedent(SPIN_WITH_A_CALL_PENDING.format(path=str(door), spin=SPIN[spin]))
    async with Host.open(proj, limits={"code_timeout": "1s"}) as host:
        assert ok(await host.run_code("x = 1\nawait slow(1.5)")) == 1.5  # waiting: not counted
        pid = guest_pid(host)
        try:
            # The gate never opens while the run lasts: before, the sandbox's clock stood
            # still while the call was pending and the spin ran until this deadline.
            with anyio.fail_after(60):
                result = await host.run_code(code)
        finally:
            door.touch()
        assert result.error is not None
        error = result.error
        assert (error.kind, error.limit) == ("limit_exceeded", "code_timeout"), error
        assert calls_of(result) == [("gate", "allow", False, "cancelled")]
        await wait_gone([pid], timeout=10)  # the guest is killed, and any child of it
        await wait_until(lambda: not group(pid), timeout=10, what="the guest's children")
        assert ok(await host.run_code("'x' in globals()")) is False  # a fresh sandbox
        assert ok(await host.run_code("await add(2, 3)")) == 5
        assert await host.call("add", 1, 1) == 2  # the tool capsule serves on


# -- the run's clock is its guest's guard: one task per guest, on time after a pause -------

GUARDS = ["lingering", "quiet"]
"""The guard of a guest still ticking fast after its last run, and one gone quiet (after
``_LINGER``; here at once), which a run's start must wake."""


def set_guard(monkeypatch: pytest.MonkeyPatch, guard: str) -> None:
    if guard == "quiet":
        monkeypatch.setattr(sandbox_module, "_LINGER", 0.0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("guard", GUARDS)
async def test_a_run_is_counted_from_its_start_whatever_its_guard_was_doing(
    make_project: MakeProject,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    guard: str,
) -> None:
    """Waiting on a tool longer than ``code_timeout`` does not count, even when the run
    begins while its guard sleeps a quiet tick (longer than the limit here): the run's
    start wakes it, else its first look would count the wait as computing. A spin is
    still stopped."""
    set_guard(monkeypatch, guard)
    proj = project(make_project, kind, request)
    async with Host.open(proj, limits={"code_timeout": "0.4s"}) as host:
        assert ok(await host.run_code("x = 1")) is None
        await anyio.sleep(0.1)  # the guard is past the run's end
        assert ok(await host.run_code("await slow(1.0)")) == 1.0
        assert ok(await host.run_code("x")) == 1  # the same sandbox
        with anyio.fail_after(30):
            result = await host.run_code("while True:\n    pass")
        assert result.error is not None
        assert (result.error.kind, result.error.limit) == ("limit_exceeded", "code_timeout")
        assert ok(await host.run_code("await add(2, 3)")) == 5


WAIT_AND_SPIN = """
    import sys
    sb = sys.modules["capsule._guest"]._SANDBOX
    sb.send({{"k": "use", "id": 99, "run": sb._run, "tool": "gate", "args": [{path!r}],
             "kwargs": {{}}, "wait": True}})
    while True:
        pass
"""


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("guard", GUARDS)
async def test_a_call_the_guest_says_it_waits_for_while_it_computes(
    make_project: MakeProject,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    kind: str,
    guard: str,
) -> None:
    """A ``use`` frame saying ``wait`` is made by the host's read loop itself, with no
    task of its own; a guest that says so and computes anyway is still stopped at
    ``code_timeout``, and the call it made is cut short and recorded."""
    set_guard(monkeypatch, guard)
    proj = project(make_project, kind, request)
    door = tmp_path / "door"
    async with Host.open(proj, limits={"code_timeout": "1s"}) as host:
        assert ok(await host.run_code("x = 1")) is None
        pid = guest_pid(host)
        try:
            with anyio.fail_after(20):  # the gate opens only after the run
                result = await host.run_code(textwrap.dedent(WAIT_AND_SPIN.format(path=str(door))))
        finally:
            door.touch()
        assert result.error is not None
        assert (result.error.kind, result.error.limit) == ("limit_exceeded", "code_timeout")
        assert calls_of(result) == [("gate", "allow", False, "cancelled")]
        await wait_gone([pid], timeout=10)
        assert ok(await host.run_code("'x' in globals()")) is False  # a fresh sandbox
        assert ok(await host.run_code("await add(2, 3)")) == 5


# -- finding 8: the result lists every call that was made, whatever stopped the run -------


@pytest.mark.parametrize("kind", KINDS)
async def test_calls_cut_short_by_the_call_limit_are_listed(
    make_project: MakeProject, request: pytest.FixtureRequest, kind: str
) -> None:
    proj = project(make_project, kind, request)
    async with Host.open(proj, limits={"code_max_calls": 50}) as host:
        result = await host.run_code("await asyncio.gather(*[add(i, 1) for i in range(60)])")
        assert result.error is not None and result.error.limit == "code_max_calls"
        assert len(result.calls) == 50
        assert {(c.tool, c.decision) for c in result.calls} == {("add", "allow")}
        # Each call the audit has from this run is in the result, and no other.
        records = [r for r in await host.store.tail(200) if r.caller == "agent"]
        assert len(records) == len(result.calls)
        assert ok(await host.run_code("await add(1, 1)")) == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_a_call_abandoned_by_wait_for_shows_its_decision(
    make_project: MakeProject, request: pytest.FixtureRequest, kind: str
) -> None:
    proj = project(make_project, kind, request)
    code = """
        import asyncio
        await asyncio.sleep(0)  # on the loop (a run stepped by hand: see the test below)
        try:
            await asyncio.wait_for(count_then_wait(30), 0.5)
            outcome = "finished"
        except TimeoutError:
            outcome = "timed out"
        outcome
    """
    async with Host.open(proj) as host:
        result = await host.run_code(textwrap.dedent(code))
        assert ok(result) == "timed out"
        assert calls_of(result) == [("count_then_wait", "allow", False, "cancelled")]
        assert await host.call("count") == 2  # it did run: it counted once


@pytest.mark.parametrize("kind", KINDS)
async def test_calls_in_flight_when_the_sandbox_dies_are_listed(
    make_project: MakeProject, request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    proj = project(make_project, kind, request)
    door = tmp_path / "door"
    code = f"""
        import asyncio, os
        pending = asyncio.create_task(gate({str(door)!r}))
        await add(1, 2)
        await asyncio.sleep(0.3)
        os._exit(3)
    """
    async with Host.open(proj) as host:
        try:
            result = await host.run_code(textwrap.dedent(code))
        finally:
            door.touch()
        assert result.error is not None and result.error.kind == "capsule_crashed"
        assert sorted(calls_of(result)) == [  # pyright: ignore[reportArgumentType]
            ("add", "allow", True, None),
            ("gate", "allow", False, "cancelled"),
        ]
        assert ok(await host.run_code("await add(2, 2)")) == 4


# -- finding 9 (part): asyncio's task-bound helpers at the top level of a run -------------


@pytest.mark.parametrize("kind", KINDS)
async def test_timeouts_and_task_groups_work_at_the_top_level(
    make_project: MakeProject, request: pytest.FixtureRequest, kind: str
) -> None:
    """A run stepped by hand has no task of its own; ``wait_for``, ``asyncio.timeout`` and
    ``TaskGroup`` ask for one (before, an ``AttributeError ... 'cancelling'``)."""
    proj = project(make_project, kind, request)
    async with Host.open(proj) as host:
        assert ok(await host.run_code("kept = 'yes'")) is None
        for code in (
            "await asyncio.wait_for(slow(30), 0.3)",
            "async with asyncio.timeout(0.3):\n    await slow(30)",
            "x = await add(1, 1)\nawait asyncio.wait_for(slow(30), 0.3)",
        ):
            result = await host.run_code(code)
            assert result.error is not None and result.error.type == "TimeoutError", code
            assert ("slow", "allow", False, "cancelled") in calls_of(result), code
        grouped = (
            "async with asyncio.TaskGroup() as tg:\n"
            "    a = tg.create_task(add(1, 2))\n"
            "    b = tg.create_task(add(3, 4))\n"
            "[a.result(), b.result(), asyncio.current_task() is not None]"
        )
        assert ok(await host.run_code(grouped)) == [3, 7, True]
        # A run that asks for its task and then ends without the loop leaves nothing behind.
        assert ok(await host.run_code("t = asyncio.current_task()\n1")) == 1
        assert ok(await host.run_code("[t.cancelled(), kept]")) == [True, "yes"]
        assert ok(await host.run_code("await add(5, 5)")) == 10


@pytest.mark.slow
@pytest.mark.subprocess
async def test_a_long_lived_fallback_sandbox_is_not_ended_by_its_total_cpu_time(
    make_project: MakeProject,
) -> None:
    """The fallback's RLIMIT_CPU counts the child's whole life; the host moves it up before
    each run, so a session whose runs each stay within code_timeout keeps its sandbox
    (before, it died with SIGXCPU once all its runs together passed code_timeout + 5 s)."""
    proj = make_project(tools=TOOLS, policy=policy("subprocess"))
    code = """
        import asyncio, time
        pending = asyncio.create_task(slow(30))
        await asyncio.sleep(0.05)  # in flight: from here only CPU time counts
        start = time.process_time()
        while time.process_time() - start < 0.45:
            pass
        pending.cancel()
        runs += 1
    """
    async with Host.open(proj, limits={"code_timeout": "1s"}) as host:
        assert ok(await host.run_code("runs = 0")) is None
        pid = guest_pid(host)
        for _ in range(15):  # 6.75 s of CPU in all: more than the 6 s the child had for life
            result = await host.run_code(textwrap.dedent(code))
            assert result.ok, result.error
        assert ok(await host.run_code("runs")) == 15
        assert guest_pid(host) == pid
