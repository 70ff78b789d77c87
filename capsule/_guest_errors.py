"""The host's error classes as the code sandbox's guest sees them, rebuilt from data.

They exist in the agent's globals by name (``except PolicyDenied``), and an error from the
host crosses the pipe as strings and numbers only: :func:`rebuild` makes a fresh one from
them, picking the class by its ``kind``. Nothing of the host's own classes is here. Part of
the guest (``capsule._guest``): standard library only, imported at its start.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "ERRORS",
    "rebuild",
    "as_dict",
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
]


def _snake(name: str) -> str:
    out = [name[0].lower()]
    for ch in name[1:]:
        out.append("_" + ch.lower() if ch.isupper() else ch)
    return "".join(out)


class HostError(Exception):
    """The root of the host's errors (rebuilt here from data)."""

    kind = "host_error"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = _snake(cls.__name__)

    def __init__(self, message: str = "", **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        for key, value in fields.items():
            setattr(self, key, value)


class CallError(HostError):
    """A call did not produce a value."""


class ToolError(CallError):
    """The tool raised (``type_name``, ``error_message``)."""


class NotSerializable(CallError):
    """The tool returned something that is not plain data."""


class InvalidArguments(CallError):
    """The arguments do not fit the tool's signature, or are not plain data."""


class UnknownTool(CallError):
    """No tool has that name."""


class PolicyDenied(CallError):
    """A policy rule denied the call (``rule``, ``reason``)."""


class NotApproved(CallError):
    """A person denied the call, or nobody answered in time."""


class ToolTimeout(CallError):
    """The call outran its deadline."""


class CapsuleCrashed(CallError):
    """The tool's capsule died while the call was in flight."""


class ToolUnavailable(CallError):
    """The tool cannot be called now."""


class LimitExceeded(CallError):
    """A budget ran out (``limit`` names which)."""


class DeclarationError(HostError):
    """The tool files cannot be declared."""


class PolicyFileError(HostError):
    """A policy file is malformed."""


class ProtocolError(HostError):
    """A capsule broke the wire rules."""


ERRORS: dict[str, type[HostError]] = {
    cls.__name__: cls
    for cls in (
        HostError,
        CallError,
        ToolError,
        NotSerializable,
        InvalidArguments,
        UnknownTool,
        PolicyDenied,
        NotApproved,
        ToolTimeout,
        CapsuleCrashed,
        ToolUnavailable,
        LimitExceeded,
        DeclarationError,
        PolicyFileError,
        ProtocolError,
    )
}
_BY_KIND = {cls.kind: cls for cls in ERRORS.values()}
for _cls in ERRORS.values():
    _cls.__module__ = "builtins"  # tracebacks say ``ToolError: ...``, as for built-in errors


def rebuild(data: dict[str, Any]) -> HostError:
    """A fresh sandbox-side error from the host's plain data (strings and numbers only)."""
    cls = _BY_KIND.get(str(data.get("kind")), HostError)
    fields: dict[str, Any] = {}
    for key, value in data.items():
        if key in ("kind", "message") or not key.isidentifier():
            continue
        if isinstance(value, (str, int, float, bool)) or value is None:
            fields["type_name" if key == "type" else key] = value
    return cls(str(data.get("message", "")), **fields)


def as_dict(value: object) -> dict[str, Any]:
    """``value`` if it is a dict, else an empty one (what :func:`rebuild` reads)."""
    if type(value) is dict:
        return value  # pyright: ignore[reportUnknownVariableType]
    return {}
