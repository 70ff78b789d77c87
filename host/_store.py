"""The host's durable state: the audit trail, remembered grants, pending approvals.

:class:`Store` is the small interface the mediator writes through; :class:`SQLiteStore`
implements it on one SQLite file in WAL mode (``.agent/state.db`` of the project). A
PostgreSQL implementation, for hosts that share approvals across machines, only has to
provide the same methods.

The audit contract (DESIGN.md section 3, SECURITY_CATALOGUE.md H07/H08):

* a call's decision is written, durably, before the call is dispatched
  (:meth:`Store.record` with ``durable=True`` waits for the disk), and its outcome after
  (:meth:`Store.finish`); a call refused before dispatch gets one terminal record;
* a record left ``started`` by a host that died is closed as ``unknown`` by the next
  host that opens the store (:meth:`Store.start`). Each host holds a lock file under
  ``.agent/hosts/`` while it runs, so a live host's open records are never closed;
* any failure to write raises :class:`StoreUnavailable`; the mediator then refuses the
  call (fail closed). Nothing here ever sees raw argument values: records carry a hash,
  a size and a redacted, bounded summary made by the caller.

SQLite calls run on a worker thread (one at a time), never on the event loop. Audit
writes that arrive while a commit runs share the next commit (group commit), so calls in
flight together share one disk sync.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import anyio

__all__ = [
    "AuditRecord",
    "Grant",
    "PendingApproval",
    "Store",
    "SQLiteStore",
    "StoreUnavailable",
    "Outcome",
]

Outcome = Literal["started", "ok", "denied", "failed", "unknown"]
"""``started`` until the call ends; then exactly one terminal outcome."""

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
    error TEXT
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
    revoked REAL
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
PRAGMA user_version = 1;
"""


class StoreUnavailable(Exception):
    """The state database cannot be read or written; the message says why."""


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One call in the audit trail. Argument values never appear: only hash and summary."""

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
    seq: int | None = None

    def to_data(self) -> dict[str, Any]:
        return asdict(self)


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
    summary: str | None = None
    """A redacted summary of the arguments it was given for."""
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
class PendingApproval:
    """An escalation waiting for its answer (for inboxes in other processes)."""

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

    def to_data(self) -> dict[str, Any]:
        return asdict(self)


class Store(Protocol):
    """What the host needs from its state database. Every method may raise
    :class:`StoreUnavailable`."""

    async def start(self, host_id: str) -> int:
        """Open for the host ``host_id``; close records of dead hosts as ``unknown``.

        Returns how many records were closed.
        """
        ...

    async def aclose(self) -> None: ...

    async def record(self, record: AuditRecord, *, durable: bool) -> None:
        """Add one audit record; with ``durable``, return only once it is on disk."""
        ...

    async def finish(
        self, call_id: str, outcome: Outcome, *, error_kind: str | None, error: str | None
    ) -> None:
        """Close a ``started`` record with its outcome."""
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

    async def remove_pending(self, pending_id: str) -> None: ...

    async def pending(self) -> list[PendingApproval]: ...


# -- host liveness: one locked file per running host ---------------------------------------

if sys.platform != "win32":
    import fcntl

    def _lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

else:  # pragma: no cover - no advisory locks: other hosts' records are left open

    def _lock(fd: int) -> bool:
        del fd
        return False


class _HostLock:
    """A file under ``hosts/`` locked while the host runs; the OS drops it when we die."""

    def __init__(self, folder: Path, host_id: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{host_id}.lock"
        # Locked before it appears under its name, so no other host ever sees it unlocked.
        hidden = folder / f".{host_id}.{os.getpid()}.tmp"
        self._fd: int | None = os.open(hidden, os.O_CREAT | os.O_RDWR, 0o600)
        _lock(self._fd)
        os.replace(hidden, self.path)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(fd)

    @staticmethod
    def is_dead(folder: Path, host_id: str) -> bool:
        """True when no running host holds ``host_id``'s lock (its file is then removed)."""
        path = folder / f"{host_id}.lock"
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return True
        try:
            if not _lock(fd):
                return False
            with contextlib.suppress(OSError):
                path.unlink()
            return True
        finally:
            os.close(fd)


# -- SQLite ----------------------------------------------------------------------------------


def _columns(row: sqlite3.Row) -> dict[str, Any]:
    return {k: row[k] for k in row.keys()}  # noqa: SIM118 - a Row iterates its values


def _audit(row: sqlite3.Row) -> AuditRecord:
    return AuditRecord(**_columns(row))


def _grant(row: sqlite3.Row) -> Grant:
    return Grant(
        id=row["id"],
        created=row["created"],
        tool=row["tool"],
        caller=row["caller"],
        args_sha256=row["args_sha256"],
        allow=bool(row["allow"]),
        rule=row["rule"],
        summary=row["summary"],
    )


@dataclass(slots=True)
class _Queued:
    work: Callable[[sqlite3.Connection], None]
    durable: bool
    done: anyio.Event = field(default_factory=anyio.Event)
    error: StoreUnavailable | None = None


def _commit(conn: sqlite3.Connection, *, batch: list[_Queued]) -> None:
    """One transaction for a batch of audit writes; synced to disk if any asks for it."""
    conn.execute(f"PRAGMA synchronous={'FULL' if any(q.durable for q in batch) else 'NORMAL'}")
    conn.execute("BEGIN IMMEDIATE")
    for queued in batch:
        conn.execute("SAVEPOINT write")
        try:
            queued.work(conn)
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK TO write")
            queued.error = StoreUnavailable(f"an audit write failed: {exc}")
        conn.execute("RELEASE write")
    conn.execute("COMMIT")


class SQLiteStore:
    """The :class:`Store` on one SQLite file in WAL mode.

    Args:
        path: the database file (created with its folder).
        durable: when true (the default), a ``durable`` write waits until SQLite has
            synced the log to disk, so a decision survives a power cut; false trades that
            for speed (a killed host still loses nothing written).
        busy_timeout: seconds to wait for another process holding the write lock.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, durable: bool = True, busy_timeout: float = 5.0
    ) -> None:
        self.path = Path(path)
        self._durable = durable
        self._busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._limiter = anyio.CapacityLimiter(1)
        self._lock: _HostLock | None = None
        self._queue: list[_Queued] = []
        self._committing = False
        self.host_id: str | None = None

    def __repr__(self) -> str:
        state = "open" if self._conn is not None else "closed"
        return f"<SQLiteStore {self.path} {state}>"

    @property
    def _hosts(self) -> Path:
        return self.path.parent / "hosts"

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
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(_SCHEMA)
        return conn

    async def start(self, host_id: str) -> int:
        def open_and_reconcile() -> int:
            try:
                self._conn = self._connect()
                self._lock = _HostLock(self._hosts, host_id)
            except (sqlite3.Error, OSError) as exc:
                raise StoreUnavailable(
                    f"cannot open the state database {self.path}: {exc}"
                ) from exc
            self.host_id = host_id
            return 0

        await anyio.to_thread.run_sync(open_and_reconcile, limiter=self._limiter)
        return await self.reconcile()

    async def reconcile(self) -> int:
        """Close the open records and pending approvals of every host that is gone."""
        mine = self.host_id

        def work(conn: sqlite3.Connection) -> int:
            hosts = [
                row[0]
                for row in conn.execute(
                    "SELECT DISTINCT host_id FROM audit WHERE outcome = 'started' "
                    "UNION SELECT DISTINCT host_id FROM pending"
                )
            ]
            dead = [h for h in hosts if h != mine and _HostLock.is_dead(self._hosts, h)]
            closed = 0
            now = time.time()
            for host in dead:
                conn.execute("BEGIN IMMEDIATE")
                cursor = conn.execute(
                    "UPDATE audit SET outcome = 'unknown', ended = ?, error_kind = "
                    "'host_stopped', error = ? WHERE host_id = ? AND outcome = 'started'",
                    (now, "the host stopped before the outcome was recorded", host),
                )
                closed += cursor.rowcount
                conn.execute("DELETE FROM pending WHERE host_id = ?", (host,))
                conn.execute("COMMIT")
            for stale in self._hosts.glob("*.lock"):  # hosts that died with nothing open
                if stale.stem != mine:
                    _HostLock.is_dead(self._hosts, stale.stem)
            return closed

        return await self._run(work)

    async def aclose(self) -> None:
        def close() -> None:
            conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("DELETE FROM pending WHERE host_id = ?", (self.host_id,))
                conn.close()
            lock, self._lock = self._lock, None
            if lock is not None:
                lock.release()

        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(close, limiter=self._limiter)

    # -- audit ---------------------------------------------------------------------------

    async def record(self, record: AuditRecord, *, durable: bool) -> None:
        data = record.to_data()
        del data["seq"]
        columns = ", ".join(data)
        marks = ", ".join("?" for _ in data)

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(f"INSERT INTO audit ({columns}) VALUES ({marks})", tuple(data.values()))

        await self._write(work, durable=durable and self._durable)

    async def finish(
        self, call_id: str, outcome: Outcome, *, error_kind: str | None, error: str | None
    ) -> None:
        now = time.time()

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE audit SET outcome = ?, ended = ?, error_kind = ?, error = ? "
                "WHERE call_id = ? AND outcome = 'started'",
                (outcome, now, error_kind, error, call_id),
            )

        await self._write(work, durable=False)

    async def _write(self, work: Callable[[sqlite3.Connection], None], *, durable: bool) -> None:
        """Group commit: writes queued while one commit runs share the next one.

        The first writer to find no commit running becomes the leader and commits batches
        until the queue is empty (shielded: its followers depend on it); each write runs
        in its own savepoint, so one failing write does not fail the others.
        """
        entry = _Queued(work, durable)
        self._queue.append(entry)
        if not self._committing:
            self._committing = True
            try:
                with anyio.CancelScope(shield=True):
                    while self._queue:
                        batch, self._queue = self._queue, []
                        try:
                            await self._run(functools.partial(_commit, batch=batch))
                        except StoreUnavailable as exc:
                            for queued in batch:
                                queued.error = queued.error or exc
                        for queued in batch:
                            queued.done.set()
            finally:
                self._committing = False
        await entry.done.wait()
        if entry.error is not None:
            raise entry.error

    async def tail(self, count: int) -> list[AuditRecord]:
        def work(conn: sqlite3.Connection) -> list[AuditRecord]:
            rows = conn.execute(
                "SELECT * FROM audit ORDER BY seq DESC LIMIT ?", (max(count, 0),)
            ).fetchall()
            return [_audit(row) for row in reversed(rows)]

        return await self._run(work)

    # -- grants ----------------------------------------------------------------------------

    async def add_grant(self, grant: Grant) -> Grant:
        created = grant.created or time.time()

        def work(conn: sqlite3.Connection) -> int:
            conn.execute(f"PRAGMA synchronous={'FULL' if self._durable else 'NORMAL'}")
            conn.execute("BEGIN IMMEDIATE")
            cursor = conn.execute(
                "INSERT INTO grants (created, tool, caller, args_sha256, allow, rule, summary) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    created,
                    grant.tool,
                    grant.caller,
                    grant.args_sha256,
                    int(grant.allow),
                    grant.rule,
                    grant.summary,
                ),
            )
            conn.execute("COMMIT")
            return int(cursor.lastrowid or 0)

        grant_id = await self._run(work)
        return replace(grant, id=grant_id, created=created, session=None)

    async def find_grants(self, tool: str, caller: str, args_sha256: str) -> list[Grant]:
        def work(conn: sqlite3.Connection) -> list[Grant]:
            rows = conn.execute(
                "SELECT * FROM grants WHERE revoked IS NULL AND tool = ? AND caller = ? "
                "AND (args_sha256 IS NULL OR args_sha256 = ?) ORDER BY id",
                (tool, caller, args_sha256),
            ).fetchall()
            return [_grant(row) for row in rows]

        return await self._run(work)

    async def grants(self) -> list[Grant]:
        def work(conn: sqlite3.Connection) -> list[Grant]:
            rows = conn.execute("SELECT * FROM grants WHERE revoked IS NULL ORDER BY id")
            return [_grant(row) for row in rows.fetchall()]

        return await self._run(work)

    async def revoke_grant(self, grant_id: int) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            conn.execute("BEGIN IMMEDIATE")
            cursor = conn.execute(
                "UPDATE grants SET revoked = ? WHERE id = ? AND revoked IS NULL",
                (time.time(), grant_id),
            )
            conn.execute("COMMIT")
            return cursor.rowcount > 0

        return await self._run(work)

    # -- pending approvals -----------------------------------------------------------------

    async def add_pending(self, pending: PendingApproval) -> None:
        data = pending.to_data()

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                f"INSERT INTO pending ({', '.join(data)}) VALUES ({', '.join('?' for _ in data)})",
                tuple(data.values()),
            )
            conn.execute("COMMIT")

        await self._run(work)

    async def remove_pending(self, pending_id: str) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("DELETE FROM pending WHERE id = ?", (pending_id,))
            conn.execute("COMMIT")

        await self._run(work)

    async def pending(self) -> list[PendingApproval]:
        def work(conn: sqlite3.Connection) -> list[PendingApproval]:
            rows = conn.execute("SELECT * FROM pending ORDER BY created").fetchall()
            return [PendingApproval(**_columns(row)) for row in rows]

        return await self._run(work)
