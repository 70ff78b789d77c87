"""The host's sandbox pool: one code sandbox booted ahead for the next session (on by
default; ``TOOLHOST_SANDBOX_POOL=0`` turns it off).

A real host and real Wasm guests. The pool stays empty until code mode is in use and
the host has a session besides its default one; then a new session's first ``run_code``
gets the guest booted ahead: isolated from every other session, its console and events
its own, and after a reload of the tool files one that knows the new tools.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from host import Host
from host.capsules import _refill
from tests.fixtures.e2e.helpers import wait_gone, wait_until

from .test_wasm import wasm_prepared

pytestmark = [pytest.mark.anyio, pytest.mark.wasm]
__all__ = ["wasm_prepared"]

TOOLS = {
    "calc": """
        import time


        def add(a: int, b: int) -> int:
            '''Add two integers.'''
            return a + b


        def slow(seconds: float) -> float:
            '''Wait, then say how long.'''
            time.sleep(seconds)
            return seconds
    """
}
POLICY = 'version = 1\n[defaults]\nagent = "allow"\n'


@pytest.fixture
def project(
    make_project: Callable[..., Path], wasm_prepared: Any, monkeypatch: pytest.MonkeyPatch
) -> Path:
    del wasm_prepared
    monkeypatch.delenv("TOOLHOST_SANDBOX_POOL", raising=False)  # the default: on
    return make_project(tools=TOOLS, policy=POLICY)


async def _ready(host: Host) -> None:
    pool = host.sandbox_pool
    assert pool is not None
    with anyio.fail_after(60):
        while not pool.ready:  # noqa: ASYNC110 - polling a flag, no event exists
            await anyio.sleep(0.02)


async def test_a_new_session_gets_the_sandbox_booted_ahead(project: Path) -> None:
    async with Host.open(project) as host:
        pool = host.sandbox_pool
        assert pool is not None
        await anyio.sleep(0.2)
        assert not pool.ready and pool.handed == 0  # no code mode yet: nothing booted
        first = await host.run_code("secret_of_a = 41\nawait add(1, 1)")
        assert first.ok and first.value == 2
        await anyio.sleep(0.5)
        assert not pool.ready  # the default session alone: nothing booted for no one
        async with host.session() as other:
            await _ready(host)  # code mode is in use, a second session: one booted ahead
            code = "import os\nos.write(2, b'console of B\\n')\n'secret_of_a' in globals()"
            result = await other.run_code(code)
            assert result.ok, result.error
            assert result.value is False  # a guest of its own: nothing of A's
            assert pool.handed == 1
            assert (await other.run_code("await add(2, 3)")).value == 5
            mine = other.code._guest  # pyright: ignore[reportPrivateUsage]
            theirs = host.default_session.code._guest  # pyright: ignore[reportPrivateUsage]
            assert mine is not None and theirs is not None
            assert mine.process.pid != theirs.process.pid
            with anyio.fail_after(10):
                while not any(  # noqa: ASYNC110 - the console arrives on its own pipe
                    e.kind == "console" and "console of B" in str(e.data.get("data"))
                    for e in host.events.recent
                ):
                    await anyio.sleep(0.02)
            console = [
                e
                for e in host.events.recent
                if e.kind == "console" and "console of B" in str(e.data.get("data"))
            ]
            assert {e.session for e in console} == {other.id}  # the adopting session's
            started = [e.session for e in host.events.recent if e.kind == "sandbox_started"]
            assert started.count(other.id) == 1
            assert "sandbox-pool" not in started
            await other.run_code("secret_of_b = 1")
            await _ready(host)  # the next one is booted behind it: never B's again
            async with host.session() as third:
                seen = await third.run_code("'secret_of_b' in globals()")
                assert seen.ok and seen.value is False
                assert pool.handed == 2
                guest = third.code._guest  # pyright: ignore[reportPrivateUsage]
                assert guest is not None and guest.process.pid != mine.process.pid


async def test_the_next_guest_boots_once_the_first_run_has_ended(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guest's boot beside a new session's first run takes its time from it on one
    CPU: the next one boots once that run has ended (or the grace has passed, here far
    off), not when the session took its guest."""
    monkeypatch.setattr(_refill, "GRACE", 60.0)
    async with Host.open(project) as host:
        pool = host.sandbox_pool
        assert pool is not None
        assert (await host.run_code("await add(1, 1)")).ok
        async with host.session() as first:
            assert (await first.run_code("await add(1, 2)")).ok
            await _ready(host)
            async with host.session() as second, anyio.create_task_group() as tg:
                done = anyio.Event()

                async def run() -> None:
                    result = await second.run_code("await slow(1.0)")
                    assert result.ok, result.error
                    done.set()

                tg.start_soon(run)
                await wait_until(lambda: pool.handed == 1, timeout=30, what="the guest taken")
                await anyio.sleep(0.3)
                assert not done.is_set()
                assert pool.spare_pid is None and pool.refill.pending  # not during the run
                await done.wait()
                await _ready(host)


async def test_the_guest_booted_ahead_lasts_as_long_as_the_other_sessions(
    project: Path,
) -> None:
    """A server whose clients all left keeps no guest booted for them; the next
    client's session that runs code boots one again."""
    async with Host.open(project) as host:
        pool = host.sandbox_pool
        assert pool is not None
        async with host.session():
            async with host.session() as other:
                assert (await other.run_code("await add(1, 2)")).ok
                await _ready(host)
                spare = pool.spare_pid
            assert pool.spare_pid == spare  # one other session is still open
        assert spare is not None
        await wait_gone([spare], timeout=10)
        assert pool.spare_pid is None
        assert (await host.run_code("await add(1, 1)")).ok  # the default session: no boot
        await anyio.sleep(1)
        assert pool.spare_pid is None and not pool.refill.pending
        async with host.session() as again:
            assert (await again.run_code("await add(2, 2)")).value == 4
            await _ready(host)
            assert pool.spare_pid != spare


async def test_a_refill_due_after_the_last_session_boots_nothing(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refill a session's opening put off comes due after that session (the last
    besides the default one) has ended: no guest is wanted any more."""
    monkeypatch.setattr(_refill, "GRACE", 60.0)
    async with Host.open(project) as host:
        pool = host.sandbox_pool
        assert pool is not None
        assert (await host.run_code("await add(1, 1)")).ok  # code mode is in use
        async with host.session():
            await anyio.sleep(0.2)
            assert pool.refill.pending and pool.spare_pid is None
        assert (await host.run_code("await add(1, 2)")).ok  # settles: the refill is due
        await anyio.sleep(0.5)
        assert not pool.refill.pending
        assert pool._maker._spare is None  # pyright: ignore[reportPrivateUsage]


async def test_after_a_reload_the_pool_knows_the_new_tools(project: Path) -> None:
    async with Host.open(project) as host, host.session() as first:
        assert (await first.run_code("await add(1, 1)")).ok
        await _ready(host)
        (project / "tools" / "more.py").write_text(
            "def shout(word: str) -> str:\n    '''Shout.'''\n    return word.upper()\n"
        )
        assert await host.reload_tools()
        await _ready(host)
        async with host.session() as other:
            result = await other.run_code("await shout('a')")
            assert result.ok and result.value == "A", result.error
        assert host.sandbox_pool is not None and host.sandbox_pool.handed == 1


async def test_a_host_with_only_its_default_session_boots_none_ahead(project: Path) -> None:
    """The command line and ``toolhost serve`` over stdio never open a second session:
    their code sandbox is the only guest, before and after many runs and a reset."""
    async with Host.open(project) as host:
        pool = host.sandbox_pool
        assert pool is not None
        for n in range(3):
            assert (await host.run_code(f"await add({n}, 1)")).value == n + 1
            await host.reset_code()
        await anyio.sleep(1)
        assert not pool.ready and pool.handed == 0
        assert "sandbox-pool" not in {e.session for e in host.events.recent}


async def test_the_pool_can_be_turned_off(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLHOST_SANDBOX_POOL", "0")
    async with Host.open(project) as host:
        assert host.sandbox_pool is None
        assert (await host.run_code("await add(1, 1)")).value == 2
        async with host.session() as other:
            assert (await other.run_code("await add(1, 2)")).value == 3
