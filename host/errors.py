"""The one exception tree of toolhost.

Every error a caller of :class:`host.Host` can see is a :class:`HostError`. Lower layers
(anyio, msgpack, wasmtime, pyright, the operating system) are translated at the boundary
where they occur, always with ``raise ... from exc``; none of their exception types reaches
a caller. The same names exist inside agent code, so generated code can write
``except PolicyDenied``.

::

    HostError
    ├── CallError                   a call did not produce a value
    │   ├── ToolError               the tool raised (type name, message, traceback text)
    │   ├── NotSerializable         the tool returned something that is not plain data
    │   ├── InvalidArguments        the arguments do not fit the tool's signature
    │   ├── UnknownTool             no tool has that name
    │   ├── PolicyDenied            a policy rule denied the call
    │   ├── NotApproved             a person denied it, or nobody answered in time
    │   ├── ToolTimeout             the call outran its deadline; the capsule was restarted
    │   ├── CapsuleCrashed          the capsule died while the call was in flight
    │   ├── ToolUnavailable         the tool cannot be called now (crash loop, load failure)
    │   └── LimitExceeded           a budget ran out (time, memory, calls, output)
    ├── DeclarationError            the tool files cannot be declared (syntax, names, types)
    ├── PolicyFileError             a policy file is malformed
    └── ProtocolError               a capsule broke the wire rules; it was killed

Every error has a stable snake_case :attr:`HostError.kind` (the ``kind`` of the CLI's
``--json`` output) and :meth:`HostError.to_data`, a plain-data description built only
from the error's own fields.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

__all__ = (
    "HostError",
    "CallError",
    "ToolError",
    "NotSerializable",
    "InvalidArguments",
    "UnknownTool",
    "PolicyDenied",
    "NotApproved",
    "ToolTimeout",
    "CapsuleCrashed",
    "ToolUnavailable",
    "LimitExceeded",
    "DeclarationError",
    "PolicyFileError",
    "ProtocolError",
)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class HostError(Exception):
    """The root of every error toolhost raises."""

    kind: ClassVar[str] = "host_error"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = _snake(cls.__name__)

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_data(self) -> dict[str, Any]:
        """A plain-data description: ``kind``, ``message`` and the error's own fields."""
        data: dict[str, Any] = {"kind": self.kind, "message": self.message}
        data.update(self._fields())
        return data

    def _fields(self) -> dict[str, Any]:
        return {}


class CallError(HostError):
    """A call did not produce a value. ``tool`` is the canonical tool name, if known."""

    def __init__(self, message: str, *, tool: str | None = None) -> None:
        super().__init__(message)
        self.tool = tool

    def _fields(self) -> dict[str, Any]:
        return {"tool": self.tool} if self.tool is not None else {}


class ToolError(CallError):
    """The tool raised. The exception crossed as data: its type name, message and traceback."""

    def __init__(
        self,
        tool: str,
        *,
        type_name: str,
        error_message: str,
        traceback: str = "",
    ) -> None:
        super().__init__(f"{tool} raised {type_name}: {error_message}", tool=tool)
        self.type_name = type_name
        self.error_message = error_message
        self.traceback = traceback

    def _fields(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "type": self.type_name,
            "error_message": self.error_message,
            "traceback": self.traceback,
        }


class NotSerializable(CallError):
    """The tool returned a value that is not plain data; ``path`` says where it sat."""

    def __init__(self, tool: str, *, type_name: str, path: str) -> None:
        super().__init__(
            f"{tool} returned a {type_name} at {path}, which is not plain data "
            "(return None, bool, int, float, str, bytes, list, dict with str keys, "
            "or a dataclass, pydantic model, NamedTuple, Enum, date/time, Decimal, UUID, Path)",
            tool=tool,
        )
        self.type_name = type_name
        self.path = path

    def _fields(self) -> dict[str, Any]:
        return {"tool": self.tool, "type": self.type_name, "path": self.path}


class InvalidArguments(CallError):
    """The arguments do not fit the tool's signature; ``parameter`` names the culprit."""

    def __init__(self, tool: str, message: str, *, parameter: str | None = None) -> None:
        super().__init__(f"invalid arguments for {tool}: {message}", tool=tool)
        self.parameter = parameter
        self.problem = message

    def _fields(self) -> dict[str, Any]:
        return {"tool": self.tool, "parameter": self.parameter, "problem": self.problem}


class UnknownTool(CallError):
    """No tool has this exact name. Names are never matched fuzzily."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no tool is named {name!r}", tool=None)
        self.name = name

    def _fields(self) -> dict[str, Any]:
        return {"name": self.name}


class PolicyDenied(CallError):
    """A policy rule denied the call; it never reached a capsule."""

    def __init__(self, tool: str, *, rule: str, reason: str | None = None) -> None:
        text = f"policy denied {tool} (rule {rule})"
        if reason:
            text += f": {reason}"
        super().__init__(text, tool=tool)
        self.rule = rule
        self.reason = reason

    def _fields(self) -> dict[str, Any]:
        return {"tool": self.tool, "rule": self.rule, "reason": self.reason}


class NotApproved(CallError):
    """A person denied the call, or nobody answered in time. The call did not run.

    ``reason`` is one of ``denied`` (a person, or a remembered decision, said no),
    ``timeout`` (nobody answered by the escalation timeout), ``approver_failed`` (the
    approver raised or answered with something else than an approval), ``mismatch``
    (the answer was given for another request) and ``channel_not_allowed`` (an allow came
    from a channel the rule's ``approvers`` exclude); ``detail`` says more. ``comment`` is
    what the person who denied it wrote, already escaped and quoted (``"..."``): data
    from a person, never the host's own words.
    """

    def __init__(
        self,
        tool: str,
        *,
        reason: str,
        rule: str | None = None,
        detail: str | None = None,
        comment: str | None = None,
    ) -> None:
        why = f"{reason}: {detail}" if detail else reason
        message = f"{tool} was not approved ({why}); the call did not run"
        if comment:
            message += f"; the approver's comment, quoted: {comment}"
        super().__init__(message, tool=tool)
        self.reason = reason
        self.rule = rule
        self.detail = detail
        self.comment = comment

    def _fields(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "reason": self.reason,
            "rule": self.rule,
            "detail": self.detail,
            "comment": self.comment,
        }


class ToolTimeout(CallError):
    """The call outran its deadline. The capsule was killed and restarted."""

    def __init__(self, tool: str, *, timeout: float) -> None:
        super().__init__(
            f"{tool} did not finish within {timeout:g} s; its capsule was restarted "
            "and module state was lost (the call may have had side effects)",
            tool=tool,
        )
        self.timeout = timeout
        self.may_have_executed = True

    def _fields(self) -> dict[str, Any]:
        return {"tool": self.tool, "timeout": self.timeout, "may_have_executed": True}


class CapsuleCrashed(CallError):
    """The capsule died while the call was in flight.

    ``may_have_executed`` is true when the call had been sent to the capsule: its side
    effects may or may not have happened.
    """

    def __init__(self, tool: str, *, reason: str, may_have_executed: bool) -> None:
        run = "may have run" if may_have_executed else "did not run"
        super().__init__(
            f"the capsule running {tool} crashed ({reason}); the call {run}", tool=tool
        )
        self.reason = reason
        self.may_have_executed = may_have_executed

    def _fields(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "reason": self.reason,
            "may_have_executed": self.may_have_executed,
        }


class ToolUnavailable(CallError):
    """The tool cannot be called now: its file failed to load, or its capsule keeps crashing."""

    def __init__(self, tool: str, *, reason: str) -> None:
        super().__init__(f"{tool} is unavailable: {reason}", tool=tool)
        self.reason = reason

    def _fields(self) -> dict[str, Any]:
        return {"tool": self.tool, "reason": self.reason}


class LimitExceeded(CallError):
    """A budget ran out; ``limit`` names which (``code_timeout``, ``code_memory``, ...)."""

    def __init__(self, limit: str, message: str, *, tool: str | None = None) -> None:
        super().__init__(f"limit {limit} exceeded: {message}", tool=tool)
        self.limit = limit

    def _fields(self) -> dict[str, Any]:
        data: dict[str, Any] = {"limit": self.limit}
        if self.tool is not None:
            data["tool"] = self.tool
        return data


class DeclarationError(HostError):
    """The tool files cannot be declared: a syntax error, a name clash, an unknown type.

    ``file`` and ``line`` point at the first place to look, when there is one.
    """

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None) -> None:
        where = f"{file}:{line}: " if file and line else (f"{file}: " if file else "")
        super().__init__(where + message)
        self.file = file
        self.line = line

    def _fields(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line}


class PolicyFileError(HostError):
    """A policy file is malformed; the host refuses to start on it."""

    def __init__(
        self, message: str, *, file: str, line: int | None = None, field: str | None = None
    ) -> None:
        where = f"{file}:{line}" if line else file
        text = f"{where}: {message}" if field is None else f"{where}: {field}: {message}"
        super().__init__(text)
        self.file = file
        self.line = line
        self.field = field

    def _fields(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "field": self.field}


class ProtocolError(HostError):
    """A capsule broke the wire rules (bad frame, bad envelope); it was killed."""
