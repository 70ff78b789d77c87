"""The event-loop primitives of the hot path: reading a pipe, waking a caller, the clock.

Every call reads one chunk, wakes one waiting task and reads the clock once, so each of
these is done with the least work the running loop offers:

* On asyncio a persistent ``loop.add_reader`` callback handles each chunk as it arrives;
  ``anyio.wait_readable`` costs a selector registration and a future per wait (measured
  ~60 us per call here, more than a whole bare pipe round trip). On trio, whose
  ``wait_readable`` is cheap, a plain loop does the same.
* A waiting call parks on a bare future (asyncio) or a ``trio.Event``, not an
  ``anyio.Event``, whose wrapper and backend lookup cost several microseconds per call.
* The clock is the loop's own (``loop.time``, ``trio.current_time``), looked up once.

This is the only module in ``host/`` that touches asyncio or trio directly, and only
through the running loop.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 - the measured fast path above; nothing else uses asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio
import sniffio

__all__ = ["PipeReader", "Wakeup", "clock", "wakeups", "write_all"]

_CHUNK = 1 << 18


class PipeReader:
    """Calls ``on_data(chunk)`` for every chunk read from ``fd`` until EOF or close."""

    def __init__(self, fd: int, on_data: Callable[[bytes], None]) -> None:
        self._fd = fd
        self._on_data = on_data
        self._stop: Callable[[], None] | None = None
        self._closed = False

    async def run(self) -> None:
        """Read until EOF, an error from ``on_data`` (re-raised) or :meth:`close`."""
        if sniffio.current_async_library() == "asyncio":
            await self._run_asyncio()
        else:
            await self._run_generic()

    async def _run_asyncio(self) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        fd = self._fd

        def finish(exc: BaseException | None = None) -> None:
            loop.remove_reader(fd)
            if not done.done():
                if exc is None:
                    done.set_result(None)
                else:
                    done.set_exception(exc)

        def readable() -> None:
            try:
                data = os.read(fd, _CHUNK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                finish()
                return
            try:
                self._on_data(data)
            except BaseException as exc:  # re-raised from run() in the reading task
                finish(exc)

        if self._closed:
            return
        self._stop = finish
        loop.add_reader(fd, readable)
        try:
            await done
        finally:
            loop.remove_reader(fd)
            self._stop = None

    async def _run_generic(self) -> None:
        fd = self._fd
        while not self._closed:
            # Wait first: after a chunk the pipe is most likely empty, and a read that
            # fails with EAGAIN costs a system call and an exception per call.
            try:
                await anyio.wait_readable(fd)
            except anyio.ClosedResourceError:
                return  # close() woke us: the descriptor is going away
            try:
                data = os.read(fd, _CHUNK)
            except BlockingIOError:
                continue
            except OSError:
                return
            if not data:
                return
            self._on_data(data)

    def close(self) -> None:
        """Stop reading (call before closing the descriptor)."""
        self._closed = True
        if self._stop is not None:
            self._stop()


def _never() -> bool:
    return False


async def write_all(fd: int, data: bytes | memoryview, closed: Callable[[], bool] = _never) -> None:
    """Write all of ``data`` to the non-blocking pipe ``fd``, waiting while it is full.

    Raises:
        BrokenPipeError: ``closed()`` says the pipe is going away, or it was closed
            while this waited on it.
        OSError: a write failed (``BrokenPipeError``: nobody reads the pipe any more).
    """
    view = memoryview(data)
    while view:
        if closed():
            raise BrokenPipeError("the pipe is closed")
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            try:
                await anyio.wait_writable(fd)
            except anyio.ClosedResourceError:
                raise BrokenPipeError("the pipe was closed") from None


class Wakeup(Protocol):
    """A one-shot wake-up for one waiting task: ``set`` any number of times, ``wait`` once."""

    def set(self) -> None: ...

    def wait(self) -> Awaitable[None]: ...


class _FutureWakeup:
    __slots__ = ("_future",)

    def __init__(self, future: asyncio.Future[None]) -> None:
        self._future = future

    def set(self) -> None:
        future = self._future
        if not future.done():  # done already if the waiting task was cancelled
            future.set_result(None)

    def wait(self) -> Awaitable[None]:
        return self._future


def wakeups() -> Callable[[], Wakeup]:
    """A factory of the cheapest wake-ups on the running event loop (call it on the loop)."""
    library = sniffio.current_async_library()
    if library == "asyncio":
        create = asyncio.get_running_loop().create_future
        return lambda: _FutureWakeup(create())
    if library == "trio":
        import trio

        return trio.Event
    return anyio.Event


def clock() -> Callable[[], float]:
    """The running loop's clock, as ``anyio.current_time`` reads it (call it on the loop)."""
    library = sniffio.current_async_library()
    if library == "asyncio":
        return asyncio.get_running_loop().time
    if library == "trio":
        import trio

        return trio.current_time
    return anyio.current_time
