"""The documentation site builds in strict mode, and its snippets cannot rot.

- ``mkdocs build --strict``: a broken link, anchor or API reference fails the build.
- Every ``python`` block compiles (top-level ``await`` allowed), every ``toml`` block is a
  valid TOML document and every ``json`` block valid JSON.
- A block the page marks ``<!-- test: run -->`` runs as it is, alone, in a fresh
  interpreter from the repository's folder; ``<!-- test: run in a new project -->`` runs in
  a folder where ``toolhost init notes`` made a project.
- Every ``toolhost COMMAND`` in a ``bash`` block is a command the CLI has.
- Every limit of ``[limits]`` is in the limits page's table, with its default.
- The README stays a front door: short, and its links reach pages that exist.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from host import Limits
from host.cli._main import _parser  # pyright: ignore[reportPrivateUsage]

from .conftest import ROOT

DOCS = ROOT / "docs"
PAGES = sorted([*DOCS.rglob("*.md"), ROOT / "README.md"])
MARK = re.compile(r"<!-- test: (run(?: in a new project)?) -->\n$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    body: str
    mark: str | None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"


def blocks(lang: str | None = None) -> list[Block]:
    found: list[Block] = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"(?m)^```(\w+)[^\n]*\n(.*?)^```", text, re.DOTALL):
            if lang is not None and match.group(1) != lang:
                continue
            before = text[: match.start()]
            mark = MARK.search(before[-80:])
            found.append(
                Block(
                    page=page,
                    line=before.count("\n") + 1,
                    lang=match.group(1),
                    body=match.group(2),
                    mark=mark.group(1) if mark else None,
                )
            )
    return found


def _ids(items: list[Block]) -> list[str]:
    return [b.id for b in items]


@pytest.mark.subprocess
def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    api = (tmp_path / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("host.Host.open", "host.Session.run_code", "host.errors.PolicyDenied"):
        assert f'id="{name}"' in api, name  # the reference is generated from the docstrings
    limits = (tmp_path / "limits" / "index.html").read_text(encoding="utf-8")
    assert 'id="host.Limits.call_timeout"' in limits


PYTHON = blocks("python")


@pytest.mark.parametrize("block", PYTHON, ids=_ids(PYTHON))
def test_every_python_snippet_compiles(block: Block) -> None:
    compile(block.body, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)


TOML = blocks("toml")


@pytest.mark.parametrize("block", TOML, ids=_ids(TOML))
def test_every_toml_snippet_parses(block: Block) -> None:
    tomllib.loads(block.body)


JSON = blocks("json")


@pytest.mark.parametrize("block", JSON, ids=_ids(JSON))
def test_every_json_snippet_parses(block: Block) -> None:
    json.loads(block.body)


RUN = [b for b in PYTHON if b.mark is not None]


def test_the_examples_that_run_are_marked() -> None:
    """The runnable examples this module promises are still marked (a lost mark would
    silently stop testing one)."""
    assert {b.page.name for b in RUN} >= {
        "index.md",
        "getting-started.md",
        "approvals.md",
        "mcp.md",
        "policy.md",
        "README.md",
    }


@pytest.mark.subprocess
@pytest.mark.parametrize("block", RUN, ids=_ids(RUN))
def test_the_marked_examples_run_alone(block: Block, tmp_path: Path) -> None:
    source = block.body.replace(".venv/bin/toolhost", str(Path(sys.executable).parent / "toolhost"))
    cwd = ROOT
    if block.mark == "run in a new project":
        cwd = tmp_path / "work"
        cwd.mkdir()
        made = subprocess.run(
            [sys.executable, "-c", "from host.cli import main; main()", "init", "notes"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert made.returncode == 0, made.stderr
    done = _run(source, cwd, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def _run(source: str, cwd: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``source`` as a script of its own, in a fresh interpreter, from ``cwd``."""
    script = tmp_path / "example.py"
    script.write_text(source, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _commands() -> set[str]:
    parser = _parser()
    sub = next(a for a in parser._actions if a.dest == "command")  # pyright: ignore[reportPrivateUsage]
    assert sub.choices is not None
    return set(sub.choices)


BASH = blocks("bash")


@pytest.mark.parametrize("block", BASH, ids=_ids(BASH))
def test_every_toolhost_command_in_a_snippet_exists(block: Block) -> None:
    known = _commands()
    for line in block.body.splitlines():
        for used in re.findall(r"(?:^|[\s/&;(])toolhost\s+([a-z][\w-]*)", line):
            assert used in known, f"{block.id}: toolhost {used} is not a command"


def test_every_limit_is_in_the_limits_table() -> None:
    page = (DOCS / "limits.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"(?m)^\| `(\w+)` \| ([^|]+) \|", page))
    assert set(rows) == set(Limits.model_fields), "docs/limits.md's table and Limits differ"
    defaults = Limits()
    for name, shown in rows.items():
        value = getattr(defaults, name)
        if value is None:
            assert shown.strip() == "off", name
        elif isinstance(value, float) and name != "code_memory":
            assert shown.strip() == f"{value:g} s", (name, shown)
        elif isinstance(value, int) and value >= 1024 and name != "code_memory":
            assert shown.strip() == f"{value // 1024**2} MiB", (name, shown)


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 300
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).is_file(), target
    assert "toolhost init" in readme and "pip install" in readme


def test_every_toolhost_variable_is_documented_under_one_name() -> None:
    text = "\n".join(p.read_text(encoding="utf-8") for p in PAGES)
    code = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "host").rglob("*.py"))
    read = set(re.findall(r"\b(TOOLHOST_[A-Z_]+)\b", code))
    read -= {"TOOLHOST_GUEST_SPEC"}  # set by the host for its own child process, not a setting
    documented = set(re.findall(r"\b(TOOLHOST_[A-Z_]+)\b", text))
    assert read - documented == set()
    # the cache has one variable; the old name of its scopes folder is said deprecated
    cache = [m.start() for m in re.finditer(r"TOOLHOST_CACHE_DIR", text)]
    assert cache and all("deprecat" in text[i - 200 : i + 200] for i in cache)


def _page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def test_the_docs_say_what_a_new_user_trips_on() -> None:
    tools = _page("tools.md")
    assert "**A tool's own dependencies** are imported in the capsule" in tools
    assert 'python = ".venv/bin/python"' in tools
    assert "**Each command is a fresh host.**" in _page("cli.md")
    assert "`toolhost policy lint`" in _page("cli.md")
    assert "A plain glob compares text" in _page("policy.md")


@pytest.mark.subprocess
def test_the_approver_example_prints_the_request_and_the_result(tmp_path: Path) -> None:
    (block,) = [b for b in RUN if b.page.name == "approvals.md"]
    done = _run(block.body, ROOT, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "kanban.close agent close-needs-ok Closing a task is visible to the whole team."
    )
    assert lines[-1] == "{'id': 'write-docs', 'title': 'write docs', 'status': 'closed'}"
