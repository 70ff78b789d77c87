"""The host's capsule pool: one tool capsule process started ahead (forked, hardened,
confined, waiting for its tool files) for the next session's capsule (on by default;
``TOOLHOST_CAPSULE_POOL=0`` turns it off).

Real hosts and real capsule processes. The pool stays empty while the host has only its
default session; then each new session's capsule is the process started ahead, with
module state of its own and the same confinement as any capsule. A spare that died, or
that was started with other settings, is never handed out; the last other session's end
and the host's close end it.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest

from host import Host, Session
from host.capsules import CapsulePool, _refill
from host.capsules import _capsule_pool as capsule_pool
from tests.fixtures.e2e.helpers import wait_gone, wait_until

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.subprocess,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux processes"),
]

TOOLS = {
    "state": """
        import os

        _count = 0


        def bump() -> int:
            '''Count the calls of this capsule.'''
            global _count
            _count += 1
            return _count


        def whoami() -> int:
            '''The capsule's pid.'''
            return os.getpid()


        def peek(path: str) -> str:
            '''Read a file, or say why not.'''
            try:
                with open(path, encoding="utf-8") as f:
                    return f.read()
            except OSError as exc:
                return type(exc).__name__
    """
}
POLICY = 'version = 1\n[defaults]\nagent = "allow"\napp = "allow"\n'


@pytest.fixture
def project(make_project: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TOOLHOST_CAPSULE_POOL", raising=False)  # the default: on
    return make_project(tools=TOOLS, policy=POLICY)


def pool_of(host: Host) -> CapsulePool:
    pool = host.capsule_pool
    assert pool is not None
    return pool


async def spare_started(pool: CapsulePool) -> int:
    await wait_until(lambda: pool.spare_pid is not None, timeout=30, what="a spare capsule")
    pid = pool.spare_pid
    assert pid is not None
    return pid


async def on_the_spare(host: Host, stack: AsyncExitStack) -> Session:
    """A new session whose capsule is the spare. A spare is not used once a folder its
    rules list an entry of has changed (``/tmp`` above the project, where other tests
    make files): then the next one is tried."""
    pool = pool_of(host)
    taken = pool.taken
    for _ in range(20):
        spare = await spare_started(pool)
        session = await stack.enter_async_context(host.session())
        if await session.call("whoami") == spare:
            assert pool.taken == taken + 1
            return session
    raise AssertionError("no new session got the spare in 20 tries")


async def test_a_new_session_gets_the_capsule_started_ahead(project: Path) -> None:
    async with Host.open(project) as host:
        pool = pool_of(host)
        assert await host.call("bump") == 1
        await anyio.sleep(0.3)
        assert pool.spare_pid is None  # the default session alone: nothing for no one
        async with host.session() as first, AsyncExitStack() as stack:
            assert await first.call("bump") == 1  # a capsule of its own
            second = await on_the_spare(host, stack)
            assert await second.call("bump") == 1  # nothing of the other sessions'
            assert await second.call("bump") == 2
            assert await first.call("bump") == 2
            assert await host.call("bump") == 2
            # The next one is started ahead again, a new process.
            mine = {await second.call("whoami"), await first.call("whoami")}
            assert await spare_started(pool) not in mine


async def test_a_capsule_from_the_pool_is_confined_as_any(project: Path) -> None:
    key = project / ".agent" / "secret-for-the-test"
    key.parent.mkdir(exist_ok=True)
    key.write_text("host state", encoding="utf-8")
    async with Host.open(project) as host:
        pool = pool_of(host)
        assert await host.call("peek", str(key)) == "PermissionError"
        async with host.session(), AsyncExitStack() as stack:
            second = await on_the_spare(host, stack)
            assert await second.call("peek", str(key)) == "PermissionError"
            assert await second.call("peek", str(project / "policy.toml")) != "PermissionError"
            assert pool.taken >= 1


async def test_a_file_made_after_the_spare_started_is_readable_to_the_next_session(
    project: Path,
) -> None:
    """A capsule's Landlock rules grant the entries of the project folder one by one (it
    holds the denied state folder), as they were when it started: a spare started before
    a file was made there would not see it, so it is not used."""
    async with Host.open(project) as host:
        pool = pool_of(host)
        async with host.session():
            spare = await spare_started(pool)
            later = project / "made-later.txt"
            later.write_text("made later", encoding="utf-8")
            async with host.session() as second:
                assert await second.call("peek", str(later)) == "made later"
                assert await second.call("whoami") != spare
                assert pool.taken == 0
            async with AsyncExitStack() as stack:  # one started after it: used
                third = await on_the_spare(host, stack)
                assert await third.call("peek", str(later)) == "made later"


@pytest.mark.parametrize("looked", ["seen", "unseen"])
async def test_a_spare_that_died_is_not_handed_out(
    project: Path, monkeypatch: pytest.MonkeyPatch, looked: str
) -> None:
    """Seen dead when taken (a zombie whose server has not said so yet), or dying
    after that look ("unseen": the look passes it): either way the session's capsule is
    a new start, and no crash is recorded against the session."""
    if looked == "unseen":
        monkeypatch.setattr(capsule_pool, "_fit", lambda started: True)
        monkeypatch.setattr(capsule_pool, "stamp", lambda folders: ())  # however /tmp changes
    async with Host.open(project) as host:
        pool = pool_of(host)
        async with host.session():
            spare = await spare_started(pool)
            os.kill(spare, signal.SIGKILL)
            await wait_gone([spare], timeout=10)  # a zombie: its server reaps it later
            async with host.session() as second:
                pid = await second.call("whoami")
                assert pid != spare
                assert await second.call("bump") == 1
            assert pool.taken == (0 if looked == "seen" else 1)
            events = [e.kind for e in host.events.recent]
            assert "capsule_crashed" not in events and "capsule_unavailable" not in events


async def test_the_spare_lasts_as_long_as_the_other_sessions(project: Path) -> None:
    """A server whose clients all left keeps nothing of theirs, the spare included; the
    next client's session starts one again."""
    async with Host.open(project) as host:
        pool = pool_of(host)
        async with host.session():
            async with host.session():
                spare = await spare_started(pool)
            assert pool.spare_pid == spare  # one other session is still open
        await wait_gone([spare], timeout=10)
        assert pool.spare_pid is None
        await anyio.sleep(0.3)
        assert pool.spare_pid is None
        async with host.session() as again:
            assert await again.call("bump") == 1
            assert await spare_started(pool) != spare


async def test_the_next_spare_waits_for_the_first_call_of_the_session(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On one CPU a spare's start beside a new session's first call takes its time from
    it: the spare starts once that call has ended (or the grace has passed, here far
    off)."""
    monkeypatch.setattr(_refill, "GRACE", 60.0)
    async with Host.open(project) as host:
        pool = pool_of(host)
        async with host.session() as first:
            await anyio.sleep(0.5)
            assert pool.spare_pid is None and pool.refill.pending
            assert await first.call("bump") == 1
            await spare_started(pool)
            assert not pool.refill.pending


async def test_closing_the_host_ends_the_spare(project: Path) -> None:
    async with Host.open(project) as host, host.session():
        spare = await spare_started(pool_of(host))
    await wait_gone([spare], timeout=10)


async def test_a_host_with_only_its_default_session_starts_none(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Host.open(project) as host:
        pool = pool_of(host)
        for _ in range(3):
            await host.call("bump")
        await anyio.sleep(0.5)
        assert pool.spare_pid is None and pool.taken == 0
    monkeypatch.setenv("TOOLHOST_CAPSULE_POOL", "0")
    async with Host.open(project) as host:
        assert host.capsule_pool is None
        async with host.session() as other:
            assert await other.call("bump") == 1


# -- the pool alone, with stand-in processes -------------------------------------------


class _Starts:
    """A ``spawn`` starting ``sleep`` children with a pipe pair each, counting starts."""

    def __init__(self) -> None:
        self.started: list[int] = []

    async def __call__(self) -> tuple[Any, int, int]:
        child_in, host_out = os.pipe()
        host_in, child_out = os.pipe()
        process = await anyio.open_process(
            ["sleep", "60"], stdin=child_in, stdout=child_out, start_new_session=True
        )
        os.close(child_in)
        os.close(child_out)
        self.started.append(process.pid)
        return process, host_out, host_in


async def test_a_spare_started_another_way_is_not_used() -> None:
    pool = CapsulePool()
    starts = _Starts()
    async with anyio.create_task_group() as tg:
        first = await pool.spawner("settings A", starts, tg)()
        pool.more_sessions()
        await wait_until(lambda: pool.spare_pid is not None, timeout=10, what="a spare")
        spare = pool.spare_pid
        # Another command, folder or environment (a reloaded policy): a start of its own.
        other = await pool.spawner("settings B", starts, tg)()
        assert other[0].pid not in (spare, first[0].pid)
        assert pool.taken == 0
        assert spare is not None
        await wait_gone([spare], timeout=10)  # the useless spare was killed
        # The same settings as the spare's: taken.
        pool.fill()
        await wait_until(lambda: pool.spare_pid is not None, timeout=10, what="a spare")
        spare = pool.spare_pid
        again = await pool.spawner("settings B", starts, tg)()
        assert again[0].pid == spare and pool.taken == 1
        pool.fill()
        await wait_until(lambda: pool.spare_pid is not None, timeout=10, what="a spare")
        spare = pool.spare_pid
        assert spare is not None
        await pool.aclose()  # the host closes: its spare ends with it
        await wait_gone([spare], timeout=10)
        pool.fill()
        assert pool.spare_pid is None and len(starts.started) == 5  # no more after that
        for process, out, into in (first, other, again):
            process.kill()
            await process.aclose()
            os.close(out)
            os.close(into)


async def test_a_refill_waits_for_the_host_to_settle_or_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = CapsulePool()
    starts = _Starts()
    monkeypatch.setattr(_refill, "GRACE", 60.0)
    async with anyio.create_task_group() as tg:
        first = await pool.spawner("settings", starts, tg)()
        pool.more_sessions()
        pool.more_sessions()  # one wait at a time
        await anyio.sleep(0.3)
        assert len(starts.started) == 1 and pool.refill.pending
        pool.refill.settle()  # a session has nothing in flight any more
        await wait_until(lambda: pool.spare_pid is not None, timeout=10, what="a spare")
        assert len(starts.started) == 2 and not pool.refill.pending
        pool.refill.settle()  # nothing waits: nothing starts
        taken = await pool.spawner("settings", starts, tg)()
        assert taken[0].pid == starts.started[1]
        monkeypatch.setattr(_refill, "GRACE", 0.3)  # no session settles: the grace ends it
        begun = anyio.current_time()
        pool.more_sessions()
        await wait_until(lambda: pool.spare_pid is not None, timeout=10, what="a spare")
        assert anyio.current_time() - begun >= 0.25
        assert len(starts.started) == 3
        pool.no_more_sessions()
        pool.more_sessions()
        pool.no_more_sessions()  # the last session ended while the refill waited
        await anyio.sleep(0.5)
        assert len(starts.started) == 3 and pool.spare_pid is None
        await pool.aclose()
        for process, out, into in (first, taken):
            process.kill()
            await process.aclose()
            os.close(out)
            os.close(into)
