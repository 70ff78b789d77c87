"""H. Nothing outlives a SIGKILLed host, even when a tool blocks its capsule's loop.

The earlier no-orphan test passes even when the capsule's watchers ignore the host's
death: its capsule is idle, so it sees its protocol pipe close and cleans up by itself. Here
the tool blocks the capsule's event loop (``time.sleep`` inside an ``async def``, after
starting a child of its own), so only the watchers of the host's death (the reaper's and
the worker's pidfd lifelines, the keeper) can end it; the issue's requirement is the whole
tree gone within 1 s of the kill being seen.

And the fork server of Wasm guests watches its parent: with its socket still open (held
by another process, so end-of-file cannot tell it), killing its parent must still end the
server and the guest it forked.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from host.capsules import _wasm, _wasm_cache
from tests.fixtures.e2e.helpers import alive, describe, wait_gone_sync
from tests.test_wasm import wasm_prepared

__all__ = ["wasm_prepared"]  # the session fixture, used here

ROOT = Path(__file__).resolve().parents[2]

BLOCKER = '''
import subprocess
import sys
import time
from pathlib import Path


async def block(marker: str) -> str:
    """Starts a child, says so, then blocks the capsule's event loop for a minute."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    Path(marker).write_text(str(child.pid))
    time.sleep(60)  # in an async tool: nothing else runs on the loop meanwhile
    return "woke"
'''

HOST_SCRIPT = textwrap.dedent(
    """
    import sys
    import time
    from pathlib import Path

    import anyio
    import psutil

    from host import Host


    async def main() -> None:
        project, marker = sys.argv[1], Path(sys.argv[2])
        async with Host.open(project) as host, anyio.create_task_group() as tg:
            tg.start_soon(host.call, "block", str(marker))
            with anyio.fail_after(60):
                while not marker.exists() or not marker.read_text():
                    await anyio.sleep(0.02)
            tree = psutil.Process().children(recursive=True)
            print(" ".join(str(p.pid) for p in tree), flush=True)
            await anyio.sleep(1000)


    anyio.run(main, backend=sys.argv[3])
    """
)


def _end(script: subprocess.Popen[bytes], pids: list[int]) -> None:
    """A failure leaves nothing running for the next test: ``pids`` (0: none) and the
    script are killed, and its pipes read to the end."""
    for pid in pids:
        if pid:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
    with contextlib.suppress(ProcessLookupError):
        os.kill(script.pid, signal.SIGKILL)
    script.communicate(timeout=30)


def read_pids(process: subprocess.Popen[bytes], what: str) -> list[int]:
    """The pids the script prints on one line (fails if it ends or says nothing)."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 90)
    assert ready, f"{what} did not report its processes"
    line = process.stdout.readline().decode()
    assert line.strip(), f"{what} ended early: {process.communicate(timeout=30)[1].decode()}"
    return [int(p) for p in line.split()]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_sigkilled_host_leaves_nothing_within_a_second_when_a_tool_blocks_the_loop(
    tmp_path: Path, backend: str
) -> None:
    project = tmp_path / "project"
    (project / "tools").mkdir(parents=True)
    (project / "tools" / "blocker.py").write_text(BLOCKER)
    (project / "policy.toml").write_text('version = 1\n[defaults]\napp = "allow"\n')
    (project / "out").mkdir()  # the only place Landlock lets the tool write
    marker = project / "out" / "marker"
    host = subprocess.Popen(
        [sys.executable, "-c", HOST_SCRIPT, str(project), str(marker), backend],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        start_new_session=True,
    )
    pids: list[int] = []
    try:
        pids = read_pids(host, "the host script")
        grandchild = int(marker.read_text())
        pids.append(grandchild)
        assert len(pids) >= 4, describe(pids)  # keeper, reaper, worker, the tool's child
        assert all(alive(p) for p in pids), describe(pids)
        os.kill(host.pid, signal.SIGKILL)
        host.wait(30)
        # The kill is seen: the requirement is every process gone within 1 s.
        wait_gone_sync(pids, timeout=1.0)
    finally:
        _end(host, pids)


PARENT_SCRIPT = textwrap.dedent(
    """
    import subprocess
    import sys

    import anyio

    from host.capsules import _forkserver, _wasm


    async def main() -> None:
        cwasm, lib = sys.argv[1], sys.argv[2]
        lease = _forkserver.Lease(cwasm)
        spec = _wasm.GuestSpec(
            cwasm=cwasm,
            argv=_wasm.guest_argv("import time\\ntime.sleep(600)"),
            env={},
            preopens=[_wasm.Preopen(lib, _wasm.LIB_GUEST)],
        )
        guest, _write, _read = await _forkserver.spawn(lease, spec)
        server = lease.server()
        # Another process holds the server's socket open: when this one dies, the
        # server reads no end of file; only its watch of its parent can end it.
        holder = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)"],
            pass_fds=[server.socket.fileno()],
            start_new_session=True,
        )
        print(server.process.pid, guest.pid, holder.pid, flush=True)
        await anyio.sleep(1000)


    anyio.run(main)
    """
)


@pytest.mark.wasm
def test_the_fork_server_and_its_guests_die_with_its_parent(
    wasm_prepared: _wasm_cache.Prepared,
) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT_SCRIPT, str(wasm_prepared.cwasm), str(wasm_prepared.lib)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        start_new_session=True,
    )
    pids: list[int] = []
    holder = 0
    try:
        server, guest, holder = read_pids(parent, "the fork server's parent")
        pids = [server, guest]
        assert "zygote" in " ".join(psutil.Process(server).cmdline())
        assert _wasm.CHILD.name in " ".join(psutil.Process(guest).cmdline())
        assert all(alive(p) for p in pids), describe(pids)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(30)
        assert alive(holder)  # the socket is still open
        wait_gone_sync(pids, timeout=10.0)
    finally:
        _end(parent, [*pids, holder])


KEEPER_HOST = textwrap.dedent(
    """
    import os, socket, subprocess, sys, time

    keeper_child = sys.argv[1]
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    keeper = subprocess.Popen(
        [sys.executable, "-I", keeper_child, str(os.getpid())],
        stdin=theirs,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        start_new_session=True,
    )
    # Another process holds this end of the keeper's socket: when this process dies,
    # the keeper reads no end of file; only its watch of the host's pidfd can end it.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        pass_fds=[mine.fileno()],
        start_new_session=True,
    )
    print(keeper.pid, holder.pid, flush=True)
    time.sleep(1000)
    """
)


def test_the_keeper_ends_when_its_host_dies_though_its_socket_stays_open() -> None:
    """The keeper watches its host's pidfd: killing the host ends it even while another
    process keeps its socket open (so it never reads end of file)."""
    from host.capsules import _keeper

    host = subprocess.Popen(
        [sys.executable, "-c", KEEPER_HOST, str(_keeper.CHILD)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        start_new_session=True,
    )
    pids: list[int] = []
    holder = 0
    try:
        keeper, holder = read_pids(host, "the keeper's host")
        pids = [keeper]
        assert "_keeper_child" in " ".join(psutil.Process(keeper).cmdline())
        time.sleep(0.5)
        assert alive(keeper), "the keeper ended before its host"
        os.kill(host.pid, signal.SIGKILL)
        host.wait(30)
        assert alive(holder)  # the socket is still open
        wait_gone_sync(pids, timeout=10.0)
    finally:
        _end(host, [*pids, holder])


FREEZER = '''
import os
import signal
from pathlib import Path


def block(marker: str) -> str:
    """Stops the keeper, then itself (the worker, its lifeline thread with it)."""
    reaper = os.getppid()
    with open(f"/proc/{reaper}/stat") as f:
        keeper = int(f.read().rsplit(")", 1)[1].split()[1])
    Path(marker).write_text(f"{reaper} {keeper}")
    os.kill(keeper, signal.SIGSTOP)
    os.kill(os.getpid(), signal.SIGSTOP)
    return "thawed"
'''


def test_the_reaper_ends_the_capsule_when_the_keeper_and_the_worker_are_frozen(
    tmp_path: Path,
) -> None:
    """Without Landlock's scoping a tool can stop the keeper and its own worker (and the
    worker's lifeline thread with it); then only the reaper's watch of the host's pidfd
    sees the host die: it wakes the keeper and kills the rest. Nothing is left."""
    project = tmp_path / "project"
    (project / "tools").mkdir(parents=True)
    (project / "tools" / "freezer.py").write_text(FREEZER)
    (project / "policy.toml").write_text(
        'version = 1\n[defaults]\napp = "allow"\n[capsules]\nzygote = false\n'
    )
    (project / "out").mkdir()
    marker = project / "out" / "marker"
    host = subprocess.Popen(
        [sys.executable, "-c", HOST_SCRIPT, str(project), str(marker), "asyncio"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "TOOLHOST_LANDLOCK": "0"},  # so that a tool can signal the keeper
        start_new_session=True,
    )
    pids: list[int] = []
    try:
        pids = read_pids(host, "the host script")
        reaper, keeper = (int(p) for p in marker.read_text().split())
        assert {reaper, keeper} <= set(pids), describe(pids)
        deadline = time.monotonic() + 10
        while psutil.Process(keeper).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, "the tool did not stop the keeper"
            time.sleep(0.02)
        os.kill(host.pid, signal.SIGKILL)
        host.wait(30)
        wait_gone_sync(pids, timeout=10.0)
    finally:
        _end(host, pids)
