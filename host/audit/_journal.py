"""The audit journal: where a decision is made durable before its call is dispatched.

A record is appended to a memory-mapped segment file under ``.agent/journal/``: once the
bytes are copied into the mapping they belong to the operating system's page cache, so a
host that is killed, crashes or exits loses nothing it appended, and the append costs
a few microseconds, not a system call. ``sync`` (``msync``) puts them on the disk too,
for hosts that must survive a power cut.

A process of its own (:class:`Ingester` starts ``serve``) moves the records into the
database (SQLite, or PostgreSQL for hosts that share one: :class:`PgConnection`) in
batches, one transaction each, and removes a segment once everything in
it is committed. A host that died leaves its segments behind; the next host replays them
(:func:`replay`) before it closes that host's open records. Readers in other processes can
read the segments of a live host too (:func:`read_segment`), so the audit shows a call the
moment it is decided.

Segment layout: a 16-byte header (:data:`MAGIC`), then records one after another, each
``length (u32 le) | seq (u64 le) | mac (16 bytes) | msgpack body``, then zeros. ``seq``
numbers a host's records from 1 without a gap across its segments; ``mac`` is a keyed
BLAKE2b over the host id, ``seq`` and the body, with the host's key (``host.trust``),
which the writer gets on its stdin. The body and MAC are written before the length, so a
reader that sees a length sees a whole record.

Tampering is detected, not prevented (``docs/security/trust.md``): a record that does not
verify, a sequence number out of order, a segment that disappears or changes under the
host, or records the host says it appended that the writer cannot find (the host tells
it how far it got after every report), and audit rows of this host removed from the
database, all make the writer report ``tampered``; the host then refuses every call
(``audit_unavailable``) until it is restarted. Segments are preallocated with
``posix_fallocate``, so a full disk fails when a segment is created (as an ``OSError``
the store turns into a refusal), never as ``SIGBUS`` on a write into the mapping.

This file runs by path as the writer process: standard library and msgpack only (and
psycopg, imported only by a writer into PostgreSQL).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol, cast

import msgpack  # pyright: ignore[reportMissingTypeStubs]

from capsule import protocol

__all__ = [
    "COLUMNS",
    "DECIDED",
    "Connection",
    "PgConnection",
    "END",
    "Damage",
    "Ingester",
    "Journal",
    "ROW",
    "Segment",
    "read_segment",
    "replay",
    "segments",
]

logger = logging.getLogger("toolhost.audit")

SEGMENT_SIZE: Final = 4 << 20
"""Bytes preallocated per segment (about 15,000 records)."""

MAGIC: Final = b"toolhost-jrnl-2\n"
"""The first 16 bytes of every segment (records follow)."""

_HEAD: Final = struct.Struct("<IQ16s")
"""length, seq, mac: what precedes each record's body."""
_MAC_SIZE: Final = 16
_PERSON: Final = b"toolhost-journal"
_NAME: Final = re.compile(r"^(?P<host>[A-Za-z0-9_.-]+)\.(?P<n>[0-9]{1,9})\.log$")

ROW: Final = 1
"""A new audit row: ``[ROW, *values in COLUMNS order]``."""
END: Final = 2
"""A call's outcome: ``[END, call_id, outcome, ended, error_kind, error]``."""
DECIDED: Final = 3
"""A row that waited for an approval, decided: ``[DECIDED, *values in COLUMNS order]``
(it replaces the ``waiting`` row's values)."""

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
_DECIDE: Final = (
    f"UPDATE audit SET {', '.join(f'{c} = ?' for c in COLUMNS[1:])} "
    "WHERE call_id = ? AND outcome = 'waiting'"
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


def _segment_number(path: Path) -> int:
    return int(path.name.split(".")[-2])


def _mac(key: bytes, host: bytes, seq: int, body: bytes | memoryview) -> bytes:
    digest = hashlib.blake2b(
        len(host).to_bytes(2, "little") + host + seq.to_bytes(8, "little"),
        key=key,
        digest_size=_MAC_SIZE,
        person=_PERSON,
    )
    digest.update(body)
    return digest.digest()


class Journal:
    """Appends records for one host to its memory-mapped segments (event-loop thread only).

    Args:
        folder: the journal folder (created private).
        host_id: the host writing; part of every segment's name and every record's MAC.
        key: the host's key (what the MACs are made with).
        sync_dirs: fsync the folder when a segment is created (for power-cut safety).
    """

    def __init__(self, folder: Path, host_id: str, key: bytes, *, sync_dirs: bool = False) -> None:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder = folder
        self.host_id = host_id
        self._host = host_id.encode()
        self._key = key
        self._sync_dirs = sync_dirs
        self._number = 0
        self._map: mmap.mmap | None = None
        self._fd = -1
        self._offset = 0
        self._size = 0
        self._rotate = False
        self.seq = 0
        """The sequence number of the last record appended."""
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
        if self._map is None or self._rotate or self._offset + need > self._size:
            self._next(need)
        mapping = self._map
        assert mapping is not None
        seq = self.seq + 1
        at = self._offset
        mac = _mac(self._key, self._host, seq, body)
        mapping[at + 4 : at + need] = seq.to_bytes(8, "little") + mac + body
        mapping[at : at + 4] = struct.pack("<I", len(body))  # last: the record now exists
        self._offset = at + need
        self.seq = seq

    def rotate(self) -> None:
        """Start a new segment with the next record (after damage to this one)."""
        self._rotate = True

    def _next(self, need: int) -> None:
        self._number += 1
        path = self.folder / f"{self.host_id}.{self._number}.log"
        size = max(SEGMENT_SIZE, need + _HEAD.size + len(MAGIC))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)  # a full disk fails here, not in the mapping
            mapping = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        mapping[0 : len(MAGIC)] = MAGIC
        if self._sync_dirs:  # power-cut safety: the new name, and the old segment's tail
            _fsync_dir(self.folder)
            if self._map is not None:
                self._map.flush()  # a sync already waiting would flush the new mapping
        self._close_map()
        self._map, self._fd, self._size, self.path = mapping, fd, size, path
        self._offset = len(MAGIC)
        self._rotate = False

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


# -- reading -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Damage:
    """Where a segment stops being the host's own writing, and how."""

    kind: str
    """``format`` (not a segment of this layout), ``overrun`` (a length past the end),
    ``mac`` (a record that does not verify), ``gap`` (a sequence number out of order)."""
    offset: int
    text: str


@dataclass(slots=True)
class Segment:
    """What was read of one segment from some byte on."""

    entries: list[list[Any]] = field(default_factory=list[list[Any]])
    end: int = 0
    """The byte after the last whole, good record read."""
    seq: int | None = None
    """The sequence number of the last good record read (``None``: none read)."""
    damage: Damage | None = None


def read_segment(
    path: Path, *, key: bytes | None = None, host_id: str | None = None
) -> Iterator[list[Any]]:
    """The records of one segment, up to its end or its first damage (verified against
    ``key`` when given: then ``host_id`` is the host that wrote it)."""
    return iter(_read_from(path, 0, key=key, host_id=host_id).entries)


def _valid(entry: object) -> bool:
    if not isinstance(entry, list) or not entry:
        return False
    items: list[Any] = entry  # pyright: ignore[reportUnknownVariableType]
    if items[0] in (ROW, DECIDED):
        if len(items) == len(COLUMNS):  # journaled before ``chain`` existed
            items.append(None)
        return len(items) == 1 + len(COLUMNS) and isinstance(items[1], str)
    return items[0] == END and len(items) == 6 and isinstance(items[1], str)


def _read_from(
    path: Path,
    offset: int,
    *,
    key: bytes | None,
    host_id: str | None,
    expect: int | None = None,
) -> Segment:
    """The whole records of ``path`` from byte ``offset`` on (0: the start), verified
    against ``key`` (and each ``seq`` against ``expect``, then its successors) when given,
    up to the end of what is written or the first damage."""
    out = Segment(end=offset)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return out
    host = (host_id or "").encode()
    try:
        size = os.fstat(fd).st_size
        if size < len(MAGIC) or size <= max(offset, len(MAGIC)) + _HEAD.size:
            return out
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as data:
            header = data[0 : len(MAGIC)]
            if header != MAGIC:
                # zeros at the start: the host has not written the header yet; anything
                # else, or zeros where a header was read before, is not its writing
                if header != bytes(len(MAGIC)) or offset > 0:
                    out.damage = Damage("format", 0, f"{path.name} has no journal header")
                return out
            at = max(offset, len(MAGIC))
            out.end = at
            while at + _HEAD.size <= size:
                length, seq, mac = _HEAD.unpack_from(data, at)
                if length == 0:
                    break
                end = at + _HEAD.size + length
                if end > size:
                    out.damage = Damage("overrun", at, f"a record at byte {at} runs past the end")
                    break
                body = data[at + _HEAD.size : end]
                if key is not None and not hmac.compare_digest(_mac(key, host, seq, body), mac):
                    out.damage = Damage("mac", at, f"the record at byte {at} does not verify")
                    break
                if expect is not None and seq != expect:
                    out.damage = Damage(
                        "gap", at, f"record {seq} at byte {at} where record {expect} belongs"
                    )
                    break
                try:
                    entry = protocol.decode(body)
                except protocol.BadFrame:
                    entry = None
                if _valid(entry):
                    out.entries.append(entry)  # pyright: ignore[reportArgumentType]
                else:
                    logger.warning("%s: a malformed audit record at byte %d", path, at)
                expect = seq + 1
                out.seq = seq
                at = end
                out.end = at
            return out
    finally:
        os.close(fd)


# -- into the database ---------------------------------------------------------------------


class Connection(Protocol):
    """What the writer needs of a database connection: ``sqlite3.Connection`` (autocommit,
    explicit transactions) or :class:`PgConnection`."""

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any: ...

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> Any: ...

    def rollback(self) -> None: ...

    def close(self) -> None: ...


_db_errors: tuple[type[Exception], ...] = (sqlite3.Error, OSError)
"""What a failing database raises here (psycopg's errors join once it is loaded)."""


class PgConnection:
    """A PostgreSQL connection that speaks the SQLite dialect of this file: ``?``
    placeholders, ``BEGIN IMMEDIATE``, ``INSERT OR IGNORE`` into ``audit`` (which becomes
    ``ON CONFLICT (call_id) DO NOTHING``). Used by the writer process and by the
    PostgreSQL store's replay of a dead host's journal."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    @classmethod
    def connect(cls, url: str, timeout: float) -> PgConnection:
        global _db_errors
        import psycopg

        _db_errors = (sqlite3.Error, OSError, psycopg.Error)
        conn = psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(timeout)))
        conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{int(timeout * 1000)}ms",))
        return cls(conn)

    @staticmethod
    def _sql(sql: str) -> str:
        if sql == "BEGIN IMMEDIATE":
            return "BEGIN"
        if sql.startswith("INSERT OR IGNORE INTO audit "):
            sql = "INSERT INTO audit " + sql[len("INSERT OR IGNORE INTO audit ") :]
            sql += " ON CONFLICT (call_id) DO NOTHING"
        return sql.replace("?", "%s")

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any:
        return self._conn.execute(self._sql(sql), tuple(parameters))

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> Any:
        cursor = self._conn.cursor()
        cursor.executemany(self._sql(sql), [tuple(p) for p in seq_of_parameters])
        return cursor

    def rollback(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.execute("ROLLBACK")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()


def apply(conn: Connection, entries: Sequence[list[Any]]) -> int:
    """Apply journal entries in order (inside the caller's transaction). Idempotent.
    Returns how many new rows were inserted."""
    rows: list[Sequence[Any]] = []
    ends: list[Sequence[Any]] = []
    decided: list[Sequence[Any]] = []
    inserted = 0
    for entry in entries:
        kind = entry[0]
        if kind == ROW:
            if ends or decided:
                inserted += _flush(conn, rows, ends, decided)
                rows, ends, decided = [], [], []
            rows.append(entry[1:])
        elif kind == DECIDED:
            if ends:
                inserted += _flush(conn, rows, ends, decided)
                rows, ends, decided = [], [], []
            decided.append((*entry[2:], entry[1]))
        else:
            ends.append((entry[2], entry[3], entry[4], entry[5], entry[1]))
    return inserted + _flush(conn, rows, ends, decided)


def _flush(
    conn: Connection,
    rows: list[Sequence[Any]],
    ends: list[Sequence[Any]],
    decided: list[Sequence[Any]],
) -> int:
    inserted = 0
    if rows:
        inserted = max(conn.executemany(_INSERT, rows).rowcount, 0)
    if decided:
        conn.executemany(_DECIDE, decided)
    if ends:
        conn.executemany(_UPDATE, ends)
    return inserted


@dataclass(frozen=True, slots=True)
class Replayed:
    """What :func:`replay` did with a dead host's journal."""

    records: int
    damage: list[str]
    """What could not be verified (each: segment, byte, why); those segments are kept
    beside the journal as ``*.tampered``."""


def replay(conn: Connection, paths: Sequence[Path], *, key: bytes, host_id: str) -> Replayed:
    """Apply the segments of a host that is gone (what verifies), then remove them.

    Records after damage in a segment cannot be found (their lengths are gone with it);
    later segments still verify and are applied, their numbering checked from their
    first record on.
    """
    count = 0
    damage: list[str] = []
    expect: int | None = None
    for path in paths:
        read = _read_from(path, 0, key=key, host_id=host_id, expect=expect)
        if read.damage is not None and read.damage.kind == "gap" and not read.entries:
            # the segment starts after missing records: say so, and read it on its own
            damage.append(f"{path.name}: {read.damage.text}")
            read = _read_from(path, 0, key=key, host_id=host_id)
        conn.execute("BEGIN IMMEDIATE")
        try:
            apply(conn, read.entries)
            conn.execute("COMMIT")
        except BaseException:
            conn.rollback()
            raise
        count += len(read.entries)
        expect = None if read.seq is None else read.seq + 1
        if read.damage is not None:
            damage.append(f"{path.name}: {read.damage.text}")
            expect = None
            with contextlib.suppress(OSError):
                path.rename(path.with_name(path.name + ".tampered"))
            continue
        with contextlib.suppress(OSError):
            path.unlink()
    return Replayed(count, damage)


def _connect(db: str, busy_timeout: float, durability: str, url: str | None) -> Connection:
    if url is not None:
        return PgConnection.connect(url, busy_timeout)
    conn = sqlite3.connect(db, timeout=busy_timeout, isolation_level=None)
    conn.execute(f"PRAGMA synchronous={'FULL' if durability == 'power' else 'NORMAL'}")
    return conn


def _segment_path(folder: Path, host_id: str, number: int) -> Path:
    return folder / f"{host_id}.{number}.log"


def _count_rows(conn: Connection, host_id: str) -> int:
    """This host's rows in the database (call ids are ``HOST.N``: a range of the unique
    index on ``call_id``, no index of its own)."""
    (count,) = conn.execute(
        "SELECT count(*) FROM audit WHERE call_id >= ? AND call_id < ?",
        (host_id + ".", host_id + "/"),
    ).fetchone()
    return int(count)


_ROWS_CHECK: Final = 1.0
"""Seconds between two counts of this host's rows in the database."""


class _Writer:
    """The writer process's state: where it is in the journal, what it expects there."""

    def __init__(self, db: str, folder: Path, host_id: str, busy: float, durability: str) -> None:
        self.db, self.folder, self.host_id = db, folder, host_id
        self.busy, self.durability = busy, durability
        self.key = b""
        self.number = 1
        self.offset = 0
        self.next_seq = 1
        self.rows = 0
        """Rows of this host the database must hold (those committed by this host)."""
        self.required = 0
        """The host has appended every record up to this one (it says so)."""
        self.tampered: str | None = None
        self.damaged: int | None = None
        """The segment where damage was found (read no further once the host moved on)."""
        self.last_seq = 0
        """The sequence number of the last record read."""
        self.suspect: tuple[int, int, str] | None = None
        """Damage or missing records seen at (segment, byte) on the last pass: a record
        being written is seen whole on the next pass; damage is seen again."""
        self.checked = 0.0
        self.conn: Connection | None = None
        self.url: str | None = None
        """The PostgreSQL database to write into (given on the handshake, never on the
        command line: it may hold a password); None: the SQLite file ``db``."""

    def handshake(self, line: str) -> None:
        _, key, number, offset, next_seq, rows, *url = line.split()
        if url:
            self.url = bytes.fromhex(url[0]).decode()
        self.key = bytes.fromhex(key)
        self.number, self.offset = int(number), int(offset)
        self.next_seq, self.rows = int(next_seq), int(rows)
        self.last_seq = self.next_seq - 1

    def read(self, final: bool) -> tuple[list[list[Any]], list[Path], tuple[int, int, int], bool]:
        """What is new: (entries, segments done with, (segment, byte, next seq) after
        them, whether more is waiting)."""
        entries: list[list[Any]] = []
        done: list[Path] = []
        number, offset = self.number, self.offset
        expect: int | None = self.next_seq
        if self.tampered is not None:
            expect = None  # past damage the numbering cannot be followed: MACs still are
            if number == self.damaged:  # the host starts a new segment after damage
                later = [
                    n
                    for n in (_segment_number(p) for p in self.folder.glob(f"{self.host_id}.*.log"))
                    if n > number
                ]
                if later:
                    self._set_aside(_segment_path(self.folder, self.host_id, number))
                    number, offset = min(later), 0
        while len(entries) < 50_000:
            path = _segment_path(self.folder, self.host_id, number)
            later = _segment_path(self.folder, self.host_id, number + 1).exists()  # first
            read = _read_from(path, offset, key=self.key, host_id=self.host_id, expect=expect)
            entries.extend(read.entries)
            offset = read.end
            if read.seq is not None:
                self.last_seq = read.seq
                expect = None if self.tampered is not None else read.seq + 1
            if read.damage is not None:
                self._damaged(number, read.damage)
                break
            if later or (final and not read.entries):
                done.append(path)
                number, offset = number + 1, 0
                if later:
                    continue
            break
        more = len(entries) >= 50_000
        return entries, done, (number, offset, self.last_seq + 1), more

    def _damaged(self, number: int, damage: Damage) -> None:
        if self.tampered is not None:
            return
        seen = (number, damage.offset, damage.kind)
        if damage.kind in ("mac", "overrun") and self.suspect != seen:
            self.suspect = seen  # maybe a record being written: look again next time
            return
        self.tampered = f"segment {number}: {damage.text}"
        self.damaged = number

    def missing(self, position: tuple[int, int, int], more: bool) -> None:
        """The host said it appended up to ``required``: nothing readable goes that far."""
        number, offset, expect = position
        if self.tampered is not None or more or expect > self.required:
            self.suspect = None if self.suspect and self.suspect[2] == "missing" else self.suspect
            return
        seen = (number, offset, "missing")
        if self.suspect != seen:
            self.suspect = seen
            return
        self.tampered = (
            f"records {expect} to {self.required} are not in the journal (overwritten, or "
            "their segment was removed or replaced)"
        )
        self.damaged = number

    def count(self, now: float, *, force: bool = False) -> None:
        if self.conn is None or self.tampered is not None:
            return
        if not force and now - self.checked < _ROWS_CHECK:
            return
        self.checked = now
        found = _count_rows(self.conn, self.host_id)
        if found < self.rows:
            self.tampered = (
                f"{self.rows - found} of this host's audit rows were removed from the database"
            )

    def _set_aside(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            path.rename(path.with_name(path.name + ".tampered"))


def _undumpable() -> None:
    """Make this process non-dumpable (Linux), as the host is: it holds the host's key, and
    a dumpable process's memory is open to every process of its user (``/proc/PID/mem``)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE


def serve(
    db: str, folder: Path, host_id: str, interval: float, busy_timeout: float, durability: str
) -> int:
    """The audit writer process: follows one host's journal into the database.

    Its first line on stdin is ``key HEX SEGMENT BYTE SEQ ROWS [URL]``: the host's key,
    where to start (everything before is in the database), how many rows of this host the
    database holds, and (hex) the PostgreSQL database to write into when ``db`` is
    ``postgresql``. Then commands, one a line: ``drain`` (write what is there now),
    ``upto SEQ`` (the host has appended every record up to ``SEQ``), ``stop`` (the host
    is done appending: write everything, remove the segments, exit). End of input means
    the host is gone: the same as ``stop``. Reports on stdout, one a line: ``done SEGMENT
    BYTE SEQ ROWS`` (everything before is in the database), ``error TEXT`` (the database
    cannot be written now), ``tampered TEXT`` (the journal or this host's rows were
    changed by someone else: the host stops dispatching).
    """
    import select

    _undumpable()  # before the key arrives: no process of the user may read it from here
    state = _Writer(db, folder, host_id, busy_timeout, durability)
    stdin = os.fdopen(0, "rb", buffering=0)
    first = b""
    while not first.endswith(b"\n"):
        chunk = stdin.read(1)
        if not chunk:
            return 1
        first += chunk
    state.handshake(first.decode())
    out = os.fdopen(1, "w", buffering=1, encoding="utf-8", errors="replace")

    def report(line: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # the host may be gone: carry on
            out.write(line)

    failing = False
    final = False
    told = False
    give_up: float | None = None
    pending = b""
    while True:
        wait = interval if not failing else min(1.0, interval * 20)
        if state.suspect is not None:  # look again soon: damage, or a record being written
            wait = min(wait, 0.05)
        ready, _, _ = select.select([0], [], [], wait)
        if ready:
            data = os.read(0, 4096)
            if not data:
                final = True
            pending += data
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                command = raw.decode("ascii", "replace").split()
                if not command:
                    continue
                if command[0] == "stop":
                    final = True
                elif command[0] == "upto" and len(command) == 2 and command[1].isdigit():
                    state.required = max(state.required, int(command[1]))
        entries, done, position, more = state.read(final)
        state.missing(position, more)
        try:
            if entries:
                if state.conn is None:
                    state.conn = _connect(db, busy_timeout, durability, state.url)
                state.conn.execute("BEGIN IMMEDIATE")
                try:
                    state.rows += apply(state.conn, _merged(entries))
                    state.conn.execute("COMMIT")
                except BaseException:
                    state.conn.rollback()
                    raise
            elif state.conn is None and state.rows:
                state.conn = _connect(db, busy_timeout, durability, state.url)
            if state.conn is not None:
                state.count(time.monotonic(), force=final)
        except _db_errors as exc:
            failing = True
            text = str(exc).replace("\n", " ")
            report(f"error the audit database cannot be written: {text}\n")
            if state.conn is not None:
                with contextlib.suppress(*_db_errors):
                    state.conn.close()
                state.conn = None
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
        state.number, state.offset, state.next_seq = position
        if state.tampered is not None and not told:
            told = True
            report(f"tampered {state.tampered}\n")
        report(f"done {state.number} {state.offset} {state.next_seq - 1} {state.rows}\n")
        if final and not entries and not more:
            break
    if state.conn is not None:
        state.conn.close()
    return 0


def _merged(entries: list[list[Any]]) -> list[list[Any]]:
    """``entries`` with each outcome folded into its row when both are here (one write)."""
    rows: dict[str, list[Any]] = {}
    out: list[list[Any]] = []
    for entry in entries:
        if entry[0] in (ROW, DECIDED):
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
    records into the database takes nothing from the host's interpreter (no lock, no GIL).

    The host only appends to the journal; the writer follows it. :attr:`error` is set while
    the database cannot be written (the store refuses new calls: fail closed), and the
    writer is started again if it dies. :attr:`tampered` is set, for good, once the writer
    finds the journal or this host's rows changed by someone else. :meth:`drain` waits
    until what the journal holds at that moment is in the database.

    Args:
        appended: the sequence number of the last record the host appended (read after
            every report of the writer, and sent to it: records it cannot find are
            missing).
        on_report: called on the follower thread after every report of the writer.
    """

    def __init__(
        self,
        db: Path,
        folder: Path,
        host_id: str,
        *,
        key: bytes,
        appended: Callable[[], int],
        on_report: Callable[[], None] | None = None,
        interval: float,
        busy_timeout: float,
        durability: str,
        url: str | None = None,
    ) -> None:
        self._url = url
        """A PostgreSQL database to write into instead of ``db`` (sent on the handshake)."""
        self._argv = [
            sys.executable,
            "-I",  # no user site, no script folder on the path: imports only what it needs
            str(Path(__file__).resolve()),
            "postgresql" if url is not None else str(db),
            str(folder),
            host_id,
            repr(interval),
            repr(busy_timeout),
            durability,
        ]
        self._key = key
        self._appended = appended
        self._on_report = on_report
        self._cond = threading.Condition(threading.Lock())
        self.error: str | None = None
        self.tampered: str | None = None
        self.done: tuple[int, int] = (0, 0)
        """Everything before this (segment, byte) is in the database."""
        self._seq = 0
        self._rows = 0
        self._told = 0
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
        number, offset = self.done
        start = f"{max(number, 1)} {offset} {self._seq + 1} {self._rows}"
        if self._url is not None:
            start += f" {self._url.encode().hex()}"
        self._send(f"key {self._key.hex()} {start}\n".encode())
        threading.Thread(
            target=self._follow, args=(proc,), name="toolhost-audit", daemon=True
        ).start()

    def _follow(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").strip()
            with self._cond:
                if line.startswith("done "):
                    _, number, offset, seq, rows = line.split()
                    self.done = (int(number), int(offset))
                    self._seq, self._rows = int(seq), int(rows)
                    self.error = None
                    self._restarts = 0
                elif line.startswith("error "):
                    self.error = line[6:]
                elif line.startswith("tampered "):
                    self.tampered = line[9:]
                self._cond.notify_all()
            if line.startswith("done "):
                if self._on_report is not None:
                    with contextlib.suppress(Exception):  # never stops following
                        self._on_report()
                appended = self._appended()
                if appended > self._told:  # only news: a quiet host sends nothing
                    self._told = appended
                    self._send(f"upto {appended}\n".encode())
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
                if self.tampered is not None:
                    raise TimeoutError(f"the audit journal was tampered with: {self.tampered}")
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
