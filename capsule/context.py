"""The tool context: what the host hands to a tool that asks for it.

A tool asks for it with a parameter annotated ``ToolContext``::

    from capsule.context import ToolContext

    async def close(task_id: str, ctx: ToolContext) -> None: ...

That parameter is *hidden*: the host recognises it by its annotation (``ToolContext``,
``ToolContext | None`` or ``Optional[ToolContext]``, imported from this module), and it
is absent from every declaration and schema the model sees and from argument binding, so
no caller can pass or forge it. The host fills it in.

Standard library only: this module is imported by tool files inside a capsule (CPython or
CPython-WASI) and read by the host's type analysis.
"""

from __future__ import annotations

__all__ = ["ToolContext"]


class ToolContext:
    """Who is calling a tool, and as part of which call.

    Attributes:
        tool: the canonical name of the tool being called (``kanban.close``).
        call_id: the host's id for this call, unique within a host.
        session: the id of the session the call belongs to.
        caller: ``agent``, ``script``, ``app`` or ``tool``.
    """

    __slots__ = ("call_id", "caller", "session", "tool")

    def __init__(self, *, tool: str, call_id: int, session: str, caller: str) -> None:
        self.tool = tool
        self.call_id = call_id
        self.session = session
        self.caller = caller

    def __repr__(self) -> str:
        return (
            f"ToolContext(tool={self.tool!r}, call_id={self.call_id}, "
            f"session={self.session!r}, caller={self.caller!r})"
        )
