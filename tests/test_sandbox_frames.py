"""The sandbox's pipe from the host's side (``host.capsules._guest_pipe.Guest``), over a bare pipe.

No guest runs here: the test writes what a guest would, and checks that frames come out
whole and in order however the bytes arrive, that a broken stream is a ``BadFrame``, that
EOF and ``close()`` end a waiting read, and that output nobody reads is not read ahead
without bound (the guest must then block on its full pipe). Run on asyncio and trio.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Generator
from contextlib import contextmanager, suppress
from typing import Any, cast

import anyio
import anyio.abc
import anyio.lowlevel
import pytest

from capsule import protocol as p
from host.capsules import _guest_pipe  # pyright: ignore[reportPrivateUsage]
from host.capsules._guest_pipe import Guest  # pyright: ignore[reportPrivateUsage]

pytestmark = pytest.mark.anyio


@contextmanager
def guest_pipe() -> Generator[tuple[Guest, int]]:
    """A guest reading the host's end of a pipe, and the write end (the guest's stdout)."""
    host_read, guest_write = os.pipe()
    host_write, guest_read = os.pipe()
    guest = Guest(cast(anyio.abc.Process, None), host_write, host_read)
    ours = {fd: os.fstat(fd).st_ino for fd in (guest_write, guest_read)}
    try:
        yield guest, guest_write
    finally:
        guest.close()
        for fd, inode in ours.items():
            # A test may have closed its end already (an EOF): close only the same pipe,
            # never a descriptor that reused the number meanwhile.
            with suppress(OSError):
                if os.fstat(fd).st_ino == inode:
                    os.close(fd)


async def test_frames_whole_and_in_order_however_split() -> None:
    frames = [p.frame({"k": "use", "id": i, "pad": "x" * (i * 37)}) for i in range(40)]
    stream = b"".join(frames)
    with guest_pipe() as (guest, write):
        # One byte, then several frames at once, then the rest in odd pieces.
        pieces = [stream[:1], stream[1:500], stream[500:501], stream[501:4000], stream[4000:]]
        got: list[dict[str, Any]] = []
        for piece in pieces:
            os.write(write, piece)
            while len(got) < 40 and guest._ready:  # pyright: ignore[reportPrivateUsage]
                msg = await guest.next()
                assert msg is not None
                got.append(msg)
            await anyio.lowlevel.checkpoint()
        while len(got) < 40:
            msg = await guest.next()
            assert msg is not None
            got.append(msg)
        assert [m["id"] for m in got] == list(range(40))
        os.close(write)
        assert await guest.next() is None
        assert await guest.next() is None


@pytest.mark.parametrize("ending", ["eof", "close"])
async def test_eof_or_close_mid_wait_returns_none(ending: str) -> None:
    with guest_pipe() as (guest, write):
        results: list[dict[str, Any] | None] = []
        async with anyio.create_task_group() as tg:

            async def read() -> None:
                results.append(await guest.next())

            tg.start_soon(read)
            with anyio.fail_after(10):
                await anyio.wait_all_tasks_blocked()  # the reader waits on the pipe now
            if ending == "eof":
                os.write(write, p.frame({"k": "done"})[:3])  # half a header, then EOF
                os.close(write)
            else:
                guest.close()
        assert results == [None]


async def test_frame_over_the_cap_is_bad() -> None:
    with guest_pipe() as (guest, write):
        os.write(write, p.frame({"k": "ready"}))
        assert await guest.next() == {"k": "ready"}
        os.write(write, struct.pack(">I", p.MAX_FRAME + 1) + b"xx")
        with pytest.raises(p.FrameTooLarge):
            await guest.next()
        with pytest.raises(p.FrameTooLarge):  # the stream stays broken
            await guest.next()


async def test_undecodable_frame_is_bad() -> None:
    with guest_pipe() as (guest, write):
        os.write(write, struct.pack(">I", 1) + b"\xc1")  # a byte msgpack never uses
        with pytest.raises(p.BadFrame):
            await guest.next()


async def test_output_nobody_reads_is_not_read_ahead_without_bound() -> None:
    frame = p.frame({"k": "use", "pad": "y" * 60_000})
    stream = frame * 200  # 12 MB, three times what the reader may hold
    with guest_pipe() as (guest, write):
        os.set_blocking(write, False)
        # A first frame read makes the reader watch the pipe, as a run's first next() does.
        os.write(write, frame)
        assert await guest.next() is not None
        sent = 0
        stuck = 0
        while stuck < 50 and sent < len(stream):  # until the pipe stays full: nobody reads
            try:
                sent += os.write(write, stream[sent : sent + 65536])
                stuck = 0
            except BlockingIOError:
                stuck += 1
            await anyio.lowlevel.checkpoint()
        held = guest._held + guest._decoder.pending  # pyright: ignore[reportPrivateUsage]
        assert held <= _guest_pipe._BACKLOG + (1 << 18)  # pyright: ignore[reportPrivateUsage]
        assert sent < len(stream)  # the rest waits: the pipe is full and unread
        # A reader takes it all, in order, and then sees the partial frame end at EOF.
        for _ in range(sent // len(frame)):
            msg = await guest.next()
            assert msg is not None and msg["pad"] == "y" * 60_000
        os.close(write)
        assert await guest.next() is None
