"""H: the audit cannot be rewritten behind the host's back (issue 12, finding 3; issue 13,
class 5).

A process of the host's own user (a tool without Landlock, or anything else the user
runs) can write the state database and the journal. It cannot make the host trust what
it wrote: a grant it plants is not signed with the host's key and is ignored and
reported; a journal it overwrites, removes or replaces, and audit rows it deletes, stop
dispatch (``audit_unavailable``) with an ``audit_tampered`` event. Every call gets exactly
one terminal record whatever dies, calls waiting for an approval included, and a host is
never taken for dead because its lock file was removed.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import replace
from hashlib import sha256
from pathlib import Path
from typing import Any

import anyio
import pytest

from capsule.protocol import encode
from host import Approval, Grant, Host, NotApproved, PolicyDenied, SQLiteStore
from host.audit import PendingApproval

from ._bank import Bank, kinds
from ._bank import bank as bank  # the fixture

pytestmark = pytest.mark.anyio


def _sha(to: str, amount: int = 1) -> str:
    return sha256(encode({"to": to, "amount": amount})).hexdigest()


async def _digest(host: Host) -> str:
    """The digest of rule ``pay`` as the host's policy has it (anybody can work it out:
    the policy file is readable; only the MAC is out of reach)."""
    decision = host.policy.current().decide("transfer", {"to": "x", "amount": 1}, "app")
    assert decision.rule == "pay" and decision.rule_digest is not None
    return decision.rule_digest


async def _offered(store: SQLiteStore) -> PendingApproval:
    """The one pending request, once its host offers it to the inbox (polled)."""
    with anyio.fail_after(10):
        while not [p for p in await store.pending() if p.offered]:  # noqa: ASYNC110 - polling test state
            await anyio.sleep(0.01)
    (request,) = await store.pending()
    return request


def _tampered(host: Host, what: str) -> list[str]:
    return [str(e.data["detail"]) for e in kinds(host, "audit_tampered") if e.data["what"] == what]


# -- grants the host did not sign ----------------------------------------------------------


async def _plant(bank: Bank, host: Host, how: str) -> None:
    """Give ``transfer`` to everybody (or to bob) behind the host's back."""
    digest = await _digest(host)
    if how == "inserted":  # a new row, with everything right but the MAC
        bank.sql(
            "INSERT INTO grants (created, tool, caller, args_sha256, allow, rule, rule_digest, "
            "reason, mac) VALUES (?, 'transfer', 'app', NULL, 1, 'pay', ?, ?, ?)",
            time.time(),
            digest,
            "payments need a person",
            "ab" * 32,
        )
    elif how == "widened":  # a real grant for alice, made to cover every call
        grant = await host.store.add_grant(
            Grant("transfer", "app", True, _sha("alice"), rule="pay", rule_digest=digest)
        )
        bank.sql("UPDATE grants SET args_sha256 = NULL WHERE id = ?", grant.id)
    elif how == "flipped":  # a real remembered deny for bob, turned into an allow
        grant = await host.store.add_grant(
            Grant("transfer", "app", False, _sha("bob"), rule="pay", rule_digest=digest)
        )
        bank.sql("UPDATE grants SET allow = 1 WHERE id = ?", grant.id)
    elif how == "unrevoked":  # a real allow for bob, revoked, brought back
        grant = await host.store.add_grant(
            Grant("transfer", "app", True, _sha("bob"), rule="pay", rule_digest=digest)
        )
        assert grant.id is not None and await host.store.revoke_grant(grant.id)
        bank.sql("UPDATE grants SET revoked = NULL WHERE id = ?", grant.id)
    elif how == "copied":  # a real grant of another project of the same user, MAC and all
        other = SQLiteStore(bank.root / "elsewhere" / "state.db")
        await other.start("other")
        try:
            await other.add_grant(
                Grant("transfer", "app", True, None, rule="pay", rule_digest=digest)
            )
        finally:
            await other.aclose()
        conn = sqlite3.connect(bank.root / "elsewhere" / "state.db")
        try:
            (row,) = conn.execute(
                "SELECT created, tool, caller, args_sha256, allow, rule, rule_digest, reason, "
                "summary, mac FROM grants"
            ).fetchall()
        finally:
            conn.close()
        bank.sql(
            "INSERT INTO grants (created, tool, caller, args_sha256, allow, rule, rule_digest, "
            "reason, summary, mac) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            *row,
        )
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["inserted", "widened", "flipped", "unrevoked", "copied"])
async def test_a_grant_the_host_did_not_sign_answers_nothing(
    bank: Callable[..., Bank], how: str
) -> None:
    b = bank()
    asked: list[Any] = []

    async def deny_all(request: Any) -> bool:
        asked.append(request)
        return False

    async with b.open(deny_all) as host:
        await _plant(b, host, how)
        with pytest.raises(NotApproved) as info:
            await host.call("transfer", "bob")
        assert info.value.reason == "denied"
        (record,) = await host.store.tail(1)
        reported = _tampered(host, "grant")
        grants = await host.store.grants()
    assert b.ran() == []  # the canary: no money moved
    assert len(asked) == 1  # a person was asked: nothing answered in their place
    assert (record.tool, record.outcome, record.decision) == ("transfer", "denied", "escalate")
    assert reported and "not signed by this host's key" in reported[0]
    assert all(g.allow is False for g in grants)  # listings show only what the host signed


async def test_a_grant_the_host_signed_still_answers(bank: Callable[..., Bank]) -> None:
    b = bank()
    async with b.open() as host:  # deny-all: only the grant can let it through
        digest = await _digest(host)
        await host.store.add_grant(
            Grant("transfer", "app", True, _sha("alice"), rule="pay", rule_digest=digest)
        )
        assert await host.call("transfer", "alice") == "sent 1 to alice"
        assert _tampered(host, "grant") == []
    assert b.ran() == [{"transfer": "alice", "amount": 1}]


@pytest.mark.subprocess
async def test_a_tool_that_plants_a_grant_gains_nothing(bank: Callable[..., Bank]) -> None:
    b = bank()
    async with b.open(capsule=None) as host:  # a real subprocess capsule, the host's user
        digest = await _digest(host)
        try:
            await host.call("plant", str(b.db), digest)
            planted = True
        except Exception:  # kept away from the file (Landlock): as good
            planted = False
        with pytest.raises(NotApproved):
            await host.call("transfer", "mallory", 1_000_000)
        reported = _tampered(host, "grant")
    assert b.ran() == []
    assert not planted or reported


# -- answers written into the database ------------------------------------------------------


@pytest.mark.parametrize("how", ["written", "copied from another request"])
async def test_an_answer_the_host_did_not_sign_approves_nothing(
    bank: Callable[..., Bank], how: str
) -> None:
    """The inbox's answers go through the database; one written there by another process
    of the user (to approve a call) is ignored: the request stays unanswered, is denied
    at its deadline, and the tampering is reported."""
    from host.audit import PendingAnswer

    b = bank(timeout="2s")
    async with b.open(approver="inbox") as host:
        store = host.store
        assert isinstance(store, SQLiteStore)
        results: list[Any] = []

        async def call(to: str) -> None:
            try:
                results.append(await host.call("transfer", to))
            except NotApproved as exc:
                results.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "mallory")
            request = await _offered(store)
            if how == "written":
                b.sql(
                    "UPDATE pending SET answer_allow = 1, answer_remember = 'once', "
                    "answer_scope = 'call', answer_channel = 'inbox', answered = ? "
                    "WHERE id = ?",
                    time.time(),
                    request.id,
                )
            else:  # a real answer, signed for another request, moved onto this one
                # another request, as the host writes one (its view signed)
                await store.add_pending(replace(request, id="other", answer=None))
                answered = await store.answer_pending("other", PendingAnswer(True))
                assert answered.status == "answered"
                b.sql(
                    "UPDATE pending SET (answer_allow, answer_remember, answer_scope, "
                    "answer_channel, answered, answer_mac) = (SELECT answer_allow, "
                    "answer_remember, answer_scope, answer_channel, answered, answer_mac "
                    "FROM pending WHERE id = 'other') WHERE id = ?",
                    request.id,
                )
        reported = _tampered(host, "answer")
    assert b.ran() == []  # mallory was never paid
    assert len(results) == 1 and isinstance(results[0], NotApproved)
    assert results[0].reason == "timeout"
    assert reported and "not signed by this host's key" in reported[0]


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE pending SET rendered = 'to = \"alice\"' WHERE id = ?",  # who gets paid
        "UPDATE pending SET warnings = '[]', reason = 'Routine.' WHERE id = ?",
    ],
    ids=["arguments shown", "warnings and reason"],
)
async def test_a_request_whose_view_was_changed_is_never_shown_nor_approved(
    bank: Callable[..., Bank], change: str
) -> None:
    """What the inbox shows an approver comes from the database; changed there (to make
    a payment to mallory look like one to alice), the request is no longer listed or
    answerable: the call is denied at its deadline and the tampering is reported."""
    from host.audit import PendingAnswer

    b = bank(timeout="2s")
    async with b.open(approver="inbox") as host:
        store = host.store
        assert isinstance(store, SQLiteStore)
        results: list[Any] = []

        async def call() -> None:
            try:
                results.append(await host.call("transfer", "mallory"))
            except NotApproved as exc:
                results.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            request = await _offered(store)
            b.sql(change, request.id)
            assert await store.pending() == []  # the inbox lists nothing to approve
            answered = await store.answer_pending(request.id, PendingAnswer(True))
            assert answered.status == "gone"  # not answerable: its view is not what was asked
        reported = _tampered(host, "pending")
    assert b.ran() == []  # mallory was never paid
    assert len(results) == 1 and isinstance(results[0], NotApproved), results
    assert reported and "not signed by this host's key" in reported[0]


async def test_an_answer_given_through_the_store_still_approves(
    bank: Callable[..., Bank],
) -> None:
    from host.audit import PendingAnswer

    b = bank()
    async with b.open(approver="inbox") as host:
        store = host.store
        assert isinstance(store, SQLiteStore)
        results: list[Any] = []

        async def call() -> None:
            results.append(await host.call("transfer", "alice"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            request = await _offered(store)
            answered = await store.answer_pending(request.id, PendingAnswer(True))
            assert answered.status == "answered"
        assert _tampered(host, "answer") == []
    assert results == ["sent 1 to alice"] and b.ran() == [{"transfer": "alice", "amount": 1}]


@pytest.mark.subprocess
async def test_a_tool_cannot_read_the_hosts_key(bank: Callable[..., Bank]) -> None:
    """What makes the MACs unforgeable: a subprocess tool cannot read the key's file
    where Landlock holds it (the host says at start when it cannot)."""
    from host.capsules import containment
    from host.trust import host_key

    b = bank()
    key = host_key().path
    async with b.open(capsule=None) as host:
        seen = await host.call("peek", str(key))
        said = [e for e in host.events.recent if "Landlock" in str(e.data)]
    if containment().landlock:
        assert seen == "EACCES"
    else:  # the tool can read it: the host said so at start
        assert seen == "read" and said


# -- the journal -----------------------------------------------------------------------------


def _zero(path: Path) -> None:
    with path.open("r+b") as f:
        f.write(bytes(path.stat().st_size))


def _replace(path: Path) -> None:
    copy = path.with_name(".copy")
    shutil.copyfile(path, copy)
    os.replace(copy, path)


def _flip(path: Path) -> None:
    from host.audit._journal import MAGIC

    data = bytearray(path.read_bytes())
    at = len(MAGIC) + 28 + 3  # inside the first record's body
    data[at] ^= 0x01
    with path.open("r+b") as f:
        f.write(bytes(data[: len(MAGIC) + 64]))


ATTACKS: dict[str, Callable[[Path], None]] = {
    "zeroed": _zero,
    "removed": Path.unlink,
    "replaced": _replace,
    "bit flipped": _flip,
}


@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_a_journal_changed_under_the_host_stops_dispatch(
    bank: Callable[..., Bank], attack: str
) -> None:
    b = bank()
    # The writer only reads when asked (flush), so the attack lands before it looks.
    store = SQLiteStore(b.db, interval=3600)
    async with b.open(store=store, approver=lambda request: _allow()) as host:
        unavailable: list[Any] = []
        host.on("audit_unavailable", unavailable.append)
        assert await host.call("transfer", "alice") == "sent 1 to alice"
        (segment,) = b.segments()
        ATTACKS[attack](segment)
        await host.call("balance")  # appended after the attack: the writer must find it
        with pytest.raises(Exception, match="tampered"):
            await store.flush()
        with pytest.raises(PolicyDenied) as info:
            await host.call("transfer", "bob")
        assert info.value.rule == "audit_unavailable"
        with pytest.raises(PolicyDenied):
            await host.call("balance")
        reported = _tampered(host, "journal")
    assert b.ran() == [{"transfer": "alice", "amount": 1}]  # bob's never ran
    assert unavailable and "tampered" in str(unavailable[0].data["reason"])
    assert len(reported) == 1
    refused = _rows(b, "SELECT tool, outcome FROM audit WHERE outcome = 'denied'")
    assert ("transfer", "denied") in refused  # the refusals after the damage are audited


async def _allow() -> bool:
    return True


def _rows(bank: Bank, query: str) -> list[Any]:
    conn = sqlite3.connect(bank.db)
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


async def test_a_journal_zeroed_while_calls_flow_stops_them(bank: Callable[..., Bank]) -> None:
    b = bank()
    async with b.open(approver=lambda request: _allow()) as host:  # the writer follows along
        for _ in range(5):
            await host.call("balance")
        for segment in b.segments():
            _zero(segment)
        with anyio.fail_after(30):
            while True:
                try:
                    await host.call("balance")
                except PolicyDenied as exc:
                    assert exc.rule == "audit_unavailable"
                    break
                await anyio.sleep(0.01)
        for who in ("mallory", "eve"):  # approved, and still nothing runs
            with pytest.raises(PolicyDenied):
                await host.call("transfer", who)
        assert _tampered(host, "journal")
    assert b.ran() == []


# -- rows removed from the database ----------------------------------------------------------


@pytest.mark.parametrize("which", ["one row", "every row", "and the writer"])
async def test_deleting_this_hosts_audit_rows_stops_dispatch(
    bank: Callable[..., Bank], which: str
) -> None:
    import psutil

    b = bank()
    async with b.open(approver=lambda request: _allow()) as host:
        for who in ("alice", "bob", "carol"):
            await host.call("transfer", who)
        assert isinstance(host.store, SQLiteStore)
        await host.store.flush()
        if which == "one row":
            b.sql("DELETE FROM audit WHERE call_id = (SELECT min(call_id) FROM audit)")
        else:
            b.sql("DELETE FROM audit WHERE host_id = ?", host.host_id)
        if which == "and the writer":  # it comes back, and is told how many rows to expect
            (writer,) = [
                p for p in psutil.Process().children() if "_journal.py" in " ".join(p.cmdline())
            ]
            writer.kill()
        with anyio.fail_after(30):
            while not _tampered(host, "journal"):
                try:
                    await host.call("balance")
                except PolicyDenied as exc:  # also while the writer is started again
                    assert exc.rule == "audit_unavailable"
                await anyio.sleep(0.02)
        with pytest.raises(PolicyDenied):
            await host.call("transfer", "mallory")
        reported = _tampered(host, "journal")
    assert [r["transfer"] for r in b.ran()] == ["alice", "bob", "carol"]
    assert reported and "removed from the database" in reported[0]


# -- every call has one terminal record, whatever dies ---------------------------------------

WAITING_HOST = """
import sys
from pathlib import Path

import anyio

from host import Host


async def main() -> None:
    marker = Path(sys.argv[2])

    async def never(request):  # a person who never answers
        with marker.open("a") as f:
            f.write(request.call_id + "\\n")
        await anyio.sleep_forever()

    async with Host.open(sys.argv[1], approver=never) as host:
        async with anyio.create_task_group() as tg:
            for _ in range(int(sys.argv[3])):
                tg.start_soon(host.call, "transfer", "bob")  # identical calls join

anyio.run(main)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize(("calls", "writer_too"), [(1, False), (2, False), (1, True)])
def test_a_host_killed_while_calls_wait_for_approval_leaves_one_record_each(
    bank: Callable[..., Bank], tmp_path: Path, calls: int, writer_too: bool
) -> None:
    import psutil

    b = bank(timeout="1h")
    marker = tmp_path / "asked.txt"
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WAITING_HOST), str(b.root), str(marker), str(calls)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() or not _rows_waiting(b, calls):
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the host never asked"
            time.sleep(0.05)
        if writer_too:  # nothing reaches the database after this: the journal is replayed
            for p in psutil.Process(child.pid).children():
                if "_journal.py" in " ".join(p.cmdline()):
                    p.kill()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()

    async def reopen() -> list[Any]:
        async with b.open() as host:
            records = await host.store.tail(100)
            assert await host.store.pending() == []
            (event,) = kinds(host, "audit_reconciled")
            assert event.data["closed_as_unknown"] == calls
            return records

    records = anyio.run(reopen)
    assert len(records) == calls  # exactly one record per call
    assert len({r.call_id for r in records}) == calls
    assert {(r.tool, r.outcome, r.error_kind, r.decision) for r in records} == {
        ("transfer", "denied", "host_stopped", "escalate")
    }
    assert b.ran() == []


def _rows_waiting(bank: Bank, calls: int) -> bool:
    """Whether every call is journaled as waiting (read as any reader would)."""
    from host.audit._reading import read_audit

    try:
        return sum(r.outcome == "waiting" for r in read_audit(bank.db, 100)) >= calls
    except sqlite3.Error:
        return False


# -- a host whose lock file is removed is still alive ----------------------------------------

HOLDING_HOST = """
import sys
from pathlib import Path

import anyio

from host import Host


async def main() -> None:
    root, flag, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    async with Host.open(root) as host:
        out.write_text(host.host_id + "\\n")
        await host.call("hold", flag)            # in flight while the other host starts
        await host.call("transfer", "after")     # app calls of transfer escalate: denied
        await host.call("balance")
        with out.open("a") as f:
            f.write("done\\n")

anyio.run(main)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("how", ["removed", "replaced by an unlocked file", "and killed"])
def test_a_host_whose_lock_file_is_removed_is_not_taken_for_dead(
    bank: Callable[..., Bank], tmp_path: Path, how: str
) -> None:
    policy = textwrap.dedent(
        """\
        version = 1
        [defaults]
        app = "allow"
        [env]
        pass = ["BANK_CANARY"]
        """
    )
    b = bank(policy=policy)
    flag, out = tmp_path / "release", tmp_path / "first.txt"
    first = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDING_HOST), str(b.root), str(flag), str(out)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not out.exists() or not _started(b):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first host never dispatched"
            time.sleep(0.05)
        host_id = out.read_text().split()[0]
        lock = b.root / ".agent" / "hosts" / f"{host_id}.lock"
        lock.unlink()
        if how == "replaced by an unlocked file":
            lock.write_text("")
        if how == "and killed":
            first.kill()
            first.wait(30)

        async def second() -> tuple[int, list[Any]]:
            async with b.open() as host:
                closed = [e.data["closed_as_unknown"] for e in kinds(host, "audit_reconciled")]
                return sum(closed), await host.store.tail(100)

        closed, seen = anyio.run(second)
        if how == "and killed":  # really dead: closed by the second host, once
            assert closed == 1
            (record,) = [r for r in seen if r.tool == "hold"]
            assert (record.outcome, record.error_kind) == ("unknown", "host_stopped")
            return
        assert closed == 0  # the first host's call in flight is left alone
        assert [r.outcome for r in seen if r.tool == "hold"] == ["started"]
        assert any(p.name.startswith(host_id + ".") for p in b.segments())  # nor its journal
        flag.write_text("go")
        first.wait(60)
        assert "done" in out.read_text(), first.communicate()
    finally:
        flag.write_text("go")
        if first.poll() is None:
            first.kill()
        first.communicate()
    rows = {tool: outcome for tool, outcome in _rows(b, "SELECT tool, outcome FROM audit")}
    assert rows == {"hold": "ok", "transfer": "ok", "balance": "ok"}  # all audited, closed


def _started(bank: Bank) -> bool:
    from host.audit._reading import read_audit

    try:
        return any(r.tool == "hold" and r.outcome == "started" for r in read_audit(bank.db, 10))
    except sqlite3.Error:
        return False


async def test_an_approval_is_not_answered_by_the_audit(bank: Callable[..., Bank]) -> None:
    """A control: the waiting record is replaced by the decision, one row per call."""
    b = bank()
    async with b.open(approver=lambda request: _answer(request)) as host:
        assert await host.call("transfer", "alice") == "sent 1 to alice"
        with pytest.raises(NotApproved):
            await host.call("transfer", "bob")
        assert isinstance(host.store, SQLiteStore)
        await host.store.flush()
    rows = _rows(b, "SELECT tool, outcome, decision, approval FROM audit ORDER BY seq")
    assert rows == [
        ("transfer", "ok", "escalate", "once"),
        ("transfer", "denied", "escalate", "denied"),
    ]


async def _answer(request: Any) -> Approval:
    return Approval(request.arguments["to"] == "alice")


def test_liveness_rests_on_the_lock_and_the_process_never_on_the_file(tmp_path: Path) -> None:
    from host.audit._hostlock import HostLock, identity

    lock = HostLock(tmp_path, "live")
    me = identity()
    assert me is not None
    try:
        assert not HostLock.is_dead(tmp_path, "live", me)  # locked
        lock.path.unlink()
        assert not HostLock.is_dead(tmp_path, "live", me)  # no file, but it runs
        assert not HostLock.is_dead(tmp_path, "live", None)  # no file, nothing to check
        lock.path.write_text("")  # an unlocked impostor
        assert not HostLock.is_dead(tmp_path, "live", me)
        assert lock.path.exists()  # and it is not removed as a dead host's
        assert not lock.verify()  # the host itself notices, and locks its own again
        assert lock.verify() and not HostLock.is_dead(tmp_path, "live", None)
    finally:
        lock.release()
    gone = "another-boot:0:1:1"  # a process of a boot that ended
    assert HostLock.is_dead(tmp_path, "live", gone)  # no lock, no process: dead
    (tmp_path / "old.lock").write_text("")
    assert HostLock.is_dead(tmp_path, "old", gone) and not (tmp_path / "old.lock").exists()


@pytest.mark.anyio
async def test_a_running_host_makes_its_removed_lock_file_again(bank: Callable[..., Bank]) -> None:
    import fcntl

    b = bank()
    async with b.open() as host:
        lock = b.root / ".agent" / "hosts" / f"{host.host_id}.lock"
        lock.unlink()
        with anyio.fail_after(30):
            while not lock.exists():
                await host.call("balance")  # the writer reports; the host checks its lock
                await anyio.sleep(0.05)
        fd = os.open(lock, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # locked: by the host, for its life
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


PEEK = """
import sys
try:
    with open(f"/proc/{sys.argv[1]}/mem", "rb") as f:
        f.read(1)
except PermissionError:
    print("refused")
except OSError as exc:
    print(f"opened ({type(exc).__name__})")
else:
    print("opened")
"""


def test_the_audit_writer_holding_the_key_is_not_dumpable() -> None:
    """The writer gets the host's key: its memory must be closed to the other processes
    of its user (a subprocess tool), as the host's is. As root the writer and the peeking
    process run as ``nobody``: root's capabilities would hide the difference."""
    import pwd

    root = Path(__file__).resolve().parents[2]
    site = next(p for p in sys.path if p.endswith("site-packages"))
    uid = pwd.getpwnam("nobody").pw_uid if os.geteuid() == 0 else os.getuid()
    python = "/usr/bin/python3.11" if os.geteuid() == 0 else sys.executable
    if not Path(python).exists():
        pytest.skip("no interpreter another user may run")
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="toolhost-writer-"))  # reachable by that user
    os.chown(work, uid, -1)

    def as_user() -> None:
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

    writer = subprocess.Popen(
        [
            *(python, str(root / "host" / "audit" / "_journal.py")),
            *(str(work / "state.db"), str(work / "journal"), "h", "0.05", "1.0", "process"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PYTHONPATH": f"{root}:{site}"},
        preexec_fn=as_user,
    )
    try:
        assert writer.stdin is not None and writer.stdout is not None
        writer.stdin.write(b"key " + b"ab" * 32 + b" 1 0 1 0\n")
        writer.stdin.flush()
        first = writer.stdout.readline()  # its first report: the key is in its memory now
        assert first.startswith(b"done "), (first, writer.stderr.read() if writer.stderr else b"")
        peek = subprocess.run(
            [python, "-c", PEEK, str(writer.pid)],
            capture_output=True,
            env={},
            preexec_fn=as_user,
            timeout=60,
            check=False,
        )
    finally:
        writer.kill()
        writer.communicate()
        shutil.rmtree(work, ignore_errors=True)
    assert peek.stdout.decode().strip() == "refused", peek
