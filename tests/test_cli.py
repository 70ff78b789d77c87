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


_NOTES = """
def add_note(text: str) -> int:
    return 1


def wipe_notes() -> str:
    return "wiped"
"""
_DENY_WIPE = """
version = 1

[[rules]]
id = "no-wipe"
tools = ["wipe_notes"]
decision = "deny"
"""


def _src_layout(root: Path) -> Path:
    """A project as a new user writes it: ``src/tools/`` and ``policy.toml`` beside ``src``."""
    (root / "src" / "tools").mkdir(parents=True)
    (root / "src" / "tools" / "notes.py").write_text(_NOTES, encoding="utf-8")
    (root / "policy.toml").write_text(_DENY_WIPE, encoding="utf-8")
    return root


@pytest.mark.parametrize("project", [None, ".", "src"])
def test_a_src_tools_layout_is_one_project_with_the_policy_beside_src(
    tmp_path: Path, project: str | None
) -> None:
    root = _src_layout(tmp_path)
    where = [] if project is None else ["--project", project]
    done = toolhost("call", "wipe_notes", "--json", *where, cwd=root)
    assert done.returncode == 1, done.stderr
    error = json.loads(done.stdout)["error"]
    assert (error["kind"], error["rule"]) == ("policy_denied", "no-wipe")
    assert (root / ".agent" / "state.db").exists()
    assert not (root / "src" / ".agent").exists(), "a second state folder under src/"
    assert "bundled" not in done.stderr


def test_a_policy_inside_src_is_refused_naming_the_project_folder(tmp_path: Path) -> None:
    root = _src_layout(tmp_path)
    (root / "policy.toml").rename(root / "src" / "policy.toml")
    done = toolhost("call", "wipe_notes", "--json", "--project", "src", cwd=root)
    assert done.returncode == 1
    error = json.loads(done.stdout)["error"]
    assert error["kind"] == "declaration_error"
    assert f"move it to {root}" in error["message"] and "policy.toml" in error["message"]


def test_both_tools_folders_are_refused(tmp_path: Path) -> None:
    _tools(tmp_path / "src" / "tools", "src/tools")
    _tools(tmp_path / "tools", "tools")
    done = toolhost("call", "where", "--json", cwd=tmp_path)
    assert done.returncode == 1
    message = json.loads(done.stdout)["error"]["message"]
    assert "both tools/ and src/tools/" in message


def test_a_project_without_a_policy_file_says_what_is_in_force(tmp_path: Path) -> None:
    _tools(tmp_path / "tools", "tools")
    done = toolhost("call", "where", "--json", cwd=tmp_path)
    assert json.loads(done.stdout) == {"ok": True, "value": "tools"}
    assert done.stderr.count("no policy.toml") == 1, done.stderr
    assert "agent deny, tool deny, script allow, app allow" in done.stderr
    done = toolhost("policy", "check", "where", cwd=tmp_path)
    assert done.returncode == 0 and "allow (rule defaults.app)" in done.stdout
    assert "no policy.toml" in done.stderr


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
    # the tool that uses its context: a nested call, the key-value store, a file
    assert "chart: 1 open, 1 closed (chart 1)" in lines
    picture = next(line for line in lines if line.startswith("  board.png: image/png, 48x48"))
    path = Path(picture.rpartition(" kept at ")[2])
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert path.is_relative_to(ROOT / "agent_src" / ".agent" / "files")
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


def test_asyncio_is_a_global_of_a_script(tmp_path: Path) -> None:
    script = _script(tmp_path, "print(await asyncio.gather(echo(1), echo(2)))\n")
    done = toolhost("run", str(script), "--project", str(PROJECT))
    assert (done.returncode, done.stdout) == (0, "[1, 2]\n"), done.stderr


def test_an_uncaught_tool_error_shows_the_tools_lines_not_the_hosts(tmp_path: Path) -> None:
    script = _script(tmp_path, "print('before')\nawait fail('uncaught')\n")
    done = toolhost("run", str(script), "--project", str(PROJECT))
    assert done.returncode == 1 and done.stdout == "before\n"
    things = PROJECT / "tools" / "things.py"
    assert done.stderr.endswith(
        "Traceback (most recent call last):\n"
        f'  File "{things}", line 23, in fail\n'
        "    raise ValueError(message)\n"
        "ValueError: uncaught\n"
        "\n"
        "The above exception was raised by the tool fail in its capsule, and reached the "
        "script as:\n"
        "\n"
        "Traceback (most recent call last):\n"
        f'  File "{script}", line 2, in <module>\n'
        "    await fail('uncaught')\n"
        "ToolError: fail raised ValueError: uncaught\n"
    ), done.stderr
    assert "host/" not in done.stderr and "anyio" not in done.stderr


def test_a_script_error_shows_only_the_scripts_frames(tmp_path: Path) -> None:
    script = _script(tmp_path, "def f():\n    return 1 / 0\n\nf()\n")
    done = toolhost("run", str(script), "--project", str(PROJECT))
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    start = lines.index("Traceback (most recent call last):")
    assert [line for line in lines[start:] if line.startswith("  File")] == [
        f'  File "{script}", line 4, in <module>',
        f'  File "{script}", line 2, in f',
    ]
    assert lines[-1] == "ZeroDivisionError: division by zero"


def test_run_json_is_one_object_shaped_like_exec(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        print("hello")
        await echo(1)
        try:
            await no_such_tool()
        except NameError:
            pass
        await greet("Ann")
        {"sum": await echo(2) + 1}
        """,
    )
    done = toolhost("run", str(script), "--json", "--project", str(PROJECT))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "ok": True,
        "value": {"sum": 3},
        "stdout": "hello\n",
        "calls": [
            {"tool": "echo", "decision": "allow", "ok": True},
            {"tool": "greet", "decision": "allow", "ok": True},
            {"tool": "echo", "decision": "allow", "ok": True},
        ],
        "error": None,
        "warnings": [],
    }


def test_run_json_of_a_failing_script(tmp_path: Path) -> None:
    script = _script(tmp_path, "print('before')\nawait fail('uncaught')\n")
    done = toolhost("run", str(script), "--json", "--project", str(PROJECT))
    assert done.returncode == 1
    data = json.loads(done.stdout)
    assert (data["ok"], data["value"], data["stdout"]) == (False, None, "before\n")
    assert data["calls"] == [
        {"tool": "fail", "decision": "allow", "ok": False, "error": "tool_error"}
    ]
    error = data["error"]
    assert (error["kind"], error["type"]) == ("tool_error", "ToolError")
    assert error["message"] == "fail raised ValueError: uncaught"
    assert "raise ValueError(message)" in error["traceback"]
    script = _script(tmp_path, "import sys\nsys.exit(3)\n")
    done = toolhost("run", str(script), "--json", "--project", str(PROJECT))
    assert done.returncode == 3
    assert json.loads(done.stdout)["error"]["kind"] == "exit"


# -- --version and --args-file -------------------------------------------------------------


def test_version() -> None:
    done = toolhost("--version")
    assert done.returncode == 0
    assert done.stdout.startswith("toolhost 0.1.0 (Python 3.")


@pytest.mark.parametrize(
    ("content", "value"),
    [('["Ann"]', "hello Ann!"), ('{"name": "Bo", "punct": "?"}', "hello Bo?")],
)
def test_call_arguments_from_a_file(tmp_path: Path, content: str, value: str) -> None:
    path = tmp_path / "args.json"
    path.write_text(content, encoding="utf-8")
    assert call_json("greet", "--args-file", str(path)) == (0, {"ok": True, "value": value})


def test_call_arguments_from_stdin_too_large_for_a_command_line() -> None:
    big = "x" * 3_000_000  # over the kernel's limit for one argument (128 KiB)
    done = subprocess.run(
        [*TOOLHOST, "call", "echo", "--args-file", "-", "--json", "--project", str(PROJECT)],
        input=json.dumps([big]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ok": True, "value": big}


@pytest.mark.parametrize(
    ("content", "extra", "says"),
    [
        ("3", [], "give a JSON list (positional arguments) or an object"),
        ("[1,", [], "not JSON"),
        ("[1]", ["2"], "leave out ARG and --kw"),
    ],
)
def test_a_bad_args_file_is_exit_2(
    tmp_path: Path, content: str, extra: list[str], says: str
) -> None:
    path = tmp_path / "args.json"
    path.write_text(content, encoding="utf-8")
    done = toolhost("call", "echo", *extra, "--args-file", str(path), "--project", str(PROJECT))
    assert done.returncode == 2 and says in done.stderr, done.stderr


# -- tool output on the command line -------------------------------------------------------


def test_a_flood_prints_whole_lines_and_a_note_for_what_was_dropped() -> None:
    lab = HERE / "lab"
    done = toolhost("call", "flood_lines", "40000", "--project", str(lab))
    assert (done.returncode, done.stdout) == (0, "40000\n"), done.stderr[-2000:]
    lines = done.stderr.splitlines()
    notes = [line for line in lines if line.startswith("toolhost: ")]
    odd = [
        line
        for line in lines
        if not line.startswith("toolhost: ")
        and not (len(line) == 80 and line[:4] in ("out ", "err ") and line[4:13].isdigit())
    ]
    assert odd == [], odd[:3]
    dropped = [n for n in notes if "of tool output dropped here" in n]
    assert dropped and all("over the capsule's console budget of 1 MiB" in n for n in dropped)


def test_output_without_a_newline_is_shown_and_ended() -> None:
    lab = HERE / "lab"
    done = toolhost("call", "partial", "--project", str(lab))
    assert (done.returncode, done.stdout) == (0, "partial\n")
    lines = done.stderr.splitlines()
    assert "no newline on stdout" in lines and "no newline on stderr" in lines
