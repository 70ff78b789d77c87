"""The wire between the host and a capsule: length-prefixed msgpack frames.

This module is shared: the host imports it (and nothing else from ``capsule``), and it runs
inside every capsule, including CPython-WASI, so it uses only the standard library and
msgpack.

A frame is a 4-byte big-endian length followed by that many bytes of one msgpack value.
A length over the cap is refused before any of the body is read. Decoding never
unpickles, never evals, refuses every ext type and trailing bytes; :func:`check_plain`
(and :func:`as_map` for an envelope) refuse what msgpack lets through: the timestamp
extension and bytes map keys. Every frame is a map whose ``"k"`` names its kind; see the
``K_*`` names.

Host to capsule:
    ``load``    {"k", "dir", "package", "files": [module...], "tools": {name: target},
                "max_frame", "max_attachment"}; a target is ``[file, path, params,
                context]``: ``params`` the (name, kind) pairs of every parameter, the
                context's included, ``context`` the name of the parameter annotated
                ``ToolContext`` or None
    ``call``    {"k", "id", "tool", "args": bin[, "ctx": {...}]}; ``args`` is the canonical
                encoding of the bound arguments, a map from parameter name to value, made
                once by the host; ``ctx`` (only for a tool that takes a context): the
                host's own record of the call: "call_id", "tool", "session", "caller",
                "chain", "metadata"
    ``cancel``  {"k", "id"}
    ``answer``  {"k", "req", "ok": true, "value"[, "files", "as"]} or
                {"k", "req", "ok": false, "error": {"kind", "message", ...}}: the answer
                to a ``ctx`` request

Capsule to host:
    ``loading`` {"k", "file"}                  about to import a tool file
    ``loaded``  {"k", "file", "exports": [..]} imported; the names it really exports
    ``failed``  {"k", "file", "error": {...}}   importing it raised
    ``ready``   {"k", "pid", "python"}          every file was tried; calls may come
    ``ok``      {"k", "id", "value"[, "files": [[name, mime_type, data, width, height]..],
                "as": "result" | "file"]}; ``files`` when the tool returned a ``Result``
                (``as`` "result") or an ``Attachment`` alone (``as`` "file", no value)
    ``err``     {"k", "id", "error": {"kind", "type", "message", "traceback", "path"}};
                for ``too_large``, ``type`` names the limit (``max_frame``,
                ``max_attachment_size``)
    ``console`` {"k", "stream", "data"}         output the tools printed
    ``ctx``     {"k", "id", "req", "op", "args": {..}}   a tool's context asks the host
                something for call ``id`` (ops: env, env_type, set_env, get, set, call);
                the host answers ``req`` with an ``answer`` frame, or refuses it if call
                ``id`` is not in flight on this capsule or takes no context
    ``event``   {"k", "id", "op", "args": {..}}  a context's event for call ``id`` (ops:
                emit, progress); nothing comes back

The code sandbox (agent code, ``capsule._guest``) speaks its own kinds on its pipes:

Host to sandbox:
    ``setup``   {"k", "tools": [[name, file, export, member|None, installed]...],
                "max_output", "max_argument"}   once, first
    ``run``     {"k", "id", "source"}            run agent code (one run at a time)
    ``ok``      {"k", "id", "value"}             a tool call's value (``id`` of its ``use``)
    ``err``     {"k", "id", "error": {"kind", "message", ...}}   a tool call's error

Sandbox to host:
    ``ready``   {"k", "pid", "python"}           set up; runs may come
    ``use``     {"k", "id", "run", "tool", "args": [..], "kwargs": {..}[, "wait": true]}
                agent code awaits a tool call; the host binds, decides and runs it as
                caller agent. ``wait``: the sandbox sends nothing until this is answered
    ``drop``    {"k", "id"}                      the code stopped waiting for that call
    ``done``    {"k", "id", "ok", "value", "stdout", "error", "warnings"}   a run ended
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from typing import Any, Final, cast

import msgpack  # pyright: ignore[reportMissingTypeStubs]

__all__ = [
    "MAX_FRAME",
    "MAX_DEPTH",
    "HEADER",
    "FrameTooLarge",
    "BadFrame",
    "FrameDecoder",
    "encode",
    "packer",
    "decode",
    "within_budget",
    "frame",
    "check_plain",
    "as_map",
]

MAX_FRAME: Final = 16 * 1024 * 1024
"""Default cap on one frame's body, in bytes."""

MAX_DEPTH: Final = 512
"""Deepest nesting accepted in a value (msgpack itself stops at 1024)."""

HEADER: Final = struct.Struct(">I")

DECODE_RATIO: Final = 16
"""Most bytes of Python objects one frame may decode to, per byte of the frame."""

DECODE_FLOOR: Final = 64 * 1024 * 1024
"""...but any frame may decode to this much: small frames are never counted (see
:func:`decode`)."""

_UNCOUNTED: Final = DECODE_FLOOR // 96
"""Frames up to this size are decoded without counting: no msgpack value decodes to more
than ~72 bytes per byte of its encoding (an array of empty maps), plus the keys, so they
stay under :data:`DECODE_FLOOR` whatever they hold. This is every frame of the hot path."""

K_LOAD: Final = "load"
K_CALL: Final = "call"
K_CANCEL: Final = "cancel"
K_LOADING: Final = "loading"
K_LOADED: Final = "loaded"
K_FAILED: Final = "failed"
K_READY: Final = "ready"
K_OK: Final = "ok"
K_ERR: Final = "err"
K_CONSOLE: Final = "console"
K_SETUP: Final = "setup"
K_RUN: Final = "run"
K_USE: Final = "use"
K_DROP: Final = "drop"
K_DONE: Final = "done"
K_CTX: Final = "ctx"
K_EVENT: Final = "event"
K_ANSWER: Final = "answer"

CTX_REQUESTS: Final = frozenset({"env", "env_type", "set_env", "get", "set", "call"})
"""The ops of ``ctx`` frames (each gets an ``answer``)."""
CTX_EVENTS: Final = frozenset({"emit", "progress", "log"})
"""The ops of ``event`` frames (one way)."""

LOG_LEVELS: Final = (
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
)
"""The levels of ``ctx.log``, least severe first: RFC 5424's, as MCP logging uses them."""

# Error kinds a capsule may report in an ``err`` frame. Anything else is a protocol error.
E_TOOL: Final = "tool_error"
E_NOT_SERIALIZABLE: Final = "not_serializable"
E_TOO_LARGE: Final = "too_large"
E_BAD_CALL: Final = "bad_call"
E_CANCELLED: Final = "cancelled"
ERROR_KINDS: Final = frozenset({E_TOOL, E_NOT_SERIALIZABLE, E_TOO_LARGE, E_BAD_CALL, E_CANCELLED})


class BadFrame(ValueError):
    """A frame that breaks the wire rules."""


class FrameTooLarge(BadFrame):
    """A frame whose declared length is over the cap (refused before reading it)."""


def _no_ext(code: int, data: bytes) -> Any:
    raise BadFrame(f"ext type {code} is not allowed on the wire")


def encode(value: Any) -> bytes:
    """Pack plain data. Raises ``TypeError`` for anything that is not plain data."""
    return cast(bytes, msgpack.packb(value, use_bin_type=True))  # pyright: ignore[reportUnknownMemberType]


def packer() -> Callable[[Any], bytes]:
    """A private encoder, as :func:`encode` but cheaper per call (no encoder is built per
    value). Not thread-safe: one per thread."""
    pack: Any = msgpack.Packer(use_bin_type=True)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return cast("Callable[[Any], bytes]", pack.pack)  # pyright: ignore[reportUnknownMemberType]


def decode(data: bytes | bytearray | memoryview) -> Any:
    """Unpack one msgpack value, strictly. Raises :class:`BadFrame` on any violation.

    What a frame decodes to is bounded: one byte of msgpack can become ~72 bytes of
    Python objects (an empty map, an empty array) and short strings ~20, so a 16 MiB frame
    of them would take a gigabyte. msgpack caps every string's and container's length by
    the frame's own length (``max_*_len``, set from ``len(data)``, checked in C on each
    header before anything is allocated). A frame over :data:`_UNCOUNTED` bytes may hold
    at most ``DECODE_RATIO`` times its size (or :data:`DECODE_FLOOR`, if more) in arrays
    and maps: one C pass bounds their number from above (:func:`_few_containers`), and
    only a frame that could pass the budget is decoded counting each container's
    ``sys.getsizeof`` as it is built, stopping with :class:`BadFrame` once past it.
    Scalars are not counted: short strings make at most ~22 bytes per byte.
    """
    size = len(data)
    try:
        if size <= _UNCOUNTED:
            return msgpack.unpackb(  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
                data,
                raw=False,
                strict_map_key=True,
                use_list=True,
                ext_hook=_no_ext,
            )
        limit = max(DECODE_FLOOR, DECODE_RATIO * size)
        if _few_containers(data, limit):
            return msgpack.unpackb(  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
                data, raw=False, strict_map_key=True, use_list=True, ext_hook=_no_ext
            )
        budget = _Budget(limit)
        return msgpack.unpackb(  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_no_ext,
            list_hook=budget.array,
            object_hook=budget.map,
        )
    except BadFrame:
        raise
    except (ValueError, TypeError) as exc:  # StackError, ExtraData, FormatError, UTF-8 errors
        raise BadFrame(f"undecodable frame: {type(exc).__name__}: {exc}") from exc


_CONTAINER_BYTES: Final = bytes([*range(0x80, 0xA0), *range(0xDC, 0xE0)])
"""Every first byte of a msgpack array or map header (fixmap, fixarray, 16 and 32 bits)."""

_CONTAINER_COST: Final = 72
"""The most bytes one container decodes to per byte of it (an empty map: 64 + a pointer)."""


def _few_containers(data: bytes | bytearray | memoryview, limit: int) -> bool:
    """Whether ``data`` surely holds too few containers to pass ``limit`` bytes.

    Counts the bytes that could start a container header (an upper bound: payload bytes
    count too) in one C pass. Plain data passes here (ASCII text and small ints never hit
    those bytes); binary or non-Latin text may not, and is then counted exactly.
    """
    view = memoryview(data).cast("B")
    rest = len(view.tobytes().translate(None, _CONTAINER_BYTES))
    return (len(view) - rest) * _CONTAINER_COST <= limit


class _Budget:
    """Counts the bytes a frame's decoded containers take (see :func:`decode`)."""

    __slots__ = ("left",)

    def __init__(self, limit: int) -> None:
        self.left = limit

    def _spent(self) -> BadFrame:
        return BadFrame(
            f"the frame decodes to more than {DECODE_RATIO} times its size "
            f"(or {DECODE_FLOOR >> 20} MiB): too many containers"
        )

    def array(self, items: list[Any]) -> list[Any]:
        self.left -= _sizeof(items)
        if self.left < 0:
            raise self._spent()
        return items

    def map(self, mapping: dict[Any, Any]) -> dict[Any, Any]:
        self.left -= _sizeof(mapping)
        if self.left < 0:
            raise self._spent()
        return mapping


_sizeof: Final = sys.getsizeof


def within_budget(body: bytes) -> bool:
    """Whether :func:`decode` would accept ``body`` as far as its decoding budget goes.

    For a sender: a capsule checks a large reply before sending it, so a result that is
    too dense to decode becomes an error it reports, not a breach of the wire rules.
    """
    size = len(body)
    if size <= _UNCOUNTED or _few_containers(body, max(DECODE_FLOOR, DECODE_RATIO * size)):
        return True
    try:
        decode(body)
    except BadFrame:
        return False
    return True


def frame(value: Any) -> bytes:
    """Encode ``value`` as one frame: length prefix plus body."""
    body = encode(value)
    return HEADER.pack(len(body)) + body


class FrameDecoder:
    """Splits a byte stream into frame bodies; checks each length before buffering it."""

    __slots__ = ("_buf", "max_frame")

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self.max_frame = max_frame

    @property
    def pending(self) -> int:
        """Bytes held that do not yet make a whole frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return the bodies of every frame now complete, in order."""
        buf = self._buf
        if not buf and len(data) > 4:  # the usual case: one whole frame, nothing held
            (size,) = HEADER.unpack_from(data)
            if size + 4 == len(data) and size <= self.max_frame:
                return [data[4:]]
        buf += data
        out: list[bytes] = []
        start = 0
        end = len(buf)
        while end - start >= 4:
            (size,) = HEADER.unpack_from(buf, start)
            if size > self.max_frame:
                raise FrameTooLarge(f"frame of {size} bytes is over the cap of {self.max_frame}")
            if end - start - 4 < size:
                break
            out.append(bytes(buf[start + 4 : start + 4 + size]))
            start += 4 + size
        if start:
            del buf[:start]
        return out


_NAMES: Final = frozenset({"k", "kind", "file"})
"""Fields that name something (a frame's kind, an error's kind, a tool file): strings
wherever they appear, so a host can look them up, compare and print them as they are."""


def as_map(value: Any) -> dict[str, Any]:
    """``value`` if it is a map (decoded with str keys), else :class:`BadFrame`.

    Its :data:`_NAMES` fields, where present, must be strings: a peer's ``"k"`` that is
    a list 1,000 deep would otherwise reach a ``repr`` in an error message and raise
    ``RecursionError`` there, and one that is unhashable a ``TypeError`` at the
    first lookup, neither of them a :class:`BadFrame`.
    """
    if not isinstance(value, dict):
        raise BadFrame(f"expected a map, got {type(value).__name__}")
    mapping: dict[Any, Any] = value  # pyright: ignore[reportUnknownVariableType]
    for key in mapping:
        if type(key) is not str:
            raise BadFrame(f"map keys must be str, not {type(key).__name__}")
        if key in _NAMES and type(mapping[key]) is not str:
            raise BadFrame(f"{key!r} must be a string, not {type(mapping[key]).__name__}")
    return mapping


_SCALARS: Final = (str, int, float, bool, bytes, type(None))


def check_plain(value: Any, *, max_depth: int = MAX_DEPTH) -> None:
    """Check that a decoded value holds only wire types, with str keys, within depth.

    msgpack decodes its timestamp extension without asking ``ext_hook``, and its
    ``strict_map_key`` accepts bytes keys as well as str, so decoded data from an
    untrusted peer is walked once. Raises :class:`BadFrame`.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, _SCALARS):
            continue
        if depth >= max_depth:
            raise BadFrame(f"value nested deeper than {max_depth}")
        if isinstance(item, list):
            items: list[Any] = item  # pyright: ignore[reportUnknownVariableType]
            stack.extend((x, depth + 1) for x in items)
        elif isinstance(item, dict):
            mapping: dict[Any, Any] = item  # pyright: ignore[reportUnknownVariableType]
            for key in mapping:
                if type(key) is not str:  # strict_map_key lets bytes keys through
                    raise BadFrame(f"map keys must be str, not {type(key).__name__}")
            stack.extend((x, depth + 1) for x in mapping.values())
        else:
            raise BadFrame(f"{type(item).__name__} is not allowed on the wire")
