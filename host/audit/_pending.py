"""Pending approvals in SQLite: the rows an inbox lists and answers, first answer wins.

A host writes a row when a call escalates and deletes it when the call has its answer.
While the row lives, any process with the database open (the host's own inbox, a second
host, ``toolhost inbox``) may list it, and answer it once the host has *offered* it
(its approver waits for an answer through the store). The answer is one atomic
``UPDATE ... WHERE answer IS NULL``: of two people clicking at once, exactly one wins,
and the other is told who did.

The host's approver learns of an answer given in its own process at once
(:class:`Changes`); of one given in another process, by reading the row again at a modest
interval (``InboxApprover(poll=...)``): SQLite cannot wake a reader in another process.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from typing import Any, Protocol, cast

import anyio

from ._records import AnswerResult, PendingAnswer, PendingApproval

__all__ = [
    "Changes",
    "RowLike",
    "from_row",
    "migrate",
    "insert",
    "select",
    "select_all",
    "offer",
    "answer",
    "answer_parameters",
    "outcome",
    "row_values",
    "strings",
]

_COLUMNS: dict[str, str] = {
    "description": "TEXT",
    "warnings": "TEXT NOT NULL DEFAULT '[]'",
    "approvers": "TEXT",
    "offered": "INTEGER NOT NULL DEFAULT 0",
    "answer_allow": "INTEGER",
    "answer_remember": "TEXT",
    "answer_scope": "TEXT",
    "answer_comment": "TEXT",
    "answer_by": "TEXT",
    "answer_channel": "TEXT",
    "answered": "REAL",
    "answer_mac": "TEXT",
    "chain": "TEXT NOT NULL DEFAULT '[]'",
    "view_mac": "TEXT",
}
"""Columns added to the ``pending`` table of the first schema (kept in place: rows of a
running older host stay readable)."""

_BASE = (
    "id",
    "host_id",
    "created",
    "expires",
    "call_id",
    "session",
    "caller",
    "tool",
    "rule",
    "reason",
    "args_sha256",
    "rendered",
)


def migrate(conn: sqlite3.Connection) -> None:
    """Add the columns this version needs to an existing ``pending`` table."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(pending)")}
    for name, kind in _COLUMNS.items():
        if name not in have:
            try:
                conn.execute(f"ALTER TABLE pending ADD COLUMN {name} {kind}")
            except sqlite3.OperationalError as exc:  # another process added it first
                if "duplicate column" not in str(exc):
                    raise


class RowLike(Protocol):
    """A database row by column name: ``sqlite3.Row``, or a dict (psycopg's ``dict_row``)."""

    def keys(self) -> Iterable[str]: ...

    def __getitem__(self, key: str, /) -> Any: ...


def from_row(row: RowLike) -> PendingApproval:
    """A ``pending`` row (of any backend) as a :class:`PendingApproval`."""
    keys = set(row.keys())
    base: dict[str, Any] = {name: row[name] for name in _BASE}
    answer: PendingAnswer | None = None
    if "answer_allow" in keys and row["answer_allow"] is not None:
        answer = PendingAnswer(
            allow=bool(row["answer_allow"]),
            remember=cast(Any, row["answer_remember"] or "once"),
            scope=cast(Any, row["answer_scope"] or "call"),
            comment=row["answer_comment"],
            approver=row["answer_by"],
            channel=row["answer_channel"] or "inbox",
            answered=row["answered"] or 0.0,
            mac=row["answer_mac"] if "answer_mac" in keys else None,
        )
    approvers = row["approvers"] if "approvers" in keys else None
    return PendingApproval(
        **base,
        description=row["description"] if "description" in keys else None,
        warnings=tuple(strings(row["warnings"])) if "warnings" in keys else (),
        approvers=tuple(strings(approvers)) if approvers is not None else None,
        offered=bool(row["offered"]) if "offered" in keys else False,
        answer=answer,
        chain=tuple(strings(row["chain"])) if "chain" in keys else (),
        view_mac=row["view_mac"] if "view_mac" in keys else None,
    )


def strings(text: str | None) -> list[str]:
    try:
        value: object = json.loads(text or "[]")
    except ValueError:
        return []
    items = cast("list[object]", value) if isinstance(value, list) else []
    return [item for item in items if isinstance(item, str)]


def row_values(pending: PendingApproval) -> dict[str, Any]:
    """The columns of a new ``pending`` row (no answer yet)."""
    values: dict[str, Any] = {name: getattr(pending, name) for name in _BASE}
    values["description"] = pending.description
    values["warnings"] = json.dumps(list(pending.warnings))
    values["approvers"] = None if pending.approvers is None else json.dumps(pending.approvers)
    values["offered"] = int(pending.offered)
    values["chain"] = json.dumps(list(pending.chain))
    values["view_mac"] = pending.view_mac
    return values


def insert(conn: sqlite3.Connection, pending: PendingApproval) -> None:
    values = row_values(pending)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        f"INSERT INTO pending ({', '.join(values)}) VALUES ({', '.join('?' for _ in values)})",
        tuple(values.values()),
    )
    conn.execute("COMMIT")


def select(conn: sqlite3.Connection, pending_id: str) -> PendingApproval | None:
    row = conn.execute("SELECT * FROM pending WHERE id = ?", (pending_id,)).fetchone()
    return None if row is None else from_row(row)


def select_all(conn: sqlite3.Connection) -> list[PendingApproval]:
    rows = conn.execute("SELECT * FROM pending ORDER BY created, id").fetchall()
    return [from_row(row) for row in rows]


def offer(conn: sqlite3.Connection, pending_id: str, margin: float) -> bool:
    conn.execute("BEGIN IMMEDIATE")
    cursor = conn.execute(
        "UPDATE pending SET offered = 1, expires = expires - ? WHERE id = ? AND offered = 0",
        (max(margin, 0.0), pending_id),
    )
    found = cursor.rowcount > 0 or (
        conn.execute("SELECT 1 FROM pending WHERE id = ?", (pending_id,)).fetchone() is not None
    )
    conn.execute("COMMIT")
    return found


def answer_parameters(given: PendingAnswer, pending_id: str, now: float) -> tuple[Any, ...]:
    """The parameters of the first-answer-wins ``UPDATE`` (both stores): the answer's
    fields, ``answered``, its MAC, then the request's id and ``now`` for the guard."""
    return (
        int(given.allow),
        given.remember,
        given.scope,
        given.comment,
        given.approver,
        given.channel,
        now,
        given.mac,
        pending_id,
        now,
    )


def answer(conn: sqlite3.Connection, pending_id: str, given: PendingAnswer) -> AnswerResult:
    """Record ``given`` (and its ``mac``) unless the request is gone, expired, not offered
    or answered."""
    now = given.answered or time.time()
    conn.execute("BEGIN IMMEDIATE")
    try:
        cursor = conn.execute(
            "UPDATE pending SET answer_allow = ?, answer_remember = ?, answer_scope = ?, "
            "answer_comment = ?, answer_by = ?, answer_channel = ?, answered = ?, "
            "answer_mac = ? "
            "WHERE id = ? AND answer_allow IS NULL AND offered = 1 AND expires > ?",
            answer_parameters(given, pending_id, now),
        )
        won = cursor.rowcount == 1
        current = select(conn, pending_id)
    finally:
        conn.execute("COMMIT")
    return outcome(won, current, now)


def outcome(won: bool, current: PendingApproval | None, now: float) -> AnswerResult:
    """What became of an answer: ``won`` the update, or why not (read after it)."""
    if won:
        return AnswerResult("answered", current)
    if current is None:
        return AnswerResult("gone")
    if current.answer is not None:
        return AnswerResult("answered_before", current)
    if current.expires <= now:
        return AnswerResult("expired", current)
    return AnswerResult("not_offered", current)


class Changes:
    """A version number of this process's changes to pending approvals, and a wait on it.

    Used from the store's event loop only (each change happens after a store call
    returns there)."""

    def __init__(self) -> None:
        self.version = 0
        self._event: anyio.Event | None = None

    def bump(self) -> None:
        self.version += 1
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def wait(self, seen: int, timeout: float) -> int:
        if self.version == seen:
            if self._event is None:
                self._event = anyio.Event()
            event = self._event
            with anyio.move_on_after(timeout):
                await event.wait()
        return self.version
