"""``toolhost serve`` as the official MCP TypeScript SDK client sees it.

Most agent apps are built on ``@modelcontextprotocol/sdk``; its client validates every
result against the tool's output schema and throws when structured content does not
match. These tests run that client (``tests/ts_client``, Node, pinned in its
``package-lock.json``; ``.ci/run`` installs it with ``npm ci``) against a real
``toolhost serve`` over stdio and Streamable HTTP, and require every failure and every
approval answer to reach it as a result it can read: ``isError`` with the message as
text, never an exception.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from host.serve import CLIENTS_FILE, ClientTokens, asgi_app

from .inbox_helpers import served_app
from .mcp_helpers import make_mcp_project

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "tests" / "ts_client"
CLIENT = HERE / "client.mjs"


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("these tests need Node.js (node) on PATH: apt-get install nodejs")
    if not (HERE / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        pytest.fail(
            "the TypeScript SDK client is not installed: npm ci --prefix tests/ts_client "
            "(.ci/run does it)"
        )
    return node


def run_client(plan: dict[str, Any], *, check: bool = True) -> dict[str, Any]:
    """The client's output; with ``check=False``, how it ended (``returncode``, ``stderr``)."""
    done = subprocess.run(
        [_node(), str(CLIENT), json.dumps(plan)],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=180,
    )
    if not check:
        return {"returncode": done.returncode, "stderr": done.stderr[-4000:]}
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = make_mcp_project(tmp_path / "project")
    (root / "policies").mkdir()
    (root / "policies" / "quota.toml").write_text(  # a limit to run into: count runs once
        'version = 1\n[[quotas]]\ntools = ["count"]\nper_session = 1\n', encoding="utf-8"
    )
    return root


def stdio(project: Path) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": ["-c", "from host.cli import main; main()", "serve", "--project", str(project)],
        "cwd": str(project),
    }


FAILURES: list[tuple[str, dict[str, Any], str]] = [
    ("fail", {"message": "it broke"}, "tool_error"),
    ("add", {"a": "two", "b": 3}, "invalid_arguments"),
    ("add", {"a": 1}, "invalid_arguments"),
    ("wipe", {"folder": "/"}, "policy_denied"),
    ("nan", {}, "not_serializable"),
    ("run_code", {"code": "1", "globals": {"add": 1}}, "invalid_arguments"),
    ("run_code", {"code": "1", "memory_limit": "1KiB"}, "invalid_arguments"),
]
"""Failed calls, each a kind of failure, and the kind it reports."""


def _assert_readable(call: dict[str, Any], kind: str) -> None:
    assert call["threw"] is None, call  # the client read it
    assert call["isError"] is True, call
    if call["name"] == "run_code":  # a run's result, which run_code's output schema describes
        assert call["structured"]["error"]["kind"] == kind, call
        assert f"({kind})" in call["text"], call
        return
    assert call["structured"] is None, call
    assert call["text"].startswith(f"{kind}: "), call
    assert call["meta"]["toolhost/error"]["kind"] == kind, call


def test_every_failure_reaches_the_typescript_client_as_a_result(project: Path) -> None:
    calls = [{"name": n, "arguments": a} for n, a, _ in FAILURES]
    calls += [
        {"name": "add", "arguments": {"a": 2, "b": 3}},
        {"name": "run_code", "arguments": {"code": "1 / 0"}},
        {"name": "run_code", "arguments": {"code": "x = await add(1, 2)\nx * 2"}},
        {"name": "count", "arguments": {}},
        {"name": "count", "arguments": {}},  # over the session's quota: a limit
    ]
    out = run_client({"server": stdio(project), "calls": calls})
    assert "add" in out["tools"] and "run_code" in out["tools"]
    for call, (_, _, kind) in zip(out["calls"], FAILURES, strict=False):
        _assert_readable(call, kind)
    ok, failed_code, code, counted, over = out["calls"][len(FAILURES) :]
    assert counted["threw"] is None and counted["structured"] == {"result": 1}, counted
    _assert_readable(over, "limit_exceeded")
    assert over["meta"]["toolhost/error"]["limit"] == "per_session", over
    assert ok["threw"] is None and not ok["isError"] and ok["structured"] == {"result": 5}
    # a failed run is a run_code result: its structured content is what the schema says
    assert failed_code["threw"] is None and failed_code["isError"] is True, failed_code
    assert failed_code["structured"]["error"]["type"] == "ZeroDivisionError"
    assert code["threw"] is None and code["structured"]["value"] == 6, code


@pytest.mark.parametrize(
    ("answer", "allowed", "said"),
    [
        ("accept:approve_once", True, None),
        ("accept:deny", False, "denied it"),
        ("decline", False, "answered decline"),
        ("cancel", False, "answered cancel"),
        ("none", False, None),
    ],
)
def test_every_approval_answer_reaches_the_typescript_client(
    project: Path, answer: str, allowed: bool, said: str | None
) -> None:
    plan = {
        "server": stdio(project),
        "elicitation": answer,
        "calls": [{"name": "note", "arguments": {"text": "hello"}}],
    }
    out = run_client(plan)
    (call,) = out["calls"]
    if allowed:
        assert call["threw"] is None and not call["isError"], call
        assert call["structured"] == {"text": "hello", "length": 5}
        assert len(out["asked"]) == 1 and "note" in out["asked"][0]
        return
    _assert_readable(call, "not_approved")
    if said is not None:
        assert said in call["text"], call
    if answer == "none":
        assert out["asked"] == []  # a client that cannot be asked is never asked
    notes = project / "out" / "notes.log"
    assert not notes.exists()  # the call never ran


def test_failures_over_streamable_http(project: Path) -> None:
    """Over HTTP with a client token, as ``toolhost serve --transport http`` asks: the
    SDK's transport sends it on every request; without it the client cannot connect."""
    token = ClientTokens(project / ".agent" / CLIENTS_FILE).add("ts-client")
    app = asgi_app(project)  # built outside any event loop: it opens the host in uvicorn's
    with served_app(app) as served:
        plan = {
            "server": {"url": f"{served.base}/mcp", "token": token},
            "calls": [{"name": n, "arguments": a} for n, a, _ in FAILURES[:4]],
        }
        out = run_client(plan)
        refused = run_client({"server": {"url": f"{served.base}/mcp"}, "calls": []}, check=False)
    for call, (_, _, kind) in zip(out["calls"], FAILURES[:4], strict=True):
        _assert_readable(call, kind)
    assert refused["returncode"] != 0 and "401" in refused["stderr"], refused


TYPES = '''
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, TypedDict


class Point(TypedDict):
    """A point."""

    x: float
    y: float


@dataclass
class Box:
    low: Point
    high: Point
    label: str | None = None


def shapes(
    points: list[Point],
    mode: Literal["fast", "exact"] = "fast",
    tags: dict[str, int] | None = None,
    when: datetime | None = None,
    data: bytes = b"",
    *extra: int,
    **named: str,
) -> Box | None:
    """Every kind of type a declaration may hold."""
    return None


def pair(a: int | str, b: tuple[int, str]) -> tuple[int, str] | list[float]:
    """Unions, tuples."""
    return b
'''


@pytest.mark.parametrize("which", ["mcp", "types", "agent_src"])
def test_every_schema_compiles_under_ajv_strict_mode(tmp_path: Path, which: str) -> None:
    """Ajv (draft 2020-12) in strict mode, as strict clients and the Inspector run it:
    no warning and no error for any tool's input or output schema, run_code's included."""
    if which == "mcp":
        project = make_mcp_project(tmp_path / "project")
    elif which == "types":
        project = tmp_path / "project"
        (project / "tools").mkdir(parents=True)
        (project / "tools" / "types.py").write_text(TYPES, encoding="utf-8")
    else:
        project = ROOT / "agent_src"
    out = run_client({"server": stdio(project), "calls": []})
    assert "run_code" in out["tools"]
    if which == "types":
        assert {"shapes", "pair"} <= set(out["tools"]), out["tools"]
    assert out["strict"] == [], json.dumps(out["strict"], indent=1)


# -- the MCP Inspector (its command line) --------------------------------------------------


def _inspector(project: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    inspector = HERE / "node_modules" / ".bin" / "inspector"
    _node()
    if not inspector.exists():
        pytest.fail("the MCP Inspector is not installed: npm ci --prefix tests/ts_client")
    toolhost = [sys.executable, "-c", "from host.cli import main; main()", "serve"]
    return subprocess.run(
        [str(inspector), "--cli", *toolhost, "--project", str(project), *args],
        cwd=project,
        env={**os.environ, "HOME": str(home)},  # it keeps a catalog in its home
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("call", "kind"),
    [
        (["--tool-name", "fail", "--tool-arg", "message=boom"], "tool_error"),
        (["--tool-name", "add", "--tool-arg", "a=2"], "invalid_arguments"),
        (["--tool-name", "wipe", "--tool-arg", "folder=/"], "policy_denied"),
        (["--tool-name", "note", "--tool-arg", "text=hi"], "not_approved"),  # no elicitation
    ],
)
def test_the_inspector_reads_every_error(
    project: Path, tmp_path: Path, call: list[str], kind: str
) -> None:
    done = _inspector(project, tmp_path, "--method", "tools/call", *call)
    # exit status 5: "the tool returned isError" (a protocol error would be another)
    assert done.returncode == 5, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["isError"] is True and "structuredContent" not in result, result
    assert result["content"][0]["text"].startswith(f"{kind}: "), result
    assert "-32602" not in done.stdout + done.stderr


def test_the_inspector_finds_no_schema_to_warn_about(project: Path, tmp_path: Path) -> None:
    """``--strict``: every schema portable (no ``type`` arrays, no schema that validates
    nothing), ``run_code``'s and a tool returning ``object`` included."""
    done = _inspector(project, tmp_path, "--method", "tools/list", "--strict")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning:" not in done.stderr and "Error:" not in done.stderr, done.stderr
    listed = json.loads(done.stdout)
    assert "run_code" in [t["name"] for t in listed["tools"]]
