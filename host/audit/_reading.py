"""Reading the audit trail back: the database's rows merged with the live journals.

A record reaches the SQLite database shortly after it is journaled, and a host that died
may leave a journal nobody has replayed yet. :func:`tail_audit` reads both, so a reader
sees every record at once and each call once (the database's copy wins; a journaled
outcome closes a record still ``started``). :func:`read_audit` does it read-only from any
process, ``SQLiteStore.tail`` with the store's own connection.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from . import _journal
from ._journal import DECIDED, ROW
from ._records import AuditRecord

__all__ = ["columns", "read_audit", "tail_audit"]


def columns(row: sqlite3.Row) -> dict[str, Any]:
    """A row as a dict of its columns."""
    return {k: row[k] for k in row.keys()}  # noqa: SIM118 - a Row iterates its values


def _audit(row: sqlite3.Row) -> AuditRecord:
    return AuditRecord(**columns(row))


def tail_audit(
    conn: sqlite3.Connection, journals: Path, count: int, *, key: bytes | None = None
) -> list[AuditRecord]:
    """The last ``count`` audit records, oldest first, from the database and the journals
    (of running hosts, or of dead ones not yet replayed) under ``journals``; journal
    records are verified against ``key`` when given (up to the first that fails)."""
    count = max(count, 0)
    rows = conn.execute("SELECT * FROM audit ORDER BY seq DESC LIMIT ?", (count,)).fetchall()
    records = {r.call_id: r for r in (_audit(row) for row in reversed(rows))}
    fresh: dict[str, AuditRecord] = {}
    ends: dict[str, list[Any]] = {}
    for host, paths in _journal.segments(journals).items():
        for path in paths:
            for entry in _journal.read_segment(path, key=key, host_id=host):
                if entry[0] in (ROW, DECIDED):
                    fresh[entry[1]] = AuditRecord(*entry[1:])
                else:
                    ends[entry[1]] = entry
    if fresh:  # journaled rows that already reached the database are the database's
        ids = list(fresh)
        for at in range(0, len(ids), 500):
            chunk = ids[at : at + 500]
            marks = ", ".join("?" * len(chunk))
            for call_id, outcome in conn.execute(
                f"SELECT call_id, outcome FROM audit WHERE call_id IN ({marks})", chunk
            ):
                record = fresh.pop(call_id)
                if outcome == "waiting" and record.outcome != "waiting":
                    if call_id in records:  # decided since: the journal's copy is newer
                        records[call_id] = record._replace(seq=records[call_id].seq)
                    else:
                        fresh[call_id] = record
    merged = list(records.values()) + list(fresh.values())
    out: list[AuditRecord] = []
    for record in merged[max(0, len(merged) - count) :] if count else []:
        end = ends.get(record.call_id)
        if end is not None and record.outcome == "started":
            record = record._replace(outcome=end[2], ended=end[3], error_kind=end[4], error=end[5])
        out.append(record)
    return out


def read_audit(path: Path, count: int) -> list[AuditRecord]:
    """The last ``count`` records of the audit trail of the database at ``path`` as any
    reader sees it, journals of running hosts included (read-only; any process)."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return tail_audit(conn, path.parent / "journal", count)
    finally:
        conn.close()
