"""The code sandbox's own codec: the msgpack subset its frames use, small and quick to load.

The guest runs in an unoptimised CPython-WASI build where msgpack's pure-Python fallback
costs a lot per frame (and more to import), so the guest encodes and decodes its frames
here. The host never uses this module: it keeps decoding every guest frame with the real,
strict msgpack decoder of ``capsule.protocol`` and trusts nothing the guest sends.

:func:`encode` writes what ``msgpack.packb(value, use_bin_type=True)`` writes for plain
data (the same bytes, checked by the tests); :func:`decode` reads every format msgpack
writes for plain data and refuses ext types, truncation and trailing bytes. Standard
library only, no ``typing`` or ``struct`` import (each costs milliseconds at start-up).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "encode",
    "encode_args",
    "encode_int",
    "pack_into",
    "decode",
    "decode_from",
    "WireError",
    "MAX_DEPTH",
]

MAX_DEPTH = 511
"""Deepest nesting written or read (msgpack's own packer stops at the same depth)."""

_float: Any = None

_BYTE = tuple(bytes((c,)) for c in range(256))
"""Every one-byte ``bytes``: a fixint, or a format byte with its length in it."""


class WireError(ValueError):
    """Bytes that are not a plain msgpack value."""


def _float_struct() -> Any:
    global _float
    if _float is None:
        import struct  # only when a float is on the wire

        _float = struct.Struct(">d")
    return _float


def _head(out: list[bytes], n: int, fix: int, fix_max: int, c16: int, c32: int) -> None:
    if n < fix_max:
        out.append(_BYTE[fix | n])
    elif n < 0x10000:
        out.append(bytes((c16, n >> 8, n & 0xFF)))
    elif n < 0x100000000:
        out.append(bytes((c32,)) + n.to_bytes(4, "big"))
    else:
        raise ValueError("too large to encode")


def encode_int(v: int) -> bytes:
    """``encode(v)`` for an ``int`` (not a ``bool``). Raises ``OverflowError``."""
    if -32 <= v < 0x80:
        return _BYTE[v & 0xFF]  # a positive or negative fixint
    if v >= 0:
        if v < 0x100:
            return bytes((0xCC, v))
        if v < 0x10000:
            return b"\xcd" + v.to_bytes(2, "big")
        if v < 0x100000000:
            return b"\xce" + v.to_bytes(4, "big")
        if v < 0x10000000000000000:
            return b"\xcf" + v.to_bytes(8, "big")
        raise OverflowError("int too big to encode")
    if v >= -0x80:
        return b"\xd0" + v.to_bytes(1, "big", signed=True)
    if v >= -0x8000:
        return b"\xd1" + v.to_bytes(2, "big", signed=True)
    if v >= -0x80000000:
        return b"\xd2" + v.to_bytes(4, "big", signed=True)
    if v >= -0x8000000000000000:
        return b"\xd3" + v.to_bytes(8, "big", signed=True)
    raise OverflowError("int too big to encode")


def _str(out: list[bytes], v: str) -> None:
    b = v.encode("utf-8")
    n = len(b)
    if n < 32:
        out.append(_BYTE[0xA0 | n])
    elif n < 0x100:
        out.append(bytes((0xD9, n)))
    else:
        _head(out, n, 0, 0, 0xDA, 0xDB)
    out.append(b)


def _pack(v: object, out: list[bytes], depth: int) -> None:
    t = type(v)
    if t is str:
        _str(out, v)  # pyright: ignore[reportArgumentType]
    elif t is int:
        out.append(encode_int(v))  # pyright: ignore[reportArgumentType]
    elif v is None:
        out.append(b"\xc0")
    elif v is True:
        out.append(b"\xc3")
    elif v is False:
        out.append(b"\xc2")
    elif t is dict or t is list or t is tuple:
        if depth >= MAX_DEPTH:
            raise ValueError("recursion limit exceeded")
        if t is dict:  # (a wire type's subclass comes back here as the base type)
            items: dict[Any, Any] = v  # pyright: ignore[reportAssignmentType]
            _head(out, len(items), 0x80, 16, 0xDE, 0xDF)
            for key, item in items.items():
                if type(key) is not str:
                    if not isinstance(key, str):
                        raise TypeError(f"map keys must be str, not {type(key).__name__}")
                    key = str.__str__(key)
                _str(out, key)
                _pack(item, out, depth + 1)
        else:
            seq: list[Any] = v  # pyright: ignore[reportAssignmentType]
            _head(out, len(seq), 0x90, 16, 0xDC, 0xDD)
            for item in seq:
                _pack(item, out, depth + 1)
    elif t is float:
        out.append(b"\xcb" + _float_struct().pack(v))
    elif t is bytes or t is bytearray or t is memoryview:
        data = bytes(v)  # pyright: ignore[reportArgumentType]
        n = len(data)
        if n < 0x100:
            out.append(bytes((0xC4, n)))
        else:
            _head(out, n, 0, 0, 0xC5, 0xC6)
        out.append(data)
    else:
        _pack(_base(v), out, depth)


def _base(v: object) -> object:
    """A subclass of a wire type as its base type, as msgpack's packer treats it."""
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    if isinstance(v, dict):
        return dict(v)  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
    if isinstance(v, (list, tuple)):
        return list(v)  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
    raise TypeError(f"can not serialize {type(v).__name__!r} object")


def encode(value: object) -> bytes:
    """Pack plain data. Raises ``TypeError``, ``ValueError`` or ``OverflowError``."""
    out: list[bytes] = []
    _pack(value, out, 0)
    return b"".join(out)


def encode_args(args: tuple[Any, ...]) -> bytes:
    """``encode(args)`` for a call's arguments, quicker for the usual few small ints and
    short strings (the same bytes and the same errors: every other item takes the
    general path)."""
    n = len(args)
    if n >= 16:
        return encode(args)
    out = [_BYTE[0x90 | n]]
    for v in args:
        t: type[object] = type(v)  # pyright: ignore[reportUnknownVariableType]
        if t is int:
            i: int = v
            out.append(_BYTE[i & 0xFF] if -32 <= i < 0x80 else encode_int(i))
        elif t is str:
            b: bytes = v.encode("utf-8")
            if len(b) < 32:
                out += (_BYTE[0xA0 | len(b)], b)
            else:
                _str(out, v)
        else:
            _pack(v, out, 1)
    return b"".join(out)


def pack_into(out: list[bytes], value: object) -> None:
    """Append the packed pieces of ``value`` to ``out`` (to build a frame by hand)."""
    _pack(value, out, 0)


def _need(b: bytes, i: int, n: int) -> int:
    end = i + n
    if end > len(b):
        raise WireError("truncated value")
    return end


def _unpack(b: bytes, i: int, depth: int) -> tuple[Any, int]:
    """One value at ``b[i:]``: (value, end). One Python frame per level of nesting."""
    c = b[i]
    i += 1
    if c < 0x80:
        return c, i
    if c >= 0xE0:
        return c - 0x100, i
    if 0xA0 <= c < 0xC0:
        end = _need(b, i, c & 0x1F)
        return b[i:end].decode("utf-8"), end
    if c == 0xC0:
        return None, i
    if c == 0xC2:
        return False, i
    if c == 0xC3:
        return True, i
    if 0xCC <= c <= 0xCF:
        end = _need(b, i, 1 << (c - 0xCC))
        return int.from_bytes(b[i:end], "big"), end
    if 0xD0 <= c <= 0xD3:
        end = _need(b, i, 1 << (c - 0xD0))
        return int.from_bytes(b[i:end], "big", signed=True), end
    if c == 0xCB:
        end = _need(b, i, 8)
        return _float_struct().unpack(b[i:end])[0], end
    if c == 0xCA:
        import struct

        end = _need(b, i, 4)
        return struct.unpack(">f", b[i:end])[0], end
    size = _SIZES.get(c)
    if size is None:
        raise WireError(f"format 0x{c:02x} is not allowed here")
    if size:
        end = _need(b, i, size)
        n = int.from_bytes(b[i:end], "big")
        i = end
    else:
        n = c & 0x0F  # fixmap, fixarray
    if c in _BLOBS:
        end = _need(b, i, n)
        if c >= 0xD9:
            return b[i:end].decode("utf-8"), end
        return b[i:end], end
    if depth >= MAX_DEPTH:
        raise WireError("value nested too deep")
    depth += 1
    if c in _ARRAYS:
        items: list[Any] = []
        for _ in range(n):
            item, i = _unpack(b, i, depth)
            items.append(item)
        return items, i
    mapping: dict[str, Any] = {}
    for _ in range(n):
        key, i = _unpack(b, i, depth)
        if type(key) is not str:
            raise WireError("map keys must be str")
        mapping[key], i = _unpack(b, i, depth)
    return mapping, i


# The formats with a length: how many bytes the length takes (0: it is in the format byte).
_SIZES = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4, 0xDC: 2, 0xDD: 4, 0xDE: 2}
_SIZES[0xDF] = 4
_SIZES.update((c, 0) for c in range(0x80, 0xA0))
_BLOBS = frozenset((0xD9, 0xDA, 0xDB, 0xC4, 0xC5, 0xC6))
_ARRAYS = frozenset((0xDC, 0xDD, *range(0x90, 0xA0)))


def decode_from(data: bytes, start: int) -> tuple[Any, int]:
    """The value at ``data[start:]`` and where it ends. Raises :class:`WireError`."""
    try:
        return _unpack(data, start, 0)
    except IndexError:
        raise WireError("truncated value") from None
    except UnicodeDecodeError as exc:
        raise WireError(f"bad UTF-8: {exc}") from None


def decode(data: bytes) -> Any:
    """Unpack one value. Raises :class:`WireError` on anything but plain msgpack."""
    value, end = decode_from(data, 0)
    if end != len(data):
        raise WireError("trailing bytes after the value")
    return value
