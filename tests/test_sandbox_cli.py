"""``toolhost exec (-c CODE | FILE)`` as a real process (DESIGN.md section 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .test_sandbox import TOOLS
from .test_wasm import wasm_prepared

pytestmark = [pytest.mark.wasm]
__all__ = ["wasm_prepared"]

_SCRIPT = Path(sys.executable).with_name("toolhost")
TOOLHOST = (
    [str(_SCRIPT)]
    if _SCRIPT.exists()
    else [sys.executable, "-c", "from host.cli import main; main()"]
)
POLICY = """
    version = 1
    [defaults]
    agent = "allow"

    [[rules]]
    id = "no-boom"
    tools = ["boom"]
    decision = "deny"
"""


@pytest.fixture
def proj(make_project: Callable[..., Path], wasm_prepared: Any) -> Path:
    del wasm_prepared
    return make_project(tools=TOOLS, policy=POLICY)


def toolhost(*args: str, cwd: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TOOLHOST, *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )


def test_exec_code_prints_output_then_value(proj: Path) -> None:
    done = toolhost(
        "exec", "-c", "x = await add(2, 3)\nprint('sum', x)\n{'twice': x * 2}", cwd=proj
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == 'sum 5\n{\n  "twice": 10\n}\n'


def test_exec_json_shape(proj: Path) -> None:
    done = toolhost("exec", "--json", "-c", "print('hi')\nawait add(1, 2)", cwd=proj)
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert json.loads(line) == {
        "ok": True,
        "value": 3,
        "stdout": "hi\n",
        "calls": [{"tool": "add", "decision": "allow", "ok": True}],
        "error": None,
        "warnings": [],
        "check": {
            "mode": "warn",
            "status": "clean",
            "diagnostics": [],
            "note": None,
            "level": "quick",
        },
    }


def test_exec_file_and_failure(proj: Path) -> None:
    (proj / "snippet.py").write_text("total = await add(1, 1)\ntotal / 0\n")
    done = toolhost("exec", "--json", "snippet.py", cwd=proj)
    assert done.returncode == 1
    data = json.loads(done.stdout)
    assert data["ok"] is False and data["value"] is None
    assert data["error"]["kind"] == "exception"
    assert data["error"]["type"] == "ZeroDivisionError"
    assert 'File "<run 1>", line 2' in data["error"]["traceback"]
    assert data["calls"] == [{"tool": "add", "decision": "allow", "ok": True}]
    plain = toolhost("exec", "snippet.py", cwd=proj)
    assert plain.returncode == 1 and plain.stdout == ""
    assert "ZeroDivisionError: division by zero" in plain.stderr


def test_exec_from_stdin_and_warnings(proj: Path) -> None:
    done = toolhost("exec", "-", cwd=proj, stdin="count()\n'left'\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "left\n"
    assert "never awaited" in done.stderr


def test_exec_policy_denial_is_data(proj: Path) -> None:
    code = "try:\n    await boom('x')\nexcept PolicyDenied as e:\n    rule = e.rule\nrule"
    done = toolhost("exec", "--json", "-c", code, cwd=proj)
    data = json.loads(done.stdout)
    assert data["ok"] is True and data["value"] == "no-boom"
    assert data["calls"] == [
        {"tool": "boom", "decision": "deny", "ok": False, "error": "policy_denied"}
    ]


def test_exec_usage_errors(proj: Path) -> None:
    assert toolhost("exec", cwd=proj).returncode == 2
    assert toolhost("exec", "-c", "1", "file.py", cwd=proj).returncode == 2
    missing = toolhost("exec", "nope.py", cwd=proj)
    assert missing.returncode == 2 and "cannot read nope.py" in missing.stderr


def test_a_limit_is_said_once_with_what_was_exceeded(
    make_project: Callable[..., Path], wasm_prepared: Any
) -> None:
    del wasm_prepared
    limits = '\n[limits]\ncode_memory = "64MiB"\ncode_max_output = "1KiB"\n'
    proj = make_project(tools=TOOLS, policy=textwrap.dedent(POLICY) + limits)
    done = toolhost("exec", "-c", "print('x' * 5000)", cwd=proj)
    assert done.returncode == 1
    assert done.stdout.endswith("\n"), "what follows captured output starts a line"
    assert done.stderr.count("limit code_max_output exceeded") == 1, done.stderr
    assert "printed more than 1024 characters" in done.stderr
    done = toolhost("exec", "-c", "keep = 1\nblob = bytearray(512 * 1024 * 1024)", cwd=proj)
    assert done.returncode == 1
    assert done.stderr.count("limit code_memory exceeded") == 1, done.stderr
    assert (
        "toolhost: limit code_memory exceeded: the code needed more memory than code_memory "
        "allows (64 MiB; raise [limits] code_memory to allow more); the sandbox was "
        "restarted: variables and imports of earlier runs were lost\n"
    ) in done.stderr
    assert 'File "<run 1>", line 2' in done.stderr  # where, in the agent's own code
