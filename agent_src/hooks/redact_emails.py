"""The example's hooks: trusted project code, loaded into the host (never into a capsule).

``toolhost hooks`` lists them. This one keeps email addresses out of what the kanban
tools return: the caller and the audit see ``<email>`` in their place.
"""

from __future__ import annotations

import re
from typing import Any

from host.hooks import HookContext, ToolCallInfo, ToolResult, hook

_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return _EMAIL.sub("<email>", value)
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, list):
        return [_scrub(v) for v in value]  # pyright: ignore[reportUnknownVariableType]
    return value


@hook("after_tool_call_success", id="redact-emails")
def redact_emails(ctx: HookContext, call: ToolCallInfo, result: ToolResult) -> Any:
    """Kanban results with every email address replaced by ``<email>``."""
    if not call.tool.startswith("kanban."):
        return None  # None keeps the result as it is
    return _scrub(result.value)
