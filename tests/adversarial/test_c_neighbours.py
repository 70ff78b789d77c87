"""Section C (subprocess capsule containment), C01 against neighbours, and C10 against
the watchers (issue 13.4): tools run as the host's user, so without more a tool could
read another session's capsule memory (its arguments, its secrets) through ``/proc``,
trace it, signal it, or freeze its own reaper with ``SIGSTOP`` and then kill the host,
after which its worker kept running tool code.

Every capsule process is non-dumpable (its ``/proc/PID/mem``, ``environ`` and ``maps``
need ``CAP_SYS_PTRACE``, which no capsule has), and with Landlock's scopes a tool cannot
signal or trace anything outside its own tree at all. Without Landlock, killing the host
still ends every tool: the keeper, the reaper and the worker all watch the host. Each
case runs as root and as an unprivileged user, with and without Landlock where the
answer must not depend on it.
"""

from __future__ import annotations

import signal
import sys

import pytest

from .contain_helpers import (
    Lab,
    account,
    accounts,
    alive,
    lab,
    marked,
    parent_of,
    wait_gone,
    wait_until,
)

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and signals"),
]
__all__ = ["account", "accounts", "lab"]  # the fixtures, used here

PROBE = '''
    import ctypes
    import errno
    import os
    import signal

    KEPT = {}


    def keep(secret: str) -> int:
        """Hold a secret in this capsule's memory (as any argument is held)."""
        KEPT["secret"] = secret
        return os.getpid()


    def kept() -> str:
        return KEPT.get("secret", "")


    def _errno(exc: OSError) -> str:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))


    def _parent(pid: int) -> int:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rfind(b")") + 2 :].split()[1])


    def _search(pid: int, needle: bytes) -> str:
        """Open the process's memory and look for ``needle`` in its writable mappings."""
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read().splitlines()
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        try:
            budget = 256 << 20
            for line in maps:
                span, perms = line.split()[:2]
                if not perms.startswith("rw"):
                    continue
                start, end = (int(x, 16) for x in span.split("-"))
                size = min(end - start, budget)
                budget -= size
                try:
                    if needle in os.pread(fd, size, start):
                        return "found"
                except OSError:
                    continue
                if budget <= 0:
                    break
        finally:
            os.close(fd)
        return "not found"


    def _attempt(fn) -> str:
        try:
            return fn() or "ok"
        except OSError as exc:
            return _errno(exc)


    def _read(path: str) -> str:
        with open(path, "rb") as f:
            f.read(4096)
        return "read"


    def _trace(pid: int) -> str:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.ptrace(16, pid, 0, 0) != 0:  # PTRACE_ATTACH
            raise OSError(ctypes.get_errno(), "ptrace")
        os.waitpid(pid, 0)
        libc.ptrace(17, pid, 0, 0)  # PTRACE_DETACH
        return "attached"


    def probe(worker: int, reaper: int, host: int, secret: str) -> dict:
        """Everything one session's tool may try against another session's capsule, its
        own reaper, the keeper and the host (signal 0: permission checks only)."""
        mine = os.getppid()
        keeper = _parent(mine)
        found = {
            "neighbour mem": _attempt(lambda: _search(worker, secret.encode())),
            "neighbour environ": _attempt(lambda: _read(f"/proc/{worker}/environ")),
            "neighbour maps": _attempt(lambda: _read(f"/proc/{worker}/maps")),
            "neighbour reaper environ": _attempt(lambda: _read(f"/proc/{reaper}/environ")),
            "neighbour ptrace": _attempt(lambda: _trace(worker)),
            "own reaper environ": _attempt(lambda: _read(f"/proc/{mine}/environ")),
            "own reaper ptrace": _attempt(lambda: _trace(mine)),
            "keeper environ": _attempt(lambda: _read(f"/proc/{keeper}/environ")),
        }
        signals = {
            "signal neighbour": worker,
            "signal neighbour reaper": reaper,
            "signal own reaper": mine,
            "signal keeper": keeper,
            "signal host": host,
        }
        for name, pid in signals.items():
            found[name] = _attempt(lambda pid=pid: os.kill(pid, 0))
        found["pidfd signal host"] = _attempt(
            lambda: signal.pidfd_send_signal(os.pidfd_open(host), 0)
        )
        return found


    def kill_neighbour(worker: int) -> str:
        return _attempt(lambda: os.kill(worker, signal.SIGKILL))
'''

NEIGHBOURS = """
    async def main():
        secret = ARGS[0]
        async with Host.open(PROJECT) as host:
            async with host.session() as other:
                await other.call("keep", secret)
                them = other.supervisor.transport
                found = await host.call("probe", them.report.pid, them.pid, os.getpid(), secret)
                say(found=found)
                if ARGS[1] == "on":
                    say(kill=await host.call("kill_neighbour", them.report.pid))
                say(kept=await other.call("kept"))

    anyio.run(main)
"""


@pytest.mark.parametrize("landlock", ["on", "off"])
def test_a_tool_cannot_read_trace_or_signal_another_sessions_capsule(
    lab: Lab, landlock: str
) -> None:
    secret = "neighbour-secret-" + lab.token("secret")
    project = lab.project({"probe": PROBE})
    env = lab.env(**({"TOOLHOST_LANDLOCK": "0"} if landlock == "off" else {}))
    run = lab.run(NEIGHBOURS, project, secret, landlock, env=env)
    found = run.report()["found"]
    # Non-dumpable capsule processes: nothing of theirs to read or trace, root or not.
    assert found["neighbour mem"] == "EACCES", found
    for what in ("neighbour environ", "neighbour maps", "neighbour reaper environ"):
        assert found[what] == "EACCES", found
    for what in ("own reaper environ", "keeper environ"):
        assert found[what] == "EACCES", found
    assert found["neighbour ptrace"] == "EPERM", found
    assert found["own reaper ptrace"] == "EPERM", found
    if landlock == "on":
        # Landlock's scope: no signal leaves the tool's own tree, not even signal 0.
        signals = {k: v for k, v in found.items() if "signal" in k}
        assert set(signals.values()) == {"EPERM"}, signals
        assert run.report() == {"kill": "EPERM"}
    assert run.report() == {"kept": secret}  # the neighbour is untouched
    assert run.wait() == 0, run.stderr()


FREEZE = {
    "freeze": '''
        import errno
        import os
        import signal
        import sys
        import threading
        import time

        DAEMON = (
            "import sys, time\\n"
            "while True:\\n"
            "    with open(sys.argv[2], 'a') as f:\\n"
            "        f.write('d')\\n"
            "    time.sleep(0.02)\\n"
        )


        def _parent(pid: int) -> int:
            with open(f"/proc/{pid}/stat", "rb") as f:
                data = f.read()
            return int(data[data.rfind(b")") + 2 :].split()[1])


        def _daemon(mark: str, canary: str) -> None:
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execv(sys.executable, [sys.executable, "-c", DAEMON, mark, canary])
                os._exit(0)
            os.wait()


        def _write(canary: str) -> None:
            while True:
                with open(canary, "a") as f:
                    f.write("w")
                time.sleep(0.02)


        def freeze_and_kill(host: int, mark: str, canary: str, freeze: str) -> dict:
            """Leave tool code running (a daemon, a thread of the worker), freeze the
            watchers named, then kill the host."""
            _daemon(mark, canary)
            threading.Thread(target=_write, args=(canary,), daemon=True).start()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # until both have written
                seen = b""
                if os.path.exists(canary):
                    with open(canary, "rb") as f:
                        seen = f.read()
                if b"d" in seen and b"w" in seen:
                    break
                time.sleep(0.01)
            reaper = os.getppid()
            targets = {"reaper": reaper, "keeper": _parent(reaper)}
            done = {}
            for name in freeze.split("+"):
                try:
                    os.kill(targets[name], signal.SIGSTOP)
                    done[name] = "stopped"
                except OSError as exc:
                    done[name] = errno.errorcode.get(exc.errno or 0, "?")
            try:
                os.kill(host, signal.SIGKILL)
                done["host"] = "killed"
            except OSError as exc:
                done["host"] = errno.errorcode.get(exc.errno or 0, "?")
            return done
    ''',
}

FROZEN = """
    async def main():
        mark, canary, freeze = ARGS
        async with Host.open(PROJECT) as host:
            capsule = host.default_session.supervisor.transport
            say(host=os.getpid(), reaper=capsule.pid, worker=capsule.report.pid)
            say(done=await host.call("freeze_and_kill", os.getpid(), mark, canary, freeze))
            await ask()

    anyio.run(main)
"""


@pytest.mark.parametrize("landlock", ["on", "off"])
@pytest.mark.parametrize("freeze", ["reaper", "reaper+keeper"])
def test_a_tool_that_freezes_its_watchers_and_kills_the_host_stops_running(
    lab: Lab, landlock: str, freeze: str
) -> None:
    mark = lab.token("frozen") + ":daemon"
    project = lab.project(FREEZE, folders=["out"])
    canary = project / "out" / "canary"
    env = lab.env(**({"TOOLHOST_LANDLOCK": "0"} if landlock == "off" else {}))
    run = lab.run(FROZEN, project, mark, str(canary), freeze, env=env)
    first = run.report()
    starter = parent_of(first["reaper"])  # the host's keeper (the host where there is none)
    watchers = [starter] if starter != first["host"] else []
    lab.own(*watchers, first["reaper"], first["worker"])
    if landlock == "on":
        done = run.report()["done"]  # refused: the host lives on, so the test kills it
        assert done == {**dict.fromkeys(freeze.split("+"), "EPERM"), "host": "EPERM"}
        wait_until(lambda: canary.exists() and b"d" in canary.read_bytes(), "the daemon")
        run.kill()
    assert run.wait() == -signal.SIGKILL
    assert b"w" in canary.read_bytes() and b"d" in canary.read_bytes(), "tool code ran"
    wait_gone([*watchers, first["reaper"], first["worker"]], mark)
    size = canary.stat().st_size
    assert not marked(mark)
    assert not alive(first["host"])
    assert canary.stat().st_size == size, "tool code still runs"
