"""toolhost: a sandboxed capsule tool host for LLM agents.

The public API is what this module lists in ``__all__`` (and ``host.errors``); every
other module, the wings (``host.declare``, ``host.policy``, ``host.audit``,
``host.capsules``, ``host.settings``, ``host.serve``, ``host.cli``) and ``host._*``
included, is private and may change. ARCHITECTURE.md maps them.
"""

from importlib.metadata import PackageNotFoundError as _NotInstalled
from importlib.metadata import version as _version

from . import errors as errors
from ._events import Event as Event
from ._host import Host as Host
from ._host import Session as Session
from ._stats import CapsuleCounts as CapsuleCounts
from ._stats import HostStats as HostStats
from ._stats import Memory as Memory
from .audit import DONE as DONE
from .audit import AuditRecord as AuditRecord
from .audit import Grant as Grant
from .audit import SQLiteStore as SQLiteStore
from .audit import Store as Store
from .capsules import CodeCall as CodeCall
from .capsules import CodeCheck as CodeCheck
from .capsules import CodeDiagnostic as CodeDiagnostic
from .capsules import CodeError as CodeError
from .capsules import CodeResult as CodeResult
from .declare import Discovery as Discovery
from .declare import Scope as Scope
from .declare import ToolSpec as ToolSpec
from .declare import discover as discover
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
from .policy import Approval as Approval
from .policy import ApprovalRequest as ApprovalRequest
from .policy import Approver as Approver
from .policy import Decision as Decision
from .policy import DenyAll as DenyAll
from .policy import InboxApprover as InboxApprover
from .policy import Policy as Policy
from .policy import PolicyConfig as PolicyConfig
from .policy import PolicyWarning as PolicyWarning
from .policy import TerminalApprover as TerminalApprover
from .policy import decide as decide
from .policy import lint_policy as lint_policy
from .policy import load_policy as load_policy
from .settings import Limits as Limits

try:
    __version__: str = _version("toolhost")
    """The installed distribution's version: the one source is ``pyproject.toml``."""
except _NotInstalled:  # run from a tree that was never installed
    __version__ = "0+unknown"

__all__ = (
    # the host
    "Host",
    "Session",
    "HostStats",
    "CapsuleCounts",
    "Memory",
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
    "CodeCheck",
    "CodeDiagnostic",
    # policy, approvals, state
    "Policy",
    "Decision",
    "decide",
    "lint_policy",
    "PolicyWarning",
    "Approval",
    "ApprovalRequest",
    "Approver",
    "DenyAll",
    "TerminalApprover",
    "InboxApprover",
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
