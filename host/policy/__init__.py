"""Policy: deciding, quotas and escalation.

Owns the policy files (parsed into pydantic models, watched for reloads), :func:`decide`
(pure: a call's tool, arguments and caller -> allow, deny or escalate, with the rule),
call budgets (quotas), and escalation to a person (approval requests, approvers, grants).

May import ``settings``, ``declare``, ``audit`` (grants and pending approvals live in the
store) and the root helpers ``_binding``, ``_display``, ``_events``. Never imports
``capsules`` or ``cli``: deciding never starts or touches a capsule. What other wings may
use is listed below.
"""

from ._approval import Approval as Approval
from ._approval import ApprovalRequest as ApprovalRequest
from ._approval import Approver as Approver
from ._approval import Escalation as Escalation
from ._approval import Escalations as Escalations
from ._approval import Ticket as Ticket
from ._approval import channel_of as channel_of
from ._approvers import DenyAll as DenyAll
from ._approvers import TerminalApprover as TerminalApprover
from ._approvers import default_approver as default_approver
from ._decide import Decision as Decision
from ._decide import Policy as Policy
from ._decide import PolicySource as PolicySource
from ._decide import decide as decide
from ._decide import policy_arguments as policy_arguments
from ._files import Channel as Channel
from ._files import PolicyConfig as PolicyConfig
from ._files import load_policy as load_policy
from ._inbox_approver import InboxApprover as InboxApprover
from ._lint import PolicyWarning as PolicyWarning
from ._lint import lint_policy as lint_policy
from ._lint import missing_policy as missing_policy
from ._quotas import Quotas as Quotas
from ._quotas import Reservation as Reservation

__all__ = [
    "Approval",
    "ApprovalRequest",
    "Approver",
    "DenyAll",
    "InboxApprover",
    "Escalation",
    "Escalations",
    "TerminalApprover",
    "Ticket",
    "default_approver",
    "channel_of",
    "Channel",
    "Decision",
    "Policy",
    "PolicySource",
    "decide",
    "policy_arguments",
    "PolicyConfig",
    "load_policy",
    "PolicyWarning",
    "lint_policy",
    "missing_policy",
    "Quotas",
    "Reservation",
]
