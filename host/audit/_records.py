"""The store's interface and the records it speaks, the same for every backend.

:class:`Store` is the small interface the mediator writes through; :class:`SQLiteStore`
(``_sqlite.py``) implements it on one SQLite file, :class:`PgStore` (``_pg.py``) on a
PostgreSQL database several hosts share; both speak the same records.

The audit contract (ARCHITECTURE.md, "The path of one call"):

* a call's decision is written, durably, before the call is dispatched
  (:meth:`Store.record` with ``durable=True``), and its outcome after
  (:meth:`Store.finish`); a call refused before dispatch gets one terminal record;
* a call that waits for an approval is recorded ``waiting`` first (:meth:`Store.record`),
  and that record is replaced by its decision once there is one;
* a record left ``started`` by a host that died is closed as ``unknown`` by the next
  host that opens the store (:meth:`Store.start`), one left ``waiting`` as ``denied``
  (``host_stopped``): every call gets exactly one terminal record, whatever dies. Each
  host holds a lock under ``.agent/hosts/`` while it runs and records its process's
  identity, so a live host's open records are never closed (``_hostlock.py``);
* any failure to write raises :class:`StoreUnavailable`; the mediator then refuses the
  call (fail closed). Nothing here ever sees raw argument values: records carry a hash,
  a size and a redacted, bounded summary made by the caller.

Nothing here knows a database or the journal: a backend's module imports this one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Generator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

__all__ = [
    "DONE",
    "AnswerResult",
    "AnswerStatus",
    "AuditRecord",
    "Grant",
    "PendingAnswer",
    "PendingApproval",
    "Store",
    "StoreUnavailable",
    "StoreFull",
    "StoredFile",
    "Outcome",
]

Outcome = Literal["waiting", "started", "ok", "denied", "failed", "unknown"]
"""``waiting`` while an escalated call waits for its approval, ``started`` once it is
decided and until it ends; then exactly one terminal outcome."""


class _Done:
    """An awaitable that is already done: what a write that finished at once returns."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # a generator that ends at once

    def __repr__(self) -> str:
        return "DONE"


DONE: Any = _Done()
"""Returned by :meth:`Store.record`/:meth:`Store.finish` when the write is already as
durable as asked; the mediator then has nothing to wait for."""


class StoreUnavailable(Exception):
    """The state database cannot be read or written; the message says why."""


class StoreFull(Exception):
    """A session's key-value store would grow over its limit; the message says which."""


@dataclass(frozen=True, slots=True)
class StoredFile:
    """A file a tool returned, as the store keeps it (in the session's file area)."""

    name: str
    """The name it is kept under (made safe, unique within its call)."""
    mime_type: str
    size: int
    sha256: str
    width: int | None
    height: int | None
    path: str
    """Where it is: ``.agent/files/SESSION/CALL/NAME`` for the SQLite store."""

    def to_data(self) -> dict[str, Any]:
        return asdict(self)


class AuditRecord(NamedTuple):
    """One call in the audit trail. Argument values never appear: only hash and summary.

    Immutable (a named tuple: one is made for every call, so it must be cheap to make);
    ``record._replace(field=...)`` gives a changed copy. The fields before ``seq`` are the
    ``audit`` table's columns in order.
    """

    call_id: str
    host_id: str
    started: float
    """Unix time the call was received."""
    session: str
    caller: str
    tool: str
    """The canonical tool name, or the requested name (escaped, bounded) if unknown."""
    outcome: Outcome
    policy_version: str | None = None
    decision: str | None = None
    """``allow``, ``deny`` or ``escalate``; ``None`` when refused before policy."""
    rule: str | None = None
    approval: str | None = None
    """How an escalation was answered (``once``, ``session``, ``always``, ``grant 3``, ...)."""
    args_sha256: str | None = None
    args_size: int | None = None
    args_summary: str | None = None
    """A redacted, bounded JSON summary of the arguments."""
    ended: float | None = None
    error_kind: str | None = None
    error: str | None = None
    chain: str | None = None
    """For a call a tool made through its context: the callers above it, outermost first,
    and the call that made it (``agent > send_email (3f2a.12)``); None for other calls."""
    seq: int | None = None

    def to_data(self) -> dict[str, Any]:
        return self._asdict()


@dataclass(frozen=True, slots=True)
class Grant:
    """A remembered answer to an escalation: ``allow`` or deny, for a tool and caller."""

    tool: str
    caller: str
    allow: bool
    args_sha256: str | None
    """The exact arguments it covers; ``None``: every call of the tool."""
    created: float = 0.0
    rule: str | None = None
    """The rule that escalated the call the answer was given for."""
    summary: str | None = None
    """A redacted summary of the arguments it was given for."""
    rule_digest: str | None = None
    """A digest of what that rule said (``Decision.rule_digest``): a remembered allow
    answers only calls escalated by the same rules saying the same thing."""
    reason: str | None = None
    """The reason the person was shown when they answered."""
    tool_digest: str | None = None
    """A digest of the tool's declaration (its signature and schemas) when the answer was
    given: a remembered allow answers only calls of the tool as it was then (a changed
    tool asks again). None for grants given before it was recorded."""
    expires: float | None = None
    """Unix time after which the grant answers nothing; None: until it is revoked."""
    id: int | None = None
    session: str | None = None
    """Set for a grant that lasts one session (kept in memory, never stored)."""

    @property
    def scope(self) -> Literal["call", "tool"]:
        return "tool" if self.args_sha256 is None else "call"

    def covers(self, tool: str, caller: str, args_sha256: str) -> bool:
        return (
            self.tool == tool
            and self.caller == caller
            and (self.args_sha256 is None or self.args_sha256 == args_sha256)
        )

    def to_data(self) -> dict[str, Any]:
        data = asdict(self)
        data["scope"] = self.scope
        return data


@dataclass(frozen=True, slots=True)
class PendingAnswer:
    """A person's answer to a pending approval, given through the store (an inbox)."""

    allow: bool
    remember: Literal["once", "session", "always"] = "once"
    scope: Literal["call", "tool"] = "call"
    comment: str | None = None
    """Free text from the person, passed to the caller of a denied call as quoted data."""
    approver: str | None = None
    """The name the person gave (a label they typed, not an authenticated identity)."""
    channel: str = "inbox"
    """Where the answer was given (checked against the rule's ``approvers``)."""
    answered: float = 0.0
    """Unix time of the answer."""
    mac: str | None = field(default=None, repr=False, compare=False)
    """The store's signature of the answer (a store checks it as it reads the answer back:
    one written into the database by anybody else answers nothing)."""

    def to_data(self) -> dict[str, Any]:
        data = asdict(self)
        del data["mac"]
        return data


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """An escalation waiting for its answer (for inboxes in other processes).

    The fields after ``rendered`` have defaults: a row written by an older host has none.
    """

    id: str
    host_id: str
    created: float
    expires: float
    call_id: str
    session: str
    caller: str
    tool: str
    rule: str | None
    reason: str | None
    args_sha256: str
    rendered: str
    """The arguments escaped, bounded and redacted for display (never raw values)."""
    description: str | None = None
    """The tool's description (the first paragraph of its docstring)."""
    warnings: tuple[str, ...] = ()
    """What in the arguments deserves a second look (hidden characters, look-alikes...)."""
    approvers: tuple[str, ...] | None = None
    """The channels whose allow counts (the rule's ``approvers``); None: any."""
    offered: bool = False
    """True once the host waits for an answer given through the store (its approver is
    the inbox): until then an inbox shows the request but cannot answer it."""
    answer: PendingAnswer | None = None
    """The first answer given through the store; the only one that counts."""
    chain: tuple[str, ...] = ()
    """For a nested call (a tool calling another through its context): the callers above
    it, outermost first, as :attr:`host.ApprovalRequest.chain`."""
    view_mac: str | None = None
    """The host key's MAC over what an approver is shown (tool, rule, reason, rendered
    arguments and their digest, description, warnings, approvers, chain...): a row whose
    view was written or changed by anyone without the key is neither listed nor answered."""

    def to_data(self) -> dict[str, Any]:
        data = asdict(self)
        del data["view_mac"]
        return data


AnswerStatus = Literal["answered", "answered_before", "expired", "not_offered", "gone"]
"""What became of an answer given through the store: ``answered`` (it is the answer),
``answered_before`` (someone else answered first), ``expired`` (the escalation timeout
passed: the call is denied), ``not_offered`` (the request is asked on another channel),
``gone`` (no such pending request: answered and done, timed out, or its host stopped)."""


@dataclass(frozen=True, slots=True)
class AnswerResult:
    """The outcome of :meth:`Store.answer_pending`."""

    status: AnswerStatus
    pending: PendingApproval | None = None
    """The request as it is now (with the answer that counts), None when ``gone``."""


class Store(Protocol):
    """What the host needs from its state database. Every method may raise
    :class:`StoreUnavailable`."""

    async def start(self, host_id: str) -> int:
        """Open for the host ``host_id``; close records of dead hosts as ``unknown``.

        Returns how many records were closed.
        """
        ...

    async def aclose(self) -> None: ...

    def record(self, record: AuditRecord, *, durable: bool) -> Awaitable[None]:
        """Add one audit record, or decide one recorded ``waiting`` (same call id). The
        returned awaitable is done once it is durable (with ``durable``: safe for the call
        to be dispatched); return :data:`DONE` when it already is. A plain ``async def``
        implementation is fine too."""
        ...

    def finish(
        self, call_id: str, outcome: Outcome, *, error_kind: str | None, error: str | None
    ) -> Awaitable[None]:
        """Close a ``started`` record with its outcome (awaitable as :meth:`record`)."""
        ...

    async def tail(self, count: int) -> list[AuditRecord]:
        """The last ``count`` records, oldest first."""
        ...

    async def add_grant(self, grant: Grant) -> Grant:
        """Persist an ``always`` grant; returns it with its id."""
        ...

    async def find_grants(self, tool: str, caller: str, args_sha256: str) -> list[Grant]:
        """The live grants covering this exact call."""
        ...

    async def grants(self) -> list[Grant]:
        """Every live grant, oldest first."""
        ...

    async def revoke_grant(self, grant_id: int) -> bool:
        """Revoke a grant; False if there is no live grant with that id."""
        ...

    async def add_pending(self, pending: PendingApproval) -> None: ...

    # -- a session's own state (tool contexts) -------------------------------------------

    async def get_value(self, session: str, key: str) -> bytes | None:
        """The encoded value of ``key`` in the session's key-value store, or None."""
        ...

    async def set_value(
        self, session: str, key: str, value: bytes | None, *, max_total: int
    ) -> None:
        """Store an encoded value (None removes the key); raises :class:`StoreFull` if the
        session's values would take more than ``max_total`` bytes."""
        ...

    async def save_files(
        self,
        session: str,
        call_id: str,
        files: Sequence[tuple[str, str, bytes, int | None, int | None]],
    ) -> list[StoredFile]:
        """Keep one call's files ``(name, mime_type, data, width, height)`` in the
        session's file area; returns them as kept (names made safe and unique)."""
        ...

    async def files(self, call_id: str) -> list[StoredFile]:
        """The files kept for one call."""
        ...

    async def remove_pending(self, pending_id: str) -> None: ...

    async def pending(self) -> list[PendingApproval]: ...

    # Answers given through the store (the approval inbox, in this or another process).
    # The first answer wins, exactly once; a change made by this process wakes
    # :meth:`pending_changed` at once, a change made by another one is seen by reading
    # again (SQLite: a poll; PostgreSQL: LISTEN/NOTIFY wakes waiters).

    async def get_pending(self, pending_id: str) -> PendingApproval | None:
        """One pending approval, with its answer if it has one."""
        ...

    async def offer_pending(self, pending_id: str, margin: float = 0.0) -> bool:
        """Let people answer this request through the store, until ``margin`` seconds
        before it expires (so that the waiting host reads an answer before it gives up);
        False if it is gone."""
        ...

    async def answer_pending(self, pending_id: str, answer: PendingAnswer) -> AnswerResult:
        """Record ``answer`` if the request is offered, unanswered and not expired."""
        ...

    def pending_version(self) -> int:
        """A number that changes whenever this process changes a pending approval."""
        ...

    async def pending_changed(self, seen: int, timeout: float) -> int:
        """Wait until :meth:`pending_version` differs from ``seen``, at most ``timeout``
        seconds; returns the version now."""
        ...
