"""``toolhost init``: a new project that lints clean and runs at once, never overwriting.

Each test runs the real command line in a child process on a fresh folder; the calls go
to real capsules. The installed-wheel smoke test (``test_package``) starts from
``toolhost init`` too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from host.cli._init import PROJECT_FILES

pytestmark = pytest.mark.subprocess

TOOLHOST = [sys.executable, "-c", "from host.cli import main; main()"]


def toolhost(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TOOLHOST, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    done = toolhost("init", "notes", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return tmp_path / "notes"


def test_init_writes_the_project_files(tmp_path: Path) -> None:
    done = toolhost("init", "fresh", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["ok"] is True and sorted(out["files"]) == sorted(PROJECT_FILES)
    root = tmp_path / "fresh"
    assert {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} == set(
        PROJECT_FILES
    )
    assert ".agent/" in (root / ".gitignore").read_text().splitlines()
    assert (root / "README.md").read_text().startswith("# fresh\n")
    policy = (root / "policy.toml").read_text()
    for decision in ('decision = "allow"', 'decision = "deny"', 'decision = "escalate"'):
        assert decision in policy
    assert "when.text" in policy


def test_init_into_the_current_folder_keeps_what_is_there(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    done = toolhost("init", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "src" / "tools" / "notes.py").is_file()
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "taken"
    (root / "src" / "tools").mkdir(parents=True)
    (root / "policy.toml").write_text("# my own policy\n")
    (root / "src" / "tools" / "text.py").write_text("# my own tool\n")
    done = toolhost("init", str(root), cwd=tmp_path)
    assert done.returncode == 2
    assert "policy.toml" in done.stderr and "src/tools/text.py" in done.stderr
    assert "never overwrites" in done.stderr and "Traceback" not in done.stderr
    assert (root / "policy.toml").read_text() == "# my own policy\n"
    assert (root / "src" / "tools" / "text.py").read_text() == "# my own tool\n"
    assert not (root / "src" / "tools" / "notes.py").exists()  # nothing written at all
    assert not (root / "README.md").exists()


def test_init_refuses_a_file_for_a_folder(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    done = toolhost("init", "file", cwd=tmp_path)
    assert done.returncode == 2 and "is not a folder" in done.stderr


def test_the_new_project_lints_clean(project: Path) -> None:
    done = toolhost("policy", "lint", cwd=project)
    assert done.returncode == 0 and "no policy warnings" in done.stdout, done.stdout + done.stderr
    # ruff, with its defaults (the project has no configuration of its own)
    ruff = Path(sys.executable).with_name("ruff")
    checked = subprocess.run(
        [str(ruff), "check", "--isolated", "--select", "E,F,W,I,B,UP", "."],
        cwd=project,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout
    hooks = toolhost("hooks", "--json", cwd=project)
    assert [h["id"] for h in json.loads(hooks.stdout)["hooks"]] == ["hide-emails-from-agents"]


def test_the_new_project_runs_calls_and_agent_code_at_once(project: Path) -> None:
    added = toolhost("call", "add", "buy milk", "--json", cwd=project)
    assert json.loads(added.stdout) == {"ok": True, "value": {"id": 1, "text": "buy milk"}}
    assert "bundled" not in added.stderr  # the project found from its own folder

    denied = toolhost("call", "add", "my PassWord is hunter2", "--json", cwd=project)
    assert json.loads(denied.stdout)["error"]["rule"] == "no-passwords"

    long = toolhost("call", "add", "x" * 300, "--json", cwd=project)
    error = json.loads(long.stdout)["error"]
    assert error["kind"] == "not_approved", error  # escalated; nobody at a terminal

    code = (
        'await add("write to ada@example.com")\nprint(await find("ADA"), await word_count("a b c"))'
    )
    ran = toolhost("exec", "-c", code, "--json", cwd=project)
    out = json.loads(ran.stdout)
    assert out["ok"] is True, ran.stdout + ran.stderr
    assert out["stdout"] == "[{'id': 1, 'text': 'write to <email>'}] 3\n"  # the hook ran
    assert out["check"]["status"] == "clean"

    removal = toolhost("policy", "check", "remove", "1", "--caller", "agent", cwd=project)
    assert removal.stdout.startswith("escalate (rule agent-removes)"), removal.stdout
    agent_removes = toolhost("exec", "-c", "await remove(1)", "--json", cwd=project)
    assert json.loads(agent_removes.stdout)["error"]["kind"] == "not_approved"


def test_the_new_project_declares_its_tools(project: Path) -> None:
    scope = toolhost("scope", "--json", cwd=project)
    assert scope.returncode == 0, scope.stderr
    text = scope.stdout
    for name in ("add", "find", "remove", "word_count"):
        assert name in text
