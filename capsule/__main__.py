"""``python -m capsule``: a persistent tool capsule speaking frames on fds 0 and 1.

Before any user code runs, the protocol pipes are moved to private descriptors that no
child process inherits; fd 0 becomes ``/dev/null`` and fd 1 becomes a pipe whose bytes
(``print``, stray writes from C code) are forwarded to the host as ``console`` frames.
fd 2 stays the host's stderr pipe, which the host drains (logging goes there).

A lifeline thread watches the parent: if the host dies, the capsule kills its own
process group and every child it adopted, so no process outlives the host.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
import sys
import threading
import time

from ._serve import Capsule
from .protocol import K_CONSOLE, encode

_CHUNK = 64 * 1024


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
    sys.stdout = open(1, "w", 1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    return proto_in, proto_out, console_read


def _forward_console(capsule: Capsule, fd: int) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        try:
            data = os.read(fd, _CHUNK)
        except OSError:
            return
        if not data:
            return
        text = decoder.decode(data)
        if text:
            try:
                capsule.write(encode({"k": K_CONSOLE, "stream": "stdout", "data": text}))
            except OSError:
                return


def _kill_everything() -> None:
    """Kill our adopted children and our process group (which includes us)."""
    me = os.getpid()
    try:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
                ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == me:
                with contextlib.suppress(OSError):
                    os.kill(int(entry), signal.SIGKILL)
    except OSError:
        pass
    if os.getpgrp() == me:
        os.killpg(me, signal.SIGKILL)
    os._exit(1)


def _lifeline(parent: int) -> None:
    while True:
        time.sleep(0.2)
        if os.getppid() != parent:
            _kill_everything()


def _become_subreaper() -> None:
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
    proto_in, proto_out, console_read = _take_stdio()
    capsule = Capsule(proto_in, proto_out)
    if sys.platform != "wasi":
        _become_subreaper()
        threading.Thread(
            target=_forward_console, args=(capsule, console_read), daemon=True, name="console"
        ).start()
        threading.Thread(
            target=_lifeline, args=(os.getppid(),), daemon=True, name="lifeline"
        ).start()
    if not capsule.load():
        return
    asyncio.run(capsule.serve())
    # The host closed the pipe: take any processes the tools left behind with us.
    sys.stdout.flush()
    if os.getpgrp() == os.getpid():
        _kill_everything()


if __name__ == "__main__":
    main()
