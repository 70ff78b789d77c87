"""A tool that uses its context: the kanban board as a bar chart, returned as a PNG file.

It shows what a ``ToolContext`` offers: a nested call that the file's ``__uses__`` declares
(``kanban.list``, through the host's full gate, caller ``tool``), progress events, the
session's durable key-value store, a secret from the policy's ``[env]``, and a file
returned beside the value (``Result``). No dependency: the PNG is made with ``zlib`` and
``struct``.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from collections.abc import Callable
from typing import TypedDict

from capsule.context import Attachment, EnvNotAllowed, Result, ToolContext

__uses__ = {"board_chart": ["kanban.list"]}
"""The tools each tool of this file may call through its context, and no others."""

_OPEN = (230, 145, 56)
_CLOSED = (88, 166, 92)
_PAPER = (250, 250, 247)


class BoardChart(TypedDict):
    open: int
    closed: int
    charts: int
    """How many charts this session has drawn (kept in the session's key-value store)."""
    signed: bool
    """Whether the image carries an HMAC made with ``EXAMPLE_API_TOKEN`` (never shown)."""


def _png(width: int, height: int, pixel: Callable[[int, int], tuple[int, int, int]]) -> bytes:
    """An RGB PNG of ``width`` x ``height``; ``pixel(x, y)`` gives each colour."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = bytearray()
    for y in range(height):
        rows.append(0)  # filter: none
        for x in range(width):
            rows.extend(pixel(x, y))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(bytes(rows), 9))
        + chunk(b"IEND", b"")
    )


async def board_chart(ctx: ToolContext) -> Result[BoardChart]:
    """Draw the board as a chart: a bar of open tasks (orange) beside one of closed ones
    (green). The image comes back as a file beside the counts."""
    await ctx.progress("reading the board", 0.1)
    tasks = await ctx.call("kanban.list")
    counts = {"open": 0, "closed": 0}
    for task in tasks:
        counts[task["status"]] += 1
    await ctx.progress("drawing", 0.5)
    size, tallest = 48, max(1, *counts.values())

    def pixel(x: int, y: int) -> tuple[int, int, int]:
        bar, column = ("open", _OPEN) if x < size // 2 else ("closed", _CLOSED)
        inside = 4 <= x % (size // 2) < size // 2 - 4
        top = size - 4 - (size - 8) * counts[bar] // tallest
        return column if inside and top <= y < size - 4 else _PAPER

    image = _png(size, size, pixel)
    charts = await ctx.get_value("charts", 0) + 1
    await ctx.set_value("charts", charts)
    try:
        key = await ctx.env("EXAMPLE_API_TOKEN")  # a secret: the host never shows it
    except EnvNotAllowed:  # passed by the policy, but not set where the host runs
        key = ""
    files = [Attachment("board.png", "image/png", image, width=size, height=size)]
    if key:
        digest = hmac.new(key.encode(), image, hashlib.sha256).hexdigest()
        files.append(Attachment("board.png.sig", "text/plain", digest.encode()))
    await ctx.progress("done", 1.0)
    chart: BoardChart = {
        "open": counts["open"],
        "closed": counts["closed"],
        "charts": charts,
        "signed": bool(key),
    }
    return Result(chart, attachments=files)
