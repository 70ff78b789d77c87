"""New code-sandbox guests from a fork server, instead of a fresh interpreter each.

A new guest child otherwise spends most of its start on things that never change: starting
Python, ``import wasmtime`` and loading the compiled module. The fork server
(``host/_wasm_child.py zygote``) does them once and forks a child per guest, which then
only boots the guest's own CPython. One server runs per compiled module while any code
sandbox of this process holds a :class:`Lease`; the last lease to go stops it, so a
closed host leaves no process behind.

The guest child is the server's child, not the host's, so :class:`ForkedProcess` stands
in for the usual process object: its pid, its exit status (reported by the server on a
status pipe that only this process reads) and its stderr. The server reaps a child only
once the host closes that status pipe, so the pid stays the child's while the host may
still kill it (:func:`host._process.kill_tree` works on it as on any capsule: the child
leads its own session). Everything else a guest gets is as with a child of its own: the
same :class:`~host._wasm.GuestSpec`, a bare environment, only its own pipes, and it dies
with the host (the server does, and takes its children with it).

When the server cannot serve (it died, or failed to fork), :func:`spawn` raises
:class:`ForkUnavailable` and the caller starts the guest as a child of its own. Setting
``TOOLHOST_FORKSERVER=0`` in the host's environment does that for every guest (to compare,
or to rule the server out).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
from typing import Protocol

import anyio
import anyio.abc

from . import _wasm
from ._process import protect_host

__all__ = [
    "ForkUnavailable",
    "ForkedProcess",
    "Lease",
    "Releasable",
    "read_pid",
    "send_request",
    "spawn",
    "spawn_leased",
    "wanted",
]

_SWITCH = "TOOLHOST_FORKSERVER"


def wanted() -> bool:
    """Whether new guests come from the fork server (unless ``TOOLHOST_FORKSERVER=0``)."""
    return os.environ.get(_SWITCH, "1") != "0"


class ForkUnavailable(Exception):
    """The fork server cannot start this guest; start it as a child of the host instead."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused
        """The server said why it would not (an ``N<reason>`` line), rather than failing."""


def start_helper(command: list[str], *, cwd: str) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """Start a per-host helper (the fork server, the keeper) in a session of its own, with
    the scrubbed environment and the other end of a ``SOCK_SEQPACKET`` pair as its stdin;
    returns it and the host's end of the pair (non-blocking)."""
    protect_host()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        process = subprocess.Popen(
            command,
            stdin=theirs.fileno(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env=_wasm.child_env(),
            start_new_session=True,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    ours.setblocking(False)
    return process, ours


class _Server:
    """One fork server process and the host's end of its socket."""

    def __init__(self, cwasm: str) -> None:
        self.process, self.socket = start_helper(
            [
                *(sys.executable, "-I", "-S", str(_wasm.CHILD), "zygote"),
                *(str(os.getpid()), _wasm.wasmtime_root(), cwasm),
            ],
            cwd=str(_wasm.HOST_ROOT),
        )
        self.sending = anyio.Lock()
        self.users = 0

    @property
    def alive(self) -> bool:
        return self.process.poll() is None and self.socket.fileno() >= 0

    async def request(self, spec: _wasm.GuestSpec, fds: list[int]) -> None:
        try:
            await send_request(self.socket, self.sending, spec.to_json().encode(), fds)
        except OSError as exc:
            raise ForkUnavailable(f"the fork server is gone: {exc}") from None

    async def stop(self) -> None:
        self.socket.close()  # the server exits on its own; a kill makes it certain
        with contextlib.suppress(OSError):
            self.process.kill()
        with anyio.CancelScope(shield=True), contextlib.suppress(subprocess.TimeoutExpired):
            await anyio.to_thread.run_sync(self.process.wait, 5)


_servers: dict[str, _Server] = {}


class Lease:
    """Keeps the fork server for one compiled module running while held."""

    def __init__(self, cwasm: str) -> None:
        self.cwasm = cwasm
        self.held = True
        server = _servers.get(cwasm)
        if server is None or not server.alive:
            server = _Server(cwasm)  # starts loading at once, while the host goes on
            _servers[cwasm] = server
        server.users += 1
        self._server = server

    def server(self) -> _Server:
        """The running server (a new one if the last one died)."""
        if not self.held:
            raise ForkUnavailable("the lease was released")
        if not self._server.alive:
            replacement = _servers.get(self.cwasm)
            if replacement is None or not replacement.alive:
                replacement = _Server(self.cwasm)
                _servers[self.cwasm] = replacement
            replacement.users += 1
            self._server.users -= 1
            self._server.socket.close()  # the process is dead and reaped (``alive``)
            self._server = replacement
        return self._server

    async def release(self) -> None:
        if not self.held:
            return
        self.held = False
        server = self._server
        server.users -= 1
        if server.users <= 0:
            if _servers.get(self.cwasm) is server:
                del _servers[self.cwasm]
            await server.stop()


class Releasable(Protocol):
    """What a :class:`ForkedProcess` holds for itself: a lease on the process that
    started it (this module's server, or the host's keeper: ``_keeper.py``)."""

    async def release(self) -> None: ...


class _Stream(anyio.abc.ByteReceiveStream):
    """The read end of a pipe, read without threads."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while True:
            if self._fd < 0:
                raise anyio.ClosedResourceError
            try:
                data = os.read(self._fd, max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(self._fd)
                continue
            except OSError:
                raise anyio.BrokenResourceError from None
            if not data:
                raise anyio.EndOfStream
            return data

    async def aclose(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            anyio.notify_closing(fd)
            os.close(fd)


class ForkedProcess(anyio.abc.Process):
    """A guest child of the fork server, as the host sees it."""

    def __init__(self, pid: int, status: int, stderr: int) -> None:
        self._pid = pid
        self._status = status
        self._buffer = b""
        self._code: int | None = None
        self._stderr = _Stream(stderr)
        self.lease: Releasable | None = None
        """A lease this process holds for itself (:func:`spawn_leased`), released by
        :meth:`aclose` once the server has been let go of the child."""

    def _poll(self) -> None:
        """Read what the server said about the child so far (never blocks)."""
        while self._code is None and self._status >= 0:
            try:
                data = os.read(self._status, 256)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # the server is gone, and its children with it
                self._code = -signal.SIGKILL
                return
            self._buffer += data
            for line in self._buffer.split(b"\n")[:-1]:
                if line.startswith(b"X"):
                    self._code = int(line[1:])
            self._buffer = self._buffer[self._buffer.rfind(b"\n") + 1 :]

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        self._poll()
        return self._code

    async def wait(self) -> int:
        while True:
            self._poll()
            if self._code is not None:
                return self._code
            await anyio.wait_readable(self._status)

    def send_signal(self, signal: int) -> None:
        if self.returncode is None:  # not reaped until we let go: the pid is still its own
            with contextlib.suppress(OSError):
                os.kill(self._pid, signal)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    @property
    def stdin(self) -> None:
        return None

    @property
    def stdout(self) -> None:
        return None

    @property
    def stderr(self) -> anyio.abc.ByteReceiveStream:
        return self._stderr

    async def aclose(self) -> None:
        """Wait for the child to end, then let the server reap it."""
        with anyio.CancelScope(shield=True):
            await self._stderr.aclose()
            if self._code is None:
                await self.wait()
            status, self._status = self._status, -1
            if status >= 0:
                anyio.notify_closing(status)
                os.close(status)
            lease, self.lease = self.lease, None
            if lease is not None:
                await lease.release()


async def send_request(sock: socket.socket, lock: anyio.Lock, data: bytes, fds: list[int]) -> None:
    """Send one request with ``fds`` on a server's non-blocking socket. Requests wait
    their turn on ``lock`` while the socket is full (one task at a time may wait for it
    to drain: many sessions start at once).

    Raises:
        OSError: the server is gone.
    """
    try:
        socket.send_fds(sock, [data], fds)
        return
    except BlockingIOError:
        pass
    async with lock:
        while True:
            try:
                socket.send_fds(sock, [data], fds)
                return
            except BlockingIOError:
                await anyio.wait_writable(sock)


async def read_pid(status: int) -> int:
    """The ``P<pid>`` line a server writes on a status pipe once the child exists."""
    buffer = b""
    while not buffer.endswith(b"\n"):
        try:
            data = os.read(status, 64)
        except BlockingIOError:
            await anyio.wait_readable(status)
            continue
        if not data:
            raise ForkUnavailable("the fork server did not start the guest")
        buffer += data
    line = buffer.split(b"\n")[0]
    if line.startswith(b"N"):
        raise ForkUnavailable(line[1:].decode("utf-8", "replace"), refused=True)
    if not line.startswith(b"P"):
        raise ForkUnavailable("the fork server answered nonsense")
    return int(line[1:])


async def spawn(lease: Lease, spec: _wasm.GuestSpec) -> tuple[ForkedProcess, int, int]:
    """Start a guest from the fork server; returns (process, host_write_fd, host_read_fd),
    as :func:`host._wasm.spawn_guest` does.

    Raises:
        ForkUnavailable: the server could not, or is switched off; nothing was started.
    """
    if not wanted():
        raise ForkUnavailable(f"{_SWITCH}=0")
    # The preopens' descriptors travel with the request; their specs say which one is
    # theirs by its place among them (the server knows them by its own numbers).
    extra = [p.fd for p in spec.preopens if p.fd is not None]
    numbered = iter(range(len(extra)))
    spec = dataclasses.replace(
        spec,
        preopens=[
            p if p.fd is None else dataclasses.replace(p, fd=next(numbered)) for p in spec.preopens
        ],
    )
    child_in, host_out = os.pipe()
    host_in, child_out = os.pipe()
    err_read, err_write = os.pipe()
    status_read, status_write = os.pipe()
    os.set_blocking(status_read, False)
    mine = [host_out, host_in, err_read, status_read]
    try:
        try:
            await lease.server().request(
                spec, [child_in, child_out, err_write, status_write, *extra]
            )
        finally:
            for fd in (child_in, child_out, err_write, status_write):
                os.close(fd)
        pid = await read_pid(status_read)
    except BaseException:
        for fd in mine:
            os.close(fd)
        raise
    return ForkedProcess(pid, status_read, err_read), host_out, host_in


async def spawn_leased(cwasm: str, spec: _wasm.GuestSpec) -> tuple[ForkedProcess, int, int]:
    """:func:`spawn` with a :class:`Lease` of the process's own, for a guest whose owner
    holds no lease (a Wasm tool capsule): the server runs at least until the process has
    ended and been closed (:meth:`ForkedProcess.aclose`).

    Raises:
        ForkUnavailable: as :func:`spawn`; the lease is already released then.
    """
    lease = Lease(cwasm)
    try:
        process, host_out, host_in = await spawn(lease, spec)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await lease.release()
        raise
    process.lease = lease
    return process, host_out, host_in
