"""The PostgreSQL store's own connection: wake-ups, this host's heartbeat, the reaper.

One thread of its own (never a pooled connection: ``LISTEN`` is a connection's state)
keeps one connection and, in a loop of ``poll`` seconds:

* listens on :data:`CHANNEL`: a notification carries only a pending approval's id
  (payloads are capped at 8000 bytes; the table is the truth), and wakes this process's
  waiters, which read the row again; after every (re)connect, and every ``catch_up``
  seconds, it wakes them anyway, so a notification lost while disconnected costs at most
  that long;
* writes this host's heartbeat (``hosts.seen``) every ``heartbeat`` seconds, and puts its
  row back if another replica took it for dead;
* every ``stale_after / 2`` seconds closes what hosts whose heartbeat is older than
  ``stale_after`` left open (any replica may: the updates are idempotent).

It tells the store when the connection is lost and when it is back (``on_state``): the
store refuses decisions meanwhile (fail closed), and accepts them again by itself.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import psycopg

from ._hostlock import identity

__all__ = ["CHANNEL", "GRANTS_CHANNEL", "Listener", "close_hosts"]

logger = logging.getLogger("toolhost.audit")

CHANNEL: Final = "toolhost_pending"
"""Notified with a pending approval's id when it is added, offered, answered or removed."""
GRANTS_CHANNEL: Final = "toolhost_grants"
"""Notified with a grant's id when it is given or revoked."""

_STOPPED: Final = "the host stopped before the outcome was recorded"
_WAITED: Final = "the host stopped while the call waited for an approval"


def close_hosts(conn: psycopg.Connection[Any], hosts: list[str], now: float) -> int:
    """Close what the (dead) ``hosts`` left open, in one transaction: ``started`` records
    become ``unknown``, ``waiting`` ones ``denied`` (``host_stopped``), their pending
    approvals and host rows go. Returns how many records were closed."""
    if not hosts:
        return 0
    closed = 0
    with conn.transaction():
        cur = conn.execute(
            "UPDATE audit SET outcome = 'unknown', ended = %s, error_kind = 'host_stopped', "
            "error = %s WHERE host_id = ANY(%s) AND outcome = 'started'",
            (now, _STOPPED, hosts),
        )
        closed += max(cur.rowcount, 0)
        cur = conn.execute(
            "UPDATE audit SET outcome = 'denied', ended = %s, error_kind = 'host_stopped', "
            "error = %s, approval = 'host_stopped' WHERE host_id = ANY(%s) "
            "AND outcome = 'waiting'",
            (now, _WAITED, hosts),
        )
        closed += max(cur.rowcount, 0)
        conn.execute("DELETE FROM pending WHERE host_id = ANY(%s)", (hosts,))
        conn.execute("DELETE FROM hosts WHERE host_id = ANY(%s)", (hosts,))
        if closed:
            conn.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
    return closed


class Listener:
    """The store's listening thread (see the module's docstring).

    Args:
        url: the database.
        host_id: this host (its heartbeat), or None for a process that only reads and
            answers (``toolhost inbox``).
        on_change: called (on this thread) when pending approvals may have changed.
        on_state: called (on this thread) with why the connection is lost, or None once
            it is back.
    """

    def __init__(
        self,
        url: str,
        host_id: str | None,
        *,
        on_change: Callable[[], None],
        on_state: Callable[[str | None], None],
        heartbeat: float = 2.0,
        stale_after: float = 30.0,
        catch_up: float = 1.0,
        poll: float = 0.25,
    ) -> None:
        self._url = url
        self._host_id = host_id
        self._on_change = on_change
        self._on_state = on_state
        self._heartbeat = heartbeat
        self._stale_after = stale_after
        self._catch_up = catch_up
        self._poll = poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="toolhost-pg", daemon=True)
        self.reaped = 0
        """Records this replica closed for hosts that stopped answering."""

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop and wait for the thread (call it from a worker thread: the thread may be
        waiting on the event loop)."""
        self._stop.set()
        self._thread.join(timeout)

    def _main(self) -> None:
        delay = 0.05
        while not self._stop.is_set():
            try:
                conn = psycopg.connect(
                    self._url, autocommit=True, connect_timeout=3, keepalives=1,
                    keepalives_idle=10, keepalives_interval=5, keepalives_count=3,
                )  # fmt: skip
            except psycopg.Error as exc:
                self._lost(exc)
                self._stop.wait(delay)
                delay = min(delay * 2, 2.0)
                continue
            try:
                with conn:
                    self._serve(conn)
            except psycopg.Error as exc:
                self._lost(exc)
                self._stop.wait(delay)
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.05

    def _lost(self, exc: BaseException) -> None:
        if self._stop.is_set():
            return
        text = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        with contextlib.suppress(Exception):
            self._on_state(text)

    def _serve(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(f"LISTEN {CHANNEL}")
        self._beat(conn)
        self._on_state(None)
        self._on_change()  # anything missed while disconnected is read again
        now = time.monotonic()
        beat = reap = woke = now
        while not self._stop.is_set():
            changed = False
            # The first notification ends the wait (the waiters read the table: one
            # wake-up covers every change so far); the next turn takes what follows.
            for _ in conn.notifies(timeout=self._poll, stop_after=1):
                changed = True
            now = time.monotonic()
            if now - woke >= self._catch_up:
                changed = True
            if now - beat >= self._heartbeat:
                self._beat(conn)
                beat = now
            if now - reap >= self._stale_after / 2:
                reap = now
                if self._reap(conn):
                    changed = True
            if changed:
                woke = now
                self._on_change()

    def _beat(self, conn: psycopg.Connection[Any]) -> None:
        host = self._host_id
        if host is None:
            conn.execute("SELECT 1")
            return
        cur = conn.execute("UPDATE hosts SET seen = now() WHERE host_id = %s", (host,))
        if cur.rowcount == 0:  # taken for dead while it could not beat: back in the table
            logger.warning(
                "host %s was taken for dead by another replica (no heartbeat for %gs); "
                "its open records were closed",
                host,
                self._stale_after,
            )
            conn.execute(
                "INSERT INTO hosts (host_id, identity, started) VALUES (%s, %s, %s) "
                "ON CONFLICT (host_id) DO UPDATE SET seen = now()",
                (host, identity(), time.time()),
            )

    def _reap(self, conn: psycopg.Connection[Any]) -> int:
        rows = conn.execute(
            "SELECT host_id FROM hosts WHERE seen < now() - make_interval(secs => %s) "
            "AND host_id IS DISTINCT FROM %s",
            (self._stale_after, self._host_id),
        ).fetchall()
        orphans = conn.execute(
            "SELECT DISTINCT host_id FROM audit WHERE outcome IN ('started', 'waiting') "
            "AND host_id NOT IN (SELECT host_id FROM hosts) AND started < %s",
            (time.time() - self._stale_after,),
        ).fetchall()
        stale = sorted({str(r[0]) for r in rows} | {str(r[0]) for r in orphans})
        stale = [h for h in stale if h != self._host_id]
        closed = close_hosts(conn, stale, time.time())
        self.reaped += closed
        return closed
