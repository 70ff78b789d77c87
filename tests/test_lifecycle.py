"""Hosts and sessions opening and closing around real capsules (H09), and a host that dies.

No process outlives the host: not when it closes with calls in flight, and not when it is
SIGKILLed (each capsule notices its parent is gone and kills its own tree).
"""

from __future__ import annotations

import textwrap
import time

import anyio
import pytest

from host import CallError, CapsuleCrashed, Host

from .conftest import ROOT
from .fixtures.e2e.helpers import (
    LAB,
    Recorder,
    alive,
    calls_in_flight,
    capsule_pids,
    sigkill_host_script,
    wait_gone,
    wait_until,
)

pytestmark = [pytest.mark.subprocess]


@pytest.mark.anyio
async def test_closing_the_host_fails_calls_in_flight_and_returns_promptly() -> None:
    failures: list[BaseException] = []

    async def pending(host: Host, *args: object) -> None:
        with pytest.raises(CapsuleCrashed) as info:
            await host.call(*args)  # pyright: ignore[reportArgumentType]
        failures.append(info.value)

    async with anyio.create_task_group() as tg:
        start = time.monotonic()
        async with Host.open(LAB) as host:
            pids = capsule_pids(host)
            tg.start_soon(pending, host, "nap", 60)
            tg.start_soon(pending, host, "block", 60)
            await wait_until(lambda: calls_in_flight(host) == 2, what="both calls sent")
        closed = time.monotonic() - start
    assert closed < 10, f"closing took {closed:.1f} s"
    assert len(failures) == 2
    assert all(f.may_have_executed for f in failures)
    await wait_gone(pids)
    with pytest.raises(CallError):
        await host.call("quick")


@pytest.mark.anyio
async def test_sessions_are_independent_and_close_with_their_capsule() -> None:
    async with Host.open(LAB) as host:
        recorder = Recorder(host)
        await host.call("bump")
        async with host.session() as first, host.session() as second:
            assert first.id != second.id != host.default_session.id
            assert await first.call("bump") == 1
            assert await first.call("bump") == 2
            assert await second.call("bump") == 1
            first_pids = [first.supervisor.transport.pid]  # pyright: ignore[reportOptionalMemberAccess, reportAttributeAccessIssue]
            assert await second.tools.state.bump() == 2
        await wait_gone(first_pids)
        assert await host.call("bump") == 2
        sessions = {e.session for e in recorder.of("capsule_started")}
        assert len(sessions) == 2, "one capsule started for each new session"


@pytest.mark.anyio
async def test_a_cancelled_call_leaves_the_capsule_serving() -> None:
    async with Host.open(LAB) as host:
        pid = capsule_pids(host)[0]
        with anyio.move_on_after(0.3):
            await host.call("nap", 30)
        with anyio.move_on_after(0.3):
            await host.call("block", 1)
        assert await host.call("bump") == 1
        assert capsule_pids(host)[0] == pid and alive(pid)


# -- the host process itself is killed -----------------------------------------------------

_HOST_SCRIPT = textwrap.dedent(
    """
    import sys

    import anyio
    import psutil

    from host import Host


    async def main() -> None:
        async with Host.open(sys.argv[1]) as host:
            plain = await host.call("spawn_sleep")
            daemon = await host.call("double_fork")
            await host.call("bump")
            root = host.default_session.supervisor.transport.pid
            tree = [p.pid for p in psutil.Process(root).children(recursive=True)]
            print(" ".join(map(str, [plain, daemon, root, *tree])), flush=True)
            await anyio.sleep(1000)


    anyio.run(main, backend=sys.argv[2])
    """
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_sigkilled_host_leaves_no_process_behind(backend: str) -> None:
    # the two sleeps, the capsule, its worker
    sigkill_host_script(_HOST_SCRIPT, [str(LAB), backend], ROOT, least=4)
