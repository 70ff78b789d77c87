"""Idle sessions (``[limits] session_idle``) and ``host.stats()``, around real capsules.

A session idle that long has its capsules stopped (``session_released``) and started
again by its next call: module state goes (a counter starts over), the key-value store
stays. Nothing in flight is ever stopped: a slow call, a pending approval. No assertion
here is on time: each waits on a condition with a generous deadline, and "not released"
is shown by a session opened later being released first.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from host import (
    Approval,
    ApprovalRequest,
    DenyAll,
    Event,
    Host,
    HostStats,
    PolicyFileError,
    load_policy,
)
from host.serve import McpServer

from .fixtures.e2e.helpers import Recorder, alive, calls_in_flight, wait_gone, wait_until
from .mcp_helpers import Recorder as McpRecorder
from .mcp_helpers import connect, make_mcp_project

pytestmark = [pytest.mark.anyio, pytest.mark.subprocess]

IDLE = 0.5
"""Seconds of ``session_idle`` in these tests: short, but far above what the host needs
between two consecutive calls of one test."""

TOOLS = {
    "counter": """
        import asyncio

        from capsule.context import ToolContext

        _count = 0
        _release = asyncio.Event()


        def bump() -> int:
            global _count
            _count += 1
            return _count


        async def remember(key: str, value: int, ctx: ToolContext) -> str:
            await ctx.set_value(key, value)
            return "set"


        async def recall(key: str, ctx: ToolContext) -> int | str:
            return await ctx.get_value(key, "absent")


        async def nap() -> str:
            await _release.wait()
            _release.clear()
            return "rested"


        async def wake() -> None:
            _release.set()


        def launch() -> str:
            return "launched"
    """
}

POLICY = """\
version = 1

[defaults]
app = "allow"
agent = "allow"

[[rules]]
id = "ask"
tools = ["launch"]
decision = "escalate"

[limits]
{limits}
"""


@pytest.fixture
def project(make_project: Callable[..., Path]) -> Path:
    return make_project(TOOLS, POLICY.format(limits=""))


def load_value(toml: str) -> Any:
    """A TOML value as Python (what ``Host.open(limits=...)`` would be given)."""
    return tomllib.loads(f"v = {toml}")["v"]


def released(recorder: Recorder, session: str) -> list[Event]:
    return [e for e in recorder.of("session_released") if e.session == session]


async def wait_released(recorder: Recorder, session: str, count: int = 1) -> None:
    await wait_until(
        lambda: len(released(recorder, session)) >= count,
        timeout=30,
        what=f"session {session} released",
    )


async def test_an_idle_session_is_released_and_its_next_call_starts_it_again(
    project: Path,
) -> None:
    async with Host.open(project, limits={"session_idle": IDLE}) as host:
        recorder = Recorder(host)
        session = host.default_session.id
        assert await host.call("remember", "k", 42) == "set"
        assert await host.call("bump") == 1
        assert await host.call("bump") == 2
        transport: Any = host.default_session.supervisor.transport
        old_pid: int = transport.pid
        await wait_released(recorder, session)
        (event,) = released(recorder, session)
        assert event.data["capsules"] == ["tools"]  # no code ran: no sandbox to stop
        assert event.data["idle"] == IDLE and event.data["state_lost"] is True
        assert "key-value store stays" in event.data["message"]
        await wait_gone([old_pid])
        assert not host.default_session.running
        stats = await host.stats()
        assert (stats.idle_sessions, stats.capsules.subprocess) == (1, 0)

        # Released once: a session opened later is released meanwhile, this one not again.
        async with host.session() as later:
            await wait_released(recorder, later.id)
        assert len(released(recorder, session)) == 1

        # The next call starts a new capsule: module state was reset, the store kept.
        assert await host.call("bump") == 1
        assert await host.call("recall", "k") == 42
        new: Any = host.default_session.supervisor.transport
        assert new.pid != old_pid and alive(new.pid)
        restarted = [e for e in recorder.of("capsule_started") if e.session == session]
        assert restarted[-1].data["state_lost"] is True
        assert not host.default_session.released


async def test_a_call_in_flight_keeps_its_session(project: Path) -> None:
    async with Host.open(project, limits={"session_idle": IDLE}) as host:
        recorder = Recorder(host)
        session = host.default_session.id
        transport: Any = host.default_session.supervisor.transport
        results: list[str] = []

        async def napping() -> None:
            results.append(await host.call("nap"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(napping)
            await wait_until(lambda: calls_in_flight(host) == 1, what="nap in flight")
            # A session opened after the call started goes idle later than this one
            # would have: once it is released, this one would have been too.
            async with host.session() as later:
                await wait_released(recorder, later.id)
            assert released(recorder, session) == []
            assert host.default_session.supervisor.transport is transport
            await host.call("wake")
        assert results == ["rested"]
        await wait_released(recorder, session)  # idle at last


async def test_a_pending_approval_keeps_its_session(project: Path) -> None:
    asked: list[ApprovalRequest] = []
    answer = anyio.Event()

    async def approver(request: ApprovalRequest) -> Approval:
        asked.append(request)
        await answer.wait()
        return request.allow()

    async with Host.open(project, limits={"session_idle": IDLE}, approver=approver) as host:
        recorder = Recorder(host)
        session = host.default_session.id
        results: list[str] = []

        async def launching() -> None:
            results.append(await host.call("launch"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(launching)
            await wait_until(lambda: len(asked) == 1, what="the escalation")
            assert (await host.stats()).approvals_pending == 1
            async with host.session() as later:
                await wait_released(recorder, later.id)
            assert released(recorder, session) == []
            assert host.default_session.running
            answer.set()
        assert results == ["launched"]
        assert (await host.stats()).approvals_pending == 0


async def test_code_sandbox_variables_go_with_an_idle_release(project: Path) -> None:
    async with Host.open(project, limits={"session_idle": IDLE}) as host:
        recorder = Recorder(host)
        session = host.default_session.id
        first = await host.run_code("x = await bump()\nx")
        assert first.ok and first.value == 1
        assert (await host.stats()).capsules.code == 1
        await wait_released(recorder, session)
        (event,) = released(recorder, session)
        assert sorted(event.data["capsules"]) == ["code", "tools"]
        assert not host.default_session.code.running
        again = await host.run_code("x")
        assert not again.ok and again.error is not None and again.error.type == "NameError"
        assert any("idle" in w for w in again.warnings), again.warnings
        third = await host.run_code("await bump()")
        assert third.ok and third.value == 1


async def test_off_by_default(project: Path) -> None:
    async with Host.open(project) as host:
        assert host.session_idle is None
        assert await host.call("bump") == 1
        stats = await host.stats()
        assert stats.session_idle is None
        assert host.default_session.running


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('"soon"', "is not a duration"),
        ('"0s"', "must be positive"),
        ("-5", "must be positive"),
        ("true", "a duration is a number of seconds"),
    ],
)
async def test_bad_values_are_refused(
    make_project: Callable[..., Path], value: str, says: str
) -> None:
    root = make_project(TOOLS, POLICY.format(limits=f"session_idle = {value}"))
    with pytest.raises(PolicyFileError) as info:
        load_policy([root / "policy.toml"])
    assert info.value.field == "limits.session_idle"
    assert says in str(info.value)
    with pytest.raises(PolicyFileError):
        async with Host.open(root):
            pass
    fine = make_project(TOOLS, POLICY.format(limits=""))
    given = {"session_idle": load_value(value)}
    with pytest.raises(PolicyFileError) as info:
        async with Host.open(fine, limits=given):
            pass
    assert info.value.field == "limits.session_idle" and says in str(info.value)


async def test_a_policy_reload_turns_it_on_and_off(make_project: Callable[..., Path]) -> None:
    root = make_project(TOOLS, POLICY.format(limits=""))
    async with Host.open(root) as host:
        recorder = Recorder(host)
        session = host.default_session.id
        assert await host.call("bump") == 1
        (root / "policy.toml").write_text(POLICY.format(limits=f'session_idle = "{IDLE}s"'))
        # The next call reads the edit (the idle watch also looks, every few seconds).
        assert await host.call("bump") == 2
        assert host.session_idle == IDLE
        await wait_released(recorder, session)
        (root / "policy.toml").write_text(POLICY.format(limits=""))
        assert await host.call("bump") == 1  # the released capsule started again
        assert host.session_idle is None
        assert (await host.stats()).session_idle is None


async def test_stats_follow_sessions_and_calls(project: Path) -> None:
    async with Host.open(project) as host:
        first = await host.stats()
        assert isinstance(first, HostStats)
        assert (first.sessions, first.capsules.subprocess, first.capsules.code) == (1, 1, 0)
        assert first.calls_total == 0 and first.calls_per_second == 0
        assert first.memory.measured and first.memory.bytes > 0
        assert first.memory.processes >= 2  # the host and its capsule at least
        for _ in range(3):
            await host.call("bump")
        async with host.session() as other:
            await other.call("bump")
            second = await host.stats()
            assert (second.sessions, second.capsules.subprocess) == (2, 2)
            assert second.calls_total == 4 and second.calls_per_second > 0
            assert second.memory.processes > first.memory.processes
        third = await host.stats()
        assert (third.sessions, third.capsules.subprocess) == (1, 1)
        assert third.approvals_pending == 0 and third.idle_sessions == 0
        assert HostStats.model_validate_json(third.model_dump_json()) == third


async def test_an_mcp_client_is_told_when_its_session_is_released(tmp_path: Path) -> None:
    project = make_mcp_project(tmp_path / "project")
    recorder = McpRecorder()
    async with (
        Host.open(
            project, approver=DenyAll("nobody answers here"), limits={"session_idle": IDLE}
        ) as host,
        McpServer(host).running() as server,
        connect(server, recorder) as client,
    ):
        assert (await client.call_tool("count", {})).structured_content == {"result": 1}
        await wait_until(
            lambda: bool(recorder.events("session_released")), timeout=30, what="the log"
        )
        (told,) = recorder.events("session_released")
        assert told["capsules"] == ["tools"] and told["state_lost"] is True
        assert (await client.call_tool("count", {})).structured_content == {"result": 1}


@pytest.mark.wasm
async def test_a_wasm_tool_capsule_is_released_too(make_project: Callable[..., Path]) -> None:
    tools = {
        "counter": """
            _count = 0


            def bump() -> int:
                global _count
                _count += 1
                return _count
        """
    }
    root = make_project(tools, POLICY.format(limits="") + '\n[capsules]\ndefault = "wasm"\n')
    async with Host.open(root, limits={"session_idle": IDLE}) as host:
        recorder = Recorder(host)
        assert await host.call("bump") == 1
        stats = await host.stats()
        assert (stats.capsules.wasm, stats.capsules.subprocess) == (1, 0)
        await wait_released(recorder, host.default_session.id)
        assert (await host.stats()).capsules.wasm == 0
        assert await host.call("bump") == 1
        assert (await host.stats()).capsules.wasm == 1
