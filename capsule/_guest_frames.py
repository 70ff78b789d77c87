"""The code sandbox's guest: its end of the protocol pipe, read as frames.

A frame is a 4-byte big-endian length, then a msgpack body (``capsule._wire`` decodes it;
the host's ``capsule.protocol`` is the reference for the kinds). :class:`Frames` reads the
host's pipe and splits what it reads into frame bodies; a host that closes the pipe or
sends bytes that are not a frame ends the guest (:class:`HostGone`, :class:`HostBroke`,
both ``BaseException`` so that agent code cannot catch them). Writing frames, and the
frames the guest builds by hand on the call path, stay with the driver (``capsule._guest``).
Standard library only, imported at the guest's start.
"""

from __future__ import annotations

import os

from . import _wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "K_SETUP",
    "K_READY",
    "K_RUN",
    "K_USE",
    "K_DROP",
    "K_DONE",
    "K_OK",
    "K_ERR",
    "MAX_FRAME",
    "Frames",
    "frame_map",
    "HostGone",
    "HostBroke",
]

# The frame kinds of ``capsule.protocol`` (which imports msgpack: too slow to load here).
K_SETUP = "setup"
K_READY = "ready"
K_RUN = "run"
K_USE = "use"
K_DROP = "drop"
K_DONE = "done"
K_OK = "ok"
K_ERR = "err"
MAX_FRAME = 16 * 1024 * 1024


class HostGone(BaseException):
    """The host closed the protocol pipe: the guest ends."""


class HostBroke(BaseException):
    """The host sent bytes that are not a frame: the guest ends (the host sees it die)."""


class Frames:
    """Frame bodies from the host's pipe: a 4-byte big-endian length, then the body."""

    __slots__ = ("_bodies", "_buf", "_fd")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buf = b""
        self._bodies: list[bytes] = []

    @property
    def pending(self) -> bool:
        return bool(self._bodies)

    @property
    def empty(self) -> bool:
        """Nothing read and not yet taken: no frame, no part of one."""
        return not self._bodies and not self._buf

    def read(self) -> bytes:
        """One ``read`` of the pipe (it must be readable, or this blocks), not yet fed."""
        try:
            data = os.read(self._fd, 1 << 18)
        except OSError:
            data = b""
        if not data:
            raise HostGone
        return data

    def feed(self, data: bytes | None = None) -> None:
        """Split ``data`` (else one :meth:`read`) into frames."""
        if data is None:
            data = self.read()
        buf = self._buf + data if self._buf else data
        start, end = 0, len(buf)
        while end - start >= 4:
            size = int.from_bytes(buf[start : start + 4], "big")
            if size > MAX_FRAME:
                raise HostBroke(f"a frame of {size} bytes is over the cap")
            if end - start - 4 < size:
                break
            self._bodies.append(buf[start + 4 : start + 4 + size])
            start += 4 + size
        self._buf = buf[start:]

    def next_body(self) -> bytes:
        """The next frame's body, reading (blocking) as needed."""
        while not self._bodies:
            self.feed()
        return self._bodies.pop(0)

    def next(self) -> dict[str, Any]:
        """The next frame, reading (blocking) as needed."""
        return frame_map(self.next_body())


def frame_map(body: bytes) -> dict[str, Any]:
    try:
        msg = _wire.decode(body)
    except _wire.WireError as exc:
        raise HostBroke(str(exc)) from None
    if type(msg) is not dict:
        raise HostBroke("a frame must be a map")
    return msg  # pyright: ignore[reportUnknownVariableType]
