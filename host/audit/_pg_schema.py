"""The PostgreSQL store's schema, its migrations, and what counts as "the database is down".

The schema is versioned in ``toolhost_schema`` (one row per applied version). The host
migrates when it starts, and ``toolhost store migrate`` on demand: in one transaction
under a transaction-scoped advisory lock, so replicas starting together migrate exactly
once (the others wait, then find nothing to do), and a failed migration leaves nothing
behind. The tables mirror the SQLite store's (``_sqlite.py``, ``_session.py``,
``_pending.py``) column for column, so records, grants and their MACs are the same on
both; ``hosts`` adds ``seen``, the heartbeat by which any replica tells a host that
stopped answering from one that runs.

Runs on a worker thread with a psycopg connection; imports psycopg (only a PostgreSQL
store loads this module).
"""

from __future__ import annotations

import os
from typing import Any, Final

import psycopg
import psycopg_pool

__all__ = ["LOCK_KEY", "MIGRATIONS", "VERSION", "is_unavailable", "migrate", "version"]

LOCK_KEY: Final = 0x746F6F6C686F7374
"""The advisory lock migrations take (``toolhost`` in ASCII)."""

_V1: Final = """
CREATE TABLE audit (
    seq bigserial PRIMARY KEY,
    call_id text COLLATE "C" NOT NULL UNIQUE,
    host_id text NOT NULL,
    started double precision NOT NULL,
    ended double precision,
    session text NOT NULL,
    caller text NOT NULL,
    tool text NOT NULL,
    policy_version text,
    decision text,
    rule text,
    approval text,
    args_sha256 text,
    args_size bigint,
    args_summary text,
    outcome text NOT NULL,
    error_kind text,
    error text,
    chain text
);
CREATE INDEX audit_open ON audit (host_id) WHERE outcome IN ('started', 'waiting');
CREATE TABLE grants (
    id bigserial PRIMARY KEY,
    created double precision NOT NULL,
    tool text NOT NULL,
    caller text NOT NULL,
    args_sha256 text,
    allow integer NOT NULL,
    rule text,
    summary text,
    revoked double precision,
    rule_digest text,
    reason text,
    mac text,
    tool_digest text,
    expires double precision
);
CREATE INDEX grants_tool ON grants (tool, caller) WHERE revoked IS NULL;
CREATE TABLE pending (
    id text PRIMARY KEY,
    host_id text NOT NULL,
    created double precision NOT NULL,
    expires double precision NOT NULL,
    call_id text NOT NULL,
    session text NOT NULL,
    caller text NOT NULL,
    tool text NOT NULL,
    rule text,
    reason text,
    args_sha256 text NOT NULL,
    rendered text NOT NULL,
    description text,
    warnings text NOT NULL DEFAULT '[]',
    approvers text,
    offered integer NOT NULL DEFAULT 0,
    answer_allow integer,
    answer_remember text,
    answer_scope text,
    answer_comment text,
    answer_by text,
    answer_channel text,
    answered double precision,
    answer_mac text,
    chain text NOT NULL DEFAULT '[]'
);
CREATE TABLE meta (
    key text PRIMARY KEY,
    value text NOT NULL
);
CREATE TABLE hosts (
    host_id text PRIMARY KEY,
    identity text,
    started double precision NOT NULL,
    seen timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE kv (
    session text NOT NULL,
    key text NOT NULL,
    value bytea NOT NULL,
    size bigint NOT NULL,
    updated double precision NOT NULL,
    PRIMARY KEY (session, key)
);
CREATE TABLE attachments (
    call_id text NOT NULL,
    idx integer NOT NULL,
    session text NOT NULL,
    name text NOT NULL,
    mime_type text NOT NULL,
    size bigint NOT NULL,
    sha256 text NOT NULL,
    width integer,
    height integer,
    path text NOT NULL,
    created double precision NOT NULL,
    PRIMARY KEY (call_id, idx)
);
CREATE INDEX attachments_session ON attachments (session);
"""

_V2: Final = """
ALTER TABLE pending ADD COLUMN view_mac text;
"""
"""The MAC over what an approver is shown of a pending request (``PendingApproval.view_mac``)."""

MIGRATIONS: Final[tuple[tuple[int, str], ...]] = ((1, _V1), (2, _V2))
"""``(version, SQL)`` in order; a new version is appended, never edited."""

VERSION: Final = MIGRATIONS[-1][0]
"""The schema version this host speaks."""


def version(conn: psycopg.Connection[Any]) -> int:
    """The database's schema version (0: never migrated)."""
    found = conn.execute("SELECT to_regclass('toolhost_schema') IS NOT NULL").fetchone()
    if not found or not found[0]:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM toolhost_schema").fetchone()
    return int(row[0]) if row else 0


def migrate(conn: psycopg.Connection[Any], lock_timeout: float = 30.0) -> list[int]:
    """Bring the schema to :data:`VERSION`; returns the versions applied (none: it was).

    Raises ``RuntimeError`` when the database is newer than this host.
    """
    applied: list[int] = []
    with conn.transaction():
        conn.execute(
            "SELECT set_config('lock_timeout', %s, true)", (f"{int(lock_timeout * 1000)}ms",)
        )
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS toolhost_schema ("
            " version integer PRIMARY KEY, applied timestamptz NOT NULL DEFAULT now())"
        )
        current = version(conn)
        if current > VERSION:
            raise RuntimeError(
                f"the database's schema is version {current}, newer than this host's "
                f"({VERSION}): upgrade toolhost on this machine"
            )
        for number, sql in MIGRATIONS:
            if number > current:
                conn.execute(sql.encode())
                conn.execute("INSERT INTO toolhost_schema (version) VALUES (%s)", (number,))
                applied.append(number)
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('id', %s) ON CONFLICT (key) DO NOTHING",
            (os.urandom(16).hex(),),
        )
    return applied


_DOWN_STATES: Final = frozenset({"57P01", "57P02", "57P03"})


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means the server cannot be reached (rather than a bad statement):
    a pool that cannot hand out a connection, a broken connection, a server shutting
    down or starting. ``QueryCanceled`` and lock timeouts are operational errors too, but
    the server is there."""
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg_pool.PoolClosed):
        return True
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if isinstance(exc, psycopg.OperationalError):
        state = exc.sqlstate
        return state is None or state.startswith("08") or state in _DOWN_STATES
    return False
