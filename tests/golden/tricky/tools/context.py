"""Tools that ask for the tool context (the parameter is hidden), and results with files
(declared as their value's type, with a comment that files may come along)."""

from __future__ import annotations

from typing import TypedDict

from capsule.context import Attachment, Result, ToolContext

__uses__ = {"whoami": [], "greeting_card": ["whoami", "tools.context.picture"]}


class Card(TypedDict):
    text: str


async def whoami(greeting: str, ctx: ToolContext) -> str:
    return f"{greeting}, {ctx.caller}"


async def greeting_card(name: str, *, ctx: ToolContext | None = None) -> Result[Card]:
    """A card, with its picture as a file."""
    assert ctx is not None
    text = await ctx.call("whoami", f"Dear {name}")
    return Result({"text": text}, attachments=[Attachment("card.png", "image/png", b"")])


def picture(side: int = 1):
    """A picture alone (its return type inferred)."""
    return Attachment("p.png", "image/png", b"\x89PNG", width=side, height=side)


def maybe_files(flag: bool) -> Result[list[int]] | None:
    return Result([1]) if flag else None
