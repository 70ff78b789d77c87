"""What ``run_code`` returns: :class:`CodeResult`, its :class:`CodeCall` records and its
:class:`CodeError`, and the helpers that build them from what the host saw (a limit hit,
the mediator's decision) and from what the guest reported (:func:`check_done`: the fields
of its ``done`` frame, each checked and capped here, whatever the guest claims).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from capsule import protocol as p
from capsule.context import Attachment
from host.errors import HostError, InvalidArguments, NotApproved, PolicyDenied, UnknownTool

__all__ = [
    "CodeCall",
    "CodeCheck",
    "CodeDiagnostic",
    "CodeError",
    "CodeResult",
    "SandboxKind",
    "LOST",
    "MAX_TEXT",
    "MAX_WARNINGS",
    "Done",
    "check_done",
    "limit_error",
    "decision_of",
    "guest_error",
    "frame_str",
]

SandboxKind = Literal["wasm", "subprocess"]

MAX_TEXT = 64 * 1024
"""Characters kept of a text field the guest sends (unless the field has its own cap)."""
LOST = "the sandbox was restarted: variables and imports of earlier runs were lost"
MAX_WARNINGS = 60
"""Warnings kept of one ``done`` frame (the guest sends at most 51)."""
_MAX_WARNING = 1000
"""Characters kept of one warning."""


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


class CodeDiagnostic(_Model):
    """One thing the checker found in the agent's code before it ran."""

    line: int
    """1-based, in the run's source."""
    column: int
    """1-based."""
    kind: Literal["not_awaited", "unknown_name", "unknown_attribute", "call", "type", "syntax"]
    """``not_awaited``: a tool call that is never awaited; ``unknown_name`` and
    ``unknown_attribute``: no such tool (or variable, or attribute); ``call``: wrong
    argument count or names; ``type``: a value of the wrong type (an argument, or a
    result used as something it is not); ``syntax``: the code does not parse."""
    message: str
    rule: str | None = None
    """pyright's rule (``reportCallIssue``, ...), when it gives one."""

    def __str__(self) -> str:
        return f"line {self.line}, column {self.column}: {self.message}"


class CodeCheck(_Model):
    """What checking the code before it ran found (``CodeResult.check``)."""

    mode: Literal["warn", "refuse"]
    status: Literal["clean", "errors", "unavailable"]
    """``unavailable``: the checker failed or took too long (``note`` says which); the
    code ran unchecked under ``warn`` and did not run under ``refuse``."""
    diagnostics: list[CodeDiagnostic] = Field(default_factory=list[CodeDiagnostic])
    note: str | None = None
    level: Literal["quick", "full"] = "full"
    """``quick``: only the quick checks ran (a run under ``warn`` that succeeded: the full
    type check is paid for where it helps, when a run fails or under ``refuse``);
    ``full``: pyright checked it too."""


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

    check: CodeCheck | None = None
    """What the check before the run found; None when the check is ``off``."""

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
    exc: HostError | None, decided: list[str], *, cancelled: bool = False
) -> Literal["allow", "deny", "escalate"] | None:
    """The mediator's decision (from its event), else what the outcome implies; for a
    call cancelled before an outcome (``cancelled``), None unless it was decided."""
    for decision in decided:
        if decision == "allow" or decision == "deny" or decision == "escalate":
            return decision
    if cancelled:
        return None
    if exc is None:
        return "allow"
    if isinstance(exc, PolicyDenied):
        return "deny"
    if isinstance(exc, NotApproved):
        return "escalate"
    if isinstance(exc, (UnknownTool, InvalidArguments)):
        return None
    return "allow"


def frame_str(msg: Mapping[str, Any], key: str, cap: int | None = MAX_TEXT) -> str:
    """``msg[key]``, a string (or absent or None: empty), at most ``cap`` characters
    (``None``: all of it).

    Raises:
        p.BadFrame: it is not a string.
    """
    value = msg.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise p.BadFrame(f"{key!r} must be a string")
    return value if cap is None else value[:cap]


def guest_error(raw: Any) -> CodeError:
    """The error a ``done`` frame reports, as the result shows it.

    Raises:
        p.BadFrame: it is not a map, or a field that must be a string is not.
    """
    e = p.as_map(raw)
    limit = e.get("limit")
    if limit is not None and type(limit) is not str:
        raise p.BadFrame("'limit' must be a string")
    return CodeError(
        kind=frame_str(e, "kind", 64) or "exception",
        type=frame_str(e, "type", 200),
        message=frame_str(e, "message"),
        traceback=frame_str(e, "traceback"),
        limit=limit[:64] if limit else None,
    )


@dataclass(frozen=True, slots=True)
class Done:
    """A run's end as the guest reported it, checked and within the host's limits."""

    ok: bool
    value: Any
    stdout: str
    error: CodeError | None
    warnings: list[str]


def _too_big(value: Any, cap: int) -> bool:
    """Whether the run's value is over ``code_max_output``, measured as the guest does:
    characters of a string, bytes of anything else encoded."""
    if isinstance(value, str):
        return len(value) > cap
    if isinstance(value, bytes):
        return len(value) > cap
    if isinstance(value, (list, dict)):
        return len(p.encode(value)) > cap
    return False  # a scalar


def check_done(msg: Mapping[str, Any], run_id: int, max_output: int) -> Done:
    """The fields of a ``done`` frame, checked: the guest is not trusted to have kept
    them in shape or within the limits, so each limit is enforced again here.

    Over a limit: captured output is cut to ``max_output`` characters and the run fails
    with ``code_max_output`` (as when the guest stops the output itself); a value over
    ``max_output`` is dropped with a warning (as the guest drops it); warnings are cut to
    :data:`MAX_WARNINGS` of 1,000 characters.

    Raises:
        p.BadFrame: a field has the wrong type, the value is not plain data, or the
            frame ends another run.
    """
    if msg.get("id") != run_id or type(msg.get("id")) is not int:
        raise p.BadFrame("a done frame for another run")
    ok = msg.get("ok")
    if type(ok) is not bool:
        raise p.BadFrame("'ok' must be a bool")
    value = msg.get("value")
    p.check_plain(value)
    stdout = frame_str(msg, "stdout", None)
    raw_error = msg.get("error")
    error = None if raw_error is None else guest_error(raw_error)
    raw_warnings: Any = msg.get("warnings")
    if raw_warnings is None:
        raw_warnings = []
    if not isinstance(raw_warnings, list):
        raise p.BadFrame("'warnings' must be a list")
    items: list[Any] = raw_warnings  # pyright: ignore[reportUnknownVariableType]
    if any(type(item) is not str for item in items):
        raise p.BadFrame("'warnings' must be a list of strings")
    warnings: list[str] = [item[:_MAX_WARNING] for item in items[:MAX_WARNINGS]]
    if len(items) > MAX_WARNINGS:
        warnings.append(f"{len(items) - MAX_WARNINGS} more warnings were left out")
    if len(stdout) > max_output:
        stdout = stdout[:max_output]
        if error is None or error.limit != "code_max_output":
            error = CodeError(
                kind="limit_exceeded",
                type="LimitExceeded",
                message=f"the run printed more than {max_output} characters",
                limit="code_max_output",
            )
    ok = ok and error is None
    if not ok:
        value = None
    elif _too_big(value, max_output):
        value = None
        warnings.append(f"the value is larger than {max_output} bytes; it is not returned")
    return Done(ok=ok, value=value, stdout=stdout, error=error, warnings=warnings)
