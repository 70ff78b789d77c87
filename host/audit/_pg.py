"""The :class:`~host.audit._records.Store` on PostgreSQL, shared by several hosts.

Several host processes (replicas behind a load balancer, one per worker, on one machine
or many) open :class:`PgStore` on one database and share everything the SQLite store
holds: the audit trail, grants (a grant given on one replica answers the next call on
any), pending approvals (created by the replica running the call, answerable through any
replica's inbox or API, the first answer winning), and each session's key-value state and
file metadata (the files themselves stay on the disk of the replica that kept them).

The call path does not wait on the network: an audit record goes to this host's
memory-mapped journal first, as with SQLite (``_journaled.py``), and the journal's writer
process moves it into PostgreSQL (``_journal.PgConnection``). Everything else runs on a
pool of connections (psycopg 3, sync, through ``anyio.to_thread`` with a limiter: one
code path under asyncio and trio). One more connection, on a thread of its own, listens
for wake-ups, beats this host's heartbeat and closes what dead hosts left
(``_pg_listen.py``). The schema and its migrations are in ``_pg_schema.py``.

Failure: when the server cannot be reached every store call raises
:class:`~host.audit._records.StoreUnavailable`, and decisions are refused (fail closed)
until the listener is connected again and the writer has caught up; the pool and the
listener reconnect by themselves. A record journaled before the outage reaches the
database after it (the writer retries; its inserts are idempotent), so none is lost or
written twice.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.from_thread
import anyio.lowlevel
import psycopg
import psycopg_pool
from psycopg.rows import dict_row

from host.trust import HostKey, host_key

from . import _journal, _pending, _session
from ._hostlock import HostLock, identity, same_machine
from ._journal import Journal, PgConnection
from ._journaled import Durability, JournaledStore, grant_values, new_grant_values
from ._pg_listen import CHANNEL, GRANTS_CHANNEL, Listener, close_hosts
from ._pg_schema import VERSION, is_unavailable, migrate, version
from ._records import (
    AnswerResult,
    AuditRecord,
    Grant,
    PendingAnswer,
    PendingApproval,
    StoredFile,
    StoreUnavailable,
)

__all__ = ["PgStore", "check_url", "migrate_url", "redacted_url"]

logger = logging.getLogger("toolhost.audit")

_T = TypeVar("_T")
_Conn = psycopg.Connection[Any]


def redacted_url(url: str) -> str:
    """``url`` without its password (what errors, logs and ``repr`` may show)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "postgresql://(unreadable URL)"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{user}:***@{host}{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _dicts(conn: _Conn, sql: Any, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql, params)
        return cur.fetchall()


class PgStore(JournaledStore):
    """The :class:`Store` on one PostgreSQL database, shared by several hosts.

    Args:
        url: ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?...]`` (libpq's URL).
        folder: this host's local state folder (its journal, its lock, the files tools
            return): ``PROJECT/.agent/postgres`` when the host opens it.
        durability: as for :class:`~host.audit.SQLiteStore` (the journal's).
        busy_timeout: seconds to wait for a connection (or a lock) before a call gives up
            with :class:`StoreUnavailable`.
        interval: seconds between the journal's batches into the database.
        key: the key the journal's records, grants and answers are signed with (default:
            the host's key). Replicas on several machines need the same key (the same
            key file, ``TOOLHOST_KEY_FILE``) to trust each other's grants and answers.
        pool_size: connections in the pool (and worker threads using them at once).
        heartbeat: seconds between two heartbeats of this host.
        stale_after: seconds without a heartbeat after which any replica takes a host for
            dead and closes what it left open (``unknown``; ``denied`` for a call that
            waited for an approval).
        catch_up: seconds between two reads of the pending approvals even without a
            notification.
    """

    def __init__(
        self,
        url: str,
        *,
        folder: str | Path,
        durability: Durability = "process",
        busy_timeout: float = 5.0,
        interval: float = 0.05,
        key: HostKey | None = None,
        pool_size: int = 8,
        heartbeat: float = 2.0,
        stale_after: float = 30.0,
        catch_up: float = 1.0,
    ) -> None:
        super().__init__(
            Path(folder),
            durability=durability,
            busy_timeout=busy_timeout,
            interval=interval,
            key=key,
        )
        self.url = url
        self._pool_size = pool_size
        self._heartbeat = heartbeat
        self._stale_after = stale_after
        self._catch_up = catch_up
        self._pool: psycopg_pool.ConnectionPool[_Conn] | None = None
        self._limiter = anyio.CapacityLimiter(pool_size)
        self._listener: Listener | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self.down: str | None = "not connected yet"
        """Why the database cannot be reached now (the listener's connection is lost);
        None while it can. Decisions are refused meanwhile."""

    def __repr__(self) -> str:
        state = "open" if self._pool is not None else "closed"
        return f"<PgStore {self.where} {state}>"

    @property
    def where(self) -> str:
        return redacted_url(self.url)

    def _writer_url(self) -> str | None:
        return self.url

    def _scrub(self, text: str) -> str:
        password = urlsplit(self.url).password if "@" in self.url else None
        return text.replace(password, "***") if password else text

    # -- connections ------------------------------------------------------------------------

    def _make_pool(self) -> psycopg_pool.ConnectionPool[_Conn]:
        pool: psycopg_pool.ConnectionPool[_Conn] | None = None

        def check(conn: _Conn) -> None:
            try:
                psycopg_pool.ConnectionPool.check_connection(conn)
            except Exception:
                if pool is not None:  # after a restart every idle connection is dead
                    pool.drain()
                raise

        pool = psycopg_pool.ConnectionPool(
            self.url,
            min_size=1,
            max_size=self._pool_size,
            open=False,
            timeout=self._busy_timeout,
            check=check,
            reconnect_timeout=2.0,
            name="toolhost",
            kwargs={
                "autocommit": True,
                "connect_timeout": max(1, int(self._busy_timeout)),
                "keepalives": 1,
                "keepalives_idle": 10,
                "keepalives_interval": 5,
                "keepalives_count": 3,
            },
        )
        return pool

    def _error(self, exc: BaseException) -> StoreUnavailable:
        what = "cannot be reached" if is_unavailable(exc) else "failed"
        text = self._scrub(f"{type(exc).__name__}: {str(exc).strip()[:500]}")
        return StoreUnavailable(f"the PostgreSQL store {self.where} {what}: {text}")

    async def _run(self, fn: Callable[[_Conn], _T]) -> _T:
        pool = self._pool
        if pool is None:
            raise StoreUnavailable(f"the PostgreSQL store {self.where} is not open")

        def work() -> _T:
            try:
                with pool.connection() as conn:
                    return fn(conn)
            except (psycopg.Error, OSError) as exc:
                raise self._error(exc) from None

        return await anyio.to_thread.run_sync(work, limiter=self._limiter)

    async def _connect(self) -> None:
        """Open the pool, migrate the schema, read the database's id and the key."""
        self._pool = pool = self._make_pool()
        self._token = anyio.lowlevel.current_token()

        def open_pool() -> str:
            try:
                pool.open(wait=True, timeout=self._busy_timeout)
                with pool.connection() as conn:
                    applied = migrate(conn, lock_timeout=max(self._busy_timeout, 30.0))
                    if applied:
                        logger.info("migrated %s to schema %s", self.where, applied)
                    row = conn.execute("SELECT value FROM meta WHERE key = 'id'").fetchone()
            except (psycopg.Error, OSError) as exc:
                with contextlib.suppress(Exception):
                    pool.close(timeout=1.0)
                raise self._error(exc) from None
            except RuntimeError as exc:  # a newer schema than this host's
                with contextlib.suppress(Exception):
                    pool.close(timeout=1.0)
                raise StoreUnavailable(f"the PostgreSQL store {self.where}: {exc}") from None
            self._key = self._key or host_key()
            return str(row[0]) if row else ""

        try:
            self._db_id = await anyio.to_thread.run_sync(open_pool, limiter=self._limiter)
        except BaseException:
            self._pool = None
            raise
        self.down = None

    def _start_listener(self, host_id: str | None) -> None:
        token = self._token

        def on_change() -> None:
            if token is not None:
                with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                    anyio.from_thread.run_sync(self._changes.bump, token=token)

        def on_state(why: str | None) -> None:
            why = None if why is None else self._scrub(why)
            if why is not None and self.down is None:
                logger.warning("the PostgreSQL store %s cannot be reached: %s", self.where, why)
            elif why is None and self.down is not None and self._listener is not None:
                logger.info("the PostgreSQL store %s is reachable again", self.where)
            self.down = why

        self._listener = listener = Listener(
            self.url,
            host_id,
            on_change=on_change,
            on_state=on_state,
            heartbeat=self._heartbeat,
            stale_after=self._stale_after,
            catch_up=self._catch_up,
        )
        listener.start()

    async def attach(self) -> None:
        """Open the database to read it and answer pending approvals, as a process that
        makes no calls (``toolhost inbox``): no host row, no journal, no writer."""
        await self._connect()
        self._start_listener(None)

    async def start(self, host_id: str) -> int:
        await self._connect()
        try:
            return await self._start(host_id)
        except BaseException:
            with anyio.CancelScope(shield=True):  # nothing of a host that did not start stays
                await self.aclose()
            raise

    async def _start(self, host_id: str) -> int:
        self.host_id = host_id

        def register(conn: _Conn) -> None:
            conn.execute(
                "INSERT INTO hosts (host_id, identity, started) VALUES (%s, %s, %s) "
                "ON CONFLICT (host_id) DO UPDATE SET identity = excluded.identity, "
                "started = excluded.started, seen = now()",
                (host_id, identity(), time.time()),
            )

        await self._run(register)

        def local() -> None:
            key = self._key
            assert key is not None
            try:
                self._lock = HostLock(self._hosts, host_id)
                self._journal = Journal(
                    self._journals, host_id, key.secret, sync_dirs=self.durability == "power"
                )
            except OSError as exc:
                raise StoreUnavailable(f"cannot open the host's journal: {exc}") from exc

        await anyio.to_thread.run_sync(local)
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
        self._start_listener(host_id)
        return closed

    async def reconcile(self) -> int:
        """Close what every host that is gone left open: the journals of this machine's
        dead hosts (replayed), and the records and pending approvals of every host that is
        dead (its lock is free, on this machine) or silent (no heartbeat for
        ``stale_after`` seconds, on any). Returns how many records were closed."""
        mine = self.host_id
        key = self._key
        assert key is not None
        damage: list[str] = []
        stale_after = self._stale_after
        folder = self._hosts
        journals = self._journals

        def work(conn: _Conn) -> int:
            rows = conn.execute(
                "SELECT host_id, identity, seen < now() - make_interval(secs => %s) FROM hosts",
                (stale_after,),
            ).fetchall()
            known: dict[str, tuple[str | None, bool]] = {
                str(r[0]): (r[1], bool(r[2])) for r in rows
            }

            def local_dead(host: str) -> bool:
                ident = known.get(host, (None, False))[0]
                return HostLock.is_dead(folder, host, ident)

            def dead(host: str) -> bool:
                if host == mine:
                    return False
                found = known.get(host)
                if found is None or found[1]:
                    return True
                return same_machine(found[0]) and local_dead(host)

            for host, paths in _journal.segments(journals).items():
                if host != mine and local_dead(host):
                    replayed = _journal.replay(
                        PgConnection(conn), paths, key=key.secret, host_id=host
                    )
                    damage.extend(f"host {host}'s journal: {d}" for d in replayed.damage)
            open_hosts = [
                str(r[0])
                for r in conn.execute(
                    "SELECT DISTINCT host_id FROM audit WHERE outcome IN ('started', 'waiting') "
                    "UNION SELECT DISTINCT host_id FROM pending UNION SELECT host_id FROM hosts"
                ).fetchall()
            ]
            return close_hosts(conn, [h for h in open_hosts if dead(h)], time.time())

        closed = await self._run(work)
        for text in damage:
            self._tell("journal", text)
        return closed

    async def aclose(self) -> None:
        listener, self._listener = self._listener, None
        journal, self._journal = self._journal, None
        ingester, self._ingester = self._ingester, None
        with anyio.CancelScope(shield=True):
            if listener is not None:
                await anyio.to_thread.run_sync(listener.stop)
            if journal is not None:
                journal.close()
            if ingester is not None:  # it writes the rest and removes the journal
                await anyio.to_thread.run_sync(ingester.stop, self._busy_timeout + 5.0)
            host = self.host_id
            if host is not None and self._pool is not None:
                with contextlib.suppress(StoreUnavailable):

                    def leave(conn: _Conn) -> None:
                        with conn.transaction():
                            conn.execute("DELETE FROM pending WHERE host_id = %s", (host,))
                            conn.execute("DELETE FROM hosts WHERE host_id = %s", (host,))

                    await self._run(leave)
            pool, self._pool = self._pool, None
            if pool is not None:
                await anyio.to_thread.run_sync(functools.partial(pool.close, timeout=5.0))
            lock, self._lock = self._lock, None
            if lock is not None:
                lock.release()

    # -- audit ------------------------------------------------------------------------------

    def record(self, record: AuditRecord, *, durable: bool) -> Awaitable[None]:
        down = self.down
        if durable and down is not None:  # fail closed: the writer could not follow
            raise StoreUnavailable(
                f"the PostgreSQL store {self.where} cannot be reached ({self._scrub(down)}); "
                "calls are refused until it is back"
            )
        return super().record(record, durable=durable)

    async def tail(self, count: int) -> list[AuditRecord]:
        """The last ``count`` records of every host, oldest first (this host's own
        records are flushed first; another's appear once its writer moved them, within
        its ``interval``)."""
        with contextlib.suppress(StoreUnavailable):
            await self.flush()

        def work(conn: _Conn) -> list[dict[str, Any]]:
            return _dicts(
                conn,
                "SELECT * FROM (SELECT * FROM audit ORDER BY seq DESC LIMIT %s) t ORDER BY seq",
                (max(count, 0),),
            )

        return [AuditRecord(**row) for row in await self._run(work)]

    # -- grants -----------------------------------------------------------------------------

    async def add_grant(self, grant: Grant) -> Grant:
        created = grant.created or time.time()
        values = new_grant_values(grant, created)

        def work(conn: _Conn) -> int:
            with conn.transaction():
                row = conn.execute(
                    "INSERT INTO grants (created, tool, caller, args_sha256, allow, rule, "
                    "rule_digest, reason, summary, tool_digest, expires) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
                    tuple(values[n] for n in values if n != "revoked"),
                ).fetchone()
                assert row is not None
                grant_id = int(row[0])
                conn.execute(
                    "UPDATE grants SET mac = %s WHERE id = %s",
                    (self._grant_mac({**values, "id": grant_id}), grant_id),
                )
                conn.execute("SELECT pg_notify(%s, %s)", (GRANTS_CHANNEL, str(grant_id)))
            return grant_id

        grant_id = await self._run(work)
        return replace(grant, id=grant_id, created=created, session=None)

    async def find_grants(self, tool: str, caller: str, args_sha256: str) -> list[Grant]:
        def work(conn: _Conn) -> list[dict[str, Any]]:
            return _dicts(
                conn,
                "SELECT * FROM grants WHERE revoked IS NULL AND (expires IS NULL OR expires > %s) "
                "AND tool = %s AND caller = %s "
                "AND (args_sha256 IS NULL OR args_sha256 = %s) ORDER BY id",
                (time.time(), tool, caller, args_sha256),
            )

        return self._verified(await self._run(work))

    async def grants(self) -> list[Grant]:
        def work(conn: _Conn) -> list[dict[str, Any]]:
            return _dicts(
                conn,
                "SELECT * FROM grants WHERE revoked IS NULL AND (expires IS NULL OR expires > %s) "
                "ORDER BY id",
                (time.time(),),
            )

        return self._verified(await self._run(work))

    async def revoke_grant(self, grant_id: int) -> bool:
        def work(conn: _Conn) -> bool:
            with conn.transaction():
                rows = _dicts(
                    conn,
                    "SELECT * FROM grants WHERE id = %s AND revoked IS NULL FOR UPDATE",
                    (grant_id,),
                )
                if not rows:
                    return False
                # Signed again with the time of revocation (as SQLiteStore does).
                values = grant_values(rows[0])
                values["revoked"] = time.time()
                conn.execute(
                    "UPDATE grants SET revoked = %s, mac = %s WHERE id = %s",
                    (values["revoked"], self._grant_mac(values), grant_id),
                )
                conn.execute("SELECT pg_notify(%s, %s)", (GRANTS_CHANNEL, str(grant_id)))
            return True

        return await self._run(work)

    # -- pending approvals ------------------------------------------------------------------

    async def add_pending(self, pending: PendingApproval) -> None:
        values = _pending.row_values(self._signed_view(pending))

        def work(conn: _Conn) -> None:
            with conn.transaction():
                conn.execute(
                    f"INSERT INTO pending ({', '.join(values)}) "  # names from _pending
                    f"VALUES ({', '.join('%s' for _ in values)})".encode(),
                    tuple(values.values()),
                )
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, pending.id))

        await self._run(work)
        self._changes.bump()

    async def remove_pending(self, pending_id: str) -> None:
        def work(conn: _Conn) -> None:
            with conn.transaction():
                conn.execute("DELETE FROM pending WHERE id = %s", (pending_id,))
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, pending_id))

        await self._run(work)
        self._changes.bump()

    async def pending(self) -> list[PendingApproval]:
        def work(conn: _Conn) -> list[dict[str, Any]]:
            return _dicts(conn, "SELECT * FROM pending ORDER BY created, id")

        rows = await self._run(work)
        return [
            checked
            for row in rows
            if (checked := self._checked(_pending.from_row(row))) is not None
        ]

    async def get_pending(self, pending_id: str) -> PendingApproval | None:
        def work(conn: _Conn) -> list[dict[str, Any]]:
            return _dicts(conn, "SELECT * FROM pending WHERE id = %s", (pending_id,))

        rows = await self._run(work)
        return self._checked(_pending.from_row(rows[0])) if rows else None

    async def offer_pending(self, pending_id: str, margin: float = 0.0) -> bool:
        def work(conn: _Conn) -> bool:
            with conn.transaction():
                cur = conn.execute(
                    "UPDATE pending SET offered = 1, expires = expires - %s "
                    "WHERE id = %s AND offered = 0",
                    (max(margin, 0.0), pending_id),
                )
                found = cur.rowcount > 0 or (
                    conn.execute("SELECT 1 FROM pending WHERE id = %s", (pending_id,)).fetchone()
                    is not None
                )
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, pending_id))
            return found

        offered = await self._run(work)
        self._changes.bump()
        return offered

    async def answer_pending(self, pending_id: str, answer: PendingAnswer) -> AnswerResult:
        key = self._key
        if key is None:
            raise StoreUnavailable(f"the PostgreSQL store {self.where} is not open")
        answer = replace(answer, answered=answer.answered or time.time())
        given = replace(answer, mac=key.mac("answer", *self._answer_parts(pending_id, answer)))
        now = given.answered

        def work(conn: _Conn) -> AnswerResult:
            with conn.transaction():
                # First answer wins: a concurrent update waits on the row's lock, then
                # finds ``answer_allow`` set and changes nothing.
                cur = conn.execute(
                    "UPDATE pending SET answer_allow = %s, answer_remember = %s, "
                    "answer_scope = %s, answer_comment = %s, answer_by = %s, "
                    "answer_channel = %s, answered = %s, answer_mac = %s WHERE id = %s "
                    "AND answer_allow IS NULL AND offered = 1 AND expires > %s",
                    _pending.answer_parameters(given, pending_id, now),
                )
                won = cur.rowcount == 1
                rows = _dicts(conn, "SELECT * FROM pending WHERE id = %s", (pending_id,))
                if won:
                    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, pending_id))
            return _pending.outcome(won, _pending.from_row(rows[0]) if rows else None, now)

        result = await self._run(work)
        self._changes.bump()
        return self._answered(result)

    # -- a session's own state --------------------------------------------------------------

    async def get_value(self, session: str, key: str) -> bytes | None:
        def work(conn: _Conn) -> bytes | None:
            row = conn.execute(
                "SELECT value FROM kv WHERE session = %s AND key = %s", (session, key)
            ).fetchone()
            return None if row is None else bytes(row[0])

        return await self._run(work)

    async def set_value(
        self, session: str, key: str, value: bytes | None, *, max_total: int
    ) -> None:
        lock = int.from_bytes(hashlib.blake2b(session.encode(), digest_size=8).digest(), "big")
        lock -= 1 << 63  # a signed bigint: the session's own advisory lock

        def work(conn: _Conn) -> None:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
                if value is None:
                    conn.execute("DELETE FROM kv WHERE session = %s AND key = %s", (session, key))
                    return
                row = conn.execute(
                    "SELECT coalesce(sum(size), 0) FROM kv WHERE session = %s AND key != %s",
                    (session, key),
                ).fetchone()
                _session.too_big(int(row[0] if row else 0) + len(value), max_total)
                conn.execute(
                    "INSERT INTO kv (session, key, value, size, updated) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (session, key) DO UPDATE SET "
                    "value = excluded.value, size = excluded.size, updated = excluded.updated",
                    (session, key, value, len(value), time.time()),
                )

        await self._run(work)

    async def save_files(
        self,
        session: str,
        call_id: str,
        files: Sequence[_session.FileData],
    ) -> list[StoredFile]:
        folder = self.files_dir
        try:
            stored = await anyio.to_thread.run_sync(
                _session.write_files, folder, session, call_id, files
            )
        except OSError as exc:
            raise StoreUnavailable(f"the files of call {call_id} cannot be kept: {exc}") from exc
        rows = _session.attachment_rows(folder, session, call_id, stored, time.time())

        def work(conn: _Conn) -> None:
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO attachments (call_id, idx, session, name, mime_type, size, "
                    "sha256, width, height, path, created) VALUES "
                    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (call_id, idx) "
                    "DO UPDATE SET session = excluded.session, name = excluded.name, "
                    "mime_type = excluded.mime_type, size = excluded.size, "
                    "sha256 = excluded.sha256, width = excluded.width, "
                    "height = excluded.height, path = excluded.path, created = excluded.created",
                    rows,
                )

        await self._run(work)
        return stored

    async def files(self, call_id: str) -> list[StoredFile]:
        folder = self.files_dir

        def work(conn: _Conn) -> list[StoredFile]:
            rows = conn.execute(
                "SELECT name, mime_type, size, sha256, width, height, path FROM attachments "
                "WHERE call_id = %s ORDER BY idx",
                (call_id,),
            ).fetchall()
            return [
                StoredFile(r[0], r[1], r[2], r[3], r[4], r[5], str(folder / r[6])) for r in rows
            ]

        return await self._run(work)


# -- the store's maintenance (``toolhost store``) ---------------------------------------------


def migrate_url(url: str, timeout: float = 10.0) -> list[int]:
    """Bring the schema of the database at ``url`` up to date; the versions applied."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(timeout))) as conn:
            return migrate(conn, lock_timeout=max(timeout, 30.0))
    except psycopg.Error as exc:
        raise _url_error(url, exc) from None
    except RuntimeError as exc:
        raise StoreUnavailable(f"the PostgreSQL store {redacted_url(url)}: {exc}") from None


def check_url(url: str, stale_after: float = 30.0, timeout: float = 10.0) -> dict[str, Any]:
    """What ``toolhost store check`` reports: the schema, the hosts, what the tables hold."""
    report: dict[str, Any] = {"url": redacted_url(url), "expected": VERSION}
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(timeout))) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            report["server"] = str(row[0]) if row else "?"
            report["schema"] = current = version(conn)
            if current == 0:
                return report
            report["hosts"] = _dicts(
                conn,
                "SELECT host_id, identity IS NOT NULL AS known, "
                "extract(epoch FROM now() - seen)::float AS silent_for, "
                "seen < now() - make_interval(secs => %s) AS stale FROM hosts ORDER BY started",
                (stale_after,),
            )
            for table, where in (
                ("audit", ""),
                ("audit", " WHERE outcome IN ('started', 'waiting')"),
                ("grants", " WHERE revoked IS NULL"),
                ("pending", ""),
            ):
                name = table if not where else f"{table}_{'open' if table == 'audit' else 'live'}"
                counted = conn.execute(f"SELECT count(*) FROM {table}{where}".encode()).fetchone()
                report[name] = int(counted[0]) if counted else 0
    except psycopg.Error as exc:
        raise _url_error(url, exc) from None
    return report


def _url_error(url: str, exc: psycopg.Error) -> StoreUnavailable:
    password = urlsplit(url).password if "@" in url else None
    text = f"{type(exc).__name__}: {str(exc).strip()[:500]}"
    if password:
        text = text.replace(password, "***")
    what = "cannot be reached" if is_unavailable(exc) else "failed"
    return StoreUnavailable(f"the PostgreSQL store {redacted_url(url)} {what}: {text}")
