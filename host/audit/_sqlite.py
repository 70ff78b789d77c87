"""The :class:`~host.audit._records.Store` on SQLite.

:class:`SQLiteStore` implements the store on one SQLite file in WAL mode
(``.agent/state.db`` of the project); the interface, the records it speaks and the audit
contract are in ``_records.py``, reading the trail back in ``_reading.py``.

:class:`SQLiteStore` makes an audit record durable by appending it to a memory-mapped
journal (``host/audit/_journal.py``): a few microseconds on the event loop's thread, and
safe from the moment it returns against the host being killed or crashing. A thread of its
own moves the records into SQLite in batches. With ``durability="power"`` a decision also
waits for the journal to reach the disk (``msync``; calls in flight together share one).
Other SQLite work runs on a worker thread (one at a time), never on the event loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import anyio

from host.trust import HostKey, host_key

from . import _journal, _pending, _session
from ._hostlock import HostLock, identity
from ._journal import COLUMNS, DECIDED, END, ROW, Ingester, Journal
from ._reading import tail_audit
from ._records import (
    DONE,
    AnswerResult,
    AuditRecord,
    Grant,
    Outcome,
    PendingAnswer,
    PendingApproval,
    StoredFile,
    StoreUnavailable,
)

logger = logging.getLogger("toolhost.audit")

__all__ = [
    "Durability",
    "SQLiteStore",
]

_BACKLOG = 64 << 20
"""Journal bytes the database may lag behind before new calls are refused."""

Durability = Literal["process", "power"]
"""What a decision written before dispatch survives: the host process being killed or
crashing (``process``), or also a power cut or kernel crash (``power``: a disk sync)."""

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    call_id TEXT NOT NULL UNIQUE,
    host_id TEXT NOT NULL,
    started REAL NOT NULL,
    ended REAL,
    session TEXT NOT NULL,
    caller TEXT NOT NULL,
    tool TEXT NOT NULL,
    policy_version TEXT,
    decision TEXT,
    rule TEXT,
    approval TEXT,
    args_sha256 TEXT,
    args_size INTEGER,
    args_summary TEXT,
    outcome TEXT NOT NULL,
    error_kind TEXT,
    error TEXT,
    chain TEXT
);
CREATE INDEX IF NOT EXISTS audit_open ON audit (host_id) WHERE outcome = 'started';
CREATE TABLE IF NOT EXISTS grants (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    tool TEXT NOT NULL,
    caller TEXT NOT NULL,
    args_sha256 TEXT,
    allow INTEGER NOT NULL,
    rule TEXT,
    summary TEXT,
    revoked REAL,
    rule_digest TEXT,
    reason TEXT,
    mac TEXT
);
CREATE INDEX IF NOT EXISTS grants_tool ON grants (tool, caller) WHERE revoked IS NULL;
CREATE TABLE IF NOT EXISTS pending (
    id TEXT PRIMARY KEY,
    host_id TEXT NOT NULL,
    created REAL NOT NULL,
    expires REAL NOT NULL,
    call_id TEXT NOT NULL,
    session TEXT NOT NULL,
    caller TEXT NOT NULL,
    tool TEXT NOT NULL,
    rule TEXT,
    reason TEXT,
    args_sha256 TEXT NOT NULL,
    rendered TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS hosts (
    host_id TEXT PRIMARY KEY,
    identity TEXT,
    started REAL NOT NULL
);
PRAGMA user_version = 2;
"""

_ADDED: Final = {"grants": ("rule_digest TEXT", "reason TEXT", "mac TEXT")}
"""Columns added since the first schema (a database made before gets them)."""

_GRANT_FIELDS: Final = (
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
"""What a grant's MAC covers (with the database's id): every column the host acts on."""


def _migrate(conn: sqlite3.Connection) -> None:
    for table, added in _ADDED.items():
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        for column in added:
            if column.split()[0] not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
    conn.execute(
        "INSERT OR IGNORE INTO meta (key, value) VALUES ('id', ?)", (os.urandom(16).hex(),)
    )


if AuditRecord._fields[:-1] != COLUMNS:  # the journal writes records as tuples
    raise ImportError("AuditRecord's fields and the audit journal's columns disagree")


# -- SQLite ----------------------------------------------------------------------------------


def _add_chain_column(conn: sqlite3.Connection) -> None:
    """A database made before ``audit.chain`` existed gets the column (another host may
    be adding it at the same moment)."""
    names = {row[1] for row in conn.execute("PRAGMA table_info(audit)")}
    if "chain" not in names:
        with contextlib.suppress(sqlite3.OperationalError):  # "duplicate column name"
            conn.execute("ALTER TABLE audit ADD COLUMN chain TEXT")


def _grant(row: sqlite3.Row) -> Grant:
    keys = row.keys()
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
    )


def _grant_parts(db_id: str, values: dict[str, Any]) -> tuple[Any, ...]:
    return (db_id, *(values[name] for name in _GRANT_FIELDS))


class SQLiteStore:
    """The :class:`Store` on one SQLite file in WAL mode.

    Audit records go to a journal first (``journal/`` beside the database) and reach the
    database within ``interval`` seconds; :meth:`tail`, and any reader using it, sees them
    at once either way.

    Args:
        path: the database file (created with its folder).
        durability: ``"process"`` (the default): a decision is in the operating system's
            hands before its call is dispatched, so a host that is killed or crashes loses
            nothing, at a few microseconds per record. ``"power"``: it is also on the disk
            (an ``msync`` of the journal, shared by the calls in flight together, a few
            milliseconds here), so it survives a power cut too.
        busy_timeout: seconds to wait for another process holding the write lock.
        interval: seconds between the journal's batches into the database.
        key: the key the journal's records and the grants are signed with (default: the
            host's key, ``host.trust.host_key``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "process",
        busy_timeout: float = 5.0,
        interval: float = 0.05,
        key: HostKey | None = None,
    ) -> None:
        if durability not in ("process", "power"):
            raise ValueError(f"durability must be 'process' or 'power', not {durability!r}")
        self.path = Path(path)
        self.durability: Durability = durability
        self._busy_timeout = busy_timeout
        self._interval = interval
        self._conn: sqlite3.Connection | None = None
        self._limiter = anyio.CapacityLimiter(1)
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

    def __repr__(self) -> str:
        state = "open" if self._conn is not None else "closed"
        return f"<SQLiteStore {self.path} {state}>"

    @property
    def _hosts(self) -> Path:
        return self.path.parent / "hosts"

    @property
    def _journals(self) -> Path:
        return self.path.parent / "journal"

    @property
    def files_dir(self) -> Path:
        """The sessions' file area: ``files/SESSION/CALL/NAME`` beside the database."""
        return self.path.parent / "files"

    async def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        def work() -> _T:
            conn = self._conn
            if conn is None:
                raise StoreUnavailable(f"the state database {self.path} is not open")
            try:
                return fn(conn)
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    if conn.in_transaction:
                        conn.rollback()
                raise StoreUnavailable(f"the state database {self.path} failed: {exc}") from exc
            except OSError as exc:
                raise StoreUnavailable(f"the state database {self.path} failed: {exc}") from exc

        return await anyio.to_thread.run_sync(work, limiter=self._limiter)

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path,
            timeout=self._busy_timeout,
            isolation_level=None,  # explicit transactions only
            check_same_thread=False,  # one worker thread at a time, under the limiter
        )
        conn.row_factory = sqlite3.Row
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            conn.close()
            raise StoreUnavailable(f"{self.path}: cannot switch to WAL mode (got {mode})")
        sync = "FULL" if self.durability == "power" else "NORMAL"
        conn.execute(f"PRAGMA synchronous={sync}")
        conn.executescript(_SCHEMA)
        _pending.migrate(conn)
        _add_chain_column(conn)
        conn.executescript(_session.SCHEMA)
        _migrate(conn)
        return conn

    async def attach(self) -> None:
        """Open the database to read it and answer pending approvals, as a process that
        makes no calls (``toolhost inbox``): no host lock, no journal, no writer.
        ``aclose`` closes it; the audit trail read back includes the journals of running
        hosts."""

        def open_only() -> None:
            try:
                self._conn = self._connect()
                self._db_id = self._read_db_id(self._conn)
                self._key = self._key or host_key()
            except (sqlite3.Error, OSError) as exc:
                raise StoreUnavailable(
                    f"cannot open the state database {self.path}: {exc}"
                ) from exc

        await anyio.to_thread.run_sync(open_only, limiter=self._limiter)

    @staticmethod
    def _read_db_id(conn: sqlite3.Connection) -> str:
        """The database's own random id: grants are signed with it, so one copied from
        another project's database does not verify here."""
        return str(conn.execute("SELECT value FROM meta WHERE key = 'id'").fetchone()[0])

    async def start(self, host_id: str) -> int:
        def open_and_reconcile() -> int:
            key = self._key or host_key()
            try:
                self._conn = conn = self._connect()
                self._db_id = self._read_db_id(conn)
                self._lock = HostLock(self._hosts, host_id)
                conn.execute(
                    "INSERT OR REPLACE INTO hosts (host_id, identity, started) VALUES (?, ?, ?)",
                    (host_id, identity(), time.time()),
                )
                self._journal = Journal(
                    self._journals, host_id, key.secret, sync_dirs=self.durability == "power"
                )
            except (sqlite3.Error, OSError) as exc:
                raise StoreUnavailable(
                    f"cannot open the state database {self.path}: {exc}"
                ) from exc
            self._key = key
            self.host_id = host_id
            return 0

        await anyio.to_thread.run_sync(open_and_reconcile, limiter=self._limiter)
        key = self._key
        assert key is not None
        if key.problem is not None:
            self._tell("key", key.problem)
        if key.notice is not None:
            self._tell("key", key.notice)
        closed = await self.reconcile()
        try:
            self._ingester = await anyio.to_thread.run_sync(self._start_writer, host_id)
        except OSError as exc:
            raise StoreUnavailable(f"cannot start the audit writer: {exc}") from exc
        return closed

    def _start_writer(self, host_id: str) -> Ingester:
        journal, key = self._journal, self._key
        assert journal is not None and key is not None
        return Ingester(
            self.path,
            self._journals,
            host_id,
            key=key.secret,
            appended=lambda: journal.seq,
            on_report=self._check_lock,
            interval=self._interval,
            busy_timeout=self._busy_timeout,
            durability=self.durability,
        )

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

    async def reconcile(self) -> int:
        """Close what every host that is gone left open: its journal (replayed), its
        records (``started``: ``unknown``; ``waiting`` for an approval: ``denied``), its
        pending approvals (each call gets its one terminal record). Returns how many
        records were closed."""
        mine = self.host_id
        key = self._key
        assert key is not None
        damage: list[str] = []

        def work(conn: sqlite3.Connection) -> int:
            lock = self._lock
            if lock is not None and not lock.verify():
                damage.append(f"this host's lock file {lock.path} was removed; made again")
            identities: dict[str, str | None] = dict(
                conn.execute("SELECT host_id, identity FROM hosts").fetchall()
            )

            def dead(host: str) -> bool:
                return host != mine and HostLock.is_dead(self._hosts, host, identities.get(host))

            journals = _journal.segments(self._journals)
            for host, paths in journals.items():  # records that never reached the database
                if dead(host):
                    replayed = _journal.replay(conn, paths, key=key.secret, host_id=host)
                    damage.extend(f"host {host}'s journal: {d}" for d in replayed.damage)
            hosts = [
                row[0]
                for row in conn.execute(
                    "SELECT DISTINCT host_id FROM audit WHERE outcome IN ('started', 'waiting') "
                    "UNION SELECT DISTINCT host_id FROM pending"
                )
            ]
            closed = 0
            now = time.time()
            for host in (h for h in hosts if dead(h)):
                conn.execute("BEGIN IMMEDIATE")
                closed += conn.execute(
                    "UPDATE audit SET outcome = 'unknown', ended = ?, error_kind = "
                    "'host_stopped', error = ? WHERE host_id = ? AND outcome = 'started'",
                    (now, "the host stopped before the outcome was recorded", host),
                ).rowcount
                closed += conn.execute(
                    "UPDATE audit SET outcome = 'denied', ended = ?, error_kind = "
                    "'host_stopped', error = ?, approval = 'host_stopped' "
                    "WHERE host_id = ? AND outcome = 'waiting'",
                    (now, "the host stopped while the call waited for an approval", host),
                ).rowcount
                # A request whose call left no record at all (written by an older host):
                # its terminal record comes from the request.
                closed += conn.execute(
                    "INSERT OR IGNORE INTO audit (call_id, host_id, started, session, caller, "
                    "tool, outcome, decision, rule, approval, args_sha256, ended, error_kind, "
                    "error) SELECT call_id, host_id, created, session, caller, tool, 'denied', "
                    "'escalate', rule, 'host_stopped', args_sha256, ?, 'host_stopped', ? "
                    "FROM pending WHERE host_id = ?",
                    (now, "the host stopped while the call waited for an approval", host),
                ).rowcount
                conn.execute("DELETE FROM pending WHERE host_id = ?", (host,))
                conn.execute("COMMIT")
            for stale in self._hosts.glob("*.lock"):  # hosts that died with nothing open
                if stale.stem != mine:
                    dead(stale.stem)
            gone = [h for h in identities if dead(h)]
            if gone:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany("DELETE FROM hosts WHERE host_id = ?", [(h,) for h in gone])
                conn.execute("COMMIT")
            return closed

        closed = await self._run(work)
        for text in damage:
            self._tell("journal", text)
        return closed

    async def aclose(self) -> None:
        journal, self._journal = self._journal, None
        ingester, self._ingester = self._ingester, None
        if journal is not None:
            journal.close()
        if ingester is not None:  # it writes the rest and removes the journal
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(ingester.stop, self._busy_timeout + 5.0)

        def close() -> None:
            conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("DELETE FROM pending WHERE host_id = ?", (self.host_id,))
                    conn.execute("DELETE FROM hosts WHERE host_id = ?", (self.host_id,))
                conn.close()
            lock, self._lock = self._lock, None
            if lock is not None:
                lock.release()

        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(close, limiter=self._limiter)

    # -- audit ---------------------------------------------------------------------------

    def record(self, record: AuditRecord, *, durable: bool) -> Awaitable[None]:
        journal, ingester = self._journal, self._ingester
        if journal is None or ingester is None:
            raise StoreUnavailable(f"the state database {self.path} is not open")
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
            raise StoreUnavailable(f"the state database {self.path} is not open")
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

    async def tail(self, count: int) -> list[AuditRecord]:
        """The last ``count`` records, oldest first: the database's, with what the journals
        of running hosts hold that has not reached it yet."""
        with contextlib.suppress(StoreUnavailable):  # this host's records, numbered, first
            await self.flush()
        journals = self._journals
        key = self._key.secret if self._key is not None else None

        def work(conn: sqlite3.Connection) -> list[AuditRecord]:
            return tail_audit(conn, journals, count, key=key)

        return await self._run(work)

    # -- grants ----------------------------------------------------------------------------

    def _grant_mac(self, values: dict[str, Any]) -> str:
        key = self._key
        assert key is not None
        return key.mac("grant", *_grant_parts(self._db_id, values))

    async def add_grant(self, grant: Grant) -> Grant:
        created = grant.created or time.time()
        values: dict[str, Any] = {
            "created": created,
            "tool": grant.tool,
            "caller": grant.caller,
            "args_sha256": grant.args_sha256,
            "allow": int(grant.allow),
            "rule": grant.rule,
            "rule_digest": grant.rule_digest,
            "reason": grant.reason,
            "summary": grant.summary,
            "revoked": None,
        }

        def work(conn: sqlite3.Connection) -> int:
            conn.execute("BEGIN IMMEDIATE")
            names = [n for n in values if n != "revoked"]
            cursor = conn.execute(
                f"INSERT INTO grants ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                tuple(values[n] for n in names),
            )
            grant_id = int(cursor.lastrowid or 0)
            conn.execute(
                "UPDATE grants SET mac = ? WHERE id = ?",
                (self._grant_mac({**values, "id": grant_id}), grant_id),
            )
            conn.execute("COMMIT")
            return grant_id

        grant_id = await self._run(work)
        return replace(grant, id=grant_id, created=created, session=None)

    def _verified(self, rows: list[sqlite3.Row]) -> list[Grant]:
        """The rows this host's key signed; any other is ignored and reported (a row
        planted in the database, or one changed after it was written)."""
        good: list[Grant] = []
        key = self._key
        assert key is not None
        for row in rows:
            values = {name: row[name] for name in _GRANT_FIELDS}
            values["allow"] = int(values["allow"]) if values["allow"] is not None else None
            if key.verify(row["mac"], "grant", *_grant_parts(self._db_id, values)):
                good.append(_grant(row))
            else:
                self._tell(
                    "grant",
                    f"grant {row['id']} ({ascii(row['tool'])[:80]}, "
                    f"{'allow' if row['allow'] else 'deny'}) is not signed by this host's key: "
                    "ignored",
                )
        return good

    async def find_grants(self, tool: str, caller: str, args_sha256: str) -> list[Grant]:
        def work(conn: sqlite3.Connection) -> list[sqlite3.Row]:
            return conn.execute(
                "SELECT * FROM grants WHERE revoked IS NULL AND tool = ? AND caller = ? "
                "AND (args_sha256 IS NULL OR args_sha256 = ?) ORDER BY id",
                (tool, caller, args_sha256),
            ).fetchall()

        return self._verified(await self._run(work))

    async def grants(self) -> list[Grant]:
        def work(conn: sqlite3.Connection) -> list[sqlite3.Row]:
            return conn.execute("SELECT * FROM grants WHERE revoked IS NULL ORDER BY id").fetchall()

        return self._verified(await self._run(work))

    async def revoke_grant(self, grant_id: int) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute(
                "SELECT * FROM grants WHERE id = ? AND revoked IS NULL", (grant_id,)
            ).fetchone()
            if row is None:
                conn.execute("COMMIT")
                return False
            # Signed again with the time of revocation: clearing it breaks the MAC, so a
            # revoked grant cannot be brought back by editing the database.
            values = {name: row[name] for name in _GRANT_FIELDS}
            values["revoked"] = time.time()
            conn.execute(
                "UPDATE grants SET revoked = ?, mac = ? WHERE id = ?",
                (values["revoked"], self._grant_mac(values), grant_id),
            )
            conn.execute("COMMIT")
            return True

        return await self._run(work)

    # -- pending approvals -----------------------------------------------------------------

    async def add_pending(self, pending: PendingApproval) -> None:
        def work(conn: sqlite3.Connection) -> None:
            _pending.insert(conn, pending)

        await self._run(work)
        self._changes.bump()

    async def remove_pending(self, pending_id: str) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("DELETE FROM pending WHERE id = ?", (pending_id,))
            conn.execute("COMMIT")

        await self._run(work)
        self._changes.bump()

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

    def _checked(self, pending: PendingApproval | None) -> PendingApproval | None:
        """``pending`` with its answer only if this store signed it: an answer written
        into the database by anybody else (to approve a call) answers nothing."""
        key = self._key
        if pending is None or pending.answer is None or key is None:
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

    async def pending(self) -> list[PendingApproval]:
        rows = await self._run(_pending.select_all)
        return [checked for row in rows if (checked := self._checked(row)) is not None]

    async def get_pending(self, pending_id: str) -> PendingApproval | None:
        def work(conn: sqlite3.Connection) -> PendingApproval | None:
            return _pending.select(conn, pending_id)

        return self._checked(await self._run(work))

    async def offer_pending(self, pending_id: str, margin: float = 0.0) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            return _pending.offer(conn, pending_id, margin)

        offered = await self._run(work)
        self._changes.bump()
        return offered

    async def answer_pending(self, pending_id: str, answer: PendingAnswer) -> AnswerResult:
        key = self._key
        if key is None:
            raise StoreUnavailable(f"the state database {self.path} is not open")
        answer = replace(answer, answered=answer.answered or time.time())
        signed = replace(answer, mac=key.mac("answer", *self._answer_parts(pending_id, answer)))

        def work(conn: sqlite3.Connection) -> AnswerResult:
            return _pending.answer(conn, pending_id, signed)

        result = await self._run(work)
        self._changes.bump()
        return replace(result, pending=self._checked(result.pending))

    def pending_version(self) -> int:
        return self._changes.version

    async def pending_changed(self, seen: int, timeout: float) -> int:
        return await self._changes.wait(seen, timeout)

    # -- a session's own state -------------------------------------------------------------

    async def get_value(self, session: str, key: str) -> bytes | None:
        def work(conn: sqlite3.Connection) -> bytes | None:
            return _session.get_value(conn, session, key)

        return await self._run(work)

    async def set_value(
        self, session: str, key: str, value: bytes | None, *, max_total: int
    ) -> None:
        def work(conn: sqlite3.Connection) -> None:
            _session.set_value(conn, session, key, value, max_total)

        await self._run(work)

    async def save_files(
        self,
        session: str,
        call_id: str,
        files: Sequence[_session.FileData],
    ) -> list[StoredFile]:
        folder = self.files_dir

        def work(conn: sqlite3.Connection) -> list[StoredFile]:
            return _session.save_files(conn, folder, session, call_id, files)

        return await self._run(work)

    async def files(self, call_id: str) -> list[StoredFile]:
        folder = self.files_dir

        def work(conn: sqlite3.Connection) -> list[StoredFile]:
            return _session.files_of(conn, folder, call_id)

        return await self._run(work)
