"""H10. Conservation under chaos: 500 concurrent calls over several sessions of one host.

Real subprocess capsules run a tool that sleeps a random short time (frames arrive late
and out of order) and then writes its arguments as a canary line, while capsule processes
are SIGKILLed at random and an approver answers some escalations, denies others and
ignores the rest until the approval timeout. Invariants:

1. every call ends exactly once, with a value or a typed host error;
2. the audit holds one terminal record per call issued, and none left open;
3. every canary line is the arguments of a call that was issued, and an escalated call
   ran only if the approver allowed it;
4. no process of the host's lineage outlives the host;
5. the host's memory returns near its baseline.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
from collections.abc import Callable
from pathlib import Path

import anyio
import psutil
import pytest

from host import Approval, ApprovalRequest, Host, HostError, NotApproved
from host.audit._reading import read_audit
from tests.fixtures.e2e.helpers import alive, wait_gone

pytestmark = pytest.mark.anyio

CALLS = 500
SESSIONS = 4
KILLS = 8

TOOLS = {
    "chaos": '''
        import asyncio
        import json
        import os
        import random


        def _note(tool: str, tag: str, n: int) -> None:
            line = json.dumps({"tool": tool, "tag": tag, "n": n}) + "\\n"
            fd = os.open(os.environ["CHAOS_CANARY"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                os.write(fd, line.encode())  # one write: lines never interleave
            finally:
                os.close(fd)


        async def work(tag: str, n: int) -> str:
            """Sleeps a little, then notes its arguments."""
            await asyncio.sleep(random.random() * 0.2)
            _note("work", tag, n)
            return f"{tag}:{n}"


        async def risky(tag: str, n: int) -> str:
            """As work, but a person must approve it."""
            await asyncio.sleep(random.random() * 0.05)
            _note("risky", tag, n)
            return f"risky {tag}:{n}"
    ''',
}

POLICY = """\
version = 1

[defaults]
app = "allow"
escalation_timeout = "1s"

[[rules]]
id = "ask"
tools = ["risky"]
decision = "escalate"
reason = "risky needs a person"

[limits]
max_restarts = 1000
call_timeout = "30s"
max_pending_approvals = 1000

[env]
pass = ["CHAOS_CANARY"]
"""


class Moody:
    """Allows an escalated call whose n is 0 mod 3, denies 1 mod 3, and never answers
    2 mod 3 (the approval times out)."""

    channel = "app"

    def __init__(self) -> None:
        self.allowed: set[tuple[str, int]] = set()

    async def decide(self, request: ApprovalRequest) -> Approval:
        tag, n = request.arguments["tag"], request.arguments["n"]
        if n % 3 == 0:
            self.allowed.add((tag, n))
            return Approval(True)
        if n % 3 == 1:
            return Approval(False, note="not this one")
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


def lineage() -> set[int]:
    """Every descendant of this (the host's) process now."""
    with contextlib.suppress(psutil.Error):
        return {p.pid for p in psutil.Process().children(recursive=True)}
    return set()


def capsule_processes() -> list[int]:
    """The capsule workers and reapers of this host now (never the keeper). A capsule
    forked from the keeper's zygote has the keeper's command line: it is the one whose
    parent is not this process."""
    found: list[int] = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            line = " ".join(proc.cmdline())
            started = "capsule" in line and "keeper" not in line
            forked = "_keeper_child.py" in line and proc.ppid() != os.getpid()
            if (started or forked) and alive(proc.pid):
                found.append(proc.pid)
    return found


async def test_conservation_under_chaos(
    make_project: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_project(TOOLS, policy=POLICY)
    (root / "out").mkdir()
    canary = root / "out" / "canary.jsonl"
    monkeypatch.setenv("CHAOS_CANARY", str(canary))
    rng = random.Random(12)
    approver = Moody()
    rss = psutil.Process().memory_info().rss
    seen: set[int] = set()
    outcomes: dict[int, list[object]] = {i: [] for i in range(CALLS)}
    issued: dict[tuple[str, str, int], int] = {}
    killed = 0

    async with Host.open(root, approver=approver) as host:
        # Warm up (first capsule, first calls), then take the memory baseline.
        assert await host.call("work", "warm", -1) == "warm:-1"
        rss = psutil.Process().memory_info().rss
        async with contextlib.AsyncExitStack() as stack:
            sessions = [await stack.enter_async_context(host.session()) for _ in range(SESSIONS)]
            for session in sessions:  # every session's capsule is up before the chaos
                assert await session.call("work", "warm", -1) == "warm:-1"
            done = anyio.Event()

            async def one(i: int) -> None:
                session = sessions[i % SESSIONS]
                tool = "risky" if i % 5 == 0 else "work"
                tag = f"s{i % SESSIONS}"
                await anyio.sleep(i * 0.005)  # paced: calls arrive over ~2.5 s, with the kills
                issued[(tool, tag, i)] = i
                try:
                    outcomes[i].append(await session.call(tool, tag, i))
                except HostError as exc:
                    outcomes[i].append(exc)

            async def chaos() -> None:
                nonlocal killed
                while not done.is_set():
                    await anyio.sleep(0.1 + rng.random() * 0.2)
                    seen.update(lineage())
                    victims = capsule_processes()
                    if victims and killed < KILLS:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(rng.choice(victims), signal.SIGKILL)
                            killed += 1

            async with anyio.create_task_group() as outer:
                outer.start_soon(chaos)
                async with anyio.create_task_group() as tg:
                    for i in range(CALLS):
                        tg.start_soon(one, i)
                done.set()
        seen.update(lineage())
        db = root / ".agent" / "state.db"
    after = psutil.Process().memory_info().rss

    # 1. Exactly one outcome per call, a value or a typed host error.
    assert all(len(o) == 1 for o in outcomes.values()), [
        i for i, o in outcomes.items() if len(o) != 1
    ]
    failures = [o[0] for o in outcomes.values() if isinstance(o[0], BaseException)]
    assert all(isinstance(f, HostError) for f in failures)
    kinds = {type(f).__name__ for f in failures}
    assert killed == KILLS, "the chaos killed fewer capsules than planned"

    # 2. One terminal audit record per call issued, none left open.
    records = [r for r in read_audit(db, 10 * CALLS) if r.tool in ("work", "risky")]
    records = [r for r in records if r.args_summary is None or '"warm"' not in r.args_summary]
    assert len(records) == CALLS, (len(records), kinds)
    assert all(r.outcome in ("ok", "denied", "failed", "unknown") for r in records), {
        r.outcome for r in records
    }
    ok_calls = sum(not isinstance(o[0], BaseException) for o in outcomes.values())
    assert sum(r.outcome == "ok" for r in records) == ok_calls

    # 3. Every canary line is an issued call's arguments; risky ran only when allowed.
    lines = [json.loads(line) for line in canary.read_text().splitlines()]
    lines = [line for line in lines if line["tag"] != "warm"]
    for line in lines:
        key = (line["tool"], line["tag"], line["n"])
        assert key in issued, line
        if line["tool"] == "risky":
            assert (line["tag"], line["n"]) in approver.allowed, line
    ran = {(line["tool"], line["tag"], line["n"]) for line in lines}
    assert len(ran) == len(lines), "a call ran twice"
    for key, i in issued.items():  # a call that returned a value ran, with its arguments
        if not isinstance(outcomes[i][0], BaseException):
            assert key in ran, key
    # The approver denied some and let others time out: both are refusals.
    assert sum(isinstance(f, NotApproved) for f in failures) >= CALLS // 5 * 2 // 3 - KILLS, kinds

    # 4. Nothing of the host's lineage outlives it.
    await wait_gone(seen, timeout=10.0)

    # 5. Memory near its baseline (generous: a loaded shared machine, allocator slack).
    assert after - rss < 96 << 20, f"the host grew by {(after - rss) >> 20} MiB"
