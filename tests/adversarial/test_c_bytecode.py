"""Bytecode is not source (issue 13.2; sections B and C, both capsule kinds): ``.pyc``
files planted in ``tools/__pycache__`` ran instead of the tool source, in the subprocess
capsule and in the Wasm capsule, and kept running after the source changed, while the
declarations showed the source.

The tools package now loads from source only, compiled afresh at each start: a planted
``.pyc`` that matches the source's timestamp and size, one with an unchecked hash, and a
sourceless ``.pyc`` are all ignored, as root and as an unprivileged user, with Landlock
and without it. And a capsule writes no bytecode into the tools folder.
"""

from __future__ import annotations

import os
import py_compile
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from host.capsules import _wasm
from tests.test_wasm import run_guest, wasm_prepared

from .contain_helpers import Lab, account, accounts, chown_tree, lab

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux processes"),
]
__all__ = ["account", "accounts", "lab", "wasm_prepared"]  # the fixtures, used here

PAD = "#" * 40


def _source(function: str, value: str) -> str:
    return f'def {function}() -> str:\n    return "{value}"\n{PAD}\n'


TOOLS = {
    "ident": _source("which", "source"),
    "hashed": _source("hashed_which", "source"),
    "ghostly": (
        "def ghost() -> str:\n"
        "    from . import ghost as module  # only a sourceless ghost.pyc is there\n"
        "    return module.VALUE\n"
    ),
}


def _planted(function: str) -> str:
    """The planted code: the same size as the source (so a timestamp pyc matches)."""
    text = f'def {function}() -> str:\n    return "planted"\n'
    size = len(_source(function, "source"))
    return text + "#" * (size - len(text) - 1) + "\n"


SCRIPT = """
    async def main():
        async with Host.open(PROJECT) as host:
            found = {"which": await host.call("which"), "hashed": await host.call("hashed_which")}
            try:
                found["ghost"] = await host.call("ghost")
            except ToolError as exc:  # "cannot import name 'ghost'": not found at all
                found["ghost"] = exc.type_name
            say(found=found)

    anyio.run(main)
"""


def _plant_compiled(project: Path, compile_one: Any, tag: str) -> None:
    """Plant, for ``ident`` a timestamp pyc matching the source's mtime and size, for
    ``hashed`` an unchecked-hash pyc, and a sourceless ``ghost.pyc`` in the folder."""
    tools = project / "tools"
    work = project.parent / "evil"
    work.mkdir()
    for module, function, mode in (
        ("ident", "which", py_compile.PycInvalidationMode.TIMESTAMP),
        ("hashed", "hashed_which", py_compile.PycInvalidationMode.UNCHECKED_HASH),
    ):
        real = tools / f"{module}.py"
        evil = work / f"{module}.py"
        evil.write_text(_planted(function))
        assert evil.stat().st_size == real.stat().st_size
        os.utime(evil, ns=(real.stat().st_atime_ns, real.stat().st_mtime_ns))
        compile_one(evil, work / f"{module}.{tag}.pyc", mode)
    (work / "ghost.py").write_text('VALUE = "planted"\n')
    compile_one(work / "ghost.py", work / "ghost.pyc", py_compile.PycInvalidationMode.TIMESTAMP)
    cache = tools / "__pycache__"
    cache.mkdir()
    for module in ("ident", "hashed"):
        shutil.copyfile(work / f"{module}.{tag}.pyc", cache / f"{module}.{tag}.pyc")
    shutil.copyfile(work / "ghost.pyc", tools / "ghost.pyc")
    shutil.rmtree(work)


def _compile_here(source: Path, target: Path, mode: py_compile.PycInvalidationMode) -> None:
    py_compile.compile(str(source), cfile=str(target), invalidation_mode=mode, doraise=True)


def _expected(project: Path) -> dict[str, str]:
    tools = project / "tools"
    return {
        str(p.relative_to(tools)): p.read_bytes().hex() for p in tools.rglob("*") if p.is_file()
    }


@pytest.mark.parametrize("landlock", ["on", "off"])
def test_planted_bytecode_never_runs_in_a_subprocess_capsule(lab: Lab, landlock: str) -> None:
    project = lab.project(TOOLS)
    tag = sys.implementation.cache_tag  # the capsule runs this same Python version
    _plant_compiled(project, _compile_here, tag)
    chown_tree(project, lab.account)
    before = _expected(project)
    env = lab.env(**({"TOOLHOST_LANDLOCK": "0"} if landlock == "off" else {}))
    run = lab.run(SCRIPT, project, env=env)
    found = run.report()["found"]
    assert found == {"which": "source", "hashed": "source", "ghost": "ImportError"}
    assert run.wait() == 0, run.stderr()
    assert _expected(project) == before  # nothing written into the tools folder either


@pytest.mark.parametrize("landlock", ["on", "off"])
def test_a_subprocess_capsule_writes_no_bytecode_into_the_tools_folder(
    lab: Lab, landlock: str
) -> None:
    project = lab.project({**TOOLS, "ghostly": "def ghost() -> str:\n    return 'none'\n"})
    env = lab.env(**({"TOOLHOST_LANDLOCK": "0"} if landlock == "off" else {}))
    run = lab.run(SCRIPT, project, env=env)
    assert run.report()["found"] == {"which": "source", "hashed": "source", "ghost": "none"}
    assert run.wait() == 0, run.stderr()
    assert not (project / "tools" / "__pycache__").exists()


WASM_POLICY = '[capsules]\ndefault = "wasm"\n'


@pytest.mark.wasm
def test_planted_bytecode_never_runs_in_a_wasm_capsule(lab: Lab, wasm_prepared: Any) -> None:
    """The guest is CPython 3.12: its bytecode is compiled by the guest itself."""
    project = lab.project(TOOLS, WASM_POLICY)
    guest_tag = "cpython-312"

    def compile_in_guest(source: Path, target: Path, mode: py_compile.PycInvalidationMode) -> None:
        # What py_compile does (it cannot make its folders under WASI, where "/" is not
        # one): the guest's own compiler and bytecode header.
        done = run_guest(
            wasm_prepared,
            "import importlib._bootstrap_external as b, importlib.util as u, os\n"
            f"source = open('/w/{source.name}', 'rb').read()\n"
            f"code = compile(source, '/project/tools/{source.name}', 'exec')\n"
            f"info = os.stat('/w/{source.name}')\n"
            f"if {mode.name!r} == 'TIMESTAMP':\n"
            "    data = b._code_to_timestamp_pyc(code, int(info.st_mtime), info.st_size)\n"
            "else:\n"
            "    data = b._code_to_hash_pyc(code, u.source_hash(source), checked=False)\n"
            f"open('/w/{target.name}', 'wb').write(data)\n",
            preopens=[_wasm.Preopen(str(source.parent), "/w", writable=True)],
        )
        assert done.returncode == 0, done.stderr.decode()

    _plant_compiled(project, compile_in_guest, guest_tag)
    chown_tree(project, lab.account)
    before = _expected(project)
    run = lab.run(SCRIPT, project)
    found = run.report()["found"]
    assert found == {"which": "source", "hashed": "source", "ghost": "ImportError"}
    assert run.wait() == 0, run.stderr()
    assert _expected(project) == before
