"""Audit: the host's durable state.

Owns the memory-mapped journal (where a decision becomes durable before its call is
dispatched) and the store behind it (SQLite in ``.agent/state.db``): the audit trail,
remembered grants and pending approvals.

Imports only the standard library and ``host.errors``; never ``capsules``, ``policy`` or
``declare``. The journal's writer runs ``_journal.py`` by path in a process of its own, so
that file imports nothing of the host at all. What other wings may use is listed below.
"""

from ._store import DONE as DONE
from ._store import AuditRecord as AuditRecord
from ._store import Grant as Grant
from ._store import Outcome as Outcome
from ._store import PendingApproval as PendingApproval
from ._store import SQLiteStore as SQLiteStore
from ._store import Store as Store
from ._store import StoreUnavailable as StoreUnavailable

__all__ = [
    "DONE",
    "AuditRecord",
    "Grant",
    "Outcome",
    "PendingApproval",
    "SQLiteStore",
    "Store",
    "StoreUnavailable",
]
