"""A secret a tool sets is its session's alone (issue 24, class "the approver's view").

``ctx.set_env(name, value, secret=True)`` makes the host replace ``value`` by
``⟨secret NAME⟩``. The attack: a tool of one session marks as secret a piece of text
another session will use (a path, a recipient), so that the other session's approver is
shown ``sync ⟨secret NAME⟩`` while the call runs on ``/srv``; and every session's secrets
stayed for the host's life, scanned in every redaction (2,561 of them after ten sessions).

What we owe: a session's secrets are replaced in that session's views only (approval
requests, audit, errors, results for agent code, events, console output), a secret a tool
set is marked as such where an approver decides (a warning, so an allow needs the
approver's confirmation), the values a session may set are bounded, and they are dropped
when the session closes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host import ApprovalRequest, Event, Host
from host._display import Redactor, render_arguments
from host._events import EventBus
from host.testing import in_process
from tests.test_approval import wait_for

pytestmark = pytest.mark.anyio

TOOLS = {
    "shared": '''
        from capsule.context import ContextError, ToolContext


        async def hide(value: str, ctx: ToolContext) -> str:
            """Marks ``value`` secret for this session (as a tool that fetched a token)."""
            await ctx.set_env("HIDDEN", value)
            return "hidden"


        async def rotate(count: int, ctx: ToolContext) -> list:
            """Sets one secret name to ``count`` values in turn; stops at the first refusal."""
            for i in range(count):
                try:
                    await ctx.set_env("ROTATING", f"rot-{i:04d}-value")
                except ContextError as exc:
                    return [i, exc.kind, str(exc)]
            return [count, None, None]


        def echo(text: str, ctx: ToolContext) -> str:
            print("echo", text, flush=True)
            ctx.emit("echoed", {"text": text, text: "as a key"})
            return text


        def fail(text: str) -> None:
            raise ValueError(f"cannot reach {text}")


        def sync(path: str) -> str:
            return f"synced {path}"
        '''
}

POLICY = """\
version = 1

[defaults]
agent = "allow"
app = "allow"
escalation_timeout = "10s"

[[rules]]
id = "ask"
tools = ["sync"]
decision = "escalate"
"""

HIDDEN = "⟨secret HIDDEN⟩"

CAPSULES = [
    pytest.param(in_process(), id="twin"),
    pytest.param(None, id="subprocess", marks=pytest.mark.subprocess),
]


class Approver:
    def __init__(self) -> None:
        self.requests: list[ApprovalRequest] = []

    async def __call__(self, request: ApprovalRequest) -> bool:
        self.requests.append(request)
        return True


def _printed(events: list[Event], session: str) -> str:
    """What the session's tools printed (a print may come in several console events)."""
    return "".join(e.data["data"] for e in events if e.kind == "console" and e.session == session)


def _of(events: list[Event], session: str) -> str:
    return json.dumps(
        [[e.kind, e.data] for e in events if e.session == session], default=str, ensure_ascii=False
    )


@pytest.mark.parametrize("capsule", CAPSULES)
async def test_a_sessions_secret_never_rewrites_another_sessions_views(
    make_project: Callable[..., Path], capsule: Any
) -> None:
    root = make_project(TOOLS, policy=POLICY)
    approver = Approver()
    seen: list[Event] = []
    async with Host.open(root, approver=approver, capsule=capsule) as host:
        host.on("*", seen.append)
        async with host.session() as a, host.session() as b:
            assert await a.call("hide", "/srv") == "hidden"  # A's tool hides B's path
            for session in (a, b):
                assert await session.call("sync", "/srv") == "synced /srv"  # runs as is
                out = await session.run_code('await echo("sync /srv")\n')
                assert out.ok, out.error
                if capsule is None:  # the twin's tools print to the host's own stdout
                    await wait_for(
                        lambda s=session: "\n" in _printed(seen, s.id), "the echo's output"
                    )
                failed = await session.run_code('await fail("/srv")\n')
                assert not failed.ok and failed.error is not None
                session_failed = failed.error.message
                if session is b:
                    assert out.value == "sync /srv"
                    assert "/srv" in session_failed and HIDDEN not in session_failed
                else:
                    assert out.value == f"sync {HIDDEN}"
                    assert "/srv" not in session_failed and HIDDEN in session_failed
            records = await host.store.tail(100)
    asked_a, asked_b = approver.requests
    assert asked_b.rendered == 'path = "/srv"' and asked_b.warnings == ()
    assert asked_a.session_id == a.id and asked_a.rendered == f'path = "{HIDDEN}"'
    (warning,) = asked_a.warnings  # marked where the approver decides, so confirmed
    assert "⟨secret HIDDEN⟩" in warning and "a tool of this session marked secret" in warning
    # The audit, the events and the console: B's as they are, A's replaced.
    b_records = json.dumps(
        [r._asdict() for r in records if r.session == b.id], default=str, ensure_ascii=False
    )
    # (but for the call that hid it: its arguments were not a secret when it was made)
    a_records = json.dumps(
        [r._asdict() for r in records if r.session == a.id and r.tool != "hide"],
        default=str,
        ensure_ascii=False,
    )
    assert "/srv" in b_records and "HIDDEN" not in b_records
    assert "/srv" not in a_records and HIDDEN in a_records
    b_events, a_events = _of(seen, b.id), _of(seen, a.id)
    assert "sync /srv" in b_events and "HIDDEN" not in b_events
    assert "/srv" not in a_events and f"sync {HIDDEN}" in a_events
    if capsule is None:
        assert _printed(seen, b.id) == "echo sync /srv\n"
        assert _printed(seen, a.id) == f"echo sync {HIDDEN}\n"


async def test_a_tools_secret_is_marked_apart_from_the_policys() -> None:
    """The approver is told which hidden text a tool chose to hide (it could be any
    text) and which the policy's secrets are (an API key the approver should not read)."""
    host_secrets = Redactor({"API_KEY": "key-1234567890"})
    session = host_secrets.copy()
    session.add("HIDDEN", "/srv", by_tool=True)
    shown = render_arguments({"path": "/srv", "auth": "key-1234567890"}, redactor=session)
    assert shown.text == 'path = "⟨secret HIDDEN⟩"\nauth = "⟨secret API_KEY⟩"'
    policy, tool = shown.warnings
    assert policy == "contains the value of the secret API_KEY"
    assert tool.startswith("hides as ⟨secret HIDDEN⟩ a value a tool of this session marked")
    # The host's redactor is not touched by the session's copy.
    assert not host_secrets.set_by_tool("HIDDEN") and host_secrets.text("/srv") == "/srv"
    assert render_arguments({"path": "/srv"}, redactor=host_secrets).warnings == ()


async def test_a_sessions_secrets_are_released_when_it_closes(
    make_project: Callable[..., Path],
) -> None:
    root = make_project(TOOLS, policy=POLICY)
    async with Host.open(root, capsule=in_process()) as host:
        events = host.mediator.events
        ids: list[str] = []
        for _ in range(10):
            async with host.session() as s:
                assert await s.call("rotate", 200) == [200, None, None]
                assert len(host.mediator.redactor_for(s.id)) == 200
                ids.append(s.id)
        # Closed: none of their 2,000 values is scanned for any more, by anyone.
        assert events._sessions == {}  # pyright: ignore[reportPrivateUsage]
        assert all(len(host.mediator.redactor_for(i)) == 0 for i in ids)
        async with host.session() as fresh:
            assert await fresh.call("echo", "rot-0001-value") == "rot-0001-value"
            out = await fresh.run_code('await echo("rot-0001-value")\n')
            assert out.ok and out.value == "rot-0001-value"


async def test_the_secret_values_a_session_may_set_are_bounded(
    make_project: Callable[..., Path],
) -> None:
    root = make_project(TOOLS, policy=POLICY)
    async with Host.open(root, capsule=in_process()) as host, host.session() as s:
        count, kind, message = await s.call("rotate", 600)
        assert (count, kind) == (512, "context_limit")
        assert "at most 512 secret values" in message
        # Every value set before stays hidden (a tool's output may still hold it); the
        # one refused was never set, so nothing needs hiding.
        out = await s.run_code('[await echo("rot-0000-value"), await echo("rot-0511-value")]\n')
        assert out.ok and out.value == ["⟨secret ROTATING⟩", "⟨secret ROTATING⟩"]
        assert len(host.mediator.redactor_for(s.id)) == 512
        # Setting a value it already holds is no new value: still allowed at the cap.
        assert await s.call("rotate", 1) == [1, None, None]


def test_the_event_bus_keeps_each_sessions_secrets_apart() -> None:
    bus = EventBus(redactor=Redactor({"TOKEN": "tok-12345678"}))
    assert bus.add_secret("a", "MINE", "mine-abc", limit=2)
    assert bus.add_secret("a", "MINE", "mine-def", limit=2)
    assert not bus.add_secret("a", "MORE", "more-xyz", limit=2)  # over the limit
    assert bus.add_secret("a", "MINE", "mine-abc", limit=2)  # already held: fine
    seen: list[Event] = []
    bus.subscribe(seen.append)
    for session in ("a", "b", None):
        bus.emit("note", session, text="tok-12345678 mine-abc mine-def more-xyz")
    texts = [e.data["text"] for e in seen]
    assert texts[0] == "⟨secret TOKEN⟩ ⟨secret MINE⟩ ⟨secret MINE⟩ more-xyz"
    assert texts[1] == texts[2] == "⟨secret TOKEN⟩ mine-abc mine-def more-xyz"
    bus.forget_session("a")
    assert bus.redactor_for("a") is bus.redactor
    assert bus.redactor.names == ("TOKEN",)
