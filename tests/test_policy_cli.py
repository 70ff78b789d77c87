"""``toolhost policy check``, ``toolhost policy grants`` and ``toolhost audit``, run as real
processes (DESIGN.md section 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from host import Approval, ApprovalRequest, NotApproved

from .conftest import ROOT
from .test_approval import Desk
from .test_approval import desk as desk  # the fixture

pytestmark = [pytest.mark.subprocess]

_SCRIPT = Path(sys.executable).with_name("toolhost")
TOOLHOST = (
    [str(_SCRIPT)]
    if _SCRIPT.exists()
    else [sys.executable, "-c", "from host.cli import main; main()"]
)


def toolhost(*args: str, project: Path | None = None) -> subprocess.CompletedProcess[str]:
    extra = ["--project", str(project)] if project is not None else []
    return subprocess.run(
        [*TOOLHOST, *args, *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=os.environ.copy(),
    )


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    lines = done.stdout.splitlines()
    assert len(lines) == 1, f"stdout: {done.stdout!r}\nstderr: {done.stderr}"
    return json.loads(lines[0])


CHECK_POLICY = """\
version = 1

[defaults]
agent = "deny"
app = "allow"

[[rules]]
id = "ask"
tools = ["launch"]
decision = "escalate"
reason = "Launching is irreversible."

[[rules]]
tools = ["launch"]
callers = ["agent"]
when.target = { in = ["sun", "moon"] }
decision = "deny"
reason = "Too hot, too close."

[env]
pass = ["DESK_MARKER"]
"""


def test_check_prints_the_decision_and_its_rule(desk: Callable[..., Desk]) -> None:
    d = desk(policy=CHECK_POLICY)
    done = toolhost("policy", "check", "launch", "mars", "--json", project=d.root)
    assert done.returncode == 0, done.stderr
    data = as_json(done)
    assert {k: data[k] for k in ("decision", "rule", "reason")} == {
        "decision": "escalate",
        "rule": "ask",
        "reason": "Launching is irreversible.",
    }
    assert data["tool"] == "launch" and data["caller"] == "app"
    assert len(data["policy_version"]) == 12
    agent = as_json(
        toolhost(
            "policy",
            "check",
            "launch",
            "--kw",
            "target=sun",
            "--caller",
            "agent",
            "--json",
            project=d.root,
        )
    )
    assert (agent["decision"], agent["rule"]) == ("deny", "policy.toml:13")
    assert agent["matched"] == ["ask", "policy.toml:13"]
    assert as_json(toolhost("policy", "check", "read", "--json", project=d.root))["rule"] == (
        "defaults.app"
    )
    assert d.ran() == []  # nothing ran
    assert not (d.root / ".agent" / "state.db").exists()  # and nothing was audited


def test_check_as_text(desk: Callable[..., Desk]) -> None:
    d = desk(policy=CHECK_POLICY)
    done = toolhost("policy", "check", "launch", "sun", "--caller", "agent", project=d.root)
    assert done.returncode == 0
    assert done.stdout.splitlines()[:3] == [
        "deny (rule policy.toml:13)",
        "reason: Too hot, too close.",
        "matched: ask, policy.toml:13",
    ]


def test_check_refuses_what_a_call_would_refuse(desk: Callable[..., Desk]) -> None:
    d = desk(policy=CHECK_POLICY)
    unknown = toolhost("policy", "check", "launch ", "--json", project=d.root)
    assert unknown.returncode == 1
    assert as_json(unknown)["error"]["kind"] == "unknown_tool"
    invalid = toolhost("policy", "check", "launch", "a", "b", "--json", project=d.root)
    assert invalid.returncode == 1
    assert as_json(invalid)["error"]["kind"] == "invalid_arguments"
    typed = toolhost("policy", "check", "launch", "5", "--json", project=d.root)  # not a str
    assert typed.returncode == 1
    assert as_json(typed)["error"]["kind"] == "invalid_arguments"
    usage = toolhost("policy", "check", "launch", "--caller", "root", project=d.root)
    assert usage.returncode == 2
    assert toolhost("policy", project=None).returncode == 2


def test_check_reports_a_malformed_policy(desk: Callable[..., Desk]) -> None:
    d = desk(policy='version = 1\n[[rules]]\ntools = ["x"]\ndecision = "sometimes"\n')
    done = toolhost("policy", "check", "read", "--json", project=d.root)
    assert done.returncode == 1
    error = as_json(done)["error"]
    assert (error["kind"], error["line"], error["field"]) == (
        "policy_file_error",
        4,
        "rules.0.decision",
    )


def test_grants_are_listed_and_revoked(desk: Callable[..., Desk]) -> None:
    d = desk(policy=CHECK_POLICY)

    async def remember() -> None:
        async def always(request: ApprovalRequest) -> Approval:
            return request.allow("always")

        async with d.open(always) as host:
            await host.call("launch", "mars")

    anyio.run(remember)
    listed = as_json(toolhost("policy", "grants", "--json", project=d.root))["grants"]
    assert len(listed) == 1
    (grant,) = listed
    assert (grant["tool"], grant["caller"], grant["allow"], grant["scope"]) == (
        "launch",
        "app",
        True,
        "call",
    )
    assert grant["summary"] == 'target="mars"'
    text = toolhost("policy", "grants", project=d.root).stdout
    assert "launch" in text and 'target="mars"' in text
    revoked = toolhost("policy", "grants", "--revoke", str(grant["id"]), "--json", project=d.root)
    assert as_json(revoked) == {"revoked": grant["id"]}
    again = toolhost("policy", "grants", "--revoke", str(grant["id"]), project=d.root)
    assert again.returncode == 1 and "no live grant" in again.stderr
    assert as_json(toolhost("policy", "grants", "--json", project=d.root)) == {"grants": []}

    async def asked_again() -> None:
        async with d.open() as host:  # deny-all: the grant is gone, so this is refused
            try:
                await host.call("launch", "mars")
            except NotApproved:
                return
            raise AssertionError("the revoked grant still answered")

    anyio.run(asked_again)


def test_audit_shows_the_trail(desk: Callable[..., Desk]) -> None:
    d = desk(policy=CHECK_POLICY)
    done = toolhost("call", "read", project=d.root)
    assert done.returncode == 0, done.stderr
    denied = toolhost("call", "launch", "mars", project=d.root)  # escalated, nobody to ask
    assert denied.returncode == 1
    records = as_json(toolhost("audit", "--json", "--tail", "5", project=d.root))["records"]
    assert [(r["tool"], r["outcome"], r["caller"]) for r in records] == [
        ("read", "ok", "app"),
        ("launch", "denied", "app"),
    ]
    assert records[1]["rule"] == "ask" and records[1]["error_kind"] == "not_approved"
    last = as_json(toolhost("audit", "--json", "--tail", "1", project=d.root))["records"]
    assert [r["tool"] for r in last] == ["launch"]
    text = toolhost("audit", project=d.root).stdout.splitlines()
    assert len(text) == 2
    assert "ok" in text[0] and "read()" in text[0]
    assert 'launch(target="mars")' in text[1] and "escalate (ask)" in text[1]
    assert d.ran() == []


def test_an_empty_trail(desk: Callable[..., Desk]) -> None:
    d = desk(policy=CHECK_POLICY)
    assert toolhost("audit", project=d.root).stdout.strip() == "the audit trail is empty"
    assert toolhost("policy", "grants", project=d.root).stdout.strip() == "no remembered grants"
