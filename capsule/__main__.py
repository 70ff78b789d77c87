"""``python -m capsule``: a persistent tool capsule speaking frames on fds 0 and 1.

Before any user code runs, the protocol pipes are moved to private descriptors that no
child process inherits; fd 0 becomes ``/dev/null`` and fd 1 becomes a pipe whose bytes
(``print``, stray writes from C code) are forwarded to the host as ``console`` frames.
fd 2 stays the host's stderr pipe, which the host drains (logging goes there).

Where processes can be forked, the process the host starts splits in two at once: a
small *reaper* that never runs user code, and the *worker* that loads the tools and
serves calls. Both are child subreapers: an orphaned descendant (a daemon that
double-forked and ``setsid()``-ed away from the process group) is re-parented to the
worker, and when the worker dies, everything it had goes to the reaper. When the worker
dies in any way (``os._exit`` or SIGKILL from a tool) or the host dies, the reaper kills
every descendant it has and exits with the worker's status, so no process outlives the
capsule or the host. The worker watches the reaper the same way (a lifeline thread), and
kills its own tree if a tool kills the reaper. (The worker does not reap the orphans it
adopts, since that would steal exit statuses from the tools' own ``subprocess`` calls;
they stay zombies until the worker ends.)

Before it loads any tool, the worker gives up privileges (Linux): no new privileges on
``exec`` (no ``sudo``, no setuid binaries) and, when run by root, no capabilities at all,
so that, like a tool of an ordinary user, it cannot read the ``/proc`` entries
(environment, memory, fds) of the host, which makes itself non-dumpable. Both processes
are non-dumpable from the start too, so no other process of the same user (another
session's tool) can read their memory or environment. Then, still before any thread
starts, the worker confines itself with Landlock as the host's ``Guard`` says
(``capsule/_landlock.py``): writes only where allowed, no reading the host's state, no
signal or trace of any process outside its own tree. A worker asked to confine itself
that cannot exits with :data:`CONFINE_EXIT` and loads no tool.

The host passes its settings in ``TOOLHOST_CAPSULE`` (JSON), and the host's keeper
(``host/capsules/_keeper_child.py``), which starts the capsule, passes pidfds of the
host and of itself in ``TOOLHOST_LIFELINES``: the reaper and the worker both end
everything they have when either of those processes ends, whatever became of the other
capsule process (a frozen reaper no longer keeps the worker alive), and when the host
ends they wake the keeper with ``SIGCONT`` first, in case a tool froze it. Both
variables are removed from the environment at once.
"""

from __future__ import annotations

import array
import asyncio
import codecs
import contextlib
import io
import json
import os
import select
import signal
import sys
import threading
import time
from typing import Any

from ._harden import drop_privileges
from ._serve import Capsule
from .protocol import K_CONSOLE, BadFrame, encode

_CHUNK = 64 * 1024
_SETTINGS = "TOOLHOST_CAPSULE"
_LIFELINES = "TOOLHOST_LIFELINES"
_TICK = 0.2
"""Seconds between two looks at the processes a capsule process watches."""
CONFINE_EXIT = 78
"""Exit status of a worker that was asked to confine itself (Landlock) and could not."""


def _settings() -> tuple[dict[str, Any], list[int]]:
    """The host's settings, and the pidfds to watch; both removed from the environment."""
    return host_settings(), lifelines(os.environ.pop(_LIFELINES, "").split())


def host_settings() -> dict[str, Any]:
    """The host's settings, removed from the environment; exits if they are unreadable."""
    raw = os.environ.pop(_SETTINGS, "")
    try:
        found: Any = json.loads(raw) if raw else {}
    except ValueError:
        found = None
    if not isinstance(found, dict):
        os.write(2, b"toolhost capsule: unreadable settings; refusing to load tools\n")
        os._exit(CONFINE_EXIT)
    return found  # pyright: ignore[reportUnknownVariableType]


def lifelines(words: list[str]) -> list[int]:
    """The pidfds to watch (host, keeper), made private to this process."""
    found: list[int] = []
    for word in words:
        with contextlib.suppress(ValueError, OSError):
            fd = int(word)
            os.set_inheritable(fd, False)  # never handed on to what tools run
            found.append(fd)
    return found


def undumpable(settings: dict[str, Any]) -> None:
    """No other process of this user may read our memory or ``/proc/PID/environ``
    (Linux; the flag survives ``fork``). ``dumpable`` in the settings keeps it (the
    host's ``TOOLHOST_KEEP_DUMPABLE=1``, for a debugger)."""
    if not sys.platform.startswith("linux") or settings.get("dumpable") is True:
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE


def _leave_network(settings: dict[str, Any]) -> None:
    """No network at all (``[capsules] network = "none"`` with no ports): a network
    namespace of the capsule's own, where the kernel allows one; Landlock is told whether
    it was made (with neither it nor Landlock's TCP rules, the capsule refuses to load).
    Fails closed."""
    rules = settings.get("landlock")
    if rules is None or rules.get("network") != "none" or rules.get("connect_ports"):
        return
    from . import _netns

    try:
        failure = _netns.isolate()
    except OSError as exc:
        os.write(
            2,
            f"toolhost capsule: could not finish its network namespace ({exc}); "
            "refusing to load the tools\n".encode(errors="replace"),
        )
        os._exit(CONFINE_EXIT)
    settings["landlock"] = {**rules, "netns": failure is None, "netns_failure": failure}


def _confine(settings: dict[str, Any]) -> None:
    """Landlock, as the host asks; before any thread starts. Fails closed."""
    rules = settings.get("landlock")
    if rules is None:
        return
    from . import _landlock

    try:
        _landlock.restrict(rules)
    except (OSError, TypeError, ValueError) as exc:
        os.write(
            2,
            f"toolhost capsule: could not confine the tools with Landlock ({exc}); "
            "refusing to load them\n".encode(errors="replace"),
        )
        os._exit(CONFINE_EXIT)


def _take_stdio() -> tuple[int, int, int]:
    """Move the protocol to private fds; returns (proto_in, proto_out, console_read)."""
    proto_in = os.dup(0)  # dup() makes non-inheritable descriptors
    proto_out = os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    console_read, console_write = os.pipe()
    os.dup2(console_write, 1)
    os.close(console_write)
    sys.stdout = _unbuffered(1)
    sys.stderr = _unbuffered(2)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    return proto_in, proto_out, console_read


def _unbuffered(fd: int) -> io.TextIOWrapper:
    """A text stream that writes straight to ``fd`` (what ``python -u`` does).

    With the usual line buffering, output without a newline (``print(x, end="")``) would
    wait in the capsule until some later newline, and be lost if the capsule is killed.
    """
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace", write_through=True)


class _Console:
    """What tools write to fd 1 (``print``, C code, their child processes), forwarded as
    console frames by a thread; and :meth:`settle`, which the capsule calls before every
    other frame, so a tool's result never overtakes the output it printed before it."""

    def __init__(self, capsule: Capsule, fd: int) -> None:
        import fcntl  # not on WASI, where there is no console thread
        import termios

        self.capsule = capsule
        self.fd = fd
        self.gate = threading.Lock()
        """Held from reading a chunk until its frame is written."""
        self._ioctl = fcntl.ioctl
        self._fionread = termios.FIONREAD

    def forward(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while True:
            poller.poll()
            with self.gate:
                try:
                    data = os.read(self.fd, _CHUNK)
                except OSError:
                    return
                if not data:
                    return
                text = decoder.decode(data)
                if text:
                    frame = encode({"k": K_CONSOLE, "stream": "stdout", "data": text})
                    try:
                        self.capsule.write(frame, console=True)
                    except OSError:
                        return

    def settle(self) -> None:
        """Wait until the pipe holds nothing unforwarded; a few milliseconds at most (a
        tool's background child may keep writing)."""
        pending = array.array("i", [0])
        for _ in range(20):
            with self.gate:
                try:
                    self._ioctl(self.fd, self._fionread, pending)
                except OSError:
                    return
                if pending[0] == 0:
                    return
            time.sleep(0.001)


def _descendants(root: int) -> list[int]:
    """Every living descendant of ``root``, read from ``/proc`` (Linux; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            # The command name may hold spaces and parentheses: split after the last ')'.
            ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def _kill_descendants() -> None:
    """SIGKILL every descendant; a few passes catch processes forked meanwhile."""
    for _ in range(3):
        tree = _descendants(os.getpid())
        if not tree:
            return
        for pid in tree:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _kill_everything() -> None:
    """Kill our descendants and our process group (which includes us)."""
    _kill_descendants()
    with contextlib.suppress(OSError):
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(1)


def _watching(lifelines: list[int]) -> select.poll:
    """A poll object that becomes readable when any of the ``lifelines`` pidfds ends."""
    watch = select.poll()
    for fd in lifelines:
        watch.register(fd, select.POLLIN)
    return watch


def _wake_keeper(lifelines: list[int]) -> None:
    """The host died: make sure the keeper (the second lifeline) is not frozen, so it
    kills what it holds (without Landlock a tool could have stopped it)."""
    if len(lifelines) > 1:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(lifelines[1], signal.SIGCONT)


def _lifeline(parent: int, lifelines: list[int], keeper_is_parent: bool) -> None:
    """The worker's watch: when its reaper, the keeper or the host ends, so does it.

    A worker whose parent is the keeper (forked from the zygote) sleeps until a pidfd
    says so: a thousand idle capsules then cost no wake-ups."""
    watch = _watching(lifelines)
    tick = -1 if keeper_is_parent and len(lifelines) > 1 else int(_TICK * 1000)
    while True:
        ended = watch.poll(tick)
        if ended or os.getppid() != parent:
            if any(fd == lifelines[0] for fd, _ in ended):
                _wake_keeper(lifelines)
            _kill_everything()


def _reap(worker: int, lifelines: list[int]) -> None:
    """The reaper's life: wait for the worker (or the host) to die, then kill the rest.

    Never returns. It holds no protocol pipe, so the worker's death is end-of-file to
    the host at once; it reaps every adopted orphan as it goes, so none stays a zombie.
    """
    parent = os.getppid()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    watch = _watching(lifelines)
    status: int | None = None
    ended: list[tuple[int, int]] = []
    while status is None and os.getppid() == parent and not ended:
        signal.sigtimedwait({signal.SIGCHLD}, _TICK)
        ended = watch.poll(0)
        while True:
            try:
                pid, code = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == worker:
                status = code
    if any(fd == lifelines[0] for fd, _ in ended):
        _wake_keeper(lifelines)
    _kill_descendants()
    if status is None:  # the host or the keeper died: the worker went with the rest
        os._exit(1)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
            os.kill(os.getpid(), sig)  # exit the way the worker did, for the host's report
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


def become_subreaper() -> None:
    """Adopt orphaned descendants (Linux), so they can be found and killed with us."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def main() -> None:
    settings, lifelines = _settings()
    undumpable(settings)
    parent = None
    if sys.platform != "wasi" and hasattr(os, "fork"):
        become_subreaper()
        parent = os.getpid()  # the reaper, read before the fork: the worker's getppid()
        # may be late (its reaper already dead, and the worker adopted)
        worker = os.fork()  # before any thread starts: forking is safe here
        if worker:
            _reap(worker, lifelines)
        become_subreaper()  # not inherited across fork
    work(settings, lifelines, parent=parent)


def work(
    settings: dict[str, Any],
    lifelines: list[int],
    *,
    parent: int | None = None,
    keeper_is_parent: bool = False,
) -> None:
    """The worker's life: give up privileges, confine, load the tools, serve until the
    host closes the pipe. Also the entry of a capsule forked from the host's zygote
    (``capsule/_zygote.py``), which has no reaper of its own: the keeper is its parent
    (checked before this is called, and watched by its pidfd).

    ``parent`` is the pid of the process that forked this one, read before the fork
    (None: whoever is its parent now); the worker ends itself once that is gone."""
    _leave_network(settings)  # before the capabilities it brings are dropped
    drop_privileges("capsule")
    _confine(settings)  # before any thread: a thread started earlier would stay outside
    proto_in, proto_out, console_read = _take_stdio()
    capsule = Capsule(proto_in, proto_out)
    if sys.platform != "wasi":
        console = _Console(capsule, console_read)
        capsule.settle = console.settle
        threading.Thread(target=console.forward, daemon=True, name="console").start()
        threading.Thread(
            target=_lifeline,
            args=(os.getppid() if parent is None else parent, lifelines, keeper_is_parent),
            daemon=True,
            name="lifeline",
        ).start()
    if not capsule.load():
        return
    try:
        asyncio.run(capsule.serve())
    except BadFrame as exc:  # the host's stream broke: stop serving, clean up as below
        os.write(2, f"toolhost capsule: the host broke the protocol: {exc}\n".encode())
    # The host closed the pipe: take any processes the tools left behind with us (the
    # reaper, if there is one, also kills whatever outlives us). A dying host closes its
    # pipes a moment before its pidfd says so: if it died, end everything, as the
    # lifeline would have (the reaper and the keeper may be frozen).
    sys.stdout.flush()
    if lifelines and select.select([lifelines[0]], [], [], _TICK)[0]:
        _wake_keeper(lifelines)
        _kill_everything()
    _kill_descendants()


if __name__ == "__main__":
    main()
