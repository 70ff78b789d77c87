"""One store suite, two backends: SQLite (a file) and PostgreSQL (a real server, pgserver).

Each test opens a store on a fresh database and checks what the ``Store`` interface
promises, the same way on both: audit records through the journal, grants (and their
signatures), pending approvals answered once, a session's values and files, and the
reconciliation of what a dead host left open.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from host.audit import (
    AuditRecord,
    Grant,
    JournaledStore,
    PendingAnswer,
    PendingApproval,
    StoreFull,
    StoreUnavailable,
    store_for,
)

pytestmark = pytest.mark.anyio

Opener = Callable[..., Awaitable[JournaledStore]]


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


def pending(pending_id: str, host_id: str = "h1", ttl: float = 60.0) -> PendingApproval:
    now = time.time()
    return PendingApproval(
        id=pending_id,
        host_id=host_id,
        created=now,
        expires=now + ttl,
        call_id=f"{host_id}.{pending_id}",
        session="s1",
        caller="agent",
        tool="launch",
        rule="ask",
        reason="look first",
        args_sha256="cd" * 32,
        rendered='target="x"',
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def open_store(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Opener]:
    """``await open_store(host_id, folder=...)``: a started store on this test's database
    (each call opens one more, as another host process would)."""
    url = request.getfixturevalue("pg_url") if backend == "postgresql" else None
    opened: list[JournaledStore] = []

    async def open_one(host_id: str = "h1", *, folder: Path | None = None, **kw: Any) -> Any:
        store: Any = store_for(url, folder or tmp_path / ".agent")
        if url is not None:
            for name, value in {"heartbeat": 0.2, "catch_up": 0.2, **kw}.items():
                setattr(store, f"_{name}", value)
        await store.start(host_id)
        opened.append(store)
        return store

    try:
        yield open_one
    finally:
        for store in reversed(opened):
            await store.aclose()


async def test_record_finish_tail(open_store: Opener) -> None:
    store = await open_store()
    await store.record(started("h1.1"), durable=True)
    await store.record(started("h1.2", outcome="denied", ended=time.time()), durable=False)
    await store.finish("h1.1", "ok", error_kind=None, error=None)
    records = await store.tail(10)
    assert [(r.call_id, r.outcome) for r in records] == [("h1.1", "ok"), ("h1.2", "denied")]
    assert records[0].ended is not None and records[0].seq is not None
    assert records[0].args_summary == 'target="x"' and records[0].args_size == 10
    assert [r.call_id for r in await store.tail(1)] == ["h1.2"]
    assert await store.tail(0) == []


async def test_a_terminal_outcome_stays_and_a_call_id_is_recorded_once(
    open_store: Opener,
) -> None:
    store = await open_store()
    await store.record(started("h1.1"), durable=True)
    with pytest.raises(StoreUnavailable):
        await store.record(started("h1.1"), durable=True)
    await store.finish("h1.1", "failed", error_kind="tool_error", error="boom")
    await store.finish("h1.1", "ok", error_kind=None, error=None)  # a late reply
    (record,) = await store.tail(1)
    assert (record.outcome, record.error_kind, record.error) == ("failed", "tool_error", "boom")


async def test_a_waiting_record_is_replaced_by_its_decision(open_store: Opener) -> None:
    store = await open_store()
    await store.record(started("h1.1", outcome="waiting", decision="escalate"), durable=True)
    await store.record(started("h1.1", decision="escalate", approval="once"), durable=True)
    await store.finish("h1.1", "ok", error_kind=None, error=None)
    (record,) = await store.tail(5)
    assert (record.outcome, record.approval) == ("ok", "once")


async def test_grants_are_signed_found_and_revoked(open_store: Opener) -> None:
    store = await open_store()
    exact = await store.add_grant(Grant("launch", "agent", True, "aa" * 32, summary="x=1"))
    tool_wide = await store.add_grant(Grant("launch", "app", False, None, rule_digest="d1"))
    assert exact.id is not None and tool_wide.id is not None and tool_wide.id > exact.id
    assert await store.find_grants("launch", "agent", "aa" * 32) == [exact]
    assert await store.find_grants("launch", "agent", "bb" * 32) == []
    assert await store.find_grants("launch", "app", "bb" * 32) == [tool_wide]
    assert await store.grants() == [exact, tool_wide]
    assert await store.revoke_grant(exact.id)
    assert not await store.revoke_grant(exact.id)
    assert not await store.revoke_grant(999)
    assert await store.grants() == [tool_wide]


async def test_a_grant_changed_in_the_database_answers_nothing(
    open_store: Opener, backend: str, request: pytest.FixtureRequest
) -> None:
    store = await open_store()
    told: list[tuple[str, str]] = []
    store.on_tamper = lambda what, detail: told.append((what, detail))
    deny = await store.add_grant(Grant("launch", "agent", False, None))
    assert deny.id is not None
    sql = "UPDATE grants SET allow = 1 WHERE id = %s"
    if backend == "postgresql":
        import psycopg

        with psycopg.connect(request.getfixturevalue("pg_url"), autocommit=True) as conn:
            conn.execute(sql, (deny.id,))
    else:
        import sqlite3

        conn = sqlite3.connect(store.where)
        with conn:
            conn.execute(sql.replace("%s", "?"), (deny.id,))
        conn.close()
    assert await store.find_grants("launch", "agent", "aa" * 32) == []
    assert told and told[0][0] == "grant"


@pytest.mark.parametrize("how", ["written", "copied from another request"])
async def test_an_answer_written_into_the_database_answers_nothing(
    open_store: Opener, backend: str, request: pytest.FixtureRequest, how: str
) -> None:
    """An answer to a pending approval that this store did not sign (written into the
    database by another process, or a signed answer moved from another request) is read
    as no answer, by every way of reading it, and the tampering is told."""
    store = await open_store()
    told: list[str] = []
    store.on_tamper = lambda what, detail: told.append(what)
    await store.add_pending(pending("p1"))
    assert await store.offer_pending("p1")
    if how == "written":
        sql = (
            "UPDATE pending SET answer_allow = 1, answer_remember = 'once', "
            "answer_scope = 'call', answer_channel = 'inbox', answered = %s WHERE id = %s"
        )
        params: tuple[Any, ...] = (time.time(), "p1")
    else:
        await store.add_pending(pending("p2"))
        assert await store.offer_pending("p2")
        assert (await store.answer_pending("p2", PendingAnswer(allow=True))).status == "answered"
        columns = (
            "answer_allow, answer_remember, answer_scope, answer_channel, answered, answer_mac"
        )
        sql = (
            f"UPDATE pending SET ({columns}) = (SELECT {columns} FROM pending WHERE id = %s) "
            "WHERE id = %s"
        )
        params = ("p2", "p1")
    _sql(backend, request, store, sql, params)
    row = await store.get_pending("p1")
    assert row is not None and row.answer is None, row
    listed = {p.id: p for p in await store.pending()}
    assert listed["p1"].answer is None
    assert told and set(told) == {"answer"}


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE pending SET rendered = 'target = \"/tmp/harmless\"' WHERE id = %s",
        "UPDATE pending SET warnings = '[]' WHERE id = %s",
        "UPDATE pending SET reason = 'Routine and safe.' WHERE id = %s",
        "UPDATE pending SET tool = 'harmless' WHERE id = %s",
        "UPDATE pending SET view_mac = NULL WHERE id = %s",
    ],
    ids=["arguments shown", "warnings dropped", "reason", "tool", "mac removed"],
)
async def test_what_an_approver_is_shown_cannot_be_changed_in_the_database(
    open_store: Opener, backend: str, request: pytest.FixtureRequest, change: str
) -> None:
    """The display of a pending request is signed when it is written: changed in the
    database by anybody without the host's key, the request is no longer listed nor
    answerable (and so its call is denied), and the tampering is told."""
    store = await open_store()
    told: list[str] = []
    store.on_tamper = lambda what, detail: told.append(what)
    row = replace(pending("p1"), warnings=("the view cuts 4 KiB of the arguments",))
    await store.add_pending(row)
    await store.add_pending(pending("p2"))
    assert {p.id for p in await store.pending()} == {"p1", "p2"}
    _sql(backend, request, store, change, ("p1",))
    assert [p.id for p in await store.pending()] == ["p2"]
    assert await store.get_pending("p1") is None
    assert await store.get_pending("p2") is not None  # the others stand
    assert told and set(told) == {"pending"}


def _sql(
    backend: str, request: pytest.FixtureRequest, store: Any, sql: str, params: tuple[Any, ...]
) -> None:
    """Run ``sql`` (``%s`` placeholders) on the store's database as another process would."""
    if backend == "postgresql":
        import psycopg

        with psycopg.connect(request.getfixturevalue("pg_url"), autocommit=True) as conn:
            conn.execute(sql, params)
    else:
        import sqlite3

        conn = sqlite3.connect(store.where)
        with conn:
            conn.execute(sql.replace("%s", "?"), params)
        conn.close()


async def test_the_first_answer_wins_and_the_others_are_told(open_store: Opener) -> None:
    store = await open_store()
    other = await open_store("h2", folder=None)  # a second host on the same database
    await store.add_pending(pending("p1"))
    early = await other.answer_pending("p1", PendingAnswer(allow=True, approver="eve"))
    assert early.status == "not_offered"
    assert await store.offer_pending("p1", margin=0.5)
    results = await _answer_together(
        [store, other, other, store],
        "p1",
        [PendingAnswer(allow=n % 2 == 0, approver=f"person{n}") for n in range(4)],
    )
    statuses = sorted(r.status for r in results)
    assert statuses == ["answered", "answered_before", "answered_before", "answered_before"]
    (winner,) = [r for r in results if r.status == "answered"]
    assert winner.pending is not None and winner.pending.answer is not None
    for result in results:  # every loser is told who won
        assert result.pending is not None and result.pending.answer == winner.pending.answer
    row = await store.get_pending("p1")
    assert row is not None and row.answer == winner.pending.answer
    await store.remove_pending("p1")
    gone = await other.answer_pending("p1", PendingAnswer(allow=True))
    assert gone.status == "gone" and await store.pending() == []
    assert not await store.offer_pending("p1")


async def _answer_together(
    stores: list[JournaledStore], pending_id: str, answers: list[Any]
) -> list[Any]:
    results: list[Any] = [None] * len(stores)

    async def one(n: int) -> None:
        results[n] = await stores[n].answer_pending(pending_id, answers[n])

    async with anyio.create_task_group() as tg:
        for n in range(len(stores)):
            tg.start_soon(one, n)
    return results


async def test_an_expired_request_takes_no_answer(open_store: Opener) -> None:
    store = await open_store()
    await store.add_pending(pending("p1", ttl=0.5))
    assert await store.offer_pending("p1", margin=0.5)
    result = await store.answer_pending("p1", PendingAnswer(allow=True))
    assert result.status == "expired"


async def test_session_values_and_files(open_store: Opener) -> None:
    store = await open_store()
    await store.set_value("s1", "a", b"x" * 10, max_total=25)
    await store.set_value("s1", "b", b"y" * 10, max_total=25)
    await store.set_value("s1", "a", b"z" * 15, max_total=25)  # replaces a's 10 bytes
    with pytest.raises(StoreFull):
        await store.set_value("s1", "c", b"w", max_total=25)
    await store.set_value("s2", "c", b"w", max_total=25)  # another session's own budget
    assert await store.get_value("s1", "a") == b"z" * 15
    await store.set_value("s1", "a", None, max_total=25)
    assert await store.get_value("s1", "a") is None
    kept = await store.save_files(
        "s1", "h1.7", [("../re port.txt", "text/plain", b"hello", None, None),
                       ("re port.txt", "text/plain", b"again", None, None)]
    )  # fmt: skip
    assert [f.name for f in kept] == ["re_port.txt", "re_port-2.txt"]
    assert await store.files("h1.7") == kept
    assert await anyio.Path(kept[0].path).read_bytes() == b"hello"


async def test_what_a_dead_host_left_open_is_closed_by_the_next(
    open_store: Opener, tmp_path: Path
) -> None:
    first = await open_store("h1")
    await first.record(started("h1.1"), durable=True)
    await first.record(started("h1.2", outcome="waiting", decision="escalate"), durable=True)
    await first.add_pending(pending("p1"))
    await first.flush()
    await anyio.to_thread.run_sync(_die, first)
    second = await open_store("h2")
    assert second is not first
    records = {r.call_id: r for r in await second.tail(10)}
    assert (records["h1.1"].outcome, records["h1.1"].error_kind) == ("unknown", "host_stopped")
    assert (records["h1.2"].outcome, records["h1.2"].approval) == ("denied", "host_stopped")
    assert await second.pending() == []


def _die(store: Any) -> None:
    """The host "dies" without closing anything: its lock is dropped, and its process
    identity is one of another boot (SQLite: as after a crash and a restart), or its
    heartbeat stopped long ago (PostgreSQL: a host on any machine that went silent)."""
    listener = getattr(store, "_listener", None)
    if listener is not None:  # the heartbeat stops with the process
        listener.stop()
        store._listener = None
    if store._ingester is not None:  # its writer finishes, as when a host is killed
        store._ingester.stop(10.0)
        store._ingester = None
    store._lock.release()
    store._lock = None
    where = store.where
    if where.startswith("postgresql"):
        import psycopg

        with psycopg.connect(store.url, autocommit=True) as conn:  # silent for an hour
            conn.execute(
                "UPDATE hosts SET seen = now() - interval '1 hour' WHERE host_id = %s",
                (store.host_id,),
            )
    else:
        import sqlite3

        conn = sqlite3.connect(where)
        with conn:
            conn.execute(
                "UPDATE hosts SET identity = 'another-boot:0:1:1' WHERE host_id = ?",
                (store.host_id,),
            )
        conn.close()
    store._journal.close()
    store._journal = None
    store.host_id = None  # closing it later removes nothing of its own


async def test_a_store_that_cannot_open(backend: str, tmp_path: Path) -> None:
    if backend == "postgresql":
        url = f"postgresql://nobody:s3cret-pw@/postgres?host={tmp_path}/nothing&connect_timeout=1"
        store: Any = store_for(url, tmp_path / ".agent")
        store._busy_timeout = 1.0
    else:
        (tmp_path / ".agent").mkdir()
        (tmp_path / ".agent" / "state.db").mkdir()  # a folder where the file should be
        store = store_for(None, tmp_path / ".agent")
    with pytest.raises(StoreUnavailable) as caught:
        await store.start("h1")
    assert "s3cret-pw" not in str(caught.value)
    await store.aclose()


POLICY = """\
version = 1

[[rules]]
id = "ask"
tools = ["launch"]
decision = "escalate"
"""


async def test_a_grant_answers_the_tool_as_declared_and_a_changed_one_asks_again(
    backend: str, make_project: Callable[..., Path], request: pytest.FixtureRequest
) -> None:
    from host import Approval, Host
    from host.testing import in_process

    url = request.getfixturevalue("pg_url") if backend == "postgresql" else None
    asked: list[str] = []

    async def approver(req: Any) -> Approval:
        asked.append(req.tool)
        return Approval(True, "always", "tool")

    before = 'def launch(target: str) -> str:\n    return "at " + target\n'
    after = 'def launch(target: str, count: int = 1) -> str:\n    return "at " + target\n'
    project = make_project({"desk": before}, POLICY)
    for source, expect in ((before, 1), (before, 1), (after, 2), (after, 2)):
        (project / "tools" / "desk.py").write_text(source)
        async with Host.open(project, approver=approver, capsule=in_process(), store=url) as host:
            assert await host.call("launch", target="x") == "at x"
        assert len(asked) == expect  # asked once per declaration of the tool


async def test_an_expired_grant_answers_nothing_and_its_expiry_is_signed(
    open_store: Opener, backend: str, request: pytest.FixtureRequest
) -> None:
    store = await open_store()
    told: list[str] = []
    store.on_tamper = lambda what, detail: told.append(what)
    past = await store.add_grant(Grant("launch", "app", True, None, expires=time.time() - 1))
    live = await store.add_grant(Grant("launch", "agent", True, None, expires=time.time() + 600))
    assert await store.find_grants("launch", "app", "aa" * 32) == []
    assert await store.find_grants("launch", "agent", "aa" * 32) == [live]
    assert await store.grants() == [live]
    assert past.id is not None
    sql = "UPDATE grants SET expires = expires + 3600 WHERE id = %s"  # extended by hand
    if backend == "postgresql":
        import psycopg

        with psycopg.connect(request.getfixturevalue("pg_url"), autocommit=True) as conn:
            conn.execute(sql, (past.id,))
    else:
        import sqlite3

        conn = sqlite3.connect(store.where)
        with conn:
            conn.execute(sql.replace("%s", "?"), (past.id,))
        conn.close()
    assert await store.find_grants("launch", "app", "aa" * 32) == []
    assert told == ["grant"]


async def test_a_policy_gives_always_answers_an_expiry(
    make_project: Callable[..., Path],
) -> None:
    from host import Approval, Host
    from host.testing import in_process

    async def approver(req: Any) -> Approval:
        return Approval(True, "always", "tool")

    project = make_project(
        {"desk": 'def launch(target: str) -> str:\n    return "at " + target\n'},
        POLICY.replace("version = 1\n", 'version = 1\n[defaults]\ngrant_expiry = "2h"\n'),
    )
    async with Host.open(project, approver=approver, capsule=in_process()) as host:
        await host.call("launch", target="x")
        (grant,) = await host.store.grants()
    assert grant.expires is not None and 7000 < grant.expires - time.time() <= 7200
