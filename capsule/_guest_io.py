"""The code sandbox's guest's input and output: the protocol pipe read as frames, and
what a run gives back as data.

In: a frame is a 4-byte big-endian length, then a msgpack body (``capsule._wire`` decodes
it; the host's ``capsule.protocol`` is the reference for the kinds). :class:`Frames` reads
the host's pipe and splits what it reads into frame bodies; a host that closes the pipe or
sends bytes that are not a frame ends the guest (:class:`HostGone`, :class:`HostBroke`,
both ``BaseException`` so that agent code cannot catch them). Writing frames, and the
frames the guest builds by hand on the call path, stay with the driver (``capsule._guest``).

Out: a run's captured output (:class:`Capture`), its error with the agent's own traceback
only (:func:`error_data`), and its value made plain data (:func:`as_plain`).

One module, not two: every module costs the guest about half a millisecond to import at
its start in the unoptimised WASI build, whatever its size. Standard library only; what
costs time to import (``traceback``, ``capsule._convert``) is imported on first use, or
while the guest idles.
"""

from __future__ import annotations

import os
import sys

from . import _wire
from ._guest_errors import HostError, LimitExceeded

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Sources = dict[str, tuple[int, None, list[str], str]]
    """The runs' code by file name, as ``linecache.cache`` holds it."""

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
    "Capture",
    "OutputLimit",
    "error_data",
    "share_sources",
    "as_plain",
    "MAX_TEXT",
]

# -- in: frames from the host ------------------------------------------------------------

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


# -- out: what a run gives back -------------------------------------------------------

MAX_TEXT = 64 * 1024
"""Characters an error's message or traceback keeps (its end, for a traceback)."""


class OutputLimit(BaseException):
    """The run printed more than it may (a BaseException: ``except Exception`` misses it)."""


class Capture:
    """``sys.stdout``/``sys.stderr`` during a run: keeps at most ``cap`` characters."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.size = 0
        self.parts: list[str] = []
        self.over = False

    def write(self, text: str) -> int:
        if type(text) is not str:  # the agent may pass anything
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        room = self.cap - self.size
        if len(text) > room:
            self.parts.append(text[: max(room, 0)])
            self.size = self.cap
            self.over = True
            raise OutputLimit
        self.parts.append(text)
        self.size += len(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def text(self) -> str:
        return "".join(self.parts)


def share_sources(sources: Sources) -> None:
    """The runs' sources for ``linecache`` (tracebacks), once something loaded it."""
    linecache = sys.modules.get("linecache")
    if linecache is not None:
        linecache.cache.update(sources)


def _traceback(exc: BaseException, sources: Sources) -> str:
    try:
        import traceback  # costly at start-up under WASI: warmed up when idle, or now

        share_sources(sources)
        frames = [
            f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<run ")
        ]
        lines = traceback.format_list(frames)
        lines += traceback.format_exception_only(type(exc), exc)
        text = "Traceback (most recent call last):\n" + "".join(lines)
    except BaseException:  # a hostile __str__: never let it escape
        text = f"{type(exc).__name__}\n"
    return text[-MAX_TEXT:]


def _text(obj: object) -> str:
    try:
        text = str(obj)
    except BaseException as exc:
        text = f"<unprintable: {type(exc).__name__}>"
    return text[:MAX_TEXT]


def error_data(exc: BaseException, sources: Sources) -> dict[str, Any]:
    """The agent's error as the ``done`` frame carries it; its traceback shows only the
    frames of the runs' own code (``sources``: the runs' code, by file name)."""
    data: dict[str, Any] = {
        "kind": exc.kind if isinstance(exc, HostError) else "exception",
        "type": type(exc).__name__,
        "message": _text(exc),
        "traceback": _traceback(exc, sources),
    }
    if isinstance(exc, LimitExceeded):
        data["limit"] = str(getattr(exc, "limit", ""))
    if isinstance(exc, MemoryError):
        data["kind"] = "limit_exceeded"
        data["limit"] = "code_memory"
    return data


def as_plain(value: Any, cap: int) -> tuple[Any, str | None]:
    """The run's value as plain data of at most ``cap`` bytes (characters, for a string),
    and a warning when it is not returned as it is."""
    kind: type[object] = type(value)  # pyright: ignore[reportUnknownVariableType]
    if value is None or kind is bool or kind is float:
        return value, None
    if kind is int and -(2**63) <= value < 2**64:
        return value, None
    if kind is str:
        return (value, None) if len(value) <= cap else _big(cap)
    from ._convert import NotPlainData, to_plain  # on first use: it imports a lot

    try:
        plain = to_plain(value, "value")
    except NotPlainData as exc:
        try:
            text = _text(repr(value))
        except BaseException as error:  # a hostile or huge object: its repr fails
            text = f"<unrepresentable: {type(error).__name__}>"
        return text, f"the value is a {exc.type_name}, which is not plain data; its repr is shown"
    except BaseException as exc:  # a hostile object: never let it escape
        return None, f"the value could not be converted: {type(exc).__name__}"
    if len(_wire.encode(plain)) > cap:
        return _big(cap)
    return plain, None


def _big(cap: int) -> tuple[None, str]:
    return None, f"the value is larger than {cap} bytes; it is not returned"
