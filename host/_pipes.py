"""Reading a pipe with the least work per chunk: the hot path of every call.

On asyncio a persistent ``loop.add_reader`` callback handles each chunk as it arrives;
``anyio.wait_readable`` costs a selector registration and a future per wait (measured
~60 us per call here, more than a whole bare pipe round trip). On trio, whose
``wait_readable`` is cheap, a plain loop does the same. This is the only module in
``host/`` that touches asyncio directly, and only through the running loop.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 - the measured fast path above; nothing else uses asyncio
import os
from collections.abc import Callable

import anyio
import sniffio

__all__ = ["PipeReader"]

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
        while not self._closed:
            try:
                data = os.read(self._fd, _CHUNK)
            except BlockingIOError:
                await anyio.wait_readable(self._fd)
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
