"""MCP over this process's stdin and stdout, read and written on the event loop.

The SDK's stdio transport reads every line, and writes and flushes every message, on a
worker thread (``anyio.wrap_file``): five thread hand-offs per call, which profiling
found to be most of a served call's time (benchmarks/README.md, "Where toolhost's time
goes"). Here the pipes are non-blocking and served by the loop, as the capsule transport
serves its pipes: on asyncio a persistent reader callback collects what arrives; on trio
(whose ``wait_readable`` is cheap) a plain loop does the same. Messages waiting to be
sent go out in one write.

As the SDK does, while serving, descriptors 0 and 1 point at the null device and at
stderr (the wire is kept on private duplicates), so a stray ``print`` or a child process
cannot read or break the protocol; both are restored afterwards, with their flags.

Bad input keeps the connection: a line that is not a JSON-RPC message, or one longer
than :data:`MAX_LINE` (dropped whole), is answered with a JSON-RPC error of id null
(``-32700`` parse error, ``-32600`` for the long line: the SDK's transport answers
nothing) and reaches the server as an exception, which the SDK logs.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 - the persistent reader callback, as in host.capsules._pipes
import contextlib
import fcntl
import os
from collections import deque
from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager
from typing import Final

import anyio
import mcp.types as types
import sniffio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

__all__ = ["MAX_LINE", "stdio_streams"]

MAX_LINE: Final = 64 * 1024 * 1024
"""Bytes one message may have on the wire (a line longer is dropped and reported)."""
_CHUNK: Final = 1 << 18
_QUEUED: Final = 256
"""Messages read and not yet taken by the server; reading pauses beyond this."""


class LineTooLong(ValueError):
    """A message longer than :data:`MAX_LINE` arrived: it was dropped."""


def _claim(fd: int, diversion: Callable[[], int]) -> tuple[int, Callable[[], None]]:
    """Move the wire of ``fd`` to a private non-blocking duplicate and point ``fd`` at
    ``diversion()``; returns the duplicate and what puts everything back."""
    private = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    flags = fcntl.fcntl(private, fcntl.F_GETFL)
    target = diversion()
    try:
        os.dup2(target, fd)
    finally:
        os.close(target)
    fcntl.fcntl(private, fcntl.F_SETFL, flags | os.O_NONBLOCK)

    def restore() -> None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(private, fcntl.F_SETFL, flags)  # a shared terminal stays blocking
        with contextlib.suppress(OSError):
            os.dup2(private, fd)
        with contextlib.suppress(OSError):
            os.close(private)

    return private, restore


def _too_long() -> LineTooLong:
    return LineTooLong(f"a message longer than {MAX_LINE} bytes was dropped")


class _Lines:
    """Complete lines read from a non-blocking descriptor, in order, until EOF."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._partial = bytearray()
        self._skipping = False
        self.lines: deque[bytes | Exception] = deque()
        self.eof = False

    def feed(self, data: bytes) -> None:
        if not data:
            self.eof = True
            return
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            if self._skipping:
                self._skipping = False
            elif len(self._partial) + end - start > MAX_LINE:
                self.lines.append(_too_long())
            else:
                self._partial += data[start:end]
                line = bytes(self._partial).strip()
                if line:
                    self.lines.append(line)
            self._partial.clear()
            start = end + 1
        if not self._skipping:
            self._partial += data[start:]
            if len(self._partial) > MAX_LINE:
                self._partial.clear()
                self._skipping = True
                self.lines.append(_too_long())

    def read(self) -> None:
        """Read what is there (non-blocking); EOF or a broken descriptor ends it."""
        try:
            data = os.read(self._fd, _CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        self.feed(data)


async def _read_asyncio(
    lines: _Lines,
    fd: int,
    out: MemoryObjectSendStream[SessionMessage | Exception],
    reply: MemoryObjectSendStream[SessionMessage],
) -> None:
    loop = asyncio.get_running_loop()
    wake: list[asyncio.Future[None]] = []
    reading = False

    def readable() -> None:
        lines.read()
        if lines.eof or len(lines.lines) >= _QUEUED:
            pause()
        if wake and not wake[0].done():
            wake[0].set_result(None)

    def resume() -> None:
        nonlocal reading
        if not reading and not lines.eof:
            loop.add_reader(fd, readable)
            reading = True

    def pause() -> None:
        nonlocal reading
        if reading:
            loop.remove_reader(fd)
            reading = False

    try:
        resume()
        while True:
            while lines.lines:
                await _forward(lines.lines.popleft(), out, reply)
            if lines.eof:
                return
            resume()
            future = loop.create_future()
            wake[:] = [future]
            await future
    finally:
        pause()


async def _read_generic(
    lines: _Lines,
    fd: int,
    out: MemoryObjectSendStream[SessionMessage | Exception],
    reply: MemoryObjectSendStream[SessionMessage],
) -> None:
    while True:
        while lines.lines:
            await _forward(lines.lines.popleft(), out, reply)
        if lines.eof:
            return
        await anyio.wait_readable(fd)
        lines.read()


async def _forward(
    line: bytes | Exception,
    out: MemoryObjectSendStream[SessionMessage | Exception],
    reply: MemoryObjectSendStream[SessionMessage],
) -> None:
    if isinstance(line, Exception):
        await _refuse(reply, -32600, str(line))
        await out.send(line)
        return
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except Exception as exc:
        await _refuse(reply, -32700, "Parse error: not a JSON-RPC message")
        await out.send(exc)
        return
    await out.send(SessionMessage(message))


async def _refuse(reply: MemoryObjectSendStream[SessionMessage], code: int, message: str) -> None:
    error = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        await reply.send(SessionMessage(types.jsonrpc_message_adapter.validate_python(error)))


async def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            await anyio.wait_writable(fd)
            continue
        view = view[written:]


async def _write(fd: int, messages: MemoryObjectReceiveStream[SessionMessage]) -> None:
    """Every message as a line; those waiting together go out in one write. The client
    gone (a broken pipe) ends it."""
    async with messages:
        async for first in messages:
            parts = [_dump(first)]
            while True:
                try:
                    parts.append(_dump(messages.receive_nowait()))
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
            try:
                await _write_all(fd, b"".join(parts))
            except OSError:  # the client is gone: nothing more can be sent
                return


def _dump(message: SessionMessage) -> bytes:
    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
    return text.encode("utf-8") + b"\n"


@asynccontextmanager
async def stdio_streams() -> AsyncGenerator[
    tuple[
        MemoryObjectReceiveStream[SessionMessage | Exception],
        MemoryObjectSendStream[SessionMessage],
    ]
]:
    """The server's ends of this process's stdin and stdout: read messages (or the
    exceptions of lines that were not messages) until end of input, and send messages."""
    rfd, restore_in = _claim(0, lambda: os.open(os.devnull, os.O_RDONLY))
    try:
        wfd, restore_out = _claim(1, lambda: os.dup(2))
    except BaseException:
        restore_in()
        raise
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](_QUEUED)
    lines = _Lines(rfd)

    async def read() -> None:
        async with read_send:
            if sniffio.current_async_library() == "asyncio":
                await _read_asyncio(lines, rfd, read_send, write_send)
            else:
                await _read_generic(lines, rfd, read_send, write_send)

    written = anyio.Event()

    async def write() -> None:
        try:
            await _write(wfd, write_recv)
        finally:
            written.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            tg.start_soon(write)
            try:
                yield read_recv, write_send
            finally:
                write_send.close()  # the writer sends what is queued, then ends
                with anyio.move_on_after(5, shield=True):
                    await written.wait()
                tg.cancel_scope.cancel()  # the reader, if input has not ended
    finally:
        restore_out()
        restore_in()
