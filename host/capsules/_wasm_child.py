"""The child process that runs one Wasm guest: ``python -I -S host/_wasm_child.py run PID
WASMTIME_ROOT``, with the guest's spec in ``TOOLHOST_GUEST_SPEC`` (never on the command
line, which every user can read) and removed from the environment at once.

It is started by path (not ``-m host...``), so it imports neither the ``host`` package nor
its dependencies: only the standard library, ``wasmtime`` and, from its own folder,
``_wasm.py`` (and ``_wasm_cache.py`` for ``prepare``). Its stdin and stdout are the
protocol pipes, which the guest inherits; its stderr is drained by the host. The guest
runs on a thread with a large known stack (wasm stack overflow traps long before it); a
lifeline thread ends the process if the host goes away. A stuck guest (even one blocked
in a WASI call, which epochs cannot interrupt) is ended by the host killing this process.

``zygote PID WASMTIME_ROOT CWASM`` is the fork server (``host/_forkserver.py`` starts it):
it imports wasmtime and loads the compiled module once, then forks one child per guest,
so a new guest skips the interpreter start, ``import wasmtime`` and the module load. Its
stdin is a Unix socket from the host; each request is a :class:`GuestSpec` as JSON with
four descriptors attached: the guest's stdin, stdout and stderr, and a status pipe on
which the server writes ``P<pid>`` once the child exists and ``X<code>`` once it has
ended (a negative code is a signal); then one per preopen the host opened itself (a data
folder), which the spec numbers by its place among them. The child is reaped only when
the host closes its end of the status pipe (until then its pid cannot be reused, so the
host may still kill it by pid); a child whose status pipe is closed before it ended is
killed.

The server stays single-threaded (nothing wasmtime loads starts a thread; it is checked
before every fork), so forking is safe. A forked child starts its own session, keeps no
descriptor but its three pipes and the compiled module that wasmtime has mapped, dies
with the server (``PR_SET_PDEATHSIG``, and the lifeline), and the server dies with the
host (it polls its parent, and exits when the host closes the socket).

``prepare FOLDER CWASM|- LIB|- [RUNTIME]`` builds what the host found missing in the
private cache folder it checked (the compiled runtime when CWASM is ``-``, the guest
library LIB; of the runtime whose build is named RUNTIME, by default the default one) and
prints what it built and the digests of the bytes it wrote, as JSON; the host records
them (``_wasm_cache.py``). It says on stderr which step it starts (``toolhost-wasm:
step compile``, ``... step library``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

_PACKAGE = "_toolhost_wasm"
"""A bare package standing for this file's folder: never ``host``, whose ``__init__``
imports the whole host."""


def _load(name: str) -> ModuleType:
    """``NAME.py`` of this folder as a module of :data:`_PACKAGE` (``_wasm.py``, whose top
    level is standard library only, and ``_wasm_cache.py``, which adds ``_wasm``)."""
    folder = Path(__file__).resolve().parent
    if _PACKAGE not in sys.modules:
        package = ModuleType(_PACKAGE)
        package.__path__ = [str(folder)]  # its modules import each other relatively
        sys.modules[_PACKAGE] = package
    spec = importlib.util.spec_from_file_location(f"{_PACKAGE}.{name}", folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _lifeline(parent: int) -> None:
    while True:
        time.sleep(0.2)
        if os.getppid() != parent:
            os._exit(1)


_QUOTA_TICK = 0.05
"""How often the quota watcher measures the writable preopens with a quota (seconds); a
guest writes at most this long (or four times a measurement, if that is longer) past one."""


def _watch_quota(wasm: ModuleType, limited: list[tuple[str | int, int]]) -> None:
    """Measure each folder (by the descriptor the host opened, where it did) until one is
    over its quota, then end this process."""
    while True:
        started = time.monotonic()
        for folder, quota in limited:
            try:
                used = wasm.disk_usage(folder)
            except OSError as exc:  # never taken for empty
                said = f"more than it can measure: {exc.strerror or type(exc).__name__}"
            else:
                if used <= quota:
                    continue
                said = str(used)
            line = f"\n{wasm.QUOTA_PREFIX} of {quota} bytes (it uses {said})\n"
            with contextlib.suppress(OSError):
                os.write(2, line.encode())
            os._exit(wasm.QUOTA_EXIT)
        time.sleep(max(_QUOTA_TICK, 4 * (time.monotonic() - started)))


def _limit_writes(wasm: ModuleType, spec: Any) -> None:
    """Enforce the quotas of the writable preopens: no file grows past the smallest one
    (``RLIMIT_FSIZE``: a write beyond fails with ``EFBIG``, since ``SIGXFSZ`` is ignored),
    and a watcher thread ends this process once a folder uses more than its quota.
    Called on the main thread (signals), after the fork server forked this child."""
    limited = [
        (p.host if p.fd is None else p.fd, p.quota)
        for p in spec.preopens
        if p.writable and p.quota is not None
    ]
    if not limited:
        return
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    smallest = min(quota for _, quota in limited)
    _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if hard != resource.RLIM_INFINITY:
        smallest = min(smallest, hard)
    resource.setrlimit(resource.RLIMIT_FSIZE, (smallest, smallest))
    threading.Thread(target=_watch_quota, args=(wasm, limited), daemon=True).start()


def _run(wasm: ModuleType, spec: Any, parent: int, loaded: Any = None) -> int:
    """Run the guest on a thread with a large stack; the lifeline watches ``parent``."""
    # The parent's pid comes from the parent: one read here could already see a reaper's.
    threading.Thread(target=_lifeline, args=(parent,), daemon=True).start()
    if loaded is None:  # before the file size limit: the module's bytes go into a memfd
        try:
            loaded = wasm.load(spec.cwasm)
        except BaseException as exc:  # reported on stderr; the host reads the tail
            print(f"toolhost-wasm: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    _limit_writes(wasm, spec)
    status: list[int] = []

    def guest() -> None:
        try:
            status.append(wasm.run_guest(spec, loaded))
        except BaseException as exc:  # reported on stderr; the host reads the tail
            print(f"toolhost-wasm: {type(exc).__name__}: {exc}", file=sys.stderr)
            status.append(1)

    threading.stack_size(wasm.GUEST_STACK)
    thread = threading.Thread(target=guest, name="guest")
    thread.start()
    thread.join()
    return status[0] if status else 1


_PR_SET_DUMPABLE = 4


def _undumpable() -> None:
    """Make this process non-dumpable (Linux), as the host makes itself: other processes
    of the same user (a subprocess capsule's tools) can then read neither its memory nor
    its ``/proc/PID/environ``, which hold a guest's spec and the variables the policy
    passes to Wasm tools. Children forked from it (the fork server's guests) inherit it.
    ``TOOLHOST_KEEP_DUMPABLE=1`` (passed on by the host) leaves it dumpable."""
    if not sys.platform.startswith("linux") or os.environ.get("TOOLHOST_KEEP_DUMPABLE") == "1":
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def main(argv: list[str]) -> int:
    if argv[:1] in (["run"], ["zygote"]):
        _undumpable()  # first: before anything is read from the environment
    wasm = _load("_wasm")
    spec = os.environ.pop(wasm.SPEC_VAR, None)  # never left for the guest's own start
    if argv[:1] == ["prepare"] and len(argv) in (4, 5):
        cwasm, lib = (None if name == "-" else name for name in argv[2:4])
        runtime = wasm.runtime_by_build(argv[4]) if len(argv) == 5 else None
        built = _load("_wasm_cache").build(
            Path(argv[1]), cwasm=cwasm, lib=lib, runtime=runtime, steps=True
        )
        print(json.dumps(built))
        return 0
    if argv[:1] == ["zygote"] and len(argv) == 4:
        sys.path.append(argv[2])
        return _Zygote(wasm, int(argv[1]), argv[3]).serve()
    if argv[:1] != ["run"] or len(argv) not in (2, 3) or spec is None:
        print(
            "usage: TOOLHOST_GUEST_SPEC=SPEC _wasm_child.py run PARENT_PID [WASMTIME_ROOT]"
            " | zygote PARENT_PID WASMTIME_ROOT CWASM | prepare FOLDER CWASM|- LIB|- [RUNTIME]",
            file=sys.stderr,
        )
        return 2
    if len(argv) == 3:  # started without ``site``: where wasmtime is
        sys.path.append(argv[2])
    return _run(wasm, wasm.GuestSpec.from_json(spec), int(argv[1]))


# -- the fork server ----------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
_MAX_PREOPENS = 8
"""Descriptors of preopens one request may carry."""
_TICK_MS = 200
"""How often the server checks that the host is still its parent."""


def _open_fds() -> set[int]:
    """This process's open descriptors."""
    try:
        names = os.listdir("/proc/self/fd")  # its own descriptor is gone once it returns
    except OSError:
        names = [str(fd) for fd in range(os.sysconf("SC_OPEN_MAX"))]
    found: set[int] = set()
    for name in names:
        fd = int(name)
        try:
            os.fstat(fd)
        except OSError:
            continue
        found.add(fd)
    return found


def _threads() -> int:
    """This process's threads, native ones included (Linux), else Python's."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


class _Zygote:
    def __init__(self, wasm: ModuleType, host: int, cwasm: str) -> None:
        import ctypes
        import signal
        import socket

        self._wasm = wasm
        self._host = host
        self._socket = socket.socket(fileno=0)  # the host's Unix socket is our stdin
        self._libc = ctypes.CDLL(None, use_errno=True)
        before = _open_fds()
        self.loaded = wasm.load(cwasm)
        # What wasmtime keeps open for the module it mapped (a sealed memfd holding the
        # verified bytes): the children need it, and it holds nothing the guest can
        # reach.
        self._keep = _open_fds() - before
        self._children: dict[int, int] = {}  # pid -> status pipe
        self._ended: set[int] = set()
        self._wake_r, wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        self._wake_w = wake_w

    def serve(self) -> int:
        import select

        poll = select.poll()
        poll.register(0, select.POLLIN)
        poll.register(self._wake_r, select.POLLIN)
        while True:
            events = poll.poll(_TICK_MS)
            if os.getppid() != self._host:
                return 1  # the host is gone: the children die with this process
            for fd, event in events:
                if fd == 0:
                    if not self._request(poll):
                        return 0  # the host closed the socket
                elif fd == self._wake_r:
                    while True:
                        try:
                            if not os.read(self._wake_r, 512):
                                break
                        except BlockingIOError:
                            break
                    self._reap_check()
                elif event & (select.POLLERR | select.POLLHUP):
                    self._released(poll, fd)

    def _request(self, poll: Any) -> bool:
        import socket

        try:
            data, fds, _flags, _addr = socket.recv_fds(self._socket, 1 << 20, 4 + _MAX_PREOPENS)
        except OSError:
            return False
        if not data:
            for fd in fds:
                os.close(fd)
            return False
        if len(fds) < 4:
            for fd in fds:
                os.close(fd)
            return True
        stdin, stdout, stderr, status = fds[:4]
        extra = fds[4:]  # the preopens' descriptors, in the order their specs number them
        pid = -1
        try:
            spec = self._wasm.GuestSpec.from_json(data.decode())
            spec = dataclasses.replace(
                spec,
                preopens=[
                    p if p.fd is None else dataclasses.replace(p, fd=extra[p.fd])
                    for p in spec.preopens
                ],
            )
            if _threads() != 1:
                raise RuntimeError("the fork server has threads; it cannot fork safely")
            server = os.getpid()  # read before the fork: the child's getppid() may be late
            pid = os.fork()
            if pid == 0:
                self._child(server, spec, stdin, stdout, stderr, extra)  # never returns
        except Exception as exc:
            os.write(stderr, f"toolhost-wasm: the fork server failed: {exc}\n".encode())
        finally:
            for fd in (stdin, stdout, stderr, *extra):
                os.close(fd)
        if pid <= 0:
            os.close(status)  # no pid: the host falls back to a child of its own
            return True
        self._children[pid] = status
        with contextlib.suppress(OSError):  # if the host already let go, _released reaps it
            os.write(status, f"P{pid}\n".encode())
        poll.register(status, 0)  # POLLERR once the host closes its end
        self._reap_check()
        return True

    def _child(
        self, server: int, spec: Any, stdin: int, stdout: int, stderr: int, keep: list[int]
    ) -> None:
        import signal

        try:
            os.setsid()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self._libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            # The server may have died at any time since the fork, even before this
            # process first asked for its parent: compare with the pid read before it.
            if os.getppid() != server:
                os._exit(1)
            for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
                os.dup2(fd, target)
            for fd in _open_fds() - self._keep - {0, 1, 2, *keep}:
                with contextlib.suppress(OSError):
                    os.close(fd)
            os.environ.clear()  # the guest gets spec.env only; this process needs nothing
            sys.stdout.flush()
            code = _run(self._wasm, spec, server, self.loaded)
            sys.stderr.flush()
        except BaseException:  # never fall back into the server's loop
            code = 1
        os._exit(code)

    def _reap_check(self) -> None:
        """Report every child that ended, without reaping it (its pid stays reserved)."""
        for pid, status in self._children.items():
            if pid in self._ended:
                continue
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = None
                code = -9
            else:
                if info is None:
                    continue
                code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            self._ended.add(pid)
            with contextlib.suppress(OSError):
                os.write(status, f"X{code}\n".encode())

    def _released(self, poll: Any, status: int) -> None:
        """The host closed a child's status pipe: kill it if it still runs, and reap it."""
        import signal

        pid = next((p for p, fd in self._children.items() if fd == status), None)
        poll.unregister(status)
        os.close(status)
        if pid is None:
            return
        del self._children[pid]
        if pid not in self._ended:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self._ended.discard(pid)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


if __name__ == "__main__":
    sys.stderr.flush()
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
