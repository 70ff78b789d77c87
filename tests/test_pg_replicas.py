"""Several host processes on one PostgreSQL database (``tests/pg_replica.py`` each).

A grant given on one replica is used by another; an approval pending on one is answered
through another's API and the call completes on the first (a late answer is told it
lost); an audit query on any replica sees every replica's records, each once, in order;
a replica killed in the middle of a call leaves a record the next replica to start on
its journal reconciles.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

POLICY = """\
version = 1

[defaults]
escalation_timeout = "60s"

[[rules]]
id = "ask"
tools = ["launch"]
decision = "escalate"
reason = "Launching is irreversible."

[[rules]]
id = "free"
tools = ["hang"]
decision = "allow"

[store]
url = { env = "REPLICA_STORE" }
stale_after = "30s"
"""

TOOLS = '''
import time


def launch(target: str) -> str:
    """Launch something at a target."""
    return f"launched at {target}"


def hang() -> str:
    """Wait for a long time."""
    time.sleep(600)
    return "woke"
'''


class Replica:
    """A host process and its JSON-lines conversation."""

    def __init__(self, project: Path, url: str) -> None:
        env = {**os.environ, "REPLICA_STORE": url, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.pg_replica", str(project)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
            env=env,
            text=True,
        )
        self._answers: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._next = 0
        self.host_id = ""
        threading.Thread(target=self._read, daemon=True).start()
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self.host_id), 90):
                raise AssertionError("the replica did not start")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            data = json.loads(line)
            with self._cond:
                if "ready" in data:
                    self.host_id = data["ready"]
                else:
                    self._answers[data["id"]] = data
                self._cond.notify_all()

    def send(self, op: str, **fields: Any) -> int:
        self._next += 1
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"id": self._next, "op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        return self._next

    def answer(self, number: int, timeout: float = 60.0) -> dict[str, Any]:
        with self._cond:
            if not self._cond.wait_for(lambda: number in self._answers, timeout):
                raise AssertionError(f"no answer to command {number}")
            return self._answers.pop(number)

    def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        return self.answer(self.send(op, **fields))

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # end of input: the replica closes its host
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def until(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def replicas(tmp_path: Path, pg_url: str) -> Iterator[Callable[[], Replica]]:
    project = tmp_path / "project"
    (project / "tools").mkdir(parents=True)
    (project / "tools" / "desk.py").write_text(textwrap.dedent(TOOLS))
    (project / "policy.toml").write_text(POLICY)
    started: list[Replica] = []

    def start() -> Replica:
        replica = Replica(project, pg_url)
        started.append(replica)
        return replica

    try:
        yield start
    finally:
        for replica in started:
            replica.close()


def test_replicas_share_grants_approvals_and_the_audit(
    replicas: Callable[[], Replica],
) -> None:
    a, b, c = replicas(), replicas(), replicas()

    # An approval pending on A, answered through B: the call completes on A.
    waiting = a.send("call", tool="launch", args={"target": "moon"})
    (request,) = until(lambda: b.ask("pending")["pending"], "the request on replica B")
    answered = b.ask("answer", pending=request, allow=True, remember="always", scope="tool")
    assert answered["status"] == "answered"
    late = c.ask("answer", pending=request, allow=False)  # the first answer won
    assert late["status"] in ("answered_before", "gone")
    assert a.answer(waiting) == {"id": waiting, "ok": "launched at moon"}

    # The grant given on A's call answers C's call at once: nobody is asked.
    assert c.ask("call", tool="launch", args={"target": "mars"})["ok"] == "launched at mars"
    assert b.ask("pending")["pending"] == []

    # Any replica's audit query sees every replica's records, each once, in order.
    def both() -> list[list[Any]]:
        records = b.ask("tail", count=50)["records"]
        hosts = {r[1] for r in records if r[2] == "ok"}
        return records if {a.host_id, c.host_id} <= hosts else []

    records = until(both, "the records of A and C on B")
    ids = [r[0] for r in records]
    assert len(ids) == len(set(ids))
    seqs = [r[4] for r in records]
    assert seqs == sorted(seqs)
    by_host = {r[1]: r for r in records}
    assert by_host[a.host_id][3] == f"always (grant 1) (inbox: {b.host_id})"  # B answered
    assert by_host[c.host_id][3] == "grant 1"


def test_a_replica_killed_mid_call_is_reconciled_by_the_next(
    replicas: Callable[[], Replica],
) -> None:
    a, b = replicas(), replicas()
    a.send("call", tool="hang")

    def started() -> list[Any]:
        records = b.ask("tail", count=20)["records"]
        return [r for r in records if r[1] == a.host_id and r[2] == "started"]

    ((call_id, *_),) = until(started, "A's call, started, seen from B")
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    assert a.proc.stdin is not None
    a.proc.stdin.close()
    replicas()  # the next replica to start on A's journal closes what A left

    def closed() -> list[Any]:
        records = b.ask("tail", count=20)["records"]
        return [r for r in records if r[0] == call_id and r[2] == "unknown"]

    until(closed, "A's call closed as unknown")
