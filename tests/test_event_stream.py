"""``host.events()`` (an async iterator with a bounded buffer), ``host.on`` and the
per-session log ``.agent/sessions/ID.jsonl``, on real subprocess capsules: typed events
for calls, hooks, policy, capsules and console output, with secrets redacted."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from host import Event, Host, PolicyDenied
from host._events import EventBus

pytestmark = pytest.mark.anyio

SECRET = "tok-" + "9f8e7d6c5b4a"

TOOLS = {
    "noisy": """
        def say(text: str) -> str:
            print("said", text)
            return text


        def forbidden() -> None:
            pass
    """,
}

POLICY = f"""
    version = 1
    [[rules]]
    id = "never"
    tools = ["forbidden"]
    decision = "deny"

    [env]
    set = {{ TOKEN = "{SECRET}" }}
    secret = ["TOKEN"]
"""


async def test_events_streams_calls_console_and_policy(make_project: Callable[..., Path]) -> None:
    project = make_project(TOOLS, POLICY)
    async with Host.open(project) as host:
        seen: list[Event] = []
        async with host.events() as stream:
            assert await host.call("say", "hello") == "hello"
            with pytest.raises(PolicyDenied):
                await host.call("forbidden")
            with anyio.fail_after(10):
                async for event in stream:
                    seen.append(event)
                    if event.kind == "policy_denied":
                        break
        kinds = [e.kind for e in seen]
        assert kinds.index("policy_decision") < kinds.index("tool_call_started")
        assert kinds.index("tool_call_started") < kinds.index("tool_call_done")
        assert kinds[-1] == "policy_denied"
        done = next(e for e in seen if e.kind == "tool_call_done")
        assert done.data["ok"] is True and done.data["tool"] == "say"
        # Console output arrives as events too (its own pipe: wait for it).
        if not any(e.kind == "console" for e in seen):
            async with host.events("console") as console:
                await host.call("say", "again")
                with anyio.fail_after(10):
                    first = await console.__anext__()
                assert "said" in first.data["data"]


async def test_a_slow_consumer_loses_events_and_is_told_how_many() -> None:
    bus = EventBus()
    stream = bus(buffer=2)
    for n in range(5):
        bus.emit("tick", None, n=n)
    got = [await stream.__anext__() for _ in range(3)]
    assert got[0].kind == "events_dropped" and got[0].data == {"dropped": 3}
    assert [e.data["n"] for e in got[1:]] == [0, 1]
    assert stream.dropped == 3
    bus.close()  # the host closes: the stream ends
    assert [e async for e in stream] == []


async def test_the_session_log_records_events_with_secrets_redacted(
    make_project: Callable[..., Path],
) -> None:
    project = make_project(TOOLS, POLICY)
    async with Host.open(project, session_logs=True) as host:
        session_id = host.default_session.id
        assert await host.call("say", f"the token is {SECRET}") == f"the token is {SECRET}"
        with pytest.raises(PolicyDenied):
            await host.call("forbidden")
        async with host.session() as other:
            await other.call("say", "elsewhere")
            other_id = other.id
    log = project / ".agent" / "sessions" / f"{session_id}.jsonl"
    text = log.read_text(encoding="utf-8")
    assert SECRET not in text
    lines = [json.loads(line) for line in text.splitlines()]
    kinds = [line["kind"] for line in lines]
    for kind in ("capsule_started", "policy_decision", "tool_call_started", "tool_call_done"):
        assert kind in kinds
    assert "policy_denied" in kinds
    assert {line["session"] for line in lines} == {session_id}
    console = [line for line in lines if line["kind"] == "console"]
    assert any("⟨secret TOKEN⟩" in line["data"]["data"] for line in console)
    assert (project / ".agent" / "sessions" / f"{other_id}.jsonl").exists()


async def test_session_logs_are_off_by_default(make_project: Callable[..., Path]) -> None:
    project = make_project(TOOLS, POLICY)
    async with Host.open(project) as host:
        await host.call("say", "x")
    assert not (project / ".agent" / "sessions").exists()


async def test_per_call_events_are_made_only_while_someone_wants_them(
    make_project: Callable[..., Path],
) -> None:
    project = make_project(TOOLS, POLICY)
    async with Host.open(project) as host:
        await host.call("say", "a")  # nobody listens: the two events every call makes are skipped
        kinds = [e.kind for e in host.events.recent]
        assert "tool_call_started" not in kinds and "tool_call_done" not in kinds
        assert "policy_decision" in kinds  # the others are made as ever

        only_policy: list[str] = []
        unsubscribe = host.events.subscribe(only_policy.append, ("policy_decision",))
        await host.call("say", "b")  # a listener of other kinds does not want them either
        assert [e.kind for e in host.events.recent].count("tool_call_started") == 0
        unsubscribe()

        async with host.events("tool_call_done") as stream:
            await host.call("say", "c")
            done = await stream.__anext__()
        assert done.kind == "tool_call_done" and done.data["ok"] is True

        seen: list[str] = []
        host.on("tool_call_started", lambda e: seen.append(e.data["tool"]))
        await host.call("say", "d")
        assert seen == ["say"]


def test_a_listener_of_some_kinds_gets_only_those() -> None:
    bus = EventBus()
    got: list[str] = []
    unsubscribe = bus.subscribe(lambda e: got.append(e.kind), ("a", "b"))
    assert bus.wants("a") and not bus.wants("c")
    bus.emit("a")
    bus.emit("c")
    bus.emit("b")
    unsubscribe()
    bus.emit("a")
    assert got == ["a", "b"]
    assert not bus.wants("a")
