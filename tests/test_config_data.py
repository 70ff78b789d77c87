"""``[capsules] data``: the policy names a project folder the tool capsules may use.

Written as the host reads it (``load_policy`` with the project root), so errors carry the
real file, line and field. The capsules' side is in ``test_wasm_capsule.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from host import PolicyFileError, load_policy
from host.policy._decide import PolicySource
from host.settings import DEFAULT_DATA_QUOTA, CapsulesConfig, DataFolder

from .conftest import ROOT


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    for folder in ("tools", "data/inner", "policies", ".agent"):
        (root / folder).mkdir(parents=True)
    (root / "afile").write_text("not a folder")
    (tmp_path / "outside").mkdir()
    (root / "escape").symlink_to(tmp_path / "outside")
    (root / "alias").symlink_to(root / "data")
    return root


def write(root: Path, data: str, name: str = "policy.toml") -> Path:
    path = root / name
    path.write_text(
        textwrap.dedent(f"""\
            version = 1
            [capsules]
            wasm = ["notes"]
            data = {data}
        """),
        encoding="utf-8",
    )
    return path


def capsules(root: Path, data: str) -> CapsulesConfig:
    return load_policy([write(root, data)], root=root).capsules


def test_a_folder_name_is_read_only(project: Path) -> None:
    config = capsules(project, '"data"')
    assert config.data == DataFolder(path="data", writable=False)
    assert config.data is not None
    assert config.data.resolve(project) == (project / "data").resolve()


def test_a_table_says_whether_it_is_writable(project: Path) -> None:
    assert capsules(project, '{ path = "data" }').data == DataFolder(path="data")
    writable = capsules(project, '{ path = "data/inner", writable = true }').data
    assert writable == DataFolder(path="data/inner", writable=True)


def test_a_writable_folder_has_a_quota(project: Path) -> None:
    default = capsules(project, '{ path = "data", writable = true }').data
    assert default is not None and default.quota == DEFAULT_DATA_QUOTA == 256 * 1024**2
    given = capsules(project, '{ path = "data", writable = true, quota = "64MiB" }').data
    assert given == DataFolder(path="data", writable=True, quota=64 * 1024**2)
    assert capsules(project, '{ path = "data", writable = true, quota = 4096 }').data == (
        DataFolder(path="data", writable=True, quota=4096)
    )
    read_only = capsules(project, '"data"').data
    assert read_only is not None and read_only.quota is None


def test_a_link_inside_the_project_is_followed(project: Path) -> None:
    config = capsules(project, '"alias"')
    assert config.data is not None
    assert config.data.resolve(project) == (project / "data").resolve()


def test_without_the_setting_there_is_no_data_folder(project: Path) -> None:
    (project / "policy.toml").write_text('version = 1\n[capsules]\nwasm = ["notes"]\n')
    assert load_policy([project / "policy.toml"], root=project).capsules.data is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('"/"', "'/' (the whole file system) is an absolute path"),
        ('"/etc"', "'/etc' is an absolute path"),
        ('".."', "'..' is outside the project"),
        ('"data/../../outside"', "is outside the project"),
        ('"escape"', "'escape' is outside the project (it resolves to"),
        ('"."', "'.' is the project itself"),
        ('"data/.."', "is the project itself"),
        ('"tools"', "overlaps the project's 'tools' folder"),
        ('"policies"', "overlaps the project's 'policies' folder"),
        ('".agent"', "overlaps the project's '.agent' folder"),
        ('"src"', "overlaps the project's 'src/tools' folder"),
        ('"missing"', "'missing' does not exist"),
        ('"afile"', "'afile' is a file, not a folder"),
        ('""', "at least 1 character"),
        ("5", 'data is a folder name, "notes", or a table'),
        (
            '{ path = "data", write = true }',
            "unknown key 'write' in capsules.data; did you mean 'writable'?",
        ),
        ("{ writable = true }", "Field required"),
        ('{ path = "data", writable = "yes" }', "valid boolean"),
        ('{ path = "data", quota = "64MiB" }', "a quota limits what tools may write"),
        ('{ path = "data", writable = false, quota = "1MiB" }', "it needs writable = true"),
        ('{ path = "data", writable = true, quota = 0 }', "a size must be positive"),
        ('{ path = "data", writable = true, quota = -5 }', "a size must be positive"),
        ('{ path = "data", writable = true, quota = "-1MiB" }', "'-1MiB' is not a size"),
        ('{ path = "data", writable = true, quota = "lots" }', "'lots' is not a size"),
        ('{ path = "data", writable = true, quota = true }', "a size is a number of bytes"),
    ],
)
def test_dangerous_or_wrong_values_are_refused(project: Path, value: str, says: str) -> None:
    (project / "src" / "tools").mkdir(parents=True)
    with pytest.raises(PolicyFileError) as caught:
        capsules(project, value)
    error = caught.value
    assert says in str(error)
    assert error.file == str(project / "policy.toml")
    assert error.line == 4
    assert error.field is not None and error.field.startswith("capsules.data")


def test_paths_are_relative_to_the_project_in_every_file(project: Path) -> None:
    (project / "policy.toml").write_text("version = 1\n")
    (project / "policies" / "data").mkdir()  # not this one: paths are the project's
    extra = write(project, '"data/inner"', "policies/capsules.toml")
    config = load_policy([project / "policy.toml", extra], root=project).capsules
    assert config.data is not None
    assert config.data.resolve(project) == (project / "data" / "inner").resolve()


def test_without_a_root_paths_are_relative_to_the_file(project: Path) -> None:
    assert load_policy([write(project, '"data"')]).capsules.data == DataFolder(path="data")
    with pytest.raises(PolicyFileError, match="'data' does not exist"):
        load_policy([write(project, '"data"', "policies/x.toml")])


def test_a_reload_naming_a_bad_folder_fails_closed(project: Path) -> None:
    path = write(project, '"data"')
    source = PolicySource(load_policy([path], root=project), files=lambda: [path], root=project)
    assert source.current().version
    write(project, '"gone"')
    os.utime(path, ns=(1, 1))  # a different mtime, whatever the clock's resolution
    with pytest.raises(PolicyFileError, match="'gone' does not exist"):
        source.current()
    (project / "gone").mkdir()
    os.utime(path, ns=(2, 2))
    assert source.current().version


def policy_check(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from host.cli import main; main()", "policy", "check", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.mark.subprocess
def test_policy_check_says_where_a_tool_runs_and_refuses_a_bad_folder(project: Path) -> None:
    for name in ("notes", "clock"):
        (project / "tools" / f"{name}.py").write_text(f"def {name}_now() -> int:\n    return 1\n")
    write(project, '{ path = "data", writable = true }')
    where = str(project)
    done = policy_check(project, "notes_now", "--project", where)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (
        "capsule: wasm, data folder data (writable, quota 256 MiB) at /data"
    )
    done = policy_check(project, "clock_now", "--json", "--project", where)
    capsule = json.loads(done.stdout)["capsule"]
    assert set(capsule.pop("containment")) == {"landlock", "scoped", "reason"}  # Landlock
    assert capsule == {
        "kind": "subprocess",
        "data": {"path": "data", "writable": True, "quota": 256 * 1024**2, "guest": None},
    }
    write(project, '"missing"')
    done = policy_check(project, "notes_now", "--project", where)
    assert done.returncode == 1
    assert "policy.toml:4: capsules.data: 'missing' does not exist" in done.stderr
