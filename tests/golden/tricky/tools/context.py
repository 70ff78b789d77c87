"""A tool that asks for the tool context: the parameter is hidden."""

from __future__ import annotations

from capsule.context import ToolContext


async def whoami(greeting: str, ctx: ToolContext) -> str:
    return f"{greeting}, {ctx.caller}"
