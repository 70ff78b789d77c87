"""The tools the official MCP conformance suite calls (``conformance server``), written
as any user writes tools: plain functions, files as attachments, ``ctx`` for progress and
logging. tests/test_conformance.py serves this project over HTTP and runs the suite."""

import asyncio
import struct
import zlib
from typing import TypedDict

from capsule.context import Attachment, Result, ToolContext


def _png() -> bytes:
    """A 1x1 red PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def _wav() -> bytes:
    """A WAV file of 8 silent 8-bit samples at 8 kHz."""
    samples = b"\x80" * 8
    fmt = struct.pack("<HHIIHH", 1, 1, 8000, 8000, 1, 8)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(samples)) + samples
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_simple_text() -> str:
    """Returns a simple text response."""
    return "This is a simple text response for testing."


def test_image_content() -> Attachment:
    """Returns a 1x1 red PNG."""
    return Attachment("pixel.png", "image/png", _png(), width=1, height=1)


def test_audio_content() -> Attachment:
    """Returns a short WAV file."""
    return Attachment("silence.wav", "audio/wav", _wav())


def test_embedded_resource() -> Attachment:
    """Returns a text file as an embedded resource."""
    return Attachment("embedded.txt", "text/plain", b"This is an embedded resource content.")


def test_multiple_content_types() -> Result[str]:
    """Returns text, an image and a resource."""
    data = b'{"test":"data","value":123}'
    return Result(
        "Multiple content types test:",
        attachments=[
            Attachment("pixel.png", "image/png", _png(), width=1, height=1),
            Attachment("mixed.json", "application/json", data),
        ],
    )


def test_error_handling() -> str:
    """Always fails."""
    raise RuntimeError("This tool intentionally returns an error for testing")


async def test_tool_with_progress(ctx: ToolContext) -> str:
    """Reports progress three times, 50 ms apart."""
    await ctx.progress("started", 0.0)
    await asyncio.sleep(0.05)
    await ctx.progress("halfway", 0.5)
    await asyncio.sleep(0.05)
    await ctx.progress("done", 1.0)
    return "Progress test completed"


async def test_tool_with_logging(ctx: ToolContext) -> str:
    """Logs three messages at info level, 50 ms apart."""
    await ctx.log("Tool execution started")
    await asyncio.sleep(0.05)
    await ctx.log("Tool processing data")
    await asyncio.sleep(0.05)
    await ctx.log("Tool execution completed")
    return "Logging test completed"


class Address(TypedDict, total=False):
    """A postal address."""

    street: str
    city: str


def json_schema_2020_12_tool(name: str = "", address: Address | None = None) -> str:
    """Tool with JSON Schema 2020-12 features"""
    return f"{name} at {address}"
