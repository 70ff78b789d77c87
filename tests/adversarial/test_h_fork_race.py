"""Section H: a fork server (the keeper, the Wasm fork server, a capsule's reaper) killed
between its ``fork()`` and its child's first look at its parent.

A child sets ``SIGKILL`` as its parent-death signal and then checks that its parent is
still the server, for the death that came before the signal was set. Read in the child,
"the server" could already be whoever adopted the child (a subreaper up the tree): the
check would pass, and the child would run on with no parent-death signal and a lifeline
watching the wrong process. The server's pid is read before the fork. Here the child is
made to start after its server is gone: it must exit at once, before it runs anything.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux processes"),
]

CAPSULES = Path(__file__).resolve().parents[2] / "host" / "capsules"

# A pid that is no one's parent any more: a process that has ended and been reaped.
_GONE = """
import os, subprocess
gone = subprocess.Popen(["true"])
gone.wait()
GONE = gone.pid
"""

KEEPER = _GONE + textwrap.dedent(
    """
    import json, socket, sys
    sys.path.insert(0, sys.argv[1])
    import _keeper_child as k

    ours, _theirs = socket.socketpair()
    os.dup2(ours.fileno(), 0)
    keeper = k._Keeper(os.getpid(), os.pidfd_open(os.getpid()))
    request = json.dumps(
        {"argv": [sys.executable, "-c", "import os; os._exit(7)"], "cwd": "/", "env": {}}
    ).encode()
    keeper._buffer[: len(request)] = request
    pid = os.fork()
    if pid == 0:
        # This child's keeper (GONE) died before it looked: it was adopted by this script.
        try:
            keeper._child(GONE, len(request), (0, 1, 2))  # never returns
        finally:
            os._exit(99)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """
)

FORK_SERVER = _GONE + textwrap.dedent(
    """
    import ctypes, sys, types
    sys.path.insert(0, sys.argv[1])
    import _wasm_child as w

    fake = types.SimpleNamespace(load=lambda cwasm: os._exit(7))  # the guest would start
    server = w._Zygote.__new__(w._Zygote)
    server._libc = ctypes.CDLL(None, use_errno=True)
    server._keep = set()
    server._wasm = fake
    server.loaded = None
    spec = types.SimpleNamespace(cwasm="guest.cwasm", preopens=[])
    pid = os.fork()
    if pid == 0:
        try:
            server._child(GONE, spec, 0, 1, 2, [])  # never returns
        finally:
            os._exit(99)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """
)


# A started capsule splits into its reaper and its worker (``capsule/__main__.py``). Here
# the reaper exits at once, before its worker looks at its parent: the worker, adopted by
# this script (a subreaper, as the keeper is), must see its reaper gone and end itself.
CAPSULE_WORKER = textwrap.dedent(
    """
    import ctypes, os, sys, time
    sys.path.insert(0, os.path.dirname(os.path.dirname(sys.argv[1])))  # the checkout
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    stdin, _keep = os.pipe()  # the capsule's protocol input: nothing is ever sent
    reaper = os.fork()
    if reaper == 0:
        try:
            os.setsid()  # the worker kills its process group: not this script's
            os.dup2(stdin, 0)
            import capsule.__main__ as capsule_main

            me, fork = os.getpid(), os.fork

            def late_fork():
                child = fork()
                if child == 0:  # the worker: on only once its reaper is gone
                    deadline = time.monotonic() + 10
                    while os.getppid() == me and time.monotonic() < deadline:
                        time.sleep(0.01)
                return child

            os.fork = late_fork
            capsule_main._reap = lambda worker, lifelines: os._exit(0)
            capsule_main.main()
        finally:
            os._exit(99)
    os.close(stdin)
    assert os.waitstatus_to_exitcode(os.waitpid(reaper, 0)[1]) == 0
    outcome = "ran"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            outcome = str(os.waitstatus_to_exitcode(status))
            break
        time.sleep(0.02)
    else:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as kids:
                for pid in kids.read().split():
                    os.kill(int(pid), 9)
    print(outcome)
    """
)


@pytest.mark.parametrize(
    ("script", "stopped"),
    [(KEEPER, "1"), (FORK_SERVER, "1"), (CAPSULE_WORKER, "-9")],
    ids=["keeper", "wasm-fork-server", "capsule-worker"],
)
def test_a_child_whose_server_died_before_it_looked_exits_at_once(
    script: str, stopped: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-c", script, str(CAPSULES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # 1: it saw its server gone and stopped (-9: the capsule worker killed its own
    # process group); 7 would be the capsule or guest it started, 99 a child that
    # raised, "ran" a capsule worker that waited on for the host.
    assert done.stdout.split() == [stopped], (done.stdout, done.stderr)
