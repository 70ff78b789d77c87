"""The code sandbox's child process from the host's side: its pipes, as frames.

:class:`Guest` writes frames to the guest's stdin and reads its stdout as it arrives, split
into frames; it also kills the child and says why it ended. This is the hot path of code
mode: every tool call from agent code arrives through :meth:`Guest.next` (on asyncio, read
by :meth:`Guest._on_readable`) and is answered through :meth:`Guest.send`. Starting the
child and serving its runs is ``_sandbox.py``'s.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 - the pipe reader of Guest, as in _pipes.py
import contextlib
import os
import select
from collections import deque
from typing import Any

import anyio
import anyio.abc
import sniffio

from capsule import protocol as p

from . import _wasm
from ._pipes import write_all
from ._process import kill_tree

__all__ = ["Dead", "Guest"]

_CHUNK = 1 << 18
_BACKLOG = 4 * 1024 * 1024
"""Bytes of the guest's output read ahead with nobody reading them: then it waits."""
_HEADER = p.HEADER


class Dead(Exception):
    """The guest's pipes are closed."""


class Guest:
    """One sandbox child process and its pipes.

    Its output is read as it arrives and split into frames (:meth:`next` decodes them):
    on asyncio by a reader callback that stays registered with the loop, as
    ``host/_pipes.py`` reads capsules (``anyio.wait_readable`` registers and unregisters
    the pipe for every wait, and a callback that only wakes the reader runs again, with
    the pipe still unread, before the reader does). It stops reading while more than
    :data:`_BACKLOG` bytes wait with nobody reading them (the guest then blocks on its
    full pipe), and reads again when :meth:`next` runs out. On trio, whose wait is cheap,
    :meth:`next` waits and reads itself.
    """

    def __init__(
        self, process: anyio.abc.Process, write_fd: int, read_fd: int, memory: int = 0
    ) -> None:
        self.memory = memory
        """The memory cap the guest was started with (bytes)."""
        os.set_blocking(write_fd, False)
        os.set_blocking(read_fd, False)
        self.process = process
        self._wfd = write_fd
        self._rfd = read_fd
        self._decoder = p.FrameDecoder(p.MAX_FRAME)
        self._ready: deque[bytes] = deque()
        self._held = 0
        """Bytes of the frames in ``_ready``."""
        self._ended = False
        """The read pipe reached EOF (or failed) or broke the framing (``_broken``)."""
        self._broken: p.BadFrame | None = None
        self._pack = p.packer()
        self._wlock = anyio.Lock()
        self.stderr_tail = bytearray()
        self.owner: Any = None
        """The sandbox serving a session with this guest, when it is not the one that
        started it (a guest booted ahead by the pool): its console is that session's."""
        self.killed: str | None = None
        self.exited = anyio.Event()
        self.closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        """The asyncio loop whose reader callback reads the pipe, while one does."""
        self._waiter: asyncio.Future[None] | None = None

    @property
    def alive(self) -> bool:
        return self.killed is None and not self.closed and self.process.returncode is None

    def has_output(self) -> bool:
        """Whether the guest sent anything not yet taken as a frame, or closed its output
        (between runs, where it has nothing to say). Never blocks."""
        if self._ready or self._decoder.pending or self._ended:
            return True
        if self.closed:
            return False
        try:
            return bool(select.select([self._rfd], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    async def send(self, value: dict[str, Any]) -> None:
        body = self._pack(value)
        data = _HEADER.pack(len(body)) + body
        lock = self._wlock
        if self.closed:
            raise Dead
        if not lock.locked():
            # Nobody else is writing (the usual case): a small frame goes out in one write,
            # with no lock taken; only the rest of a partial write holds it.
            try:
                written = os.write(self._wfd, data)
            except BlockingIOError:
                written = 0
            except OSError:
                raise Dead from None
            if written == len(data):
                return
            lock.acquire_nowait()  # free: nothing was awaited since locked()
        else:
            written = 0
            await lock.acquire()
        try:
            await write_all(self._wfd, memoryview(data)[written:], lambda: self.closed)
        except OSError:
            raise Dead from None
        finally:
            lock.release()

    async def next(self) -> dict[str, Any] | None:
        """The next frame from the guest; None once its output is closed.

        Raises:
            p.BadFrame: the frame, or the framing of the stream, breaks the wire rules.
        """
        ready = self._ready
        while not ready:
            if self._broken is not None:
                raise self._broken
            if self._ended or self.closed:
                return None
            if not await self._more():  # closed by aclose() while a run reads
                return None
        body = ready.popleft()
        self._held -= len(body)
        return p.as_map(p.decode(body))

    async def _more(self) -> bool:
        """Wait for more of the guest's output; False if the pipe was closed meanwhile."""
        loop = self._loop
        if loop is None:
            if sniffio.current_async_library() == "asyncio":
                loop = asyncio.get_running_loop()
                try:
                    loop.add_reader(self._rfd, self._on_readable)
                except NotImplementedError:  # a loop without readers: anyio's own wait
                    loop = None
                else:
                    self._loop = loop
            if loop is None:
                return await self._read_generic()
        if self._waiter is not None:  # as anyio's wait would: one reader at a time
            raise anyio.BusyResourceError("reading from")
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None
        return not self.closed

    async def _read_generic(self) -> bool:
        # Wait first: after a frame the pipe is most likely empty, and a read that fails
        # with EAGAIN costs a system call and an exception.
        try:
            await anyio.wait_readable(self._rfd)
        except anyio.ClosedResourceError:
            return False
        if self.closed:
            return False
        self._read()
        return True

    def _read(self) -> None:
        """Read one chunk from the pipe and split it into frames."""
        try:
            data = os.read(self._rfd, _CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._ended = True
            return
        try:
            bodies = self._decoder.feed(data)
        except p.BadFrame as exc:  # raised by next() once the frames split off before are read
            self._broken = exc
            self._ended = True
            return
        for body in bodies:
            self._held += len(body)
            self._ready.append(body)

    def _on_readable(self) -> None:
        self._read()
        if self._ended:
            self._unwatch()  # else a pipe at EOF is readable on every loop iteration
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._ready or self._ended:
                waiter.set_result(None)
        elif self._held + self._decoder.pending > _BACKLOG:
            self._unwatch()  # nobody reads: next() watches again when it runs out

    def _unwatch(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.remove_reader(self._rfd)

    def kill(self, reason: str) -> None:
        if self.killed is None:
            self.killed = reason
        kill_tree(self.process.pid)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._unwatch()  # before the descriptor is closed (and its number reused)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        for fd in (self._wfd, self._rfd):
            anyio.notify_closing(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def exit_reason(self) -> str:
        code = self.process.returncode
        tail = self.stderr_tail.decode("utf-8", "replace").strip().splitlines()
        trap = [line for line in tail if line.startswith(_wasm.TRAP_PREFIX)]
        if trap:
            return "the guest trapped: " + trap[-1][len(_wasm.TRAP_PREFIX) :]
        if code is None:
            return "it stopped answering"
        if code < 0:
            return f"it was killed by signal {-code}"
        return f"it exited with status {code}"
