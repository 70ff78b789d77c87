"""Audit: the host's durable state.

Owns the memory-mapped journal (where a decision becomes durable before its call is
dispatched) and the store behind it (SQLite in ``.agent/state.db``, or PostgreSQL shared
by several hosts): the audit trail,
remembered grants and pending approvals, and each session's own state (the key-value
store of tool contexts, and the file area where the files tools return are kept).

Imports the standard library, anyio, ``host.errors`` and ``host.trust`` (and psycopg, only
in the PostgreSQL store's modules, loaded when a ``postgresql://`` store is opened) (the key that
signs grants and journal records); never ``capsules``, ``policy`` or ``declare``. The
journal's writer runs ``_journal.py`` by path in a process of its own, so that file
imports nothing of the host at all (it gets the key on a pipe). What other wings may use
is listed below.
"""

from ._journaled import JournaledStore as JournaledStore
from ._records import DONE as DONE
from ._records import AnswerResult as AnswerResult
from ._records import AnswerStatus as AnswerStatus
from ._records import AuditRecord as AuditRecord
from ._records import Grant as Grant
from ._records import Outcome as Outcome
from ._records import PendingAnswer as PendingAnswer
from ._records import PendingApproval as PendingApproval
from ._records import Store as Store
from ._records import StoredFile as StoredFile
from ._records import StoreFull as StoreFull
from ._records import StoreUnavailable as StoreUnavailable
from ._select import check_store as check_store
from ._select import migrate_store as migrate_store
from ._select import store_for as store_for
from ._sqlite import SQLiteStore as SQLiteStore

__all__ = [
    "DONE",
    "AnswerResult",
    "AnswerStatus",
    "AuditRecord",
    "Grant",
    "JournaledStore",
    "Outcome",
    "PendingAnswer",
    "PendingApproval",
    "SQLiteStore",
    "Store",
    "StoredFile",
    "StoreFull",
    "StoreUnavailable",
    "check_store",
    "migrate_store",
    "store_for",
]
