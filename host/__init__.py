"""toolhost: a sandboxed capsule tool host for LLM agents.

The public API is what this module lists in ``__all__``; everything in ``host._*`` is
private and may change.
"""

from . import errors as errors
from ._approval import Approval as Approval
from ._approval import ApprovalRequest as ApprovalRequest
from ._approval import Approver as Approver
from ._approval import DenyAll as DenyAll
from ._approval import TerminalApprover as TerminalApprover
from ._config import Limits as Limits
from ._config import PolicyConfig as PolicyConfig
from ._config import load_policy as load_policy
from ._discovery import Discovery as Discovery
from ._discovery import ToolSpec as ToolSpec
from ._discovery import discover as discover
from ._events import Event as Event
from ._host import Host as Host
from ._host import Session as Session
from ._policy import Decision as Decision
from ._policy import Policy as Policy
from ._policy import decide as decide
from ._sandbox import CodeCall as CodeCall
from ._sandbox import CodeError as CodeError
from ._sandbox import CodeResult as CodeResult
from ._scope import Scope as Scope
from ._store import DONE as DONE
from ._store import AuditRecord as AuditRecord
from ._store import Grant as Grant
from ._store import SQLiteStore as SQLiteStore
from ._store import Store as Store
from .errors import CallError as CallError
from .errors import CapsuleCrashed as CapsuleCrashed
from .errors import DeclarationError as DeclarationError
from .errors import HostError as HostError
from .errors import InvalidArguments as InvalidArguments
from .errors import LimitExceeded as LimitExceeded
from .errors import NotApproved as NotApproved
from .errors import NotSerializable as NotSerializable
from .errors import PolicyDenied as PolicyDenied
from .errors import PolicyFileError as PolicyFileError
from .errors import ProtocolError as ProtocolError
from .errors import ToolError as ToolError
from .errors import ToolTimeout as ToolTimeout
from .errors import ToolUnavailable as ToolUnavailable
from .errors import UnknownTool as UnknownTool

__all__ = (
    # the host
    "Host",
    "Session",
    "Event",
    "Limits",
    "PolicyConfig",
    "load_policy",
    "Discovery",
    "ToolSpec",
    "Scope",
    "discover",
    # agent code
    "CodeResult",
    "CodeError",
    "CodeCall",
    # policy, approvals, state
    "Policy",
    "Decision",
    "decide",
    "Approval",
    "ApprovalRequest",
    "Approver",
    "DenyAll",
    "TerminalApprover",
    "Store",
    "SQLiteStore",
    "DONE",
    "AuditRecord",
    "Grant",
    # errors
    "errors",
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
