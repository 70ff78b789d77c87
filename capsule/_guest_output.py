"""What a run of the code sandbox's guest gives back, as data: its captured output, its
error with the agent's own traceback only, and its value made plain data.

Part of the guest (``capsule._guest`` drives the runs): standard library only, imported at
its start. What costs time to import in the unoptimised WASI build (``traceback``,
``capsule._convert``) is imported on first use, or while the guest idles.
"""

from __future__ import annotations

import sys

from . import _wire
from ._guest_errors import HostError, LimitExceeded

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Sources = dict[str, tuple[int, None, list[str], str]]
    """The runs' code by file name, as ``linecache.cache`` holds it."""

__all__ = ["Capture", "OutputLimit", "error_data", "share_sources", "as_plain", "MAX_TEXT"]

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
