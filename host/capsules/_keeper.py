"""The host's keeper: one process per host process that starts every subprocess capsule,
so that whatever a capsule leaves behind can be found and killed.

A tool that double-forks, ``setsid()`` away and then kills its own process group
takes its capsule's reaper and worker with it: their orphans would be re-parented to
init and outlive the host. The keeper (``_keeper_child.py``, a child subreaper) is the
parent of every capsule instead of the host, so such orphans come back to it, and it
kills them at once. It also watches the host through a ``pidfd`` and kills every process
below it when the host dies, even by ``SIGKILL``, and it hands each capsule pidfds
of the host and of itself to watch too (a frozen capsule reaper no longer keeps tools
running). Where the kernel has Landlock's signal scoping, tools cannot signal the
keeper, the host or their own reaper at all (``capsule/_landlock.py``).

The host is not made the subreaper itself: a process with an event loop that also
reaps adopted orphans races its own child watcher for exit statuses.

The keeper runs while any capsule it started is held (:class:`Lease`, released when the
capsule's process is closed), like the Wasm fork server; a capsule started by it is a
:class:`~host.capsules._forkserver.ForkedProcess` to the host. Where it cannot run
(not Linux, no ``pidfd_open``), capsules are children of the host's own, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import anyio

from . import _wasm
from ._forkserver import ForkedProcess, ForkUnavailable, read_pid
from ._process import protect_host

__all__ = ["KeeperUnavailable", "Lease", "spawn", "available", "CHILD"]

CHILD: Final = Path(__file__).resolve().with_name("_keeper_child.py")
_STOP_GRACE: Final = 5.0
"""Seconds a keeper let go of has to finish its work before it is killed."""


class KeeperUnavailable(Exception):
    """The keeper cannot start this capsule; start it as a child of the host instead."""


def available() -> bool:
    """Whether capsules can be started by a keeper here (Linux with ``pidfd_open``)."""
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open")


class _Keeper:
    """The keeper process and the host's end of its socket."""

    def __init__(self) -> None:
        protect_host()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(CHILD), str(os.getpid())],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env=_wasm.child_env(),
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self.socket = ours
        self.users = 0

    @property
    def alive(self) -> bool:
        return self.process.poll() is None and self.socket.fileno() >= 0

    async def request(self, data: bytes, fds: list[int]) -> None:
        while True:
            try:
                socket.send_fds(self.socket, [data], fds)
                return
            except BlockingIOError:
                await anyio.wait_writable(self.socket)
            except OSError as exc:
                raise KeeperUnavailable(f"the keeper is gone: {exc}") from None

    async def stop(self) -> None:
        """Let go of the keeper: it kills what is left below it (orphans it may be about
        to adopt included) and exits; killed only if it has not within a few seconds."""
        self.socket.close()
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(self.process.wait, _STOP_GRACE)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    self.process.kill()
                await anyio.to_thread.run_sync(self.process.wait)


_current: list[_Keeper] = []


class Lease:
    """Keeps the keeper running while held (one per capsule process)."""

    def __init__(self) -> None:
        keeper = _current[0] if _current else None
        if keeper is None or not keeper.alive:
            keeper = _Keeper()
            _current[:] = [keeper]
        keeper.users += 1
        self.keeper = keeper
        self.held = True

    async def release(self) -> None:
        if not self.held:
            return
        self.held = False
        keeper = self.keeper
        keeper.users -= 1
        if keeper.users <= 0:
            if _current and _current[0] is keeper:
                _current.clear()
            await keeper.stop()


async def spawn(
    command: Sequence[str], *, cwd: str, env: Mapping[str, str]
) -> tuple[ForkedProcess, int, int]:
    """Start ``command`` from the keeper, as :func:`~host.capsules._process.spawn_piped`
    does from the host: ``(process, host_write_fd, host_read_fd)``, its stderr a pipe the
    caller drains, its own session, exactly ``env``.

    Raises:
        KeeperUnavailable: the keeper could not start it; nothing was started.
    """
    try:
        lease = Lease()
    except OSError as exc:
        raise KeeperUnavailable(f"the keeper cannot start: {exc}") from None
    child_in, host_out = os.pipe()
    host_in, child_out = os.pipe()
    err_read, err_write = os.pipe()
    status_read, status_write = os.pipe()
    os.set_blocking(status_read, False)
    mine = [host_out, host_in, err_read, status_read]
    data = json.dumps({"argv": list(command), "cwd": cwd, "env": dict(env)}).encode()
    try:
        try:
            await lease.keeper.request(data, [child_in, child_out, err_write, status_write])
        finally:
            for fd in (child_in, child_out, err_write, status_write):
                os.close(fd)
        try:
            pid = await read_pid(status_read)
        except ForkUnavailable:
            raise KeeperUnavailable("the keeper did not start the capsule") from None
    except BaseException:
        for fd in mine:
            os.close(fd)
        with anyio.CancelScope(shield=True):
            await lease.release()
        raise
    process = ForkedProcess(pid, status_read, err_read)
    process.lease = lease
    return process, host_out, host_in
