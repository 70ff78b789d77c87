"""Subprocess capsules forked from the keeper's zygote (``capsule/_zygote.py``).

A forked capsule must be what a started one is: its own module state, the same hardening
(no new privileges, no capabilities, non-dumpable, only the policy's environment,
Landlock), gone with the host even when the host is SIGKILLed. The variables the policy
passes (secrets among them) never reach the zygote's memory, and a zygote that dies or
cannot serve costs the next session nothing but an event.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from host import Host
from host.capsules import _keeper  # pyright: ignore[reportPrivateUsage]
from host.capsules._forkserver import send_request  # pyright: ignore[reportPrivateUsage]
from host.capsules._guard import containment  # pyright: ignore[reportPrivateUsage]
from host.trust import key_path

from .conftest import ROOT
from .fixtures.e2e.helpers import (
    LAB,
    Recorder,
    alive,
    sigkill_host_script,
    wait_gone,
)

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the keeper is Linux only"),
]

PROBE = {
    "probe": """
        import ctypes
        import os


        def status() -> dict[str, str]:
            with open("/proc/self/status") as f:
                pairs = (line.split(":", 1) for line in f)
                return {key: value.strip() for key, value in pairs}


        def dumpable() -> int:
            return ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE


        def environ() -> dict[str, str]:
            return dict(os.environ)


        def write(path: str) -> str:
            try:
                with open(path, "a") as f:
                    f.write("x")
            except PermissionError:
                return "denied"
            return "written"


        def read(path: str) -> str:
            try:
                with open(path, "rb") as f:
                    f.read(1)
            except PermissionError:
                return "denied"
            return "read"
    """,
}
POLICY = """
    version = 1

    [env]
    pass = ["ZYGOTE_PASSED"]
"""


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


def _forked(pid: int) -> bool:
    """Whether ``pid`` is a fork of the keeper that never exec'd (its command line is the
    keeper's)."""
    return "_keeper_child.py" in _cmdline(pid)


def _pid(session: Any) -> int:
    transport: Any = session.supervisor.transport
    assert transport is not None
    return transport.pid


def _holds(pid: int, needle: bytes) -> bool:
    """Whether ``needle`` is anywhere in the writable memory of ``pid`` (needs root: the
    process is not dumpable)."""
    found = False
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if "w" not in fields[1]:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                found = found or needle in mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue
    return found


@pytest.mark.anyio
async def test_each_sessions_capsule_is_forked_with_its_own_module_state() -> None:
    async with Host.open(LAB) as host:
        recorder = Recorder(host)
        assert await host.call("bump") == 1
        async with host.session() as first, host.session() as second:
            assert await first.call("bump") == 1
            assert await first.call("bump") == 2
            assert await second.call("bump") == 1
            pids = [_pid(host.default_session), _pid(first), _pid(second)]
            assert len(set(pids)) == 3
            assert all(_forked(pid) for pid in pids), [_cmdline(p) for p in pids]
            keepers = {_parent(pid) for pid in pids}
            assert len(keepers) == 1, "one keeper (and zygote) for the host"
            assert _parent(keepers.pop()) == os.getpid()
        await wait_gone(pids[1:])
        async with host.session() as third:
            assert await third.call("bump") == 1, "a new fork starts from the zygote's state"
        assert await host.call("bump") == 2
    assert not recorder.of("zygote_unavailable")


@pytest.mark.anyio
async def test_a_forked_capsule_is_hardened(
    make_project: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    passed = "zygote-passed-" + os.urandom(8).hex()
    monkeypatch.setenv("ZYGOTE_PASSED", passed)
    root = make_project(tools=PROBE, policy=POLICY)
    async with Host.open(root) as host, host.session() as session:
        assert _forked(_pid(session))
        status = await session.call("status")
        assert status["NoNewPrivs"] == "1"
        assert status["CapEff"] == status["CapPrm"] == "0" * 16
        if os.geteuid() == 0:
            assert status["CapBnd"] == "0" * 16
        assert await session.call("dumpable") == 0
        environ = await session.call("environ")
        assert environ["ZYGOTE_PASSED"] == passed
        assert "CANARY_SECRET" not in environ
        assert not {"TOOLHOST_CAPSULE", "TOOLHOST_LIFELINES"} & set(environ)
        if containment().landlock:
            assert await session.call("write", str(root / "policy.toml")) == "denied"
            assert await session.call("write", str(root / "tools" / "probe.py")) == "denied"
            assert await session.call("read", str(key_path())) == "denied"
        if os.geteuid() == 0:  # root reads a non-dumpable process's memory
            keeper = _parent(_pid(session))
            assert not _holds(keeper, passed.encode()), "the zygote holds a passed variable"


@pytest.mark.anyio
@pytest.mark.skipif(os.geteuid() != 0, reason="reads the keeper's memory: needs root")
async def test_a_started_capsules_environment_does_not_stay_in_the_keeper(
    make_project: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Capsules started with exec (no zygote for this host) send their environment through
    # the keeper that later capsules are forked from: it must not stay there.
    passed = "zygote-started-" + os.urandom(8).hex()
    monkeypatch.setenv("ZYGOTE_PASSED", passed)
    root = make_project(tools=PROBE, policy=POLICY + "\n[capsules]\nzygote = false\n")
    async with Host.open(root) as host, host.session() as session:
        assert not _forked(_pid(session))
        assert (await session.call("environ"))["ZYGOTE_PASSED"] == passed
        keeper = _parent(_pid(session))  # the reaper's parent
        assert "_keeper_child.py" in _cmdline(keeper)
        assert not _holds(keeper, passed.encode()), "the keeper kept a capsule's environment"


@pytest.mark.anyio
async def test_a_killed_zygote_is_replaced_and_the_next_session_works() -> None:
    async with Host.open(LAB) as host:
        recorder = Recorder(host)
        assert await host.call("bump") == 1
        first = _pid(host.default_session)
        keeper = _parent(first)
        os.kill(keeper, signal.SIGKILL)
        await wait_gone([keeper, first])  # its capsules see it end (a pidfd) and end too
        async with host.session() as session:
            assert await session.call("bump") == 1
            pid = _pid(session)
            assert _forked(pid)
            assert _parent(pid) != keeper and alive(_parent(pid))
        assert await host.call("bump") == 1, "the default session's capsule was restarted"
    assert not recorder.of("zygote_unavailable")


@pytest.mark.anyio
async def test_a_zygote_that_cannot_load_falls_back_to_a_plain_start_with_an_event(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A keeper that cannot import the capsule runtime (here: a broken package first on
    # its path) serves without a zygote.
    assert not _keeper._current, "a keeper of another test still runs"  # pyright: ignore[reportPrivateUsage]
    broken = tmp_path / "capsule"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('a broken runtime')\n")
    monkeypatch.setattr(_keeper, "_CAPSULE_PARENT", str(tmp_path))
    async with Host.open(LAB) as host:
        recorder = Recorder(host)
        assert await host.call("bump") == 1
        async with host.session() as session:
            assert await session.call("bump") == 1
            assert not _forked(_pid(session))
        events = recorder.of("zygote_unavailable")
    assert events, "the fallback is said in an event"
    assert "could not import the capsule runtime" in str(events[0].data["reason"])


_HOST_SCRIPT = textwrap.dedent(
    """
    import sys

    import anyio
    import psutil

    from host import Host


    async def main() -> None:
        async with Host.open(sys.argv[1]) as host:
            async with host.session() as a, host.session() as b:
                pids = []
                for session in (host.default_session, a, b):
                    await session.call("spawn_sleep")
                    await session.call("double_fork")
                    pids.append(session.supervisor.transport.pid)
                keeper = psutil.Process(pids[0]).ppid()
                tree = [p.pid for p in psutil.Process(keeper).children(recursive=True)]
                print(" ".join(map(str, [keeper, *pids, *tree])), flush=True)
                await anyio.sleep(1000)


    anyio.run(main, backend=sys.argv[2])
    """
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_sigkilled_host_leaves_no_forked_capsule_behind(backend: str) -> None:
    # the keeper, three capsules and their sleeps (the daemons were re-parented to the
    # capsules, which are subreapers)
    pids = sigkill_host_script(_HOST_SCRIPT, [str(LAB), backend], ROOT, least=1 + 3 + 3)
    assert len(set(pids)) >= 7


@pytest.mark.anyio
async def test_many_capsules_starting_at_once_wait_for_the_keepers_socket_in_turn() -> None:
    # A thousand sessions opening together fill the keeper's socket: every request must
    # wait for it to drain, not fail because another one is already waiting.
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    r, w = os.pipe()
    try:
        sent = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                socket.send_fds(ours, [b"x" * 512], [r])
                sent += 1
        lock = anyio.Lock()
        done: list[int] = []

        async def request(index: int) -> None:
            await send_request(ours, lock, b"y" * 512, [r])
            done.append(index)

        async with anyio.create_task_group() as tg:
            for index in range(3):
                tg.start_soon(request, index)
            for _ in range(5):  # each request runs until it waits for the socket
                await anyio.lowlevel.checkpoint()
            assert not done
            received = 0
            while received < sent + 3:
                _data, fds, _flags, _addr = await anyio.to_thread.run_sync(
                    socket.recv_fds, theirs, 1024, 1
                )
                for fd in fds:
                    os.close(fd)
                received += 1
        assert sorted(done) == [0, 1, 2]
    finally:
        ours.close()
        theirs.close()
        os.close(r)
        os.close(w)


@pytest.mark.anyio
async def test_a_forked_capsule_makes_itself_non_dumpable(
    make_project: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only by inheriting it: from a keeper left dumpable (a debugger's
    ``TOOLHOST_KEEP_DUMPABLE=1`` when the host started), a capsule whose settings do not
    keep it dumpable still makes itself non-dumpable."""
    root = make_project(tools=PROBE, policy=POLICY)
    monkeypatch.setenv("TOOLHOST_KEEP_DUMPABLE", "1")
    async with Host.open(root) as host:
        assert _forked(_pid(host.default_session))
        assert await host.call("dumpable") == 1  # the keeper and this capsule: dumpable
        monkeypatch.delenv("TOOLHOST_KEEP_DUMPABLE")
        async with host.session() as session:
            assert _forked(_pid(session))
            assert await session.call("dumpable") == 0
