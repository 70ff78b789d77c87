"""The audit trail: decision before dispatch, outcome after, redaction, fail closed,
and records of a host that died closed as ``unknown`` by the next one (SECURITY
catalogue H07, H08, F08, I05)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from host import Host, PolicyDenied, SQLiteStore, ToolError, ToolTimeout, UnknownTool
from host.audit import StoreUnavailable
from host.testing import in_process

pytestmark = pytest.mark.anyio

PROBE_TOOLS = {
    "probe": '''
        import os
        import sqlite3
        from pathlib import Path

        import anyio


        def _mark(text: str) -> None:
            with Path(os.environ["AUDIT_MARKER"]).open("a", encoding="utf-8") as f:
                f.write(text + "\\n")


        def peek() -> dict:
            """What the audit trail says about the newest call, seen from inside a call
            (from another process, as any reader of the project's state sees it)."""
            from host.audit._reading import read_audit

            (row,) = read_audit(Path(os.environ["AUDIT_DB"]), 1)
            return {"call_id": row.call_id, "outcome": row.outcome, "decision": row.decision}


        def echo(text: str) -> str:
            return text


        def fail(text: str) -> str:
            raise ValueError(text)


        def launch(target: str = "moon") -> str:
            _mark(f"launch {target}")
            return target


        async def slow(seconds: float = 60.0) -> str:
            _mark("slow started")
            await anyio.sleep(seconds)
            return "done"
        '''
}

PROBE_POLICY = """\
version = 1

[defaults]
app = "allow"

[[rules]]
id = "no-forbidden"
tools = ["launch"]
when.target = "forbidden*"
decision = "deny"

[limits]
call_timeout = "30s"

[env]
pass = ["AUDIT_DB", "AUDIT_MARKER", "AUDIT_SECRET"]
secret = ["AUDIT_SECRET"]
"""


class Probe:
    def __init__(self, root: Path, marker: Path) -> None:
        self.root = root
        self.marker = marker
        self.db = root / ".agent" / "state.db"

    def marks(self) -> list[str]:
        return self.marker.read_text().splitlines() if self.marker.exists() else []

    def raw(self) -> bytes:
        """Every byte SQLite has written for this project."""
        return b"".join(p.read_bytes() for p in self.db.parent.glob("state.db*"))

    @asynccontextmanager
    async def open(self, **kwargs: Any) -> AsyncIterator[Host]:
        kwargs.setdefault("capsule", in_process())
        async with Host.open(self.root, **kwargs) as host:
            yield host


@pytest.fixture
def probe(
    make_project: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Probe:
    root = make_project(PROBE_TOOLS, policy=PROBE_POLICY)
    # In a folder of its own: a subprocess capsule may not create files directly in the
    # folders above the project (Landlock; README, "The capsule").
    marker = tmp_path / "out" / "marker.txt"
    marker.parent.mkdir()
    monkeypatch.setenv("AUDIT_DB", str(root / ".agent" / "state.db"))
    monkeypatch.setenv("AUDIT_MARKER", str(marker))
    monkeypatch.setenv("AUDIT_SECRET", "sk-" + os.urandom(12).hex())
    return Probe(root, marker)


# -- before and after ----------------------------------------------------------------------


@pytest.mark.subprocess
async def test_the_decision_is_written_before_dispatch(
    probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The probe reads the state database from inside a call, which Landlock denies tools.
    monkeypatch.setenv("TOOLHOST_LANDLOCK", "0")
    async with probe.open(capsule=None) as host:  # a real subprocess capsule
        seen = await host.call("peek")
        (after,) = await host.store.tail(1)
    assert seen == {"call_id": after.call_id, "outcome": "started", "decision": "allow"}
    assert after.outcome == "ok" and after.ended is not None and after.ended >= after.started


async def test_every_call_gets_one_terminal_outcome(probe: Probe) -> None:
    async with probe.open(limits={"call_timeout": 0.5}) as host:
        assert await host.call("echo", "hi") == "hi"
        with pytest.raises(ToolError):
            await host.call("fail", "boom")
        with pytest.raises(PolicyDenied):
            await host.call("launch", "forbidden-zone")
        with pytest.raises(UnknownTool):
            await host.call("nope")
        with pytest.raises(ToolTimeout):
            await host.call("slow", 30)
        records = await host.store.tail(10)
    assert [(r.tool, r.outcome, r.error_kind) for r in records] == [
        ("echo", "ok", None),
        ("fail", "failed", "tool_error"),
        ("launch", "denied", "policy_denied"),
        ("nope", "denied", "unknown_tool"),
        ("slow", "unknown", "tool_timeout"),  # it may have had side effects
    ]
    assert [r.decision for r in records] == ["allow", "allow", "deny", None, "allow"]
    assert records[2].rule == "no-forbidden"
    assert len({r.call_id for r in records}) == 5
    assert probe.marks() == ["slow started"]


async def test_a_cancelled_call_is_closed(probe: Probe) -> None:
    async with probe.open() as host:
        with anyio.move_on_after(0.5):
            await host.call("slow", 30)
        (record,) = await host.store.tail(1)
    assert (record.outcome, record.error_kind) == ("unknown", "cancelled")


# -- what the audit keeps, and what it never keeps -----------------------------------------


async def test_secrets_and_argument_values_are_redacted(probe: Probe) -> None:
    secret = os.environ["AUDIT_SECRET"]
    middle = "MIDDLE-" + os.urandom(8).hex()
    huge = "A" * 50_000 + middle + "B" * 50_000
    async with probe.open() as host:
        assert await host.call("echo", f"my key is {secret}") == f"my key is {secret}"
        with pytest.raises(ToolError):
            await host.call("fail", f"rejected {secret}")
        await host.call("echo", huge)
        records = await host.store.tail(3)
        events = repr(list(host.events.recent))
    shown, failed, big = records
    assert shown.args_summary == 'text="my key is ⟨secret AUDIT_SECRET⟩"'
    assert failed.error is not None and "⟨secret AUDIT_SECRET⟩" in failed.error
    assert big.args_size is not None and big.args_size > 100_000
    assert big.args_summary is not None and len(big.args_summary) <= 512
    assert f"{len(huge):,} chars" in big.args_summary
    raw = probe.raw()
    assert secret.encode() not in raw
    assert middle.encode() not in raw
    assert secret not in events
    assert all(len(r.args_sha256 or "") == 64 for r in records)


async def test_unknown_names_are_stored_escaped_and_bounded(probe: Probe) -> None:
    async with probe.open() as host:
        for name in ["echo\u202e", "x" * 5000, "\x1b[2Jecho"]:
            with pytest.raises(UnknownTool):
                await host.call(name)
        records = await host.store.tail(3)
    assert records[0].tool == "echo\\u{202E}"
    assert len(records[1].tool) <= 201
    assert records[2].tool == "\\x1b[2Jecho"


# -- fail closed ---------------------------------------------------------------------------


async def test_a_locked_audit_fails_closed(probe: Probe) -> None:
    store = SQLiteStore(probe.db, busy_timeout=0.2, interval=0.01)
    async with probe.open(store=store) as host:
        failures: list[Any] = []
        host.on("audit_unavailable", failures.append)
        blocker = sqlite3.connect(probe.db, isolation_level=None)
        try:
            blocker.execute("BEGIN EXCLUSIVE")
            # The first call is journaled: the database is only found locked when the
            # journal's records are moved into it; from then on nothing runs.
            assert await host.call("launch", "pluto") == "pluto"
            with anyio.fail_after(30):
                while True:
                    try:
                        await host.call("launch", "mars")
                    except PolicyDenied as exc:
                        assert exc.rule == "audit_unavailable"
                        break
                    await anyio.sleep(0.01)
            marks = probe.marks()
            with pytest.raises(PolicyDenied):
                await host.call("launch", "saturn")
            assert probe.marks() == marks  # nothing ran while the trail was broken
            assert failures
            blocker.execute("ROLLBACK")
        finally:
            blocker.close()
        with anyio.fail_after(30):  # the journal catches up, and calls run again
            while True:
                try:
                    assert await host.call("launch", "venus") == "venus"
                    break
                except PolicyDenied:
                    await anyio.sleep(0.01)
        records = await host.store.tail(1000)
    assert "saturn" not in "".join(probe.marks())
    assert probe.marks()[-1] == "launch venus"
    # nothing was lost: every call, run or refused, is in the database with its outcome
    targets = [r.args_summary for r in records]
    assert any("pluto" in (t or "") for t in targets)
    assert any("saturn" in (t or "") for t in targets)
    assert all(r.outcome != "started" and r.seq is not None for r in records)


async def test_a_broken_store_fails_closed(probe: Probe) -> None:
    class Broken(SQLiteStore):
        async def record(self, record: Any, *, durable: bool) -> None:
            raise StoreUnavailable("the audit database is down")

    async with probe.open(store=Broken(probe.db)) as host:
        with pytest.raises(PolicyDenied, match="audit trail cannot be written"):
            await host.call("launch", "mars")
        with pytest.raises(UnknownTool):  # refusals still raise their own error
            await host.call("l\u0430unch")  # a Cyrillic a
    assert probe.marks() == []


async def test_a_host_that_cannot_open_its_store_does_not_start(probe: Probe) -> None:
    from host import HostError

    (probe.root / ".agent").mkdir(exist_ok=True)
    (probe.root / ".agent" / "state.db").mkdir()  # a folder where the file should be
    with pytest.raises(HostError, match="cannot start"):
        async with probe.open():
            pass


# -- a host that died between decision and outcome ----------------------------------------

HOST_SCRIPT = """
import sys
import anyio
from host import Host

async def main() -> None:
    async with Host.open(sys.argv[1]) as host:
        await host.call("slow", 60)

anyio.run(main)
"""


@pytest.mark.subprocess
def test_records_of_a_killed_host_are_closed_as_unknown(probe: Probe) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOST_SCRIPT), str(probe.root)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while "slow started" not in probe.marks():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the host never dispatched the call"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)  # between the decision and the outcome
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()

    # The host's audit writer outlives it only to write the journal out, then ends.
    journal = probe.root / ".agent" / "journal"
    deadline = time.monotonic() + 30
    while list(journal.glob("*.log")):
        assert time.monotonic() < deadline, "the audit writer did not finish the journal"
        time.sleep(0.05)
    conn = sqlite3.connect(probe.db)
    try:
        (open_before,) = conn.execute("SELECT outcome FROM audit").fetchone()
    finally:
        conn.close()
    assert open_before == "started"

    async def reopen() -> None:
        async with probe.open() as host:
            (record,) = await host.store.tail(1)
            assert (record.tool, record.outcome, record.error_kind) == (
                "slow",
                "unknown",
                "host_stopped",
            )
            assert record.ended is not None
            (event,) = [e for e in host.events.recent if e.kind == "audit_reconciled"]
            assert event.data["closed_as_unknown"] == 1

    anyio.run(reopen)


# -- how durable a decision is ---------------------------------------------------------------


async def test_the_policy_can_ask_for_power_cut_durability(probe: Probe) -> None:
    policy = probe.root / "policy.toml"
    policy.write_text(policy.read_text() + '\n[audit]\ndurability = "power"\n')
    async with probe.open() as host:
        assert isinstance(host.store, SQLiteStore)
        assert host.store.durability == "power"
        assert await host.call("echo", "hi") == "hi"
        (record,) = await host.store.tail(1)
    assert record.outcome == "ok"


async def test_the_default_durability_is_the_process(probe: Probe) -> None:
    async with probe.open() as host:
        assert isinstance(host.store, SQLiteStore) and host.store.durability == "process"


def test_a_bad_durability_names_the_field(probe: Probe) -> None:
    from host import PolicyFileError
    from host.policy._files import load_policy

    policy = probe.root / "policy.toml"
    policy.write_text(policy.read_text() + '\n[audit]\ndurability = "disk"\n')
    with pytest.raises(PolicyFileError) as info:
        load_policy([policy], root=probe.root)
    assert "durability" in str(info.value) and info.value.line is not None


async def test_the_audit_writer_holds_none_of_the_hosts_environment(probe: Probe) -> None:
    import psutil

    async with probe.open() as host:
        assert await host.call("echo", "hi") == "hi"
        writers = [
            p
            for p in psutil.Process().children()
            if any(part.endswith("_journal.py") for part in p.cmdline())
        ]
        assert len(writers) == 1
        environ = writers[0].environ()
    assert "AUDIT_SECRET" not in environ and os.environ["AUDIT_SECRET"] not in str(environ)


async def test_a_killed_audit_writer_is_started_again_and_nothing_is_lost(probe: Probe) -> None:
    import psutil

    def writers() -> list[psutil.Process]:
        return [
            p
            for p in psutil.Process().children()
            if any(part.endswith("_journal.py") for part in p.cmdline())
        ]

    async with probe.open() as host:
        assert await host.call("echo", "one") == "one"
        (first,) = writers()
        first.kill()
        first.wait(10)
        ran = 0
        with anyio.fail_after(30):  # refused while it is gone, then served again
            while True:
                try:
                    await host.call("echo", "two")
                    ran += 1
                except PolicyDenied as exc:
                    assert exc.rule == "audit_unavailable"
                if ran and writers() and writers()[0].pid != first.pid:
                    break
                await anyio.sleep(0.02)
        assert isinstance(host.store, SQLiteStore)
        await host.store.flush()
    conn = sqlite3.connect(probe.db)
    try:
        summaries = [r[0] for r in conn.execute("SELECT args_summary FROM audit")]
    finally:
        conn.close()
    assert any("one" in (s or "") for s in summaries)
    assert sum("two" in (s or "") for s in summaries) >= ran
