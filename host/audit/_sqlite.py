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
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final, TypeVar

import anyio

from host.trust import HostKey, host_key

from . import _journal, _pending, _session
from ._hostlock import HostLock, identity
from ._journal import COLUMNS, Journal
from ._journaled import Durability, JournaledStore, grant_values, new_grant_values
from ._reading import tail_audit
from ._records import (
    AnswerResult,
    AuditRecord,
    Grant,
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

_ADDED: Final = {
    "grants": ("rule_digest TEXT", "reason TEXT", "mac TEXT", "tool_digest TEXT", "expires REAL")
}
"""Columns added since the first schema (a database made before gets them)."""


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


class SQLiteStore(JournaledStore):
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
        self.path = Path(path)
        super().__init__(
            self.path.parent,
            durability=durability,
            busy_timeout=busy_timeout,
            interval=interval,
            key=key,
        )
        self._conn: sqlite3.Connection | None = None
        self._limiter = anyio.CapacityLimiter(1)

    def __repr__(self) -> str:
        state = "open" if self._conn is not None else "closed"
        return f"<SQLiteStore {self.path} {state}>"

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

    async def add_grant(self, grant: Grant) -> Grant:
        created = grant.created or time.time()
        values = new_grant_values(grant, created)

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

    async def find_grants(self, tool: str, caller: str, args_sha256: str) -> list[Grant]:
        def work(conn: sqlite3.Connection) -> list[sqlite3.Row]:
            return conn.execute(
                "SELECT * FROM grants WHERE revoked IS NULL AND (expires IS NULL OR expires > ?) "
                "AND tool = ? AND caller = ? "
                "AND (args_sha256 IS NULL OR args_sha256 = ?) ORDER BY id",
                (time.time(), tool, caller, args_sha256),
            ).fetchall()

        return self._verified(await self._run(work))

    async def grants(self) -> list[Grant]:
        def work(conn: sqlite3.Connection) -> list[sqlite3.Row]:
            return conn.execute(
                "SELECT * FROM grants WHERE revoked IS NULL AND (expires IS NULL OR expires > ?) "
                "ORDER BY id",
                (time.time(),),
            ).fetchall()

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
            values = grant_values(row)
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
        pending = self._signed_view(pending)

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
        return self._answered(result)

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
