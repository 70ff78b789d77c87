"""F. Odd text crossing into and out of the code sandbox (issue 12, finding 9; F06).

Text that UTF-8 cannot carry (lone surrogates, from a value, a print, an exception, a
warning, or the source itself), a source larger than a frame, and odd input on the
command line: each is a clear, typed outcome, and the sandbox keeps the session's
variables wherever it survives. On the real Wasm guest and the labelled subprocess
fallback; the command line as a real process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from host import Host
from tests.test_wasm import wasm_data_prepared, wasm_prepared

from ._code import KINDS, guest_pid, ok, project

pytestmark = pytest.mark.anyio
__all__ = ["wasm_data_prepared", "wasm_prepared"]

MakeProject = Callable[..., Path]

ODD = {
    # code: (ok, what the value or error shows)
    "'a\\ud800b'": (True, "'a\\ud800b'"),
    "[1, {'k': '\\udcff'}]": (True, "[1, {'k': '\\udcff'}]"),
    "{'\\ud800': 1}": (True, "{'\\ud800': 1}"),
    "print('out \\ud800')\n'printed'": (True, "printed"),
    "raise ValueError('bad \\udfff text')": (False, "bad \\udfff text"),
    "p = add\np._tool = 'add\\ud800'\np(1, 2)\n'left'": (True, "left"),
}


@pytest.mark.parametrize("kind", KINDS)
async def test_text_utf8_cannot_carry_is_escaped_and_the_sandbox_survives(
    make_project: MakeProject, request: pytest.FixtureRequest, kind: str
) -> None:
    proj = project(make_project, kind, request)
    async with Host.open(proj) as host:
        assert ok(await host.run_code("kept = 41")) is None
        pid = guest_pid(host)
        for code, (good, shown) in ODD.items():
            result = await host.run_code(code)
            assert result.ok is good, (code, result)
            if good:
                assert result.value == shown, code
            else:
                assert result.error is not None and result.error.type == "ValueError"
                assert result.error.message == shown
                assert shown in result.error.traceback
            if "print" in code:
                assert result.stdout == "out \\ud800\n"
            if "_tool" in code:  # a call never awaited: its (tampered) name in a warning
                assert any("add\\ud800" in w for w in result.warnings), result.warnings
            # The same sandbox, with the session's variables.
            assert ok(await host.run_code("kept + 1")) == 42, code
            assert guest_pid(host) == pid, code


@pytest.mark.parametrize("kind", KINDS)
async def test_a_source_that_cannot_be_sent_is_refused_and_the_sandbox_kept(
    make_project: MakeProject, request: pytest.FixtureRequest, kind: str
) -> None:
    proj = project(make_project, kind, request)
    async with Host.open(proj) as host:
        assert ok(await host.run_code("kept = 41")) is None
        pid = guest_pid(host)
        surrogate = await host.run_code("x = '\ud800'")
        assert surrogate.error is not None
        assert (surrogate.error.kind, surrogate.error.type) == (
            "invalid_arguments",
            "InvalidArguments",
        )
        assert "not valid Unicode" in surrogate.error.message
        huge = await host.run_code("x = 1\n" + "#" * (18 << 20))  # over a frame: 16 MiB
        assert huge.error is not None
        assert (huge.error.kind, huge.error.limit) == ("limit_exceeded", "max_argument_size")
        assert "18874374 bytes" in huge.error.message
        assert ok(await host.run_code("[kept + 1, 'x' in globals()]")) == [42, False]
        assert guest_pid(host) == pid


# -- the command line ----------------------------------------------------------------------

_SCRIPT = Path(sys.executable).with_name("toolhost")
TOOLHOST: list[str | bytes] = (
    [str(_SCRIPT)]
    if _SCRIPT.exists()
    else [sys.executable, "-c", "from host.cli import main; main()"]
)


def toolhost(*args: str | bytes, cwd: Path, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*TOOLHOST, *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        timeout=120,
        env=os.environ.copy(),
        check=False,
    )
    return subprocess.CompletedProcess(
        done.args,
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


@pytest.mark.subprocess
def test_odd_command_lines_are_usage_errors(make_project: MakeProject) -> None:
    proj = make_project(tools={"lab": "def echo(x: list) -> list:\n    return x\n"})
    deep = "[" * 5000 + "]" * 5000
    cases: dict[str, tuple[list[str | bytes], bytes, str]] = {
        "deep JSON": (["call", "echo", deep], b"", "nested too deeply"),
        "deep JSON keyword": (["call", "echo", "--kw", f"x={deep}"], b"", "nested too deeply"),
        "bad UTF-8 argument": (["call", "echo", b"[\xff]"], b"", "argument 1 is not valid UTF-8"),
        "bad UTF-8 keyword": (["call", "echo", "--kw", b"x=\xfe"], b"", "--kw x is not valid"),
        "bad UTF-8 code": (["exec", "-c", b"x = '\xff'"], b"", "the code (-c) is not valid"),
        "bad UTF-8 stdin": (["exec", "-"], b"x = '\xff'", "stdin is not valid UTF-8"),
        "deep JSON args file": (
            ["call", "echo", "--args-file", "-"],
            f"[{deep}]".encode(),
            "nested too deeply",
        ),
        "bad UTF-8 args file": (["call", "echo", "--args-file", "-"], b'["\xff"]', "cannot read"),
    }
    for name, (args, stdin, said) in cases.items():
        for json_flag in ([], ["--json"]):
            done = toolhost(*args, *json_flag, cwd=proj, stdin=stdin)
            assert done.returncode == 2, (name, done.stderr)
            assert "Traceback" not in done.stderr, (name, done.stderr)
            assert said in done.stderr, (name, done.stderr)


@pytest.mark.wasm
def test_exec_json_of_a_huge_file_is_json(
    make_project: MakeProject, wasm_prepared: object, tmp_path: Path
) -> None:
    del wasm_prepared
    proj = make_project(
        tools={"lab": "def add(a: int, b: int) -> int:\n    return a + b\n"},
        policy='version = 1\n[defaults]\nagent = "allow"\n',
    )
    source = tmp_path / "big.py"
    source.write_text("x = 1\n" + "#" * (18 << 20), encoding="utf-8")
    done = toolhost("exec", "--json", str(source), cwd=proj)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    out = json.loads(done.stdout)
    assert out["ok"] is False
    assert (out["error"]["kind"], out["error"]["limit"]) == ("limit_exceeded", "max_argument_size")
