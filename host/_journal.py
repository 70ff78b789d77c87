"""The audit journal: where a decision is made durable before its call is dispatched.

A record is appended to a memory-mapped segment file under ``.agent/journal/``: once the
bytes are copied into the mapping they belong to the operating system's page cache, so a
host that is killed, crashes or exits loses nothing it appended (SECURITY_CATALOGUE.md
H07) and the append costs about a microsecond, not a system call. ``sync`` (``msync``)
puts them on the disk too, for hosts that must survive a power cut.

A background thread (:class:`Ingester`) moves the records into the SQLite database in
batches, one transaction each, and removes a segment once everything in it is committed.
A host that died leaves its segments behind; the next host replays them (:func:`replay`)
before it closes that host's open records as ``unknown``. Readers in other processes can
read the segments of a live host too (:func:`read_segment`), so the audit shows a call the
moment it is decided.

Segment layout: records one after another, each ``length (u32 le) | crc32 (u32 le) |
msgpack body``, then zeros. The body and checksum are written before the length, so a
reader that sees a length sees a whole record, and a record torn by a crash (a zero or
wrong length, a bad checksum) ends the segment. Segments are preallocated with
``posix_fallocate``, so a full disk fails when a segment is created (as an ``OSError``
the store turns into a refusal), never as ``SIGBUS`` on a write into the mapping.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import sqlite3
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, cast

import msgpack  # pyright: ignore[reportMissingTypeStubs]

from capsule import protocol

__all__ = [
    "COLUMNS",
    "END",
    "Ingester",
    "Journal",
    "ROW",
    "read_segment",
    "replay",
    "segments",
]

logger = logging.getLogger("toolhost.audit")

SEGMENT_SIZE: Final = 4 << 20
"""Bytes preallocated per segment (about 15,000 records)."""

_HEAD: Final = struct.Struct("<II")
_NAME: Final = re.compile(r"^(?P<host>[A-Za-z0-9_.-]+)\.(?P<n>[0-9]{1,9})\.log$")

ROW: Final = 1
"""A whole audit row: ``[ROW, *values in COLUMNS order]``."""
END: Final = 2
"""A call's outcome: ``[END, call_id, outcome, ended, error_kind, error]``."""

COLUMNS: Final = (
    "call_id",
    "host_id",
    "started",
    "session",
    "caller",
    "tool",
    "outcome",
    "policy_version",
    "decision",
    "rule",
    "approval",
    "args_sha256",
    "args_size",
    "args_summary",
    "ended",
    "error_kind",
    "error",
)
"""The ``audit`` table's columns, in the order rows are journaled (``AuditRecord``'s
fields before ``seq``)."""

_OUTCOME = COLUMNS.index("outcome")
_ENDED = COLUMNS.index("ended")
_INSERT: Final = (
    f"INSERT OR IGNORE INTO audit ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
)
_UPDATE: Final = (
    "UPDATE audit SET outcome = ?, ended = ?, error_kind = ?, error = ? "
    "WHERE call_id = ? AND outcome = 'started'"
)


def segments(folder: Path) -> dict[str, list[Path]]:
    """The journal segments under ``folder`` by host id, oldest first."""
    found: dict[str, list[tuple[int, Path]]] = {}
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return {}
    for entry in entries:
        match = _NAME.match(entry.name)
        if match is not None:
            found.setdefault(match["host"], []).append((int(match["n"]), Path(entry.path)))
    return {host: [path for _, path in sorted(items)] for host, items in found.items()}


class Journal:
    """Appends records for one host to its memory-mapped segments (event-loop thread only).

    Args:
        folder: the journal folder (created private).
        host_id: the host writing; part of every segment's name.
        sync_dirs: fsync the folder when a segment is created (for power-cut safety).
    """

    def __init__(self, folder: Path, host_id: str, *, sync_dirs: bool = False) -> None:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder = folder
        self.host_id = host_id
        self._sync_dirs = sync_dirs
        self._number = 0
        self._map: mmap.mmap | None = None
        self._fd = -1
        self._offset = 0
        self._size = 0
        self.path: Path | None = None
        self._pack = cast(
            "Callable[[Any], bytes]",
            msgpack.Packer(use_bin_type=True).pack,  # pyright: ignore[reportUnknownMemberType]
        )

    def append(self, entry: Sequence[Any]) -> Path | None:
        """Append one record; returns the segment it filled and left, if it moved on.

        Raises ``OSError`` (a full disk, a removed folder) and ``ValueError`` (an entry
        msgpack cannot encode).
        """
        body = self._pack(entry)
        need = _HEAD.size + len(body)
        sealed: Path | None = None
        if self._map is None or self._offset + need > self._size:
            sealed = self._next(need)
        mapping = self._map
        assert mapping is not None
        at = self._offset
        mapping[at + 4 : at + need] = struct.pack("<I", zlib.crc32(body)) + body
        mapping[at : at + 4] = struct.pack("<I", len(body))  # last: the record now exists
        self._offset = at + need
        return sealed

    def _next(self, need: int) -> Path | None:
        sealed = self.path if self._map is not None else None
        self._number += 1
        path = self.folder / f"{self.host_id}.{self._number}.log"
        size = max(SEGMENT_SIZE, need + _HEAD.size)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)  # a full disk fails here, not in the mapping
            mapping = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        if self._sync_dirs:
            _fsync_dir(self.folder)
        self._close_map()
        self._map, self._fd, self._offset, self._size, self.path = mapping, fd, 0, size, path
        return sealed

    def sync(self) -> None:
        """Put what was appended on the disk (``msync``). Safe from a worker thread."""
        mapping = self._map
        if mapping is not None:
            mapping.flush()

    def _close_map(self) -> None:
        mapping, self._map = self._map, None
        if mapping is not None:
            mapping.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> Path | None:
        """Stop appending; returns the last segment (left for the ingester to remove)."""
        self._close_map()
        path, self.path = self.path, None
        return path


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_segment(path: Path) -> Iterator[list[Any]]:
    """The records of one segment, up to its end or its first torn record."""
    try:
        data = path.read_bytes()
    except OSError:
        return
    at, size = 0, len(data)
    while at + _HEAD.size <= size:
        length, crc = _HEAD.unpack_from(data, at)
        end = at + _HEAD.size + length
        if length == 0 or end > size:
            return
        body = data[at + _HEAD.size : end]
        if zlib.crc32(body) != crc:
            return
        try:
            entry = protocol.decode(body)
        except protocol.BadFrame as exc:
            logger.warning("%s: an unreadable audit record at byte %d: %s", path, at, exc)
            return
        if _valid(entry):
            yield entry
        else:
            logger.warning("%s: a malformed audit record at byte %d", path, at)
        at = end


def _valid(entry: object) -> bool:
    if not isinstance(entry, list) or not entry:
        return False
    items: list[Any] = entry  # pyright: ignore[reportUnknownVariableType]
    if items[0] == ROW:
        return len(items) == 1 + len(COLUMNS) and isinstance(items[1], str)
    return items[0] == END and len(items) == 6 and isinstance(items[1], str)


def apply(conn: sqlite3.Connection, entries: Sequence[list[Any]]) -> None:
    """Apply journal entries in order (inside the caller's transaction). Idempotent."""
    rows: list[Sequence[Any]] = []
    ends: list[Sequence[Any]] = []
    for entry in entries:
        if entry[0] == ROW:
            if ends:
                _flush(conn, rows, ends)
                rows, ends = [], []
            rows.append(entry[1:])
        else:
            ends.append((entry[2], entry[3], entry[4], entry[5], entry[1]))
    _flush(conn, rows, ends)


def _flush(conn: sqlite3.Connection, rows: list[Sequence[Any]], ends: list[Sequence[Any]]) -> None:
    if rows:
        conn.executemany(_INSERT, rows)
    if ends:
        conn.executemany(_UPDATE, ends)


def replay(conn: sqlite3.Connection, paths: Sequence[Path]) -> int:
    """Apply the segments of a host that is gone, then remove them. Returns the records read."""
    count = 0
    for path in paths:
        entries = list(read_segment(path))
        conn.execute("BEGIN IMMEDIATE")
        try:
            apply(conn, entries)
            conn.execute("COMMIT")
        except BaseException:
            conn.rollback()
            raise
        count += len(entries)
        with contextlib.suppress(OSError):
            path.unlink()
    return count


class Ingester:
    """Moves journaled records into SQLite on a thread of its own, in batches.

    The event loop's thread calls :meth:`row`, :meth:`end` and :meth:`seal` (each takes a
    lock for a moment, nothing else); the thread wakes every ``interval`` seconds, commits
    what has gathered in one transaction, and removes sealed segments once committed. A
    row whose outcome arrives before its batch is written is stored once, already closed.
    When a commit fails, the batch is kept and retried, and :attr:`error` says why until
    one succeeds (the store refuses new calls meanwhile: fail closed).
    """

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        *,
        interval: float = 0.05,
        backlog: int = 200_000,
    ) -> None:
        self._connect = connect
        self._interval = interval
        self.backlog = backlog
        self._cond = threading.Condition(threading.Lock())
        self._ops: list[list[Any]] = []
        self._rows: dict[str, list[Any]] = {}
        """Rows not yet handed to the thread, by call id (their outcome is merged in)."""
        self._busy = False
        self._drainers = 0
        self._stop = False
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="toolhost-audit", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        return len(self._ops)

    def row(self, entry: list[Any]) -> None:
        """Queue ``[ROW, *values]`` (the journal's own entry, shared)."""
        with self._cond:
            self._ops.append(entry)
            if entry[1 + _OUTCOME] == "started":
                self._rows[entry[1]] = entry

    def end(self, entry: list[Any]) -> None:
        """Queue ``[END, call_id, outcome, ended, error_kind, error]``."""
        with self._cond:
            row = self._rows.pop(entry[1], None)
            if row is not None:  # not written yet: store it once, closed
                row[1 + _OUTCOME] = entry[2]
                row[1 + _ENDED], row[2 + _ENDED], row[3 + _ENDED] = entry[3], entry[4], entry[5]
            else:
                self._ops.append(entry)

    def seal(self, path: Path) -> None:
        """Remove ``path`` once everything queued so far is committed."""
        with self._cond:
            self._ops.append([0, str(path)])

    def drain(self, timeout: float) -> None:
        """Block until everything queued is committed; raise ``TimeoutError`` if not in time."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._drainers += 1
            try:
                while self._ops or self._busy:
                    self._cond.notify_all()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(self.error or "the audit database is not keeping up")
                    self._cond.wait(min(left, 0.05))
            finally:
                self._drainers -= 1

    def stop(self, timeout: float) -> None:
        """Commit what is queued (up to ``timeout`` seconds) and end the thread."""
        with contextlib.suppress(TimeoutError):
            self.drain(timeout)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=max(timeout, 1.0))

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        delay = self._interval
        while True:
            with self._cond:
                if not self._stop and not self._drainers:
                    self._cond.wait(delay)  # let a batch gather (drain and stop cut it short)
                if self._stop:
                    break
                batch, self._ops = self._ops, []
                self._rows.clear()  # rows in the batch are the thread's now
                self._busy = bool(batch)
            if not batch:
                continue
            try:
                if conn is None:
                    conn = self._connect()
                self._commit(conn, batch)
            except (sqlite3.Error, OSError) as exc:
                with self._cond:
                    self.error = f"the audit database cannot be written: {exc}"
                    self._ops[:0] = batch  # kept, in order, for the next try
                    self._busy = False
                    self._cond.notify_all()
                logger.warning("%s (records kept in the journal; retrying)", self.error)
                delay = min(1.0, delay * 2)
                if conn is not None:
                    with contextlib.suppress(sqlite3.Error):
                        conn.close()
                    conn = None
                time.sleep(delay)
                continue
            delay = self._interval
            with self._cond:
                self.error = None
                self._busy = False
                self._cond.notify_all()
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    @staticmethod
    def _commit(conn: sqlite3.Connection, batch: list[list[Any]]) -> None:
        entries = [entry for entry in batch if entry[0] != 0]
        conn.execute("BEGIN IMMEDIATE")
        try:
            apply(conn, entries)
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.rollback()
            raise
        for entry in batch:
            if entry[0] == 0:
                with contextlib.suppress(OSError):
                    os.unlink(entry[1])
