"""The README's examples run as they are, and it documents what a new user needs.

The examples are taken from the README itself and run in a fresh interpreter from the
repository's folder, each alone: none may depend on another's state.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else len(README)]


def _python_block(title: str, index: int = 0) -> str:
    blocks = re.findall(r"```python\n(.*?)```", _section(title), re.DOTALL)
    return blocks[index]


def _run(source: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "example.py"
    script.write_text(source, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.subprocess
def test_the_approver_example_runs_alone(tmp_path: Path) -> None:
    done = _run(_python_block("Approvals"), tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "kanban.close agent close-needs-ok Closing a task is visible to the whole team."
    )
    assert lines[-1] == "{'id': 'write-docs', 'title': 'write docs', 'status': 'closed'}"


@pytest.mark.subprocess
def test_the_first_example_runs_alone(tmp_path: Path) -> None:
    done = _run(_python_block("What you get"), tmp_path)
    assert done.returncode == 0, done.stderr


def test_the_readme_says_what_a_new_user_trips_on() -> None:
    projects = _section("Projects and tool files")
    assert "**A tool's own dependencies** are imported in the capsule" in projects
    assert 'python = ".venv/bin/python"' in projects
    assert "**Each command is a fresh host.**" in _section("Command line")
    assert "`toolhost policy lint`" in _section("Command line")
    assert "A plain glob compares text" in _section("Policy file")


def test_every_toolhost_variable_is_documented_under_one_name() -> None:
    code = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "host").rglob("*.py"))
    read = set(re.findall(r"\b(TOOLHOST_[A-Z_]+)\b", code))
    read -= {"TOOLHOST_GUEST_SPEC"}  # set by the host for its own child process, not a setting
    documented = set(re.findall(r"\b(TOOLHOST_[A-Z_]+)\b", README))
    assert read - documented == set()
    # the cache has one variable; the old name of its scopes folder is said deprecated
    cache = [m.start() for m in re.finditer(r"TOOLHOST_CACHE_DIR", README)]
    assert cache and all("deprecat" in README[i - 200 : i + 200] for i in cache)
