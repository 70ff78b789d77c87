"""A session's own durable state: its key-value store and its file area, on SQLite.

Tools reach both through their context: ``ctx.get_value``/``ctx.set_value`` read and write
the ``kv`` table (plain data, encoded by the host, keyed by session id and key), and the
files a tool returns (attachments) are written under ``files/SESSION/CALL/NAME`` next to
the database, their metadata in the ``attachments`` table. Both outlive the capsule and
the host: a host that reopens a session id finds them again.

The tables are separate from the audit trail's and written only here. Every function
runs on the store's worker thread with its connection (``SQLiteStore._run``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from ._records import StoredFile, StoreFull

__all__ = [
    "SCHEMA",
    "FileData",
    "attachment_rows",
    "get_value",
    "set_value",
    "save_files",
    "files_of",
    "safe_name",
    "too_big",
    "write_files",
]

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS kv (
    session TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    size INTEGER NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (session, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS attachments (
    call_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    session TEXT NOT NULL,
    name TEXT NOT NULL,
    mime_type TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    width INTEGER,
    height INTEGER,
    path TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (call_id, idx)
);
CREATE INDEX IF NOT EXISTS attachments_session ON attachments (session);
"""

FileData = tuple[str, str, bytes, "int | None", "int | None"]
"""One file to keep: (name, mime_type, data, width, height)."""

_ID: Final = re.compile(r"[A-Za-z0-9_.-]{1,80}", re.ASCII)
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]+", re.ASCII)
_NAME_MAX: Final = 100


def _checked_id(value: str, what: str) -> str:
    """A session or call id as a path part: the host makes them safe; never trusted."""
    if not _ID.fullmatch(value) or value.strip(".") == "":
        raise ValueError(f"{what} {value!r} cannot name a folder")
    return value


def get_value(conn: sqlite3.Connection, session: str, key: str) -> bytes | None:
    row = conn.execute(
        "SELECT value FROM kv WHERE session = ? AND key = ?", (session, key)
    ).fetchone()
    return None if row is None else bytes(row[0])


def set_value(
    conn: sqlite3.Connection, session: str, key: str, value: bytes | None, max_total: int
) -> None:
    """Store ``value`` (None: remove the key) in one transaction; raises :class:`StoreFull`
    if the session's values would take more than ``max_total`` bytes together."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if value is None:
            conn.execute("DELETE FROM kv WHERE session = ? AND key = ?", (session, key))
        else:
            row = conn.execute(
                "SELECT COALESCE(SUM(size), 0) FROM kv WHERE session = ? AND key != ?",
                (session, key),
            ).fetchone()
            too_big(int(row[0]) + len(value), max_total)
            conn.execute(
                "INSERT INTO kv (session, key, value, size, updated) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (session, key) DO UPDATE SET value = excluded.value, "
                "size = excluded.size, updated = excluded.updated",
                (session, key, value, len(value), time.time()),
            )
    except BaseException:
        conn.rollback()
        raise
    conn.execute("COMMIT")


def too_big(total: int, max_total: int) -> None:
    """Raise :class:`StoreFull` if a session's values would take ``total`` bytes."""
    if total > max_total:
        raise StoreFull(
            f"the session's values would take {total} bytes, over the limit of "
            f"{max_total} ([limits] max_session_store): remove keys you no longer "
            "need (set them to None)"
        )


def safe_name(name: str) -> str:
    """A file name that names one file in its folder and nothing else.

    The last path part only; characters outside ``A-Za-z0-9._-`` become ``_``; no leading
    dots (no hidden files, no ``..``); at most 100 characters, the extension kept.
    """
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    cleaned = _UNSAFE.sub("_", base).lstrip(".").strip("_") or "file"
    if len(cleaned) > _NAME_MAX:
        stem, dot, ext = cleaned.rpartition(".")
        if dot and 0 < len(ext) <= 16:
            cleaned = stem[: _NAME_MAX - len(ext) - 1] + "." + ext
        else:
            cleaned = cleaned[:_NAME_MAX]
    return cleaned


def _unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        stem, ext = name, ""
    n = 2
    while True:
        candidate = f"{stem}-{n}.{ext}" if ext else f"{stem}-{n}"
        if candidate not in taken:
            return candidate
        n += 1


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file at ``path`` (0600), whole or not at all."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.part")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    os.close(fd)
    os.replace(temp, path)


def save_files(
    conn: sqlite3.Connection,
    folder: Path,
    session: str,
    call_id: str,
    files: Sequence[FileData],
) -> list[StoredFile]:
    """Write one call's files under ``folder/SESSION/CALL/`` and record them."""
    stored = write_files(folder, session, call_id, files)
    now = time.time()
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany(
            "INSERT OR REPLACE INTO attachments (call_id, idx, session, name, mime_type, size, "
            "sha256, width, height, path, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            attachment_rows(folder, session, call_id, stored, now),
        )
    except BaseException:
        conn.rollback()
        raise
    conn.execute("COMMIT")
    return stored


def attachment_rows(
    folder: Path, session: str, call_id: str, stored: Sequence[StoredFile], now: float
) -> list[tuple[object, ...]]:
    """The ``attachments`` rows of one call's files, in the table's column order."""
    return [
        (
            call_id,
            i,
            session,
            f.name,
            f.mime_type,
            f.size,
            f.sha256,
            f.width,
            f.height,
            os.path.relpath(f.path, folder),
            now,
        )
        for i, f in enumerate(stored)
    ]


def write_files(
    folder: Path, session: str, call_id: str, files: Sequence[FileData]
) -> list[StoredFile]:
    """Write one call's files under ``folder/SESSION/CALL/`` (names made safe and unique);
    returns them as kept. Recording them is the caller's."""
    where = folder / _checked_id(session, "session id") / _checked_id(call_id, "call id")
    for part in (folder, where.parent, where):
        with contextlib.suppress(FileExistsError):
            part.mkdir(mode=0o700)
    taken: set[str] = set()
    stored: list[StoredFile] = []
    for name, mime_type, data, width, height in files:
        safe = _unique(safe_name(name), taken)
        taken.add(safe)
        path = where / safe
        _write_private(path, data)
        stored.append(
            StoredFile(
                name=safe,
                mime_type=mime_type,
                size=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
                width=width,
                height=height,
                path=str(path),
            )
        )
    return stored


def files_of(conn: sqlite3.Connection, folder: Path, call_id: str) -> list[StoredFile]:
    """The files kept for one call, in the order the tool returned them."""
    rows = conn.execute(
        "SELECT name, mime_type, size, sha256, width, height, path FROM attachments "
        "WHERE call_id = ? ORDER BY idx",
        (call_id,),
    ).fetchall()
    return [
        StoredFile(row[0], row[1], row[2], row[3], row[4], row[5], str(folder / row[6]))
        for row in rows
    ]
