"""The SQLite store: WAL mode, audit records, grants, pending approvals, reconciliation."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from host import AuditRecord, Grant, SQLiteStore
from host.audit import DONE, PendingApproval, StoreUnavailable
from host.audit._reading import read_audit

pytestmark = pytest.mark.anyio


def started(call_id: str, host_id: str = "h1", **fields: object) -> AuditRecord:
    base: dict[str, object] = {
        "call_id": call_id,
        "host_id": host_id,
        "started": time.time(),
        "session": "s1",
        "caller": "app",
        "tool": "launch",
        "outcome": "started",
        "decision": "allow",
        "rule": "r",
        "args_sha256": "ab" * 32,
        "args_size": 10,
        "args_summary": 'target="x"',
    }
    base.update(fields)
    return AuditRecord(**base)  # type: ignore[arg-type]


def die(store: SQLiteStore) -> None:
    """The host "dies" without closing anything: the kernel drops its lock, and no
    process with its identity runs any more (here: it ran before the machine restarted)."""
    store._lock.release()  # type: ignore[union-attr]  # pyright: ignore[reportPrivateUsage, reportOptionalMemberAccess]
    conn = sqlite3.connect(store.path)
    try:
        with conn:
            conn.execute(
                "UPDATE hosts SET identity = 'another-boot:0:1:1' WHERE host_id = ?",
                (store.host_id,),
            )
    finally:
        conn.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / ".agent" / "state.db")
    assert await store.start("h1") == 0
    yield store
    await store.aclose()


async def test_the_database_is_in_wal_mode(store: SQLiteStore) -> None:
    conn = sqlite3.connect(store.path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


async def test_record_finish_tail(store: SQLiteStore) -> None:
    await store.record(started("h1.1"), durable=True)
    await store.record(started("h1.2", outcome="denied", ended=time.time()), durable=False)
    await store.finish("h1.1", "ok", error_kind=None, error=None)
    records = await store.tail(10)
    assert [(r.call_id, r.outcome) for r in records] == [("h1.1", "ok"), ("h1.2", "denied")]
    assert records[0].ended is not None and records[0].seq is not None
    assert [r.call_id for r in await store.tail(1)] == ["h1.2"]
    assert await store.tail(0) == []


async def test_tail_of_more_than_there_is_gives_them_all(store: SQLiteStore) -> None:
    for n in range(7):
        await store.record(started(f"h1.{n}", outcome="denied", ended=time.time()), durable=False)
    assert [r.call_id for r in await store.tail(10)] == [f"h1.{n}" for n in range(7)]


async def test_a_terminal_outcome_is_never_rewritten(store: SQLiteStore) -> None:
    await store.record(started("h1.1"), durable=True)
    await store.finish("h1.1", "failed", error_kind="tool_error", error="boom")
    await store.finish("h1.1", "ok", error_kind=None, error=None)  # a late reply
    (record,) = await store.tail(1)
    assert (record.outcome, record.error_kind, record.error) == ("failed", "tool_error", "boom")


async def test_a_call_id_is_recorded_once(store: SQLiteStore) -> None:
    await store.record(started("h1.1"), durable=True)
    with pytest.raises(StoreUnavailable):
        await store.record(started("h1.1"), durable=True)


async def test_grants(store: SQLiteStore) -> None:
    exact = await store.add_grant(Grant("launch", "agent", True, "aa" * 32, summary="x=1"))
    tool_wide = await store.add_grant(Grant("launch", "app", False, None))
    assert exact.id is not None and tool_wide.id == exact.id + 1
    assert exact.created > 0 and exact.scope == "call" and tool_wide.scope == "tool"
    assert await store.find_grants("launch", "agent", "aa" * 32) == [exact]
    assert await store.find_grants("launch", "agent", "bb" * 32) == []
    assert await store.find_grants("launch", "app", "bb" * 32) == [tool_wide]
    assert await store.find_grants("record", "app", "bb" * 32) == []
    assert await store.grants() == [exact, tool_wide]
    assert await store.revoke_grant(exact.id)
    assert not await store.revoke_grant(exact.id)
    assert not await store.revoke_grant(999)
    assert await store.grants() == [tool_wide]
    assert exact.to_data()["scope"] == "call"


def pending(pending_id: str, host_id: str = "h1") -> PendingApproval:
    now = time.time()
    return PendingApproval(
        id=pending_id,
        host_id=host_id,
        created=now,
        expires=now + 60,
        call_id=f"{host_id}.1",
        session="s1",
        caller="agent",
        tool="launch",
        rule="ask",
        reason=None,
        args_sha256="aa" * 32,
        rendered='target = "x"',
    )


async def test_pending_approvals(store: SQLiteStore) -> None:
    await store.add_pending(pending("p1"))
    await store.add_pending(pending("p2"))
    assert [p.id for p in await store.pending()] == ["p1", "p2"]
    await store.remove_pending("p1")
    assert [p.id for p in await store.pending()] == ["p2"]


async def test_closing_withdraws_this_hosts_pending_approvals(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    await store.start("h1")
    await store.add_pending(pending("p1"))
    await store.aclose()
    again = SQLiteStore(tmp_path / "state.db")
    await again.start("h2")
    assert await again.pending() == []
    await again.aclose()


async def test_records_of_a_dead_host_are_closed_as_unknown(tmp_path: Path) -> None:
    path = tmp_path / ".agent" / "state.db"
    dead = SQLiteStore(path)
    await dead.start("dead")
    await dead.record(started("dead.1", "dead"), durable=True)
    await dead.record(started("dead.2", "dead", outcome="ok", ended=time.time()), durable=True)
    await dead.add_pending(pending("p1", "dead"))
    die(dead)  # without its records being closed
    live = SQLiteStore(path)
    assert await live.start("live") == 1  # the next host to start closes them
    await live.record(started("live.1", "live"), durable=True)
    following = SQLiteStore(path)
    assert await following.start("next") == 0
    outcomes = {r.call_id: (r.outcome, r.error_kind) for r in await following.tail(10)}
    assert outcomes == {
        "dead.1": ("unknown", "host_stopped"),
        "dead.2": ("ok", None),
        "live.1": ("started", None),  # its host still runs
    }
    assert await following.pending() == []
    assert await following.reconcile() == 0
    for store in (following, live, dead):
        await store.aclose()


async def test_a_locked_database_keeps_records_and_refuses_decisions(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "state.db", busy_timeout=0.1, interval=0.01)
    await store.start("h1")
    blocker = sqlite3.connect(store.path, isolation_level=None)
    try:
        blocker.execute("BEGIN EXCLUSIVE")
        await store.record(started("h1.1"), durable=True)  # journaled: safe already
        with pytest.raises(StoreUnavailable, match="locked"):
            await store.flush()
        with pytest.raises(StoreUnavailable, match="locked"):  # no new decision goes through
            await store.record(started("h1.2"), durable=True)
        # records after the fact are still kept (a refusal, an outcome)
        await store.record(started("h1.3", outcome="denied", ended=time.time()), durable=False)
        await store.finish("h1.1", "ok", error_kind=None, error=None)
        blocker.execute("ROLLBACK")
        await store.flush()
        await store.record(started("h1.4"), durable=True)
    finally:
        blocker.close()
        await store.aclose()
    conn = sqlite3.connect(store.path)
    try:
        rows = conn.execute("SELECT call_id, outcome FROM audit ORDER BY seq").fetchall()
    finally:
        conn.close()
    assert rows == [("h1.1", "ok"), ("h1.3", "denied"), ("h1.4", "started")]


async def test_a_store_that_cannot_open(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    store = SQLiteStore(tmp_path / "file" / "state.db")
    with pytest.raises(StoreUnavailable, match="cannot open"):
        await store.start("h1")
    with pytest.raises(StoreUnavailable, match="not open"):
        await store.tail(1)
    await store.aclose()


async def test_a_record_is_in_the_journal_when_record_returns(tmp_path: Path) -> None:
    from host.audit import _journal

    store = SQLiteStore(tmp_path / "state.db", interval=3600)  # nothing reaches SQLite
    await store.start("h1")
    try:
        assert store.record(started("h1.1"), durable=True) is DONE  # nothing to wait for
        (segment,) = _journal.segments(tmp_path / "journal")["h1"]
        entries = list(_journal.read_segment(segment))
        assert [e[:2] for e in entries] == [[_journal.ROW, "h1.1"]]
        conn = sqlite3.connect(store.path)
        try:
            assert conn.execute("SELECT count(*) FROM audit").fetchone() == (0,)
        finally:
            conn.close()
        # any reader sees it at once, journals included
        assert [r.call_id for r in read_audit(store.path, 5)] == ["h1.1"]
        await store.finish("h1.1", "ok", error_kind=None, error=None)
        assert [r.outcome for r in read_audit(store.path, 5)] == ["ok"]
    finally:
        await store.aclose()
    assert _journal.segments(tmp_path / "journal") == {}  # committed, then removed


async def test_power_durability_syncs_decisions_and_shares_the_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from host.audit import _journal

    syncs: list[float] = []
    original = _journal.Journal.sync

    def slow_sync(self: _journal.Journal) -> None:
        time.sleep(0.05)  # a disk that takes its time
        syncs.append(time.monotonic())
        original(self)

    monkeypatch.setattr(_journal.Journal, "sync", slow_sync)
    store = SQLiteStore(tmp_path / "state.db", durability="power")
    await store.start("h1")
    try:
        written = store.record(started("h1.0"), durable=True)
        assert written is not DONE and not syncs
        await written
        assert len(syncs) == 1
        assert store.record(started("h1.x", outcome="denied"), durable=False) is DONE
        async with anyio.create_task_group() as tg:
            for i in range(1, 21):
                tg.start_soon(_await, store.record(started(f"h1.{i}"), durable=True))
        assert 2 <= len(syncs) <= 4  # 20 decisions in flight together, one or two syncs
    finally:
        await store.aclose()
    with pytest.raises(ValueError, match="durability"):
        SQLiteStore(tmp_path / "x.db", durability="sometimes")  # type: ignore[arg-type]


async def _await(awaitable: Any) -> None:
    await awaitable


async def test_a_call_id_is_open_once_and_outcomes_are_kept(store: SQLiteStore) -> None:
    for i in range(50):
        await store.record(started(f"h1.{i}"), durable=True)
    with pytest.raises(StoreUnavailable, match="already"):
        await store.record(started("h1.7"), durable=True)
    for i in range(0, 50, 2):
        await store.finish(f"h1.{i}", "ok", error_kind=None, error=None)
    await store.finish("h1.0", "failed", error_kind="x", error=None)  # already closed: kept
    records = {r.call_id: r.outcome for r in await store.tail(100)}
    assert len(records) == 50
    assert records["h1.0"] == "ok" and records["h1.1"] == "started"


async def test_a_dead_hosts_journal_is_replayed(tmp_path: Path) -> None:
    from host.audit import _journal

    dead = SQLiteStore(tmp_path / "state.db", interval=3600)
    await dead.start("dead")
    await dead.record(started("dead.1", "dead"), durable=True)
    await dead.record(started("dead.2", "dead"), durable=True)
    await dead.finish("dead.2", "ok", error_kind=None, error=None)
    # the host dies with its audit writer: its lock goes, its journal stays, nothing
    # reached the database
    writer = dead._ingester  # pyright: ignore[reportPrivateUsage]
    assert writer is not None and writer._proc is not None  # pyright: ignore[reportPrivateUsage]
    writer._stopping = True  # pyright: ignore[reportPrivateUsage]
    writer._proc.kill()  # pyright: ignore[reportPrivateUsage]
    writer._proc.wait()  # pyright: ignore[reportPrivateUsage]
    die(dead)
    following = SQLiteStore(tmp_path / "state.db")
    assert await following.start("next") == 1
    try:
        outcomes = {r.call_id: (r.outcome, r.error_kind) for r in await following.tail(10)}
        assert outcomes == {"dead.1": ("unknown", "host_stopped"), "dead.2": ("ok", None)}
        assert "dead" not in _journal.segments(tmp_path / "journal")
    finally:
        await following.aclose()


async def test_lock_files_of_dead_hosts_are_removed(tmp_path: Path) -> None:
    path = tmp_path / ".agent" / "state.db"
    hosts = path.parent / "hosts"
    dead = SQLiteStore(path)
    await dead.start("dead")
    live = SQLiteStore(path)
    await live.start("live")
    assert sorted(p.name for p in hosts.iterdir()) == ["dead.lock", "live.lock"]
    dead._lock.release()  # type: ignore[union-attr]  # pyright: ignore[reportPrivateUsage, reportOptionalMemberAccess]
    (hosts / "ghost.lock").write_text("")  # a host that died without a trace in the db
    following = SQLiteStore(path)
    await following.start("next")
    assert sorted(p.name for p in hosts.iterdir()) == ["live.lock", "next.lock"]
    for store in (following, live, dead):
        await store.aclose()
    assert list(hosts.iterdir()) == []


def test_a_torn_or_corrupt_journal_is_read_up_to_the_damage(tmp_path: Path) -> None:
    from host.audit import _journal

    key = os.urandom(32)
    journal = _journal.Journal(tmp_path, "h1", key)
    rows = [[_journal.ROW, f"h1.{i}", *[None] * (len(_journal.COLUMNS) - 1)] for i in range(5)]
    for row in rows:
        journal.append(row)
    journal.append([_journal.END, "h1.0", "ok", 1.0, None, None])
    (segment,) = _journal.segments(tmp_path)["h1"]
    journal.close()

    def read() -> list[str]:
        return [e[1] for e in _journal.read_segment(segment, key=key, host_id="h1")]

    assert read() == [f"h1.{i}" for i in range(5)] + ["h1.0"]
    assert list(_journal.read_segment(segment, key=os.urandom(32), host_id="h1")) == []
    data = bytearray(segment.read_bytes())
    first = len(_journal.MAGIC)
    second = first + 28 + int.from_bytes(data[first : first + 4], "little")
    data[second + 30] ^= 0xFF  # a flipped bit in its body: its MAC fails
    segment.write_bytes(bytes(data))
    assert read() == ["h1.0"]
    data[second : second + 4] = b"\0\0\0\0"  # a record whose length never got written
    segment.write_bytes(bytes(data))
    assert read() == ["h1.0"]
    segment.write_bytes(_journal.MAGIC + b"\xff\xff\xff\x7f" + bytes(100))  # past the end
    assert read() == []
    segment.write_bytes(b"not a journal segment at all" + bytes(100))
    assert read() == []
