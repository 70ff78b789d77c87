"""``[capsules] python``: the project's tools run under the project's own interpreter.

A project whose tools need packages of their own names the interpreter of its virtual
environment; subprocess tool capsules then run under it and import what is installed
there, with only the ``capsule`` package added (README, "The capsule"). The host checks
the interpreter when it starts and says what to install when it cannot be used.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest

from host import Host, PolicyFileError, load_policy

from .test_policy_cli import toolhost

pytestmark = [pytest.mark.subprocess]

TOOLS = {
    "where": """
        import sys


        def where() -> dict[str, object]:
            import projdep

            try:
                import pydantic  # the host's, never the project's
            except ImportError:
                host_packages = False
            else:
                host_packages = True
            return {"prefix": sys.prefix, "dep": projdep.NAME, "host_packages": host_packages}
        """,
}


def _venv(root: Path, *, msgpack_too: bool = True) -> Path:
    """A virtual environment in ``root/.venv`` holding ``projdep`` (and msgpack)."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(root / ".venv")], check=True)
    (site,) = (root / ".venv" / "lib").glob("python3.*/site-packages")
    (site / "projdep.py").write_text('NAME = "the project\'s own"\n', encoding="utf-8")
    if msgpack_too:  # msgpack alone, not the rest of the host's packages
        only = root / "only-msgpack"
        only.mkdir()
        (only / "msgpack").symlink_to(Path(msgpack.__file__).parent)
        (site / "msgpack.pth").write_text(f"{only}\n", encoding="utf-8")
    return root / ".venv" / "bin" / "python"


POLICY = """\
version = 1

[capsules]
python = ".venv/bin/python"
"""


@pytest.mark.anyio
async def test_tools_run_under_the_projects_interpreter(
    make_project: Callable[..., Path],
) -> None:
    root = make_project(TOOLS, policy=POLICY)
    _venv(root)
    async with Host.open(root) as host:
        assert await host.call("where") == {
            "prefix": str(root / ".venv"),
            "dep": "the project's own",
            "host_packages": False,
        }


def test_policy_check_says_which_interpreter(make_project: Callable[..., Path]) -> None:
    root = make_project(TOOLS, policy=POLICY)
    _venv(root)
    done = toolhost("policy", "check", "where", "--project", str(root))
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-1]  # then how it is confined (Landlock), if it is
    assert last.startswith("capsule: subprocess under .venv/bin/python")


@pytest.mark.anyio
async def test_an_interpreter_without_msgpack_is_refused_saying_what_to_install(
    make_project: Callable[..., Path],
) -> None:
    root = make_project(TOOLS, policy=POLICY)
    python = _venv(root, msgpack_too=False)
    with pytest.raises(PolicyFileError) as caught:
        async with Host.open(root):
            pass  # pragma: no cover
    error = caught.value
    assert (error.file, error.field) == ("policy.toml", "capsules.python")
    assert f"{python} (CPython 3." in str(error)
    assert f"cannot import msgpack, which the capsule needs: install it there ({python} -m pip" in (
        str(error)
    )


@pytest.mark.anyio
async def test_a_program_that_is_no_python_is_refused(make_project: Callable[..., Path]) -> None:
    root = make_project(TOOLS, policy=POLICY.replace(".venv/bin/python", "fake-python"))
    fake = root / "fake-python"
    fake.write_text("#!/bin/sh\necho hello\n", encoding="utf-8")
    fake.chmod(0o755)
    with pytest.raises(PolicyFileError) as caught:
        async with Host.open(root):
            pass  # pragma: no cover
    assert "is not a Python interpreter toolhost can use: it needs CPython 3.11" in str(
        caught.value
    )


@pytest.mark.parametrize(
    ("python", "says"),
    [
        ("missing/bin/python", "'missing/bin/python' does not exist"),
        ("tools", "is not an executable file"),
        ("policy.toml", "is not an executable file"),
    ],
)
def test_a_path_that_cannot_be_an_interpreter_is_a_policy_error(
    make_project: Callable[..., Path], python: str, says: str
) -> None:
    root = make_project(TOOLS, policy=POLICY.replace(".venv/bin/python", python))
    with pytest.raises(PolicyFileError) as caught:
        load_policy([root / "policy.toml"], root=root)
    assert str(caught.value).startswith(f"{root / 'policy.toml'}:4: capsules.python: ")
    assert says in str(caught.value)
