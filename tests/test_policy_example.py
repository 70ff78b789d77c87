"""The bundled example's policy: it uses every feature, and the tour shows a denied call
and an escalation (answered at a terminal, denied without one)."""

from __future__ import annotations

import os
import pty
import subprocess
from typing import Any

import pytest

from host import Policy, decide, load_policy
from host.declare._project import resolve_project

from .conftest import AGENT_SRC, ROOT
from .test_policy_cli import TOOLHOST


def example() -> Policy:
    project = resolve_project(AGENT_SRC)
    return Policy(load_policy(project.policy_files, root=project.root))


@pytest.mark.parametrize(
    ("tool", "arguments", "caller", "decision", "rule"),
    [
        ("add", {"a": 1, "b": 2}, "agent", "allow", "read-only"),
        ("tools.time.format", {"iso": "2026-01-01", "style": "long"}, "agent", "allow", None),
        ("now", {"tz": "UTC"}, "agent", "allow", "read-only"),
        ("now", {"tz": "local"}, "agent", "deny", "policies/agent.toml:6"),
        ("now", {"tz": "local"}, "script", "allow", "read-only"),
        ("kanban.add", {"title": "write the docs"}, "agent", "allow", "agent-adds-plain-tasks"),
        ("kanban.add", {"title": "x\u202e"}, "agent", "deny", "defaults.agent"),
        ("kanban.close", {"task_id": "x"}, "agent", "escalate", "close-needs-ok"),
        ("kanban.close", {"task_id": "x"}, "script", "allow", "defaults.script"),
        ("roll", {"count": 3, "sides": 6}, "agent", "allow", "ordinary-dice"),
        ("roll", {"count": 3, "sides": 7}, "agent", "deny", "defaults.agent"),
        ("roll", {"count": 60, "sides": 6}, "script", "escalate", "many-dice"),
        ("roll", {"count": 500, "sides": 6}, "app", "deny", "too-many"),
        ("mean", {"values": [1.0]}, "tool", "allow", "read-only"),
        ("kanban.list", {"status": None}, "tool", "allow", "read-only"),
        ("kanban.add", {"title": "x"}, "tool", "deny", "defaults.tool"),
        ("board_chart", {}, "agent", "allow", "charts"),
    ],
)
def test_the_example_decides_as_documented(
    tool: str, arguments: dict[str, Any], caller: Any, decision: str, rule: str | None
) -> None:
    got = decide(example(), tool, arguments, caller)
    assert got.decision == decision
    if rule is not None:
        assert got.rule == rule


def test_the_example_uses_every_feature() -> None:
    policy = example()
    config = policy.config
    assert [name for name, _ in config.files] == ["policy.toml", "policies/agent.toml"]
    rules = policy.rules
    assert {r.decision for r in rules} == {"allow", "deny", "escalate"}
    assert any(r.callers for r in rules) and any(r.reason for r in rules)
    assert any(r.id is None for r in rules) and any(r.id for r in rules)
    globs = [g for r in rules for g in r.tools]
    assert any("**" in g for g in globs) and any(g.endswith(".*") for g in globs)
    conditions = [c for r in rules for c in r.when.values()]
    assert any(isinstance(c, str) for c in conditions)
    kinds = {k for c in conditions if isinstance(c, dict) for k in c}
    assert {"regex", "in", "gt", "ge", "le"} <= kinds
    assert any(q.per_session for q in policy.quotas) and any(q.per_minute for q in policy.quotas)
    assert config.defaults.escalation_timeout == 120
    assert config.limits.max_pending_approvals == 5
    assert config.env.secret == ["EXAMPLE_API_TOKEN"]


@pytest.mark.subprocess
def test_the_tour_without_a_terminal_denies_the_escalation() -> None:
    done = subprocess.run(
        [*TOOLHOST, "run", "agent_src/scripts/tour.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "open tasks: ['write the docs']" in lines
    assert (
        "escalated and not approved: denied (no approver is configured (nobody is at a terminal))"
    ) in lines
    assert "denied by rule too-many: Nobody needs more than 100 of anything at once." in lines
    assert lines[-1].startswith("a tool error crosses as data: KeyError")


@pytest.mark.subprocess
def test_the_tour_at_a_terminal_asks() -> None:
    controller, terminal = pty.openpty()
    try:
        os.write(controller, b"y\n")  # the answer waits in the terminal's input
        done = subprocess.run(
            [*TOOLHOST, "run", "agent_src/scripts/tour.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=terminal,
        )
    finally:
        os.close(terminal)
        os.close(controller)
    assert done.returncode == 0, done.stderr
    assert "approval needed" in done.stderr and "many-dice" in done.stderr
    assert "count = 60" in done.stderr
    assert any(
        line.startswith("escalated and approved: 60 dice") for line in done.stdout.splitlines()
    ), done.stdout
