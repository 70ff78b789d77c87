"""The audit journal: where a decision is made durable before its call is dispatched.

A record is appended to a memory-mapped segment file under ``.agent/journal/``: once the
bytes are copied into the mapping they belong to the operating system's page cache, so a
host that is killed, crashes or exits loses nothing it appended, and the append costs
about a microsecond, not a system call. ``sync`` (``msync``) puts them on the disk too,
for hosts that must survive a power cut.

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
import subprocess
import sys
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
    "chain",
)
"""The ``audit`` table's columns, in the order rows are journaled (``AuditRecord``'s
fields before ``seq``). ``chain`` came last, later: a row journaled without it (by an
older host) is read with ``chain`` None."""

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

    def append(self, entry: Sequence[Any]) -> None:
        """Append one record (to a new segment when this one is full).

        Raises ``OSError`` (a full disk, a removed folder) and ``ValueError`` (an entry
        msgpack cannot encode).
        """
        body = self._pack(entry)
        need = _HEAD.size + len(body)
        if self._map is None or self._offset + need > self._size:
            self._next(need)
        mapping = self._map
        assert mapping is not None
        at = self._offset
        mapping[at + 4 : at + need] = struct.pack("<I", zlib.crc32(body)) + body
        mapping[at : at + 4] = struct.pack("<I", len(body))  # last: the record now exists
        self._offset = at + need

    def _next(self, need: int) -> None:
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
        if self._sync_dirs:  # power-cut safety: the new name, and the old segment's tail
            _fsync_dir(self.folder)
            if self._map is not None:
                self._map.flush()  # a sync already waiting would flush the new mapping
        self._close_map()
        self._map, self._fd, self._offset, self._size, self.path = mapping, fd, 0, size, path

    @property
    def position(self) -> tuple[int, int]:
        """Where the next record goes: (segment number, byte)."""
        return (self._number, self._offset)

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

    def close(self) -> None:
        """Stop appending (the writer removes the segments once they are written)."""
        self._close_map()
        self.path = None


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_segment(path: Path) -> Iterator[list[Any]]:
    """The records of one segment, up to its end or its first torn record."""
    entries, _ = _read_from(path, 0)
    return iter(entries)


def _valid(entry: object) -> bool:
    if not isinstance(entry, list) or not entry:
        return False
    items: list[Any] = entry  # pyright: ignore[reportUnknownVariableType]
    if items[0] == ROW:
        if len(items) == len(COLUMNS):  # journaled before ``chain`` existed
            items.append(None)
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


def _connect(db: str, busy_timeout: float, durability: str) -> sqlite3.Connection:
    conn = sqlite3.connect(db, timeout=busy_timeout, isolation_level=None)
    conn.execute(f"PRAGMA synchronous={'FULL' if durability == 'power' else 'NORMAL'}")
    return conn


def _segment_path(folder: Path, host_id: str, number: int) -> Path:
    return folder / f"{host_id}.{number}.log"


def _read_from(path: Path, offset: int) -> tuple[list[list[Any]], int]:
    """The whole records of ``path`` from byte ``offset`` on, and where they end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return [], offset
    try:
        size = os.fstat(fd).st_size
        if size <= offset + _HEAD.size:
            return [], offset
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as data:
            entries: list[list[Any]] = []
            at = offset
            while at + _HEAD.size <= size:
                length, crc = _HEAD.unpack_from(data, at)
                end = at + _HEAD.size + length
                if length == 0 or end > size:
                    break
                body = data[at + _HEAD.size : end]
                if zlib.crc32(body) != crc:
                    break  # being written, or torn: read again next time
                try:
                    entry = protocol.decode(body)
                except protocol.BadFrame:
                    entry = None
                if _valid(entry):
                    entries.append(entry)  # pyright: ignore[reportArgumentType]
                else:
                    logger.warning("%s: a malformed audit record at byte %d", path, at)
                at = end
            return entries, at
    finally:
        os.close(fd)


def serve(
    db: str, folder: Path, host_id: str, interval: float, busy_timeout: float, durability: str
) -> int:
    """The audit writer process: follows one host's journal into the database.

    Commands on stdin, one a line: ``drain`` (write what is there now), ``stop`` (the host
    is done appending: write everything, remove the segments, exit). End of input means
    the host is gone: the same as ``stop``. Reports on stdout, one a line: ``done N OFFSET``
    (everything before that segment and byte is in the database), ``error TEXT``.
    """
    import select

    numbers = sorted(int(p.name.split(".")[-2]) for p in folder.glob(f"{host_id}.*.log"))
    number = numbers[0] if numbers else 1
    offset = 0
    conn: sqlite3.Connection | None = None
    out = os.fdopen(1, "w", buffering=1, encoding="utf-8", errors="replace")

    def report(line: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # the host may be gone: carry on
            out.write(line)

    failing = False
    final = False
    give_up: float | None = None
    while True:
        ready, _, _ = select.select(
            [0], [], [], interval if not failing else min(1.0, interval * 20)
        )
        if ready:
            data = os.read(0, 4096)
            if not data or b"stop" in data:
                final = True
        entries: list[list[Any]] = []
        done: list[Path] = []
        at_number, at_offset = number, offset
        while len(entries) < 50_000:
            path = _segment_path(folder, host_id, at_number)
            later = _segment_path(folder, host_id, at_number + 1).exists()  # before reading
            new, at_offset = _read_from(path, at_offset)
            entries.extend(new)
            if later or (final and not new):
                done.append(path)
                at_number, at_offset = at_number + 1, 0
                if later:
                    continue
            break
        try:
            if entries:
                if conn is None:
                    conn = _connect(db, busy_timeout, durability)
                conn.execute("BEGIN IMMEDIATE")
                try:
                    apply(conn, _merged(entries))
                    conn.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        conn.rollback()
                    raise
        except (sqlite3.Error, OSError) as exc:
            failing = True
            text = str(exc).replace("\n", " ")
            report(f"error the audit database cannot be written: {text}\n")
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
                conn = None
            if final:
                if give_up is None:
                    give_up = time.monotonic() + max(30.0, busy_timeout * 3)
                elif time.monotonic() > give_up:
                    return 1  # the journal stays: the next host replays it
            continue
        failing = False
        for path in done:
            with contextlib.suppress(OSError):
                path.unlink()
        number, offset = at_number, at_offset
        report(f"done {number} {offset}\n")
        if final and not entries:
            break
    if conn is not None:
        conn.close()
    return 0


def _merged(entries: list[list[Any]]) -> list[list[Any]]:
    """``entries`` with each outcome folded into its row when both are here (one write)."""
    rows: dict[str, list[Any]] = {}
    out: list[list[Any]] = []
    for entry in entries:
        if entry[0] == ROW:
            row = list(entry)
            out.append(row)
            if row[1 + _OUTCOME] == "started":
                rows[row[1]] = row
            continue
        row = rows.pop(entry[1], None)
        if row is None:
            out.append(entry)
        else:
            row[1 + _OUTCOME] = entry[2]
            row[1 + _ENDED], row[2 + _ENDED], row[3 + _ENDED] = entry[3], entry[4], entry[5]
    return out


class Ingester:
    """The host's handle on its audit writer: a process of its own (``serve``), so moving
    records into SQLite takes nothing from the host's interpreter (no lock, no GIL).

    The host only appends to the journal; the writer follows it. :attr:`error` is set while
    the database cannot be written (the store refuses new calls: fail closed), and the
    writer is started again if it dies. :meth:`drain` waits until what the journal holds
    at that moment is in the database.
    """

    def __init__(
        self,
        db: Path,
        folder: Path,
        host_id: str,
        *,
        interval: float,
        busy_timeout: float,
        durability: str,
    ) -> None:
        self._argv = [
            sys.executable,
            "-I",  # no user site, no script folder on the path: imports only what it needs
            str(Path(__file__).resolve()),
            str(db),
            str(folder),
            host_id,
            repr(interval),
            repr(busy_timeout),
            durability,
        ]
        self._cond = threading.Condition(threading.Lock())
        self.error: str | None = None
        self.done: tuple[int, int] = (0, 0)
        """Everything before this (segment, byte) is in the database."""
        self._stopping = False
        self._restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._spawn()

    def _spawn(self) -> None:
        proc = subprocess.Popen(
            self._argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            env={},  # nothing of the host's environment: no secret to find in /proc
        )
        self._proc = proc
        threading.Thread(
            target=self._follow, args=(proc,), name="toolhost-audit", daemon=True
        ).start()

    def _follow(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").strip()
            with self._cond:
                if line.startswith("done "):
                    _, number, offset = line.split()
                    self.done = (int(number), int(offset))
                    self.error = None
                    self._restarts = 0
                elif line.startswith("error "):
                    self.error = line[6:]
                self._cond.notify_all()
        proc.stdout.close()
        code = proc.wait()
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        with self._cond:
            if self._stopping:
                self._cond.notify_all()
                return
            self.error = f"the audit writer stopped (exit code {code}); starting it again"
            self._cond.notify_all()
        logger.warning("%s", self.error)
        self._restarts += 1  # quickly at first, then at most every 5 s
        with self._cond:
            self._cond.wait_for(lambda: self._stopping, min(5.0, 0.1 * 2**self._restarts))
            if self._stopping:
                return
        try:
            self._spawn()
        except OSError as exc:
            with self._cond:
                self.error = f"the audit writer cannot be started again: {exc}"

    def _send(self, command: bytes) -> None:
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.write(command)
                proc.stdin.flush()

    def behind(self, position: tuple[int, int]) -> int:
        """About how many bytes of the journal up to ``position`` are not in the database."""
        number, offset = self.done
        return max(0, (position[0] - number) * SEGMENT_SIZE + position[1] - offset)

    def drain(self, position: tuple[int, int], timeout: float) -> None:
        """Block until the journal up to ``position`` is in the database."""
        deadline = time.monotonic() + timeout
        self._send(b"drain\n")
        with self._cond:
            while self.done < position:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(self.error or "the audit database is not keeping up")
                self._cond.wait(min(left, 0.1))

    def stop(self, timeout: float) -> bool:
        """Tell the writer the journal is complete; True if it wrote everything and ended."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        proc = self._proc
        if proc is None:
            return True
        self._send(b"stop\n")
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            return proc.wait(timeout) == 0
        except subprocess.TimeoutExpired:
            proc.kill()  # what it did not write, the next host replays from the journal
            proc.wait()
            return False


if __name__ == "__main__":
    _db, _folder, _host, _interval, _busy, _durability = sys.argv[1:7]
    sys.exit(serve(_db, Path(_folder), _host, float(_interval), float(_busy), _durability))
