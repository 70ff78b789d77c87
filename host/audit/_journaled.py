"""What every store that journals its audit records shares, whatever its database.

:class:`JournaledStore` holds the journal side of the audit contract (``_records.py``): a
record is appended to this host's memory-mapped journal (``_journal.py``) and its writer
process moves it into the database, so a decision is durable before dispatch without
waiting on the database; and the signatures the store puts on grants and answers, checked
as they are read back. :class:`~host.audit._sqlite.SQLiteStore` and
:class:`~host.audit._pg.PgStore` add their database.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, Literal

import anyio

from host.trust import HostKey

from . import _pending
from ._hostlock import HostLock
from ._journal import DECIDED, END, ROW, Ingester, Journal
from ._pending import RowLike
from ._records import (
    DONE,
    AnswerResult,
    AuditRecord,
    Grant,
    Outcome,
    PendingAnswer,
    PendingApproval,
    StoreUnavailable,
)

logger = logging.getLogger("toolhost.audit")

__all__ = [
    "GRANT_FIELDS",
    "Durability",
    "JournaledStore",
    "grant_from_row",
    "grant_parts",
    "grant_values",
]

_BACKLOG = 64 << 20
"""Journal bytes the database may lag behind before new calls are refused."""

Durability = Literal["process", "power"]
"""What a decision written before dispatch survives: the host process being killed or
crashing (``process``), or also a power cut or kernel crash (``power``: a disk sync)."""

GRANT_FIELDS: Final = (
    "id",
    "created",
    "tool",
    "caller",
    "args_sha256",
    "allow",
    "rule",
    "rule_digest",
    "reason",
    "summary",
    "revoked",
)
"""What a grant's MAC covers (with the database's id): every column the host acts on;
and those of :data:`_OPTIONAL` the grant has (so grants signed before they existed still
verify)."""

_OPTIONAL: Final = ("tool_digest", "expires")
"""Grant columns added later, signed when set."""


def grant_from_row(row: RowLike) -> Grant:
    keys = set(row.keys())
    return Grant(
        id=row["id"],
        created=row["created"],
        tool=row["tool"],
        caller=row["caller"],
        args_sha256=row["args_sha256"],
        allow=bool(row["allow"]),
        rule=row["rule"],
        summary=row["summary"],
        rule_digest=row["rule_digest"] if "rule_digest" in keys else None,
        reason=row["reason"] if "reason" in keys else None,
        tool_digest=row["tool_digest"] if "tool_digest" in keys else None,
        expires=row["expires"] if "expires" in keys else None,
    )


def grant_values(row: RowLike) -> dict[str, Any]:
    """What a grant's MAC covers, read from its row."""
    values = {name: row[name] for name in GRANT_FIELDS}
    values["allow"] = int(values["allow"]) if values["allow"] is not None else None
    keys = set(row.keys())
    for name in _OPTIONAL:
        if name in keys:
            values[name] = row[name]
    return values


def new_grant_values(grant: Grant, created: float) -> dict[str, Any]:
    """The row of a grant about to be stored (``revoked`` is None: it is new)."""
    return {
        "created": created,
        "tool": grant.tool,
        "caller": grant.caller,
        "args_sha256": grant.args_sha256,
        "allow": int(grant.allow),
        "rule": grant.rule,
        "rule_digest": grant.rule_digest,
        "reason": grant.reason,
        "summary": grant.summary,
        "tool_digest": grant.tool_digest,
        "expires": grant.expires,
        "revoked": None,
    }


def grant_parts(db_id: str, values: dict[str, Any]) -> tuple[Any, ...]:
    parts: tuple[Any, ...] = (db_id, *(values[name] for name in GRANT_FIELDS))
    for name in _OPTIONAL:  # signed only when set: older grants verify as they were
        if values.get(name) is not None:
            parts = (*parts, name, values[name])
    return parts


class JournaledStore:
    """The journal side of a store; a subclass adds the database (``start``, ``aclose``,
    grants, pending approvals, session state) and may name a PostgreSQL database for the
    writer (``_writer_url``)."""

    def __init__(
        self,
        folder: Path,
        *,
        durability: Durability = "process",
        busy_timeout: float = 5.0,
        interval: float = 0.05,
        key: HostKey | None = None,
    ) -> None:
        if durability not in ("process", "power"):
            raise ValueError(f"durability must be 'process' or 'power', not {durability!r}")
        self.folder = folder
        """The host's local state folder: journals, host locks, the sessions' files."""
        self.durability: Durability = durability
        self._busy_timeout = busy_timeout
        self._interval = interval
        self._lock: HostLock | None = None
        self._journal: Journal | None = None
        self._ingester: Ingester | None = None
        self._open: set[str] = set()
        """Call ids recorded as ``started`` and not yet finished."""
        self._waiting: set[str] = set()
        """Call ids recorded as ``waiting`` for an approval, not yet decided."""
        self._key = key
        self._db_id = ""
        self._told: set[tuple[str, str]] = set()
        self._lock_checked = 0.0
        self.on_tamper: Callable[[str, str], None] | None = None
        """Called (on the event loop) when tampering is found: what (``journal``,
        ``grant``, ``key``...) and a description. The host turns it into an
        ``audit_tampered`` event."""
        self._appended = 0
        self._synced = 0
        self._syncing: anyio.Event | None = None
        self._changes = _pending.Changes()
        self.host_id: str | None = None

    @property
    def where(self) -> str:
        """The database as people may be shown it (no password)."""
        return str(self.folder / "state.db")

    @property
    def _hosts(self) -> Path:
        return self.folder / "hosts"

    @property
    def _journals(self) -> Path:
        return self.folder / "journal"

    @property
    def files_dir(self) -> Path:
        """The sessions' file area: ``files/SESSION/CALL/NAME`` beside the database."""
        return self.folder / "files"

    def _start_writer(self, host_id: str) -> Ingester:
        journal, key = self._journal, self._key
        assert journal is not None and key is not None
        return Ingester(
            self.folder / "state.db",
            self._journals,
            host_id,
            key=key.secret,
            appended=lambda: journal.seq,
            on_report=self._check_lock,
            interval=self._interval,
            busy_timeout=self._busy_timeout,
            durability=self.durability,
            url=self._writer_url(),
        )

    def _writer_url(self) -> str | None:
        """The PostgreSQL database the writer fills; None: the SQLite file ``state.db``."""
        return None

    def _check_lock(self) -> None:
        """About once a second (the writer's follower thread): the lock file is still
        this host's, or is made again, so a removed one never lasts."""
        now = time.monotonic()
        if now - self._lock_checked < 1.0:
            return
        self._lock_checked = now
        lock = self._lock
        if lock is not None and not lock.verify():
            logger.warning(
                "this host's lock file %s was removed or replaced; made again", lock.path
            )

    def _tell(self, what: str, detail: str) -> None:
        """Report tampering once (on the event loop)."""
        if (what, detail) in self._told:
            return
        self._told.add((what, detail))
        logger.warning("tampering found (%s): %s", what, detail)
        hook = self.on_tamper
        if hook is not None:
            hook(what, detail)

    def record(self, record: AuditRecord, *, durable: bool) -> Awaitable[None]:
        journal, ingester = self._journal, self._ingester
        if journal is None or ingester is None:
            raise StoreUnavailable(f"the state database {self.where} is not open")
        call_id = record.call_id
        tampered = ingester.tampered
        if tampered is not None:
            self._damaged(journal, tampered)
        if durable:  # a decision: nothing runs unless the whole trail is healthy
            if tampered is not None:
                raise StoreUnavailable(
                    f"the audit trail was tampered with ({tampered}); nothing runs until "
                    "the host is restarted"
                )
            if ingester.error is not None:
                raise StoreUnavailable(ingester.error)
            if ingester.behind(journal.position) > _BACKLOG:
                raise StoreUnavailable(
                    "the audit database is more than "
                    f"{_BACKLOG >> 20} MiB of records behind the journal"
                )
        waiting = call_id in self._waiting
        if call_id in self._open or (waiting and record.outcome == "waiting"):
            raise StoreUnavailable(f"the call id {call_id} is already in the audit trail")
        entry = [DECIDED if waiting else ROW, *record]
        del entry[-1]  # seq: the database numbers the rows
        self._append(journal, entry)
        if waiting:
            self._waiting.discard(call_id)
        if record.outcome == "started":
            self._open.add(call_id)
        elif record.outcome == "waiting":
            self._waiting.add(call_id)
        if durable and self.durability == "power":
            return self._sync(journal)
        return DONE

    def _damaged(self, journal: Journal, text: str) -> None:
        """Tampering found: report it once, and go on in a fresh segment, so the records
        of the calls refused from now on can still be read past the damage."""
        if ("journal", text) not in self._told:
            journal.rotate()
            self._tell("journal", text)

    def finish(
        self, call_id: str, outcome: Outcome, *, error_kind: str | None, error: str | None
    ) -> Awaitable[None]:
        journal, ingester = self._journal, self._ingester
        if journal is None or ingester is None:
            raise StoreUnavailable(f"the state database {self.where} is not open")
        if call_id not in self._open:
            return DONE  # never started here, or already closed: a terminal outcome stays
        entry = [END, call_id, outcome, time.time(), error_kind, error]
        self._append(journal, entry)
        self._open.discard(call_id)
        return DONE

    def _append(self, journal: Journal, entry: list[Any]) -> None:
        try:
            journal.append(entry)
        except (OSError, ValueError) as exc:
            raise StoreUnavailable(f"the audit journal cannot be written: {exc}") from exc
        self._appended += 1

    async def _sync(self, journal: Journal) -> None:
        """Wait until everything appended so far is on the disk; one ``msync`` serves every
        call that arrives while another runs."""
        target = self._appended
        while self._synced < target:
            running = self._syncing
            if running is not None:
                await running.wait()
                continue
            self._syncing = done = anyio.Event()
            upto = self._appended
            try:
                with anyio.CancelScope(shield=True):  # followers depend on it
                    await anyio.to_thread.run_sync(journal.sync)
            except (OSError, ValueError) as exc:
                raise StoreUnavailable(f"the audit journal cannot be synced: {exc}") from exc
            else:
                self._synced = max(self._synced, upto)
            finally:
                self._syncing = None
                done.set()

    async def flush(self) -> None:
        """Wait until every record so far is in the database (raises
        :class:`StoreUnavailable` if it cannot be written within ``busy_timeout``)."""
        ingester, journal = self._ingester, self._journal
        if ingester is None or journal is None:
            return
        try:
            await anyio.to_thread.run_sync(
                ingester.drain, journal.position, self._busy_timeout + 1.0
            )
        except TimeoutError as exc:
            raise StoreUnavailable(str(exc)) from None

    def _grant_mac(self, values: dict[str, Any]) -> str:
        key = self._key
        assert key is not None
        return key.mac("grant", *grant_parts(self._db_id, values))

    def _verified(self, rows: Sequence[RowLike]) -> list[Grant]:
        """The rows this host's key signed; any other is ignored and reported (a row
        planted in the database, or one changed after it was written)."""
        good: list[Grant] = []
        key = self._key
        assert key is not None
        for row in rows:
            values = grant_values(row)
            if key.verify(row["mac"], "grant", *grant_parts(self._db_id, values)):
                good.append(grant_from_row(row))
            else:
                self._tell(
                    "grant",
                    f"grant {row['id']} ({ascii(row['tool'])[:80]}, "
                    f"{'allow' if row['allow'] else 'deny'}) is not signed by this host's key: "
                    "ignored",
                )
        return good

    def _answer_parts(self, pending_id: str, answer: PendingAnswer) -> tuple[Any, ...]:
        return (
            self._db_id,
            pending_id,
            answer.allow,
            answer.remember,
            answer.scope,
            answer.comment,
            answer.approver,
            answer.channel,
            answer.answered,
        )

    def _view_parts(self, pending: PendingApproval) -> tuple[Any, ...]:
        """What an approver is shown of ``pending``, and what identifies it (not its
        ``expires``, which offering moves, nor its answer, which has a MAC of its own)."""
        return (
            self._db_id,
            pending.id,
            pending.host_id,
            repr(pending.created),
            pending.call_id,
            pending.session,
            pending.caller,
            pending.tool,
            pending.rule,
            pending.reason,
            pending.args_sha256,
            pending.rendered,
            pending.description,
            json.dumps(list(pending.warnings)),
            None if pending.approvers is None else json.dumps(list(pending.approvers)),
            json.dumps(list(pending.chain)),
        )

    def _signed_view(self, pending: PendingApproval) -> PendingApproval:
        """``pending`` with the MAC of what an approver is shown of it."""
        key = self._key
        if key is None:
            return pending
        return replace(pending, view_mac=key.mac("pending-view", *self._view_parts(pending)))

    def _checked(self, pending: PendingApproval | None) -> PendingApproval | None:
        """``pending`` if this store signed what an approver is shown of it (else None:
        a request whose view was written or changed in the database by anybody else is
        neither listed nor answered), with its answer only if this store signed that too
        (an answer written into the database, to approve a call, answers nothing)."""
        key = self._key
        if pending is None or key is None:
            return pending
        if not key.verify(pending.view_mac, "pending-view", *self._view_parts(pending)):
            self._tell(
                "pending",
                f"what request {pending.id} ({ascii(pending.tool)[:80]}) shows an approver "
                "is not signed by this host's key (written or changed in the database): "
                "not shown, not answerable",
            )
            return None
        if pending.answer is None:
            return pending
        if key.verify(
            pending.answer.mac, "answer", *self._answer_parts(pending.id, pending.answer)
        ):
            return pending
        self._tell(
            "answer",
            f"the answer to request {pending.id} ({ascii(pending.tool)[:80]}) is not signed by "
            "this host's key: ignored",
        )
        return replace(pending, answer=None)

    def _answered(self, result: AnswerResult) -> AnswerResult:
        """``result`` as the store's reader may trust it: a request whose view this store
        did not sign is ``gone`` (whatever was written, its call never counts it)."""
        checked = self._checked(result.pending)
        if result.pending is not None and checked is None:
            return AnswerResult("gone")
        return replace(result, pending=checked)

    def pending_version(self) -> int:
        return self._changes.version

    async def pending_changed(self, seen: int, timeout: float) -> int:
        return await self._changes.wait(seen, timeout)
