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

The keeper is also the host's zygote (unless ``TOOLHOST_ZYGOTE=0``): it has imported the
capsule runtime (``capsule/_zygote.py``), and :func:`spawn_forked` forks a capsule from it
that only imports the project's tool files, sharing the rest copy-on-write. Such a capsule
is the worker itself, without a reaper of its own (the keeper is its subreaper), and gets
its environment on its stdin from the host, never through the keeper.

The keeper runs while any capsule it started is held (:class:`Lease`, released when the
capsule's process is closed), like the Wasm fork server; a capsule started by it is a
:class:`~host.capsules._forkserver.ForkedProcess` to the host. Where it cannot run
(not Linux, no ``pidfd_open``), capsules are children of the host's own, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import anyio

import capsule

from ._forkserver import ForkedProcess, ForkUnavailable, read_pid, send_request, start_helper
from ._pipes import write_all

__all__ = [
    "CHILD",
    "KeeperUnavailable",
    "Lease",
    "ZygoteUnavailable",
    "available",
    "spawn",
    "spawn_forked",
    "zygote_wanted",
]

CHILD: Final = Path(__file__).resolve().with_name("_keeper_child.py")
_CAPSULE_PARENT: Final = str(Path(capsule.__file__).resolve().parent.parent)
_SWITCH: Final = "TOOLHOST_ZYGOTE"
_FORK: Final = b"Z"
"""The first byte of a request for a capsule forked from the zygote
(``_keeper_child.py``)."""
_STOP_GRACE: Final = 5.0
"""Seconds a keeper let go of has to finish its work before it is killed."""


class KeeperUnavailable(Exception):
    """The keeper cannot start this capsule; start it as a child of the host instead."""


class ZygoteUnavailable(Exception):
    """The keeper cannot fork this capsule from its zygote; start it with ``exec``."""


def zygote_wanted() -> bool:
    """Whether the keeper preloads the capsule runtime to fork capsules from (unless
    ``TOOLHOST_ZYGOTE=0`` in the host's environment)."""
    return os.environ.get(_SWITCH, "1") != "0"


def available() -> bool:
    """Whether capsules can be started by a keeper here (Linux with ``pidfd_open``)."""
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open")


class _Keeper:
    """The keeper process and the host's end of its socket."""

    def __init__(self) -> None:
        # As the zygote, the keeper imports the capsule runtime as a capsule would (with
        # site-packages, for msgpack); otherwise it needs only the standard library.
        command = (
            [sys.executable, "-I", str(CHILD), str(os.getpid()), _CAPSULE_PARENT]
            if zygote_wanted()
            else [sys.executable, "-I", "-S", str(CHILD), str(os.getpid())]
        )
        self.process, self.socket = start_helper(command, cwd="/")
        self.sending = anyio.Lock()
        self.users = 0

    @property
    def alive(self) -> bool:
        return self.process.poll() is None and self.socket.fileno() >= 0

    async def request(self, data: bytes, fds: list[int]) -> None:
        try:
            await send_request(self.socket, self.sending, data, fds)
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
    data = json.dumps({"argv": list(command), "cwd": cwd, "env": dict(env)}).encode()
    return await _start(data)


async def spawn_forked(*, cwd: str, env: Mapping[str, str]) -> tuple[ForkedProcess, int, int]:
    """A capsule forked from the keeper's zygote (``capsule/_zygote.py``), as
    :func:`spawn` starts one: the environment is written on its stdin, never sent to the
    keeper.

    Raises:
        ZygoteUnavailable: the keeper has no zygote (it says why); nothing was started.
        KeeperUnavailable: as :func:`spawn`.
    """
    process, host_out, host_in = await _start(_FORK + json.dumps({"cwd": cwd}).encode())
    preamble = json.dumps({"env": dict(env)}).encode()
    try:
        await _write_all(host_out, len(preamble).to_bytes(4, "big") + preamble)
    except BaseException:
        os.close(host_out)
        os.close(host_in)
        with anyio.CancelScope(shield=True):
            process.kill()
            await process.aclose()
        raise
    return process, host_out, host_in


async def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the pipe ``fd`` (a capsule that died already reads none
    of it: its load then says why it ended)."""
    os.set_blocking(fd, False)
    with contextlib.suppress(BrokenPipeError):
        await write_all(fd, data)


async def _start(data: bytes) -> tuple[ForkedProcess, int, int]:
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
    try:
        try:
            await lease.keeper.request(data, [child_in, child_out, err_write, status_write])
        finally:
            for fd in (child_in, child_out, err_write, status_write):
                os.close(fd)
        try:
            pid = await read_pid(status_read)
        except ForkUnavailable as exc:
            if data.startswith(_FORK) and exc.refused:
                raise ZygoteUnavailable(str(exc)) from None
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
