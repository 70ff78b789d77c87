"""Which channels may answer an escalation: a rule's ``approvers``.

A rule with ``approvers = ["inbox"]`` must never be allowed by anything on the agent's
own channel. The tools append to a marker file (the canary): a call that was not
approved leaves it untouched.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host import Approval, ApprovalRequest, Host, NotApproved, PolicyFileError, decide
from host.testing import in_process

pytestmark = pytest.mark.anyio

POLICY = """\
version = 1

[defaults]
escalation_timeout = "5s"

[[rules]]
id = "inbox-only"
tools = ["launch"]
decision = "escalate"
approvers = ["inbox"]

[[rules]]
id = "inbox-or-terminal"
tools = ["launch", "record"]
decision = "escalate"
approvers = ["inbox", "terminal"]

[[rules]]
id = "anyone"
tools = ["record", "fire"]
decision = "escalate"

[env]
pass = ["APPROVERS_MARKER"]
"""

TOOLS = {
    "desk": """
        import os


        def launch(target: str) -> str:
            with open(os.environ["APPROVERS_MARKER"], "a", encoding="utf-8") as f:
                f.write(target + "\\n")
            return "launched " + target


        def record(text: str) -> str:
            return text


        def fire() -> str:
            return "fired"
    """
}


@pytest.fixture
def project(
    make_project: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    monkeypatch.setenv("APPROVERS_MARKER", str(tmp_path / "marker"))
    return make_project(TOOLS, policy=POLICY)


def ran(tmp_path: Path) -> list[str]:
    marker = tmp_path / "marker"
    return marker.read_text().splitlines() if marker.exists() else []


def test_a_rule_names_its_approvers(project: Path) -> None:
    from host import load_policy

    policy = load_policy([project / "policy.toml"])
    # Every matching escalate rule's restriction holds: the channels they all allow.
    launch = decide(policy, "launch", {"target": "x"}, "agent")
    assert (launch.decision, launch.rule, launch.approvers) == (
        "escalate",
        "inbox-only",
        ("inbox",),
    )
    record = decide(policy, "record", {"text": "x"}, "agent")
    assert record.approvers == ("inbox", "terminal")
    assert decide(policy, "fire", {}, "agent").approvers is None
    assert decide(policy, "launch", {"target": "x"}, "agent").to_data()["approvers"] == ["inbox"]


def test_an_unknown_channel_is_a_policy_error(tmp_path: Path) -> None:
    from host import load_policy

    path = tmp_path / "policy.toml"
    path.write_text(
        textwrap.dedent("""\
            version = 1
            [[rules]]
            tools = ["launch"]
            decision = "escalate"
            approvers = ["inbx"]
        """)
    )
    with pytest.raises(PolicyFileError) as info:
        load_policy([path])
    assert info.value.field == "rules.0.approvers.0"
    assert "inbox" in str(info.value)


async def test_an_allow_from_another_channel_does_not_count(project: Path, tmp_path: Path) -> None:
    asked: list[ApprovalRequest] = []

    async def app_approver(request: ApprovalRequest) -> bool:
        asked.append(request)
        return True  # the app's channel is "app": not in ["inbox"]

    async with Host.open(project, approver=app_approver, capsule=in_process()) as host:
        with pytest.raises(NotApproved) as info:
            await host.default_session.call_as("agent", "launch", ("moon",), {})
        assert info.value.reason == "channel_not_allowed"
        assert "inbox" in str(info.value) and "app" in str(info.value)
        (record,) = await host.store.tail(1)
        assert (record.outcome, record.error_kind) == ("denied", "not_approved")
    assert asked[0].approvers == ("inbox",)
    assert ran(tmp_path) == []


async def test_an_answer_says_its_channel(project: Path, tmp_path: Path) -> None:
    answers: list[Any] = [
        Approval(True, channel="mcp"),  # the agent's own client: refused
        Approval(True, channel="inbox"),
    ]

    async def approver(request: ApprovalRequest) -> Approval:
        del request
        return answers.pop(0)

    async with Host.open(project, approver=approver, capsule=in_process()) as host:
        session = host.default_session
        with pytest.raises(NotApproved, match="came from mcp"):
            await session.call_as("agent", "launch", ("mars",), {})
        assert await session.call_as("agent", "launch", ("venus",), {}) == "launched venus"
        # A deny from any channel denies.
        answers.append(Approval(False, channel="mcp"))
        with pytest.raises(NotApproved, match="denied"):
            await session.call_as("agent", "record", ("x",), {})
    assert ran(tmp_path) == ["venus"]


class InboxApprover:
    """An approver object that answers on the inbox channel."""

    channel = "inbox"

    def __init__(self, *answers: Approval | bool) -> None:
        self.answers = list(answers)
        self.asked = 0

    async def decide(self, request: ApprovalRequest) -> Approval | bool:
        del request
        self.asked += 1
        return self.answers.pop(0)


async def test_remembered_allows_do_not_answer_a_restricted_rule(
    project: Path, tmp_path: Path
) -> None:
    inbox = InboxApprover(
        Approval(True, remember="session"),
        Approval(True, remember="always"),
        True,
        Approval(False, remember="always"),
    )
    async with Host.open(project, approver=inbox, capsule=in_process()) as host:
        session = host.default_session
        for _ in range(3):  # a session or always grant made here is not used again
            await session.call_as("agent", "launch", ("pluto",), {})
        assert inbox.asked == 3
        with pytest.raises(NotApproved):
            await session.call_as("agent", "launch", ("pluto",), {})
        # A remembered deny still answers without asking.
        with pytest.raises(NotApproved, match="remembered"):
            await session.call_as("agent", "launch", ("pluto",), {})
        assert inbox.asked == 4
    assert ran(tmp_path) == ["pluto"] * 3


async def test_a_rule_with_no_approvers_lets_no_channel_allow(
    make_project: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``approvers = []`` names no channel: nobody's allow counts (an empty list is not
    "no list"), so the call never runs, whoever says yes."""
    monkeypatch.setenv("APPROVERS_MARKER", str(tmp_path / "marker"))
    policy = POLICY.replace('approvers = ["inbox"]', "approvers = []")
    project = make_project(TOOLS, policy=policy)
    for channel in ("app", "inbox", "terminal", "mcp"):

        async def allow(request: ApprovalRequest, channel: str = channel) -> Approval:
            assert request.approvers == ()
            return Approval(True, request_id=request.id, channel=channel)

        async with Host.open(project, approver=allow, capsule=in_process()) as host:
            with pytest.raises(NotApproved) as info:
                await host.default_session.call_as("agent", "launch", ("moon",), {})
            assert info.value.reason == "channel_not_allowed", channel
            assert "no channel" in str(info.value)
    assert ran(tmp_path) == []
