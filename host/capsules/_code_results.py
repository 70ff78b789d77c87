"""What ``run_code`` returns: :class:`CodeResult`, its :class:`CodeCall` records and its
:class:`CodeError`, and the helpers that build them from what the host saw (a limit hit,
the mediator's decision) and from what the guest reported (the fields of its ``done``
frame, checked and capped).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from capsule import protocol as p
from capsule.context import Attachment
from host.errors import HostError, InvalidArguments, NotApproved, PolicyDenied, UnknownTool

__all__ = [
    "CodeCall",
    "CodeError",
    "CodeResult",
    "SandboxKind",
    "LOST",
    "MAX_TEXT",
    "limit_error",
    "decision_of",
    "guest_error",
    "frame_str",
]

SandboxKind = Literal["wasm", "subprocess"]

MAX_TEXT = 64 * 1024
"""Characters kept of a text field the guest sends (unless the field has its own cap)."""
LOST = "the sandbox was restarted: variables and imports of earlier runs were lost"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class CodeCall(_Model):
    """One tool call made by agent code."""

    tool: str
    """The tool name as the code wrote it (canonical when it resolves)."""
    decision: Literal["allow", "deny", "escalate"] | None
    """What policy made of it; None when it never got that far (unknown tool, bad args)."""
    ok: bool
    error: str | None = None
    """The error's kind (``policy_denied``, ``tool_error``, ...) when it failed."""


class CodeError(_Model):
    """Why a run failed. ``traceback`` shows the agent's own code only."""

    kind: str
    """``exception`` for an ordinary Python exception, else the host error's kind."""
    type: str
    message: str
    traceback: str = ""
    limit: str | None = None
    """For ``limit_exceeded``: which limit (``code_timeout``, ``code_memory``, ...)."""


class CodeResult(_Model):
    """What one ``run_code`` did."""

    ok: bool
    value: Any = None
    """The value of the last expression, as plain data (None if there was none)."""
    stdout: str = ""
    """Captured ``print`` output (and stderr), at most ``code_max_output`` characters."""
    error: CodeError | None = None
    calls: list[CodeCall] = Field(default_factory=list[CodeCall])
    warnings: list[str] = Field(default_factory=list[str])
    """Things the code should know: calls never awaited, a lost sandbox, a non-plain value."""
    sandbox: SandboxKind = "wasm"
    attachments: list[Attachment] = Field(default_factory=list[Attachment])
    """The files the run's tool calls returned, in the order they came (each kept in the
    session's file area: ``path``). Agent code saw only a tool's value, or for a file
    alone its metadata (``Attachment.info()``)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)


def limit_error(limit: str, message: str) -> CodeError:
    """A limit the host enforces was hit: the sandbox is replaced, and the message says so."""
    return CodeError(
        kind="limit_exceeded",
        type="LimitExceeded",
        message=f"limit {limit} exceeded: {message}; {LOST}",
        limit=limit,
    )


def decision_of(
    exc: HostError | None, decided: list[str]
) -> Literal["allow", "deny", "escalate"] | None:
    """The mediator's decision (from its event), else what the outcome implies."""
    for decision in decided:
        if decision == "allow" or decision == "deny" or decision == "escalate":
            return decision
    if exc is None:
        return "allow"
    if isinstance(exc, PolicyDenied):
        return "deny"
    if isinstance(exc, NotApproved):
        return "escalate"
    if isinstance(exc, (UnknownTool, InvalidArguments)):
        return None
    return "allow"


def frame_str(msg: Mapping[str, Any], key: str, cap: int = MAX_TEXT) -> str:
    """``msg[key]``, a string (or absent or None: empty), at most ``cap`` characters.

    Raises:
        p.BadFrame: it is not a string.
    """
    value = msg.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise p.BadFrame(f"{key!r} must be a string")
    return value[:cap]


def guest_error(raw: Any) -> CodeError:
    """The error a ``done`` frame reports, as the result shows it.

    Raises:
        p.BadFrame: it is not a map, or a field that must be a string is not.
    """
    e = p.as_map(raw)
    limit = e.get("limit")
    return CodeError(
        kind=frame_str(e, "kind", 64) or "exception",
        type=frame_str(e, "type", 200),
        message=frame_str(e, "message"),
        traceback=frame_str(e, "traceback"),
        limit=limit if isinstance(limit, str) else None,
    )
