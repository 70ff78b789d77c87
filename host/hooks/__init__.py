"""Hooks: trusted project code that observes and reshapes every tool call.

Owns the ``hook`` decorator (``from host.hooks import hook``), the objects hooks receive
(``HookContext``, ``ToolCallInfo``, ``ToolResult``), loading ``hooks/*.py`` into the host
process (never into a capsule), the progress argument of each tool (read with ``ast``),
and ``HookRunner``, which the mediator uses to run them in the Standard Agents order.
May import ``_display``, ``declare``, ``settings``, ``_events`` and ``errors``; only the
mediator, the orchestrator and the CLI import it.
"""

from ._hooks import (
    HOOK_KINDS,
    POLICY_HOOK_KINDS,
    Hook,
    HookContext,
    HookFn,
    HookKind,
    HookRunner,
    ToolCallInfo,
    ToolResult,
    app_hook,
    hook,
    load_hook_files,
)
from ._progress import progress_arguments

__all__ = [
    "HOOK_KINDS",
    "POLICY_HOOK_KINDS",
    "Hook",
    "HookContext",
    "HookFn",
    "HookKind",
    "HookRunner",
    "ToolCallInfo",
    "ToolResult",
    "app_hook",
    "hook",
    "load_hook_files",
    "progress_arguments",
]
