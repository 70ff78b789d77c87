"""The host's keeper: the one process that starts subprocess capsules, and kills what
they leave behind.

``python -I -S host/capsules/_keeper_child.py HOST_PID`` (or ``python -I ... HOST_PID
CAPSULE_PARENT`` as the zygote, below), started by the host (``_keeper.py``) in a
session of its own, with a Unix socket from the host as its stdin. It is run by path and
imports only the standard library (and, as the zygote, the ``capsule`` package and what
it preloads), and it stays single-threaded, so it may fork at any time.

It is a *child subreaper* (Linux): a process whose parent dies is re-parented to its
nearest subreaper ancestor. Each capsule's reaper and worker are subreapers too, so an
orphan reaches the keeper only once both of its capsule's processes are gone (a tool that
killed its own process group, say). The capsule has ended then, and the keeper kills
every process it adopts, with all its descendants, as soon as it sees it: on the
``SIGCHLD`` of the capsule process that died, and every second in case an adoption
came without one.

Each request on the socket is ``{"argv", "cwd", "env"}`` as JSON with four descriptors
attached: the capsule's stdin, stdout and stderr, and a status pipe on which the keeper
writes ``P<pid>`` once the capsule exists and ``X<code>`` once it has ended (a negative
code is a signal), as the Wasm fork server does (``host/_forkserver.py``'s
``ForkedProcess`` reads it). The capsule is reaped only when the host closes its end of
the status pipe, so its pid stays reserved while the host may still kill it by pid; one
whose pipe is closed before it ended is killed, with its process group.

A capsule starts in its own session, with ``SIGKILL`` as its parent-death signal (the
keeper's death ends it; a forked one, the worker itself, has none: it watches the
keeper's pidfd and kills what it started first), fds 0-2 as sent, fd 3 a ``pidfd`` of
the host and fd 4 one of the keeper (named in ``TOOLHOST_LIFELINES``: the capsule
watches both), no other descriptor, exactly the environment sent.

Started with a second argument (the folder holding the ``capsule`` package), the keeper
is also the host's *zygote*: it imports the capsule runtime once (``capsule/_zygote.py``),
and a request whose first byte is ``Z`` (then ``{"cwd"}`` as JSON, no environment) gets a
capsule forked from it that does not ``exec``: the same fds, session and parent-death
signal, and it reads its environment from its stdin. A keeper without a zygote answers
such a request with ``N<reason>`` on the status pipe, and the host starts the capsule
with ``exec`` instead. Each request is read into one buffer that is overwritten once the
capsule is forked (the child parses it), so the environment a started capsule was sent
stays in that capsule, never in the keeper later capsules are forked from.

When the host dies (its ``pidfd`` becomes readable) or closes the socket, the keeper
kills every process below it and exits. It is non-dumpable (the environments it is sent
hold the variables the policy passes to tools) unless ``TOOLHOST_KEEP_DUMPABLE=1``.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import sys
from typing import Any

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_TICK_MS = 1000
"""How often the keeper looks for adopted processes without being woken for one."""
_HOST_FD = 3
_KEEPER_FD = 4
_LIFELINES = "TOOLHOST_LIFELINES"
_REQUEST_MAX = 1 << 20
_FDS = 4
_INT = array.array("i")
_FORK = b"Z"
"""The first byte of a request for a capsule forked from the zygote (else it is JSON)."""


def _received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return list(fds)


def _prctl(option: int, value: int) -> bool:
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process, from ``/proc``."""
    table: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
            # The command name may hold spaces and parentheses: split after the last ')'.
            table[int(entry)] = int(data[data.rfind(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return table


def _descendants(*roots: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def _children() -> set[int]:
    """This process's children (``/proc/self/task/*/children``, else a full scan)."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as f:
            return {int(pid) for pid in f.read().split()}
    except (OSError, ValueError):
        return {pid for pid, parent in _parents().items() if parent == me}


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


class _Keeper:
    def __init__(self, host: int, host_fd: int) -> None:
        self._host = host
        self._host_fd = host_fd
        self._own_fd = os.pidfd_open(os.getpid())
        self._socket = socket.socket(fileno=0)
        self._capsules: dict[int, int] = {}  # pid -> status pipe
        self._buffer = bytearray(_REQUEST_MAX)
        self._zygote: Any = None
        """``capsule._zygote`` once preloaded (:meth:`preload`)."""
        self._no_zygote = "the keeper was started without a zygote"
        self._ended: set[int] = set()
        self._wake_r, wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)

    def preload(self, package_parent: str) -> None:
        """Become the zygote: import the capsule runtime from ``package_parent`` (and what
        tools commonly import) once, for every capsule forked from here."""
        try:
            sys.path.insert(0, package_parent)
            import importlib

            zygote = importlib.import_module("capsule._zygote")
            zygote.preload()
        except Exception as exc:
            self._no_zygote = f"the zygote could not import the capsule runtime: {exc}"
            return
        if len(os.listdir("/proc/self/task")) != 1:  # forking would copy a thread's locks
            self._no_zygote = "importing the capsule runtime started a thread"
            return
        self._zygote = zygote

    def serve(self) -> int:
        poll = select.poll()
        poll.register(0, select.POLLIN)
        poll.register(self._wake_r, select.POLLIN)
        poll.register(self._host_fd, select.POLLIN)
        while True:
            events = poll.poll(_TICK_MS)
            for fd, event in events:
                if fd == self._host_fd:
                    return self._end()  # the host died
                if fd == 0:
                    if not self._request(poll):
                        return self._end()  # the host let go of the socket
                elif fd == self._wake_r:
                    with contextlib.suppress(OSError):
                        while os.read(self._wake_r, 512):
                            pass
                elif event & (select.POLLERR | select.POLLHUP):
                    self._released(poll, fd)
            self._check()

    # -- starting a capsule ---------------------------------------------------------------

    def _request(self, poll: select.poll) -> bool:
        try:
            size, ancillary, flags, _addr = self._socket.recvmsg_into(
                [self._buffer], socket.CMSG_SPACE(_FDS * _INT.itemsize)
            )
        except OSError:
            return False
        fds = _received_fds(ancillary)
        if not size and not fds:
            return False
        if len(fds) != _FDS or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            for fd in fds:
                os.close(fd)
            self._forget(size)
            return True
        stdin, stdout, stderr, status = fds
        pid = -1
        try:
            if self._buffer.startswith(_FORK) and self._zygote is None:
                with contextlib.suppress(OSError):
                    os.write(status, f"N{self._no_zygote}\n".encode())
                os.close(status)
                return True
            keeper = os.getpid()  # read before the fork: the child's getppid() may be late
            pid = os.fork()
            if pid == 0:
                self._child(keeper, size, (stdin, stdout, stderr))
        except Exception as exc:
            with contextlib.suppress(OSError):
                os.write(stderr, f"toolhost keeper: cannot start the capsule: {exc}\n".encode())
        finally:
            self._forget(size)
            for fd in (stdin, stdout, stderr):
                os.close(fd)
        if pid <= 0:
            os.close(status)  # no pid: the host reports the failure
            return True
        self._capsules[pid] = status
        with contextlib.suppress(OSError):  # if the host already let go, _released reaps it
            os.write(status, f"P{pid}\n".encode())
        poll.register(status, 0)  # POLLERR once the host closes its end
        return True

    def _forget(self, size: int) -> None:
        """Overwrite a request: the environment it carried (the variables the policy passes
        to tools) stays in the capsule it was for, never in the keeper a later capsule is
        forked from."""
        self._buffer[:size] = bytes(size)

    def _child(self, keeper: int, size: int, std: tuple[int, ...]) -> None:
        """In the forked child of ``keeper`` (this process's pid before the fork): become
        the capsule. Never returns."""
        try:
            os.setsid()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            # The keeper may have died at any time since the fork, even before this
            # process first asked for its parent: compare with the pid read before it.
            if os.getppid() != keeper:
                os._exit(1)
            forked = self._buffer.startswith(_FORK)
            request = json.loads(bytes(self._buffer[1 if forked else 0 : size]))
            self._forget(size)
            # Out of the way first: a received descriptor may sit on 0-4 already.
            moved = [
                fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
                for fd in (*std, self._host_fd, self._own_fd)
            ]
            self._socket.detach()  # fd 0 is the capsule's stdin from here on
            for target, fd in enumerate(moved):
                os.dup2(fd, target, inheritable=True)
            os.closerange(5, os.sysconf("SC_OPEN_MAX"))
            os.chdir(str(request["cwd"]))
            if forked and self._zygote is not None:
                # The worker itself: no parent-death signal, which would kill it before it
                # could kill what it started (re-parented past a dead keeper, that would
                # escape). Its lifeline sees the keeper's pidfd end instead, and kills
                # its tree first, as a started capsule's worker does.
                _prctl(_PR_SET_PDEATHSIG, 0)
                self._zygote.serve_forked((_HOST_FD, _KEEPER_FD))  # never returns
            argv = [str(a) for a in request["argv"]]
            env = {str(k): str(v) for k, v in request["env"].items()}
            env[_LIFELINES] = f"{_HOST_FD} {_KEEPER_FD}"
            os.execve(argv[0], argv, env)
        except BaseException as exc:
            with contextlib.suppress(BaseException):
                os.write(2, f"toolhost keeper: cannot start the capsule: {exc}\n".encode())
        os._exit(127)

    # -- watching -------------------------------------------------------------------------

    def _check(self) -> None:
        """Report capsules that ended; kill whatever was adopted."""
        for pid, status in self._capsules.items():
            if pid in self._ended:
                continue
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = None
                code = -signal.SIGKILL
            else:
                if info is None:
                    continue
                code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            self._ended.add(pid)
            with contextlib.suppress(OSError):
                os.write(status, f"X{code}\n".encode())
        adopted = _children() - set(self._capsules)
        if adopted:
            self._kill_trees(adopted)

    def _kill_trees(self, roots: set[int]) -> None:
        """Kill ``roots`` (children of ours) and all their descendants, and reap them."""
        for pid in [*_descendants(*roots), *roots]:
            _kill(pid)
        for pid in roots:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)

    def _released(self, poll: select.poll, status: int) -> None:
        """The host closed a capsule's status pipe: kill it if it still runs, reap it."""
        pid = next((p for p, fd in self._capsules.items() if fd == status), None)
        poll.unregister(status)
        os.close(status)
        if pid is None:
            return
        del self._capsules[pid]
        if pid not in self._ended:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            self._kill_trees({pid})
        else:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self._ended.discard(pid)

    def _end(self) -> int:
        """Kill everything below the keeper, reap it, exit."""
        for pid in self._capsules:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        for _ in range(10):  # a few passes catch processes forked meanwhile
            tree = _descendants(os.getpid())
            if not tree:
                break
            for pid in tree:
                _kill(pid)
            for pid in _children():
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        return 0


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or not argv[0].isdigit():
        print(
            "usage: _keeper_child.py HOST_PID [CAPSULE_PARENT] (stdin: a Unix socket)",
            file=sys.stderr,
        )
        return 2
    if os.environ.get("TOOLHOST_KEEP_DUMPABLE") != "1":
        _prctl(_PR_SET_DUMPABLE, 0)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    host = int(argv[0])
    try:
        host_fd = os.pidfd_open(host)
    except OSError as exc:
        print(f"toolhost keeper: cannot watch the host: {exc}", file=sys.stderr)
        return 1
    if os.getppid() != host:
        return 1  # the host died already (and the pid may be another process's now)
    keeper = _Keeper(host, host_fd)
    if len(argv) == 2:
        keeper.preload(argv[1])
    return keeper.serve()


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
