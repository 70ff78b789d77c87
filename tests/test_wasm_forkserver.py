"""The fork server that starts code-sandbox guests: what a forked guest gets (only its own
pipes, no environment, its own session), how it ends, and that nothing outlives the host.

Guests here are real: forked by the real server (``host/_wasm_child.py zygote``) from the
compiled module that ``wasm_prepared`` makes once per test session.
"""

from __future__ import annotations

import os
import signal
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import psutil
import pytest

from host import Host, HostError
from host.capsules import _forkserver, _wasm, _wasm_cache

from .conftest import ROOT
from .fixtures.e2e.helpers import sigkill_host_script, wait_gone, wait_until
from .test_wasm import wasm_prepared

pytestmark = [pytest.mark.anyio, pytest.mark.wasm]
__all__ = ["wasm_prepared"]  # the session fixture, reused here

# Says "up", waits for one byte, says what it saw, then exits with the status it was sent.
PROBE = (
    "import os; os.write(1, b'up ' + repr(sorted(os.environ)).encode() + b'\\n'); "
    "b = os.read(0, 1); os.write(1, b'bye\\n'); sys.exit(b[0] if b else 9)"
)


@pytest.fixture
async def lease(wasm_prepared: _wasm_cache.Prepared) -> AsyncIterator[_forkserver.Lease]:
    held = _forkserver.Lease(wasm_prepared.cwasm)
    try:
        yield held
    finally:
        await held.release()


class Guest:
    def __init__(self, process: _forkserver.ForkedProcess, write: int, read: int) -> None:
        self.process = process
        self.write = write
        self.read = read

    async def line(self) -> bytes:
        data = b""
        with anyio.fail_after(30):
            while not data.endswith(b"\n"):
                await anyio.wait_readable(self.read)
                chunk = os.read(self.read, 4096)
                if not chunk:
                    break
                data += chunk
        return data

    async def close(self) -> None:
        os.close(self.write)
        os.close(self.read)
        await self.process.aclose()


async def start(
    lease: _forkserver.Lease, prepared: _wasm_cache.Prepared, code: str = PROBE, **env: str
) -> Guest:
    spec = _wasm.GuestSpec(
        cwasm=prepared.cwasm,
        argv=_wasm.guest_argv(code),
        env=env,
        preopens=[_wasm.Preopen(prepared.lib, _wasm.LIB_GUEST)],
    )
    return Guest(*await _forkserver.spawn(lease, spec))


def _pipe_inode(fd: int) -> str:
    return f"pipe:[{os.fstat(fd).st_ino}]"


async def test_a_forked_guest_gets_its_own_pipes_and_nothing_else(
    lease: _forkserver.Lease, wasm_prepared: _wasm_cache.Prepared
) -> None:
    first = await start(lease, wasm_prepared, SEEN="yes")
    second = await start(lease, wasm_prepared)
    try:
        assert (await first.line()).startswith(b"up ['SEEN']")  # exactly the spec's env
        assert (await second.line()).startswith(b"up []")
        server = lease.server().process.pid
        for guest, other in ((first, second), (second, first)):
            pid = guest.process.pid
            fds = {
                int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")
            }
            # Its stdin and stdout are the pipes this process holds the other ends of.
            assert fds.pop(0) == _pipe_inode(guest.write)
            assert fds.pop(1) == _pipe_inode(guest.read)
            assert fds.pop(2).startswith("pipe:")
            # Nothing else of the server's or the host's: no socket, no pipe (of the other
            # guest, of a status), no file but the preopened folder and the compiled module
            # wasmtime mapped (a sealed memfd of its verified bytes, never the .cwasm file);
            # wasmtime's own event descriptors are made in the child.
            for target in fds.values():
                assert not target.startswith(("pipe:", "socket:")), fds
                if target.startswith("/"):
                    assert target in (
                        wasm_prepared.lib,
                        "/memfd:toolhost-cwasm (deleted)",
                    ), fds
                else:
                    assert target in ("anon_inode:[eventpoll]", "anon_inode:[eventfd]"), fds
            assert _pipe_inode(other.write) not in fds.values()
            proc = psutil.Process(pid)
            assert proc.ppid() == server != os.getpid()
            assert os.getsid(pid) == pid, "a guest leads its own session"
            environ = proc.environ()  # the server's, from its start: bare
            assert "CANARY_SECRET" not in environ
            assert set(environ) <= {"PATH", "LANG"}
        os.write(first.write, bytes([3]))
        os.write(second.write, bytes([0]))
        assert await first.line() == b"bye\n"
        assert await first.process.wait() == 3
        assert await second.process.wait() == 0
        # Ended, but not reaped while this process holds its status pipe: the pid is still
        # the guest's own, so killing it by pid cannot hit anything else.
        assert psutil.Process(first.process.pid).status() == psutil.STATUS_ZOMBIE
    finally:
        await first.close()
        await second.close()
    # Reaped once let go.
    await wait_until(lambda: not psutil.pid_exists(first.process.pid), what="the reap")


async def test_a_killed_guest_reports_its_signal(
    lease: _forkserver.Lease, wasm_prepared: _wasm_cache.Prepared
) -> None:
    guest = await start(lease, wasm_prepared)
    try:
        await guest.line()
        assert guest.process.returncode is None
        guest.process.kill()
        assert await guest.process.wait() == -signal.SIGKILL
    finally:
        await guest.close()


async def test_letting_go_of_a_running_guest_kills_it(
    lease: _forkserver.Lease, wasm_prepared: _wasm_cache.Prepared
) -> None:
    guest = await start(lease, wasm_prepared)
    await guest.line()
    pid = guest.process.pid
    await guest.process._stderr.aclose()  # pyright: ignore[reportPrivateUsage]
    os.close(guest.process._status)  # pyright: ignore[reportPrivateUsage]
    os.close(guest.write)
    os.close(guest.read)
    await wait_gone([pid])


async def test_guests_die_with_the_server_and_a_new_server_takes_over(
    lease: _forkserver.Lease, wasm_prepared: _wasm_cache.Prepared
) -> None:
    guest = await start(lease, wasm_prepared)
    await guest.line()
    server = lease.server().process
    server.kill()
    assert await guest.process.wait() == -signal.SIGKILL
    await guest.close()
    await wait_gone([guest.process.pid])
    server.wait()
    again = await start(lease, wasm_prepared)  # a new server, started by the lease
    try:
        assert (await again.line()).startswith(b"up")
        assert lease.server().process.pid != server.pid
        os.write(again.write, bytes([0]))
        assert await again.process.wait() == 0
    finally:
        await again.close()


async def test_the_last_lease_stops_the_server(wasm_prepared: _wasm_cache.Prepared) -> None:
    first = _forkserver.Lease(wasm_prepared.cwasm)
    second = _forkserver.Lease(wasm_prepared.cwasm)
    server = first.server().process
    assert second.server().process is server
    guest = await start(first, wasm_prepared)
    await guest.line()
    await first.release()
    assert server.poll() is None, "another lease still holds it"
    await second.release()
    assert server.poll() is not None, "stopped and reaped"
    assert server.pid not in {p.pid for p in psutil.Process().children()}
    assert await guest.process.wait() == -signal.SIGKILL
    await guest.close()
    with pytest.raises(_forkserver.ForkUnavailable):
        first.server()


async def test_a_closed_host_leaves_no_server_or_guest(tmp_path: Path) -> None:
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "calc.py").write_text(
        "def add(a: int, b: int) -> int:\n    return a + b\n"
    )
    (tmp_path / "policy.toml").write_text('version = 1\n[defaults]\nagent = "allow"\n')
    async with Host.open(tmp_path) as host:
        assert (await host.run_code("await add(1, 2)")).value == 3
        await host.reset_code()
        assert (await host.run_code("2")).value == 2
        mine = psutil.Process().children(recursive=True)
        servers = [p for p in mine if "zygote" in p.cmdline()]
        assert servers, "the sandbox was forked by the server"
        guests = servers[0].children()
        assert guests
    await wait_gone([p.pid for p in [*servers, *guests]])
    assert not [p for p in psutil.Process().children(recursive=True) if "zygote" in p.cmdline()]


def _calc_project(root: Path) -> Path:
    (root / "tools").mkdir()
    (root / "tools" / "calc.py").write_text("def add(a: int, b: int) -> int:\n    return a + b\n")
    (root / "policy.toml").write_text('version = 1\n[defaults]\nagent = "allow"\n')
    return root


def _servers() -> list[psutil.Process]:
    return [p for p in psutil.Process().children() if "zygote" in p.cmdline()]


async def test_a_dead_server_is_replaced_and_the_session_goes_on(tmp_path: Path) -> None:
    async with Host.open(_calc_project(tmp_path)) as host:
        assert (await host.run_code("x = await add(1, 2)\nx")).value == 3
        (server,) = _servers()
        guests = server.children()
        assert guests
        server.kill()
        await wait_gone([server.pid, *(g.pid for g in guests)])  # they die with it
        result = await host.run_code("await add(2, 2)")
        assert result.value == 4
        assert any("variables and imports of earlier runs were lost" in w for w in result.warnings)
        (again,) = _servers()
        assert again.pid != server.pid


async def test_switched_off_guests_are_children_of_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLHOST_FORKSERVER", "0")
    async with Host.open(_calc_project(tmp_path)) as host:
        assert (await host.run_code("await add(1, 2)")).value == 3
        assert not _servers()
        children = [" ".join(p.cmdline()) for p in psutil.Process().children()]
        assert any("_wasm_child.py run" in c for c in children), children


_HOST_SCRIPT = textwrap.dedent(
    """
    import sys

    import anyio
    import psutil

    from host import Host


    async def main() -> None:
        async with Host.open(sys.argv[1]) as host:
            assert (await host.run_code("1")).ok
            await host.reset_code()
            assert (await host.run_code("2")).ok
            mine = psutil.Process().children(recursive=True)
            pids = [p.pid for p in mine if "zygote" in p.cmdline()]
            print(" ".join(map(str, pids)), flush=True)
            await anyio.sleep(1000)


    anyio.run(main, backend=sys.argv[2])
    """
)


def test_a_sigkilled_host_leaves_no_server_or_guest_behind(tmp_path: Path) -> None:
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "calc.py").write_text(
        "def add(a: int, b: int) -> int:\n    return a + b\n"
    )
    # the server and the sandbox it forked
    sigkill_host_script(_HOST_SCRIPT, [str(tmp_path), "trio"], ROOT, least=2)


async def test_wasm_tool_capsules_come_from_the_server_and_leave_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Wasm tool capsule is forked by the server too (no code sandbox needed for it to
    run), a crashed one is restarted from a server (a new one if the crash let go of the
    last lease), and no server outlives the host."""
    root = _calc_project(tmp_path)
    (root / "tools" / "crash.py").write_text("import os\n\ndef die() -> None:\n    os._exit(3)\n")
    (root / "policy.toml").write_text(
        'version = 1\n[defaults]\nagent = "allow"\n[capsules]\nwasm = ["calc", "crash"]\n'
    )
    async with Host.open(root) as host:
        assert await host.call("add", 1, 2) == 3
        (server,) = _servers()
        (capsule,) = server.children()
        with pytest.raises(HostError):
            await host.call("die")
        await wait_gone([capsule.pid])
        assert await host.call("add", 2, 2) == 4  # restarted
        (server,) = _servers()
        (again,) = server.children()
        assert again.pid != capsule.pid
    await wait_gone([server.pid, again.pid])
    assert not _servers()
    monkeypatch.setenv("TOOLHOST_FORKSERVER", "0")
    async with Host.open(root) as host:  # switched off: a child of the host's own
        assert await host.call("add", 1, 2) == 3
        assert not _servers()
