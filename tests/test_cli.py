"""The ``toolhost`` command line, run as a real process (DESIGN.md section 5).

Exit status: 0 on success, 1 when the host reports an error, 2 on bad usage. With
``--json`` the command prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from .conftest import AGENT_SRC, ROOT
from .fixtures.e2e.helpers import HERE

pytestmark = [pytest.mark.subprocess]

PROJECT = HERE / "cliproj"
_SCRIPT = Path(sys.executable).with_name("toolhost")
TOOLHOST = (
    [str(_SCRIPT)]
    if _SCRIPT.exists()
    else [sys.executable, "-c", "from host.cli import main; main()"]
)


def toolhost(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TOOLHOST, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )


def call_json(*args: str, project: Path = PROJECT) -> tuple[int, dict[str, Any]]:
    """``toolhost call ARGS --json``: the exit status and the one JSON object printed."""
    done = toolhost("call", *args, "--json", "--project", str(project))
    lines = done.stdout.splitlines()
    assert len(lines) == 1, f"stdout: {done.stdout!r}\nstderr: {done.stderr}"
    return done.returncode, json.loads(lines[0])


# -- toolhost call -------------------------------------------------------------------------


def test_call_prints_the_value_as_json() -> None:
    assert call_json("add", "2", "3", project=AGENT_SRC) == (0, {"ok": True, "value": 5})


def test_call_without_json_prints_the_value() -> None:
    done = toolhost("call", "add", "2", "3", "--project", str(AGENT_SRC))
    assert (done.returncode, done.stdout) == (0, "5\n")
    done = toolhost("call", "greet", "Ann", "--project", str(PROJECT))
    assert (done.returncode, done.stdout) == (0, "hello Ann!\n")


def test_a_tool_error_is_exit_1_with_its_kind() -> None:
    status, out = call_json("fail", "broken")
    assert status == 1
    assert out["ok"] is False
    error = out["error"]
    assert error["kind"] == "tool_error"
    assert error["type"] == "ValueError"
    assert error["error_message"] == "broken"
    assert error["tool"] == "fail"
    assert "in fail" in error["traceback"]
    done = toolhost("call", "fail", "--project", str(PROJECT))
    assert done.returncode == 1 and done.stdout == ""
    assert "ValueError: it went wrong" in done.stderr


def test_an_unknown_tool_is_exit_1() -> None:
    status, out = call_json("no_such_tool")
    assert status == 1
    assert out["error"]["kind"] == "unknown_tool"
    assert out["error"]["name"] == "no_such_tool"


def test_invalid_arguments_are_exit_1() -> None:
    status, out = call_json("add", "2", project=AGENT_SRC)
    assert status == 1
    assert out["error"]["kind"] == "invalid_arguments"
    assert out["error"]["parameter"] == "b"
    status, out = call_json("greet", "Ann", "--kw", "colour=red")
    assert status == 1
    assert out["error"]["kind"] == "invalid_arguments"
    assert out["error"]["parameter"] == "colour"


@pytest.mark.parametrize(
    ("arg", "value"),
    [
        ("3", 3),
        ("2.5", 2.5),
        ("true", True),
        ("null", None),
        ('"3"', "3"),
        ("hello", "hello"),
        ("hello world", "hello world"),
        ('{"a": [1, 2]}', {"a": [1, 2]}),
        ("[1, 2", "[1, 2"),  # not JSON: taken as the string itself
    ],
)
def test_each_arg_is_json_if_it_parses_else_a_string(arg: str, value: Any) -> None:
    assert call_json("echo", arg) == (0, {"ok": True, "value": value})


def test_bytes_are_printed_as_base64() -> None:
    assert call_json("blob") == (0, {"ok": True, "value": {"$bytes": "AP9ieXRlcw=="}})


def test_keyword_arguments() -> None:
    assert call_json("greet", "--kw", "name=Ann", "--kw", "punct=?") == (
        0,
        {"ok": True, "value": "hello Ann?"},
    )
    assert call_json("echo", "--kw", "value=[1, 2]") == (0, {"ok": True, "value": [1, 2]})
    assert call_json("echo", "--kw", "value=a=b") == (0, {"ok": True, "value": "a=b"})


@pytest.mark.parametrize("kw", ["name", "=Ann", "1x=2", "na me=Ann"])
def test_a_malformed_kw_is_exit_2(kw: str) -> None:
    done = toolhost("call", "greet", "--kw", kw, "--project", str(PROJECT))
    assert done.returncode == 2, done.stderr
    assert "--kw" in done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["call"],
        ["bogus"],
        ["call", "add", "--no-such-option"],
        ["run"],
    ],
)
def test_argparse_misuse_is_exit_2(argv: list[str]) -> None:
    done = toolhost(*argv)
    assert done.returncode == 2, done.stderr
    assert "usage:" in done.stderr


def test_a_missing_project_is_exit_2() -> None:
    done = toolhost("call", "add", "1", "2", "--project", "/no/such/project")
    assert done.returncode == 2
    assert "/no/such/project" in done.stderr


def test_a_project_that_cannot_be_declared_is_exit_1(tmp_path: Path) -> None:
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "typo.py").write_text("def f(:\n", encoding="utf-8")
    status, out = call_json("f", project=tmp_path)
    assert status == 1
    assert out["error"]["kind"] == "declaration_error"
    assert out["error"]["file"].endswith("typo.py") and out["error"]["line"] == 1


def test_tool_output_goes_to_stderr_and_stdout_stays_one_json_object() -> None:
    done = toolhost("call", "chatty", "--json", "--project", str(PROJECT))
    assert done.returncode == 0
    assert json.loads(done.stdout) == {"ok": True, "value": "quiet result"}
    assert "chatter on stdout" in done.stderr and "chatter on stderr" in done.stderr


# -- default project resolution ------------------------------------------------------------


def _tools(folder: Path, value: str) -> None:
    folder.mkdir(parents=True)
    (folder / "where.py").write_text(
        f"def where() -> str:\n    return {value!r}\n", encoding="utf-8"
    )


def test_the_default_project_is_src_tools_first(tmp_path: Path) -> None:
    _tools(tmp_path / "src" / "tools", "src/tools")
    _tools(tmp_path / "tools", "tools")
    done = toolhost("call", "where", "--json", cwd=tmp_path)
    assert json.loads(done.stdout) == {"ok": True, "value": "src/tools"}
    assert "bundled" not in done.stderr


def test_the_default_project_is_then_tools(tmp_path: Path) -> None:
    _tools(tmp_path / "tools", "tools")
    done = toolhost("call", "where", "--json", cwd=tmp_path)
    assert json.loads(done.stdout) == {"ok": True, "value": "tools"}
    assert "bundled" not in done.stderr


def test_the_default_project_is_else_the_bundled_example(tmp_path: Path) -> None:
    done = toolhost("call", "add", "2", "3", "--json", cwd=tmp_path)
    assert done.returncode == 0
    assert json.loads(done.stdout) == {"ok": True, "value": 5}
    assert "bundled" in done.stderr and "agent_src" in done.stderr


# -- toolhost run --------------------------------------------------------------------------


def test_run_the_tour() -> None:
    done = toolhost("run", "agent_src/scripts/tour.py")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("now: 20")
    assert "2 + 3 = 5" in lines
    assert any(line.startswith("rolled [") for line in lines)
    assert "open tasks: ['write the docs']" in lines
    assert lines[-1].startswith("a tool error crosses as data: KeyError")


def _script(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def test_run_a_script_with_every_kind_of_call(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import asyncio

        print("bare", await greet("Ann"))
        print("path", await tools.things.greet("Bob", punct="?"))
        values = await asyncio.gather(*(echo(i) for i in range(5)))
        print("gather", values)
        try:
            await fail("on purpose")
        except ToolError as exc:
            print("caught", exc.type_name, exc.error_message)
        """,
    )
    done = toolhost("run", str(script), "--project", str(PROJECT))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "bare hello Ann!",
        "path hello Bob?",
        "gather [0, 1, 2, 3, 4]",
        "caught ValueError on purpose",
    ]


def test_run_a_script_that_fails_is_exit_1(tmp_path: Path) -> None:
    script = _script(tmp_path, "print('before')\nawait fail('uncaught')\nprint('after')\n")
    done = toolhost("run", str(script), "--project", str(PROJECT))
    assert done.returncode == 1
    assert done.stdout == "before\n"
    assert "ToolError" in done.stderr and "uncaught" in done.stderr
    script = _script(tmp_path, "x = 1 / 0\n")
    done = toolhost("run", str(script), "--project", str(PROJECT))
    assert done.returncode == 1
    assert "ZeroDivisionError" in done.stderr


def test_run_a_script_that_exits(tmp_path: Path) -> None:
    script = _script(tmp_path, "import sys\nawait echo(1)\nsys.exit(3)\n")
    assert toolhost("run", str(script), "--project", str(PROJECT)).returncode == 3


def test_run_a_missing_or_broken_script_is_exit_2(tmp_path: Path) -> None:
    done = toolhost("run", str(tmp_path / "missing.py"), "--project", str(PROJECT))
    assert done.returncode == 2 and "missing.py" in done.stderr
    script = _script(tmp_path, "print(\n")
    done = toolhost("run", str(script), "--project", str(PROJECT))
    assert done.returncode == 2 and "syntax error" in done.stderr
