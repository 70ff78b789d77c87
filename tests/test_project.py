"""One rule for the project folder, for the API and the command line alike.

The project is the folder that holds ``tools/`` or ``src/tools/``, the policy files and
``.agent/``; naming the ``src/`` folder of a ``src/tools`` layout names the folder above.
A project with no policy file at all says which defaults are in force.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from host import DeclarationError, Host, PolicyDenied
from host.declare import default_project, resolve_project
from host.testing import in_process

_TOOLS = """
def wipe_notes() -> str:
    return "wiped"
"""
_POLICY = """
version = 1

[[rules]]
id = "no-wipe"
tools = ["wipe_notes"]
decision = "deny"
"""


def _layout(root: Path, *, tools: str = "src/tools", policy: str | None = "policy.toml") -> Path:
    (root / tools).mkdir(parents=True)
    (root / tools / "notes.py").write_text(textwrap.dedent(_TOOLS), encoding="utf-8")
    if policy is not None:
        (root / policy).parent.mkdir(parents=True, exist_ok=True)
        (root / policy).write_text(textwrap.dedent(_POLICY), encoding="utf-8")
    return root


@pytest.mark.parametrize("named", [".", "src"])
def test_the_src_folder_names_the_project_above_it(tmp_path: Path, named: str) -> None:
    root = _layout(tmp_path)
    project = resolve_project(root / named)
    assert project.root == root.resolve()
    assert project.tools_dir == (root / "src" / "tools").resolve()
    assert project.policy_files == [root.resolve() / "policy.toml"]
    assert project.state_dir == root.resolve() / ".agent"


@pytest.mark.parametrize("stray", ["policy.toml", "policies/more.toml"])
def test_a_policy_file_inside_src_is_refused_naming_where_it_belongs(
    tmp_path: Path, stray: str
) -> None:
    root = _layout(tmp_path, policy=f"src/{stray}")
    with pytest.raises(DeclarationError) as caught:
        resolve_project(root / "src")
    message = str(caught.value)
    assert stray in message and f"move it to {root.resolve()}" in message


def test_both_tools_folders_are_ambiguous(tmp_path: Path) -> None:
    root = _layout(tmp_path)
    _layout(tmp_path, tools="tools", policy=None)
    with pytest.raises(DeclarationError, match=r"both tools/ and src/tools/"):
        resolve_project(root)


@pytest.mark.parametrize("named", ["tools", "src/tools"])
def test_naming_the_tools_folder_itself_names_the_project(tmp_path: Path, named: str) -> None:
    root = _layout(tmp_path, tools=named)
    with pytest.raises(DeclarationError) as caught:
        resolve_project(root / named)
    assert f"name its project, {root.resolve()}" in str(caught.value)


@pytest.mark.parametrize("tools", ["tools", "src/tools"])
def test_the_command_line_default_is_the_folder_holding_the_tools(
    tmp_path: Path, tools: str
) -> None:
    root = _layout(tmp_path / "p", tools=tools)
    assert default_project(root) == (root.resolve(), False)
    (tmp_path / "empty").mkdir()
    assert default_project(tmp_path / "empty")[1] is True  # the bundled example


@pytest.mark.anyio
@pytest.mark.parametrize("named", [".", "src"])
async def test_host_open_on_src_reads_the_policy_beside_it(tmp_path: Path, named: str) -> None:
    root = _layout(tmp_path)
    async with Host.open(root / named, capsule=in_process()) as host:
        assert host.project.root == root.resolve()
        with pytest.raises(PolicyDenied) as caught:
            await host.call("wipe_notes")
        assert caught.value.rule == "no-wipe"
        kinds = [e.kind for e in host.events.recent]
        assert "policy_missing" not in kinds
    assert not (root / "src" / ".agent").exists()


@pytest.mark.anyio
async def test_no_policy_file_is_said_in_an_event_with_the_defaults(tmp_path: Path) -> None:
    root = _layout(tmp_path, policy=None)
    async with Host.open(root, capsule=in_process()) as host:
        (event,) = [e for e in host.events.recent if e.kind == "policy_missing"]
        assert event.data["defaults"] == {
            "agent": "deny",
            "tool": "deny",
            "script": "allow",
            "app": "allow",
        }
        assert "no policy.toml or policies/*.toml" in event.data["message"]
        assert event.data["project"] == str(root.resolve())
        assert await host.call("wipe_notes") == "wiped"  # app: allow, the default


@pytest.mark.anyio
async def test_removing_the_last_policy_file_is_said_too(tmp_path: Path) -> None:
    root = _layout(tmp_path)
    async with Host.open(root, capsule=in_process()) as host:
        assert [e for e in host.events.recent if e.kind == "policy_missing"] == []
        (root / "policy.toml").unlink()
        assert await host.call("wipe_notes") == "wiped"  # reloaded: the defaults allow it
        (event,) = [e for e in host.events.recent if e.kind == "policy_missing"]
        assert event.data["defaults"]["app"] == "allow"
