"""Agent code calls tools as caller ``agent``, and nothing else (D01, D07; issue 12).

Code mode (``run_code``, ``toolhost exec``) makes every tool call as ``agent``: a policy
that denies the agent (by its default, or by a rule limited to ``callers = ["agent"]``)
must hold there, while the app may still call the same tool. The canary is a file the
tool creates: it must not exist after the agent's attempt, whatever the code says it saw.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host import Host
from tests.test_sandbox_cli import toolhost
from tests.test_wasm import wasm_prepared

pytestmark = [pytest.mark.wasm, pytest.mark.subprocess]
__all__ = ["wasm_prepared"]

TOOLS = {
    "files": '''
        import os
        from pathlib import Path


        def touch(name: str) -> str:
            """Creates the file NAME in the folder CALLERS_CANARY names."""
            path = Path(os.environ["CALLERS_CANARY"]) / name
            path.touch()
            return str(path)
        ''',
}
ENV = """
    [env]
    pass = ["CALLERS_CANARY"]
"""
DEFAULT_DENY = (
    """
    version = 1
    [defaults]
    agent = "deny"
    app = "allow"
"""
    + ENV
)
RULE_FOR_AGENTS = (
    """
    version = 1
    [defaults]
    agent = "allow"
    app = "allow"

    [[rules]]
    id = "not-for-agents"
    tools = ["touch"]
    callers = ["agent"]
    decision = "deny"
"""
    + ENV
)
POLICIES = [
    pytest.param(DEFAULT_DENY, "defaults.agent", id="agent-default-deny"),
    pytest.param(RULE_FOR_AGENTS, "not-for-agents", id="rule-for-agents"),
]
CODE = textwrap.dedent(
    """
    try:
        await touch("by-agent")
        outcome = "ran"
    except PolicyDenied as e:
        outcome = e.rule
    outcome
    """
)


def made(folder: Path) -> list[str]:
    """The files the tool created."""
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture
def canary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "canary"
    folder.mkdir()
    monkeypatch.setenv("CALLERS_CANARY", str(folder))
    return folder


@pytest.mark.anyio
@pytest.mark.parametrize(("policy", "rule"), POLICIES)
async def test_run_code_calls_as_the_agent(
    make_project: Callable[..., Path], canary: Path, wasm_prepared: Any, policy: str, rule: str
) -> None:
    del wasm_prepared
    async with Host.open(make_project(TOOLS, policy=policy)) as host:
        result = await host.run_code(CODE)
        assert not (canary / "by-agent").exists(), "agent code ran a tool denied to agents"
        assert result.ok and result.value == rule
        assert [(c.tool, c.decision, c.error) for c in result.calls] == [
            ("touch", "deny", "policy_denied")
        ]
        (record,) = await host.store.tail(1)
        assert (record.caller, record.outcome, record.rule) == ("agent", "denied", rule)
        # The same tool, called by the app, runs: the canary can be set off.
        await host.call("touch", "by-app")
    assert made(canary) == ["by-app"]


@pytest.mark.parametrize(("policy", "rule"), POLICIES)
def test_toolhost_exec_calls_as_the_agent(
    make_project: Callable[..., Path], canary: Path, wasm_prepared: Any, policy: str, rule: str
) -> None:
    del wasm_prepared
    project = make_project(TOOLS, policy=policy)
    done = toolhost("exec", "--json", "-c", CODE, cwd=project)
    assert not (canary / "by-agent").exists(), "toolhost exec ran a tool denied to agents"
    data = json.loads(done.stdout)
    assert data["value"] == rule
    assert data["calls"] == [
        {"tool": "touch", "decision": "deny", "ok": False, "error": "policy_denied"}
    ]
    called = toolhost("call", "touch", "by-app", cwd=project)  # the app may
    assert called.returncode == 0, called.stderr
    assert made(canary) == ["by-app"]
