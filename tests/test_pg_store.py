"""What only the PostgreSQL store does: migrations under a lock, wake-ups by NOTIFY, the
reaper of silent hosts, and failing closed while the server is down (then recovering by
itself, losing and duplicating nothing). Against real servers from pgserver."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import psycopg
import pytest

from host.audit import Grant, PendingAnswer, StoreUnavailable, check_store, migrate_store
from host.audit._pg import PgStore, migrate_url
from host.cli import main

from .pg_helpers import PgServer
from .test_store_backends import pending, started

pytestmark = pytest.mark.anyio


def _store(url: str, folder: Path, **kw: Any) -> PgStore:
    settings: dict[str, Any] = {"heartbeat": 0.2, "catch_up": 0.2, "busy_timeout": 2.0}
    settings.update(kw)
    return PgStore(url, folder=folder, **settings)


async def _until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` (the caller's ``fail_after`` bounds the wait)."""
    while True:
        if condition():
            return
        await anyio.sleep(0.01)


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[list[PgStore]]:
    opened: list[PgStore] = []
    yield opened
    for store in reversed(opened):
        await store.aclose()


async def test_replicas_starting_together_migrate_once(pg_url: str) -> None:
    applied: list[list[int]] = []
    barrier = threading.Barrier(4)

    def one() -> None:
        barrier.wait()
        applied.append(migrate_url(pg_url))

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(anyio.to_thread.run_sync, one)
    assert sorted(applied) == [[], [], [], [1, 2]]
    assert await migrate_store(pg_url) == []
    report = await check_store(pg_url)
    assert (report["schema"], report["expected"], report["hosts"]) == (2, 2, [])


def test_the_store_commands(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tools").mkdir()
    argv = ["--project", str(tmp_path), "--url", pg_url]
    with pytest.raises(SystemExit) as code:
        main(["store", "check", *argv])
    assert code.value.code == 1 and "run toolhost store migrate" in capsys.readouterr().out
    with pytest.raises(SystemExit) as code:
        main(["store", "migrate", *argv])
    assert code.value.code == 0 and "applied schema version(s) 1, 2" in capsys.readouterr().out
    with pytest.raises(SystemExit) as code:
        main(["store", "check", *argv])
    out = capsys.readouterr().out
    assert code.value.code == 0 and "schema: 2 (up to date)" in out and "hosts: 0" in out
    with pytest.raises(SystemExit) as code:  # a project on SQLite has no store to check
        main(["store", "check", "--project", str(tmp_path)])
    assert code.value.code != 0 and "use SQLite" in capsys.readouterr().err


def test_the_audit_and_grants_commands_read_the_shared_store(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tools").mkdir()
    monkeypatch.setenv("TOOLHOST_STORE", pg_url)

    async def seed() -> None:
        store = _store(pg_url, tmp_path / "elsewhere")  # another host, another folder
        await store.start("hx")
        await store.record(started("hx.1", host_id="hx", outcome="denied"), durable=True)
        await store.add_grant(Grant("launch", "app", True, None))
        await store.aclose()

    anyio.run(seed)
    for argv, expect in ((["audit"], '"hx.1"'), (["policy", "grants"], '"launch"')):
        with pytest.raises(SystemExit) as code:
            main([*argv, "--project", str(tmp_path), "--json"])
        assert code.value.code == 0 and expect in capsys.readouterr().out


async def test_an_answer_on_one_replica_wakes_the_waiter_on_another(
    pg_url: str, tmp_path: Path, stores: list[PgStore]
) -> None:
    waiting = _store(pg_url, tmp_path / "a", catch_up=3600.0)  # only a NOTIFY wakes it
    stores.append(waiting)
    await waiting.start("ha")
    answering = _store(pg_url, tmp_path / "b")
    stores.append(answering)
    await answering.start("hb")
    await waiting.add_pending(pending("p1", host_id="ha"))
    assert await waiting.offer_pending("p1")
    seen = waiting.pending_version()
    with anyio.fail_after(30):  # without the notification it would sleep an hour
        async with anyio.create_task_group() as tg:
            tg.start_soon(answering.answer_pending, "p1", PendingAnswer(allow=True))
            while waiting.pending_version() == seen:
                await waiting.pending_changed(seen, 3600)
    row = await waiting.get_pending("p1")
    assert row is not None and row.answer is not None and row.answer.allow


async def test_a_silent_host_is_reaped_by_a_running_replica(
    pg_url: str, tmp_path: Path, stores: list[PgStore]
) -> None:
    silent = _store(pg_url, tmp_path / "a")
    stores.append(silent)
    await silent.start("ha")
    watcher = _store(pg_url, tmp_path / "b", stale_after=1.0)
    stores.append(watcher)
    await watcher.start("hb")
    await silent.record(started("ha.1", host_id="ha"), durable=True)
    await silent.flush()
    listener = silent._listener  # pyright: ignore[reportPrivateUsage]
    assert listener is not None
    await anyio.to_thread.run_sync(listener.stop)  # its heartbeat stops: it went silent
    silent._listener = None  # pyright: ignore[reportPrivateUsage]
    with anyio.fail_after(60):
        while True:
            (record,) = [r for r in await watcher.tail(10) if r.call_id == "ha.1"]
            if record.outcome != "started":
                break
            await anyio.sleep(0.1)
    assert (record.outcome, record.error_kind) == ("unknown", "host_stopped")
    # its own late outcome changes nothing: one terminal record per call
    await silent.finish("ha.1", "ok", error_kind=None, error=None)
    await silent.flush()
    (record,) = [r for r in await watcher.tail(10) if r.call_id == "ha.1"]
    assert record.outcome == "unknown"


@pytest.mark.slow
async def test_the_server_stopped_and_restarted_mid_run(tmp_path: Path) -> None:
    """Calls keep coming while the server stops and starts again: those refused are
    refused before dispatch (StoreUnavailable), the others are each recorded exactly
    once, and the store recovers by itself."""
    server = await anyio.to_thread.run_sync(PgServer().start)
    store = _store(server.url(), tmp_path / "a")
    try:
        await store.start("h1")
        accepted: list[str] = []
        refused: list[str] = []
        stop = anyio.Event()
        phase = {"down": False}

        async def calls() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                call_id = f"h1.{n}"
                try:
                    await store.record(started(call_id), durable=True)
                except StoreUnavailable:
                    refused.append(call_id)
                else:
                    accepted.append(call_id)
                    await store.finish(call_id, "ok", error_kind=None, error=None)
                await anyio.sleep(0.005)

        async with anyio.create_task_group() as tg:
            tg.start_soon(calls)
            with anyio.fail_after(60):
                await _until(lambda: len(accepted) >= 20)
                await anyio.to_thread.run_sync(server.stop, "fast")
                phase["down"] = True
                await _until(lambda: bool(refused))  # fail closed, soon
                with pytest.raises(StoreUnavailable):
                    await store.find_grants("launch", "app", "ab" * 32)
                before = len(accepted)
                await anyio.to_thread.run_sync(server.start)
                await _until(lambda: len(accepted) >= before + 20)  # it recovers by itself
            stop.set()
        with anyio.fail_after(60):
            while True:
                try:
                    await store.flush()
                    break
                except StoreUnavailable:
                    await anyio.sleep(0.1)
        with psycopg.connect(server.url(), autocommit=True) as conn:
            rows = conn.execute("SELECT call_id, outcome FROM audit").fetchall()
        ids = [r[0] for r in rows]
        assert len(ids) == len(set(ids))  # nothing twice
        assert sorted(ids) == sorted(accepted)  # nothing accepted lost, nothing refused in
        assert {r[1] for r in rows} == {"ok"}
        assert refused and phase["down"]
    finally:
        await store.aclose()
        await anyio.to_thread.run_sync(server.close)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # a server of its own: once is enough
async def test_while_the_server_is_down_the_store_says_so(tmp_path: Path) -> None:
    server = await anyio.to_thread.run_sync(PgServer().start)
    try:
        store = _store(server.url(), tmp_path / "a")
        await anyio.to_thread.run_sync(server.stop, "immediate")
        with pytest.raises(StoreUnavailable) as caught:
            await store.start("h1")
        assert "cannot be reached" in str(caught.value)
        await store.aclose()
    finally:
        await anyio.to_thread.run_sync(server.close)
