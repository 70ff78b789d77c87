"""Agent code checked against the declarations before it runs (``[limits] code_check``).

A real pyright language server per host (started on the first check), a real Wasm
sandbox, and the check's three modes through the API, ``toolhost exec`` and MCP: each
diagnostic kind with its line and column; ``refuse`` runs nothing with errors and says
why; ``warn`` runs and carries the diagnostics; ``off`` does not check. A checker that is
too slow or has died never blocks a run under ``warn``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from host import CodeResult, Host
from host.serve import RUN_CODE, McpServer

from .mcp_helpers import connect
from .test_sandbox_cli import TOOLHOST
from .test_wasm import wasm_prepared

pytestmark = [pytest.mark.wasm]
__all__ = ["wasm_prepared"]

TOOLS = {
    "calc": """
        def add(a: int, b: int) -> int:
            return a + b
    """,
    "kanban": """
        def close(ticket: str, *, reason: str = "done") -> bool:
            return True
    """,
}


def policy(check: str = "warn", timeout: str = "60s", memory: str = "1GiB") -> str:
    return textwrap.dedent(
        f"""
        version = 1
        [defaults]
        agent = "allow"
        [limits]
        code_check = "{check}"
        code_check_timeout = "{timeout}"
        code_check_memory = "{memory}"
        """
    )


@pytest.fixture
def proj(make_project: Callable[..., Path], wasm_prepared: Any) -> Path:
    del wasm_prepared
    return make_project(tools=TOOLS, policy=policy())


def kinds(result: CodeResult) -> list[tuple[int, int, str]]:
    assert result.check is not None
    return [(d.line, d.column, d.kind) for d in result.check.diagnostics]


BAD = """\
x = await add(1, 2)
add(3, 4)
await nosuch(1)
await tools.kanban.nope("t")
await add(1, 2, 3)
await tools.kanban.close("t", why="x")
await add("a", 2)
x + "text"
"""
"""Each line but the first breaks one rule; the expected (line, column, kind) below."""
BAD_FOUND = [
    (2, 1, "not_awaited"),
    (3, 7, "unknown_name"),
    (4, 20, "unknown_attribute"),
    (5, 17, "call"),
    (6, 31, "call"),
    (7, 11, "type"),
    (8, 1, "type"),
]


@pytest.mark.anyio
async def test_each_diagnostic_kind_with_warn_refuse_and_off(proj: Path) -> None:
    async with Host.open(proj) as host:
        # refuse: nothing runs (x stays unbound), the error lists every line.
        refused = await host.run_code(BAD, check="refuse")
        assert not refused.ok and refused.calls == []
        assert refused.error is not None and refused.error.kind == "check_failed"
        assert refused.error.message.startswith(
            "the code did not run: checked against the tool declarations, it has 7 errors:"
        )
        assert "  line 2, column 1: Result of async function call is not used" in (
            refused.error.message
        )
        assert refused.error.message.endswith("fix these lines and run the code again")
        assert kinds(refused) == BAD_FOUND
        assert refused.check is not None and refused.check.mode == "refuse"
        assert refused.check.status == "errors"
        # warn (the policy's default): the code runs, the diagnostics ride along.
        warned = await host.run_code(BAD)
        assert kinds(warned) == BAD_FOUND
        assert warned.check is not None and warned.check.mode == "warn"
        assert [c.tool for c in warned.calls] == ["add"]  # it ran, up to line 3
        assert warned.error is not None and warned.error.type == "NameError"
        # off: not checked at all.
        off = await host.run_code("await add(1, 2)", check="off")
        assert off.ok and off.value == 3 and off.check is None
        # A syntax error: found before the guest says so.
        syntax = await host.run_code("def (:\n", check="refuse")
        assert syntax.check is not None and syntax.check.diagnostics
        assert {d.kind for d in syntax.check.diagnostics} == {"syntax"}
        assert syntax.check.diagnostics[0].line == 1
        # Clean code under refuse runs; what earlier runs bound is known, not unknown.
        clean = await host.run_code("y = await add(x, 1)\ny", check="refuse")
        assert clean.ok and clean.value == 4
        assert clean.check is not None and clean.check.status == "clean"
        # REPL forms are not errors: top-level await, async for, a bare last expression,
        # the run's own globals and modules.
        source = "import helpers\nasync def g():\n    yield 1\n[i async for i in g()] + [z]"
        fine = await host.run_code(
            source, check="refuse", globals={"z": 2}, modules={"helpers.py": "v = 1\n"}
        )
        assert fine.ok and fine.value == [1, 2], fine.error
        bad = await host.run_code("1", check="sometimes")  # type: ignore[arg-type]
        assert bad.error is not None and bad.error.kind == "invalid_arguments"
        assert "check must be 'warn', 'refuse' or 'off'" in bad.error.message


@pytest.mark.anyio
async def test_refuse_is_the_policys_and_a_run_overrides_it(
    make_project: Callable[..., Path], wasm_prepared: Any
) -> None:
    del wasm_prepared
    root = make_project(tools=TOOLS, policy=policy("refuse"))
    async with Host.open(root) as host:
        result = await host.run_code("add(1, 2)\n'ran'")
        assert result.error is not None and result.error.kind == "check_failed"
        assert (await host.run_code("add(1, 2)\n'ran'", check="warn")).value == "ran"
        assert (await host.run_code("add(1, 2)\n'ran'", check="off")).value == "ran"


@pytest.mark.anyio
async def test_a_slow_or_dead_checker_never_blocks_warn(
    make_project: Callable[..., Path], wasm_prepared: Any
) -> None:
    del wasm_prepared
    root = make_project(tools=TOOLS, policy=policy("warn", timeout="1ms"))
    async with Host.open(root) as host:
        # A run that fails pays for the full check (to explain it): here it times out,
        # and the run's own result comes back as it is.
        slow = await host.run_code("n = await add(1, 2)\n1 / 0")
        assert not slow.ok and slow.error is not None and "ZeroDivisionError" in slow.error.type
        assert [c.ok for c in slow.calls] == [True]
        assert slow.check is not None and slow.check.status == "unavailable"
        assert slow.check.note is not None and "code_check_timeout" in slow.check.note
        # Under refuse the same checker refuses: unchecked code does not run.
        refused = await host.run_code("await add(1, 2)", check="refuse")
        assert refused.error is not None and refused.error.kind == "check_failed"
        assert "could not be checked" in refused.error.message


@pytest.mark.anyio
async def test_the_checker_is_restarted_and_sees_no_secret(proj: Path) -> None:
    async with Host.open(proj) as host:
        first = await host.run_code("add(1, 2)", check="refuse")  # the full check
        assert kinds(first) == [(1, 1, "not_awaited")]
        server = host.checker._servers["shared"]  # pyright: ignore[reportPrivateUsage]
        assert server is not None
        pid = server.process.pid
        environ = (await anyio.Path(f"/proc/{pid}/environ").read_bytes()).split(b"\0")
        command = (await anyio.Path(f"/proc/{pid}/cmdline").read_bytes()).split(b"\0")
        assert b"--max-old-space-size=1024" in command  # code_check_memory, 1 GiB
        assert not any(b"CANARY_SECRET" in item for item in environ)
        assert sorted(item.split(b"=")[0] for item in environ if item) == [
            b"HOME",
            b"LANG",
            b"PATH",
            b"TMPDIR",
        ]
        if host.checker.isolated:  # its own network namespace: no network at all
            assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
        server.process.kill()
        await server.gone.wait()
        again = await host.run_code("add(1, 2)", check="refuse")
        assert kinds(again) == [(1, 1, "not_awaited")]
        assert host.checker.starts == 2
        # What pyright leaves in its temporary folder (a killed server never cleans up)
        # stays in the checker's folder, never in the system's /tmp.
        root = host.checker._root  # pyright: ignore[reportPrivateUsage]
        assert root is not None
        assert f"TMPDIR={root / '.tmp'}".encode() in environ
        left = sorted(p.name for p in (root / ".tmp").iterdir())
        assert len([n for n in left if n.startswith(f"pyright-{pid}-")]) == 1, left
    assert not root.exists()  # the checker's folder goes with the host


BOMB = "t0 = (1, 'a')\n" + "".join(f"t{i} = t{i - 1} + t{i - 1}\n" for i in range(1, 40))
"""Valid Python whose inferred types double in size at each line: pyright's memory
explodes (measured: 5.3 GB and 50 s before node gave up, with no heap bound)."""


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # it restarts pyright four times
async def test_a_check_that_breaks_the_checker_fails_alone(
    make_project: Callable[..., Path], wasm_prepared: Any
) -> None:
    """One session's pathological code ends the shared language server (its heap is
    bounded); another session's check in flight on it is tried again alone and passes, so
    its ``refuse`` run runs; the breaker's session checks alone from then on."""
    del wasm_prepared
    root = make_project(tools=TOOLS, policy=policy("refuse", memory="192MiB"))
    async with Host.open(root) as host, host.session() as a, host.session() as b:
        checker = host.checker
        assert (await b.run_code("await add(1, 2)")).value == 3  # the shared server is up
        shared = checker._servers["shared"]  # pyright: ignore[reportPrivateUsage]
        assert shared is not None and checker.starts == 1
        results: dict[str, CodeResult] = {}

        async def run(name: str, session: Any, code: str) -> None:
            results[name] = await session.run_code(code)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "bomb", a, BOMB)
            await anyio.sleep(0.3)  # the bomb is on the server: these queue behind it
            tg.start_soon(run, "good", b, "await add(2, 3)")
            tg.start_soon(run, "bad", b, "add(2, 3)\n'ran'")
        bomb = results["bomb"]
        assert bomb.error is not None and bomb.error.kind == "check_failed", bomb
        assert not shared.alive  # it took the shared server down...
        assert results["good"].ok and results["good"].value == 5  # ...and failed alone
        bad = results["bad"]  # checked for real, not waved through
        assert bad.error is not None and bad.error.kind == "check_failed"
        assert kinds(bad) == [(1, 1, "not_awaited")]
        assert checker.retried >= 2 and checker.suspect(a.id) and not checker.suspect(b.id)
        # The breaker's ordinary code is still checked (alone); the others' on a new server.
        assert (await a.run_code("await add(1, 1)")).value == 2
        assert (await b.run_code("await add(3, 3)")).value == 6
        assert checker._servers["shared"] is not None  # pyright: ignore[reportPrivateUsage]
        assert checker._servers["alone"] is None  # pyright: ignore[reportPrivateUsage]


def toolhost(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TOOLHOST, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_exec_shows_the_check_and_takes_every_option(proj: Path) -> None:
    warned = toolhost("exec", "-c", "add(1, 2)\n'ran'", cwd=proj)
    assert warned.returncode == 0, warned.stderr
    assert warned.stdout == "ran\n"
    assert 'toolhost: check: line 1, column 1: the call to "add" is never awaited' in warned.stderr
    refused = toolhost("exec", "--check", "refuse", "--json", "-c", "add(1, 2)\n'ran'", cwd=proj)
    assert refused.returncode == 1
    data = json.loads(refused.stdout)
    assert data["error"]["kind"] == "check_failed"
    assert data["check"]["diagnostics"][0]["kind"] == "not_awaited"
    (proj / "helpers.py").write_text("def twice(v):\n    return v * 2\n")
    done = toolhost(
        "exec",
        "--json",
        "--check",
        "refuse",
        "--module",
        str(proj / "helpers.py"),
        "--globals",
        '{"bump": 100}',
        "--execute",
        "main",
        "--args",
        "[2]",
        "--kwargs",
        '{"k": 5}',
        "--memory-limit",
        "128MiB",
        "--filename",
        "agent.py",
        "-c",
        "import helpers\nasync def main(n, k=1):\n    return helpers.twice(await add(n, k)) + bump",
        cwd=proj,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["value"] == 114 and data["check"]["status"] == "clean"
    trace = toolhost("exec", "--check", "off", "--filename", "agent.py", "-c", "1 // 0", cwd=proj)
    assert 'File "agent.py", line 1' in trace.stderr
    bad = toolhost("exec", "--globals", "[1]", "-c", "1", cwd=proj)
    assert bad.returncode == 2 and "--globals takes a JSON object" in bad.stderr
    bad = toolhost("exec", "--args", "[1]", "-c", "1", cwd=proj)
    assert bad.returncode == 2 and "--args and --kwargs go with --execute" in bad.stderr
    bad = toolhost("exec", "--memory-limit", "1KiB", "-c", "1", cwd=proj)
    assert bad.returncode == 1 and "memory_limit" in bad.stderr


@pytest.mark.anyio
async def test_mcp_run_code_takes_the_options_and_shows_the_check(proj: Path) -> None:
    async with (
        Host.open(proj) as host,
        McpServer(host).running() as server,
        connect(server) as client,
    ):
        listed = await client.list_tools()
        run_code = next(t for t in listed.tools if t.name == RUN_CODE)
        assert set(run_code.input_schema["properties"]) == {
            "code",
            "modules",
            "globals",
            "execute",
            "memory_limit",
            "filename",
            "check",
        }
        refused = await client.call_tool(RUN_CODE, {"code": "add(1, 2)", "check": "refuse"})
        assert refused.is_error
        data = refused.structured_content
        assert data is not None and data["error"]["kind"] == "check_failed"
        assert data["check"]["diagnostics"][0]["line"] == 1
        text = refused.content[0].text  # type: ignore[union-attr]
        assert "the code did not run" in text and "line 1, column 1" in text
        warned = await client.call_tool(RUN_CODE, {"code": "add(1, 2)\n'ran'"})
        assert not warned.is_error
        assert warned.structured_content is not None
        assert warned.structured_content["value"] == "ran"
        text = warned.content[0].text  # type: ignore[union-attr]
        assert 'check: line 1, column 1: the call to "add" is never awaited' in text
        options = {
            "code": "def main(a):\n    return a + bump",
            "globals": {"bump": 1},
            "execute": {"fn": "main", "args": [41]},
            "filename": "agent.py",
            "memory_limit": "128MiB",
            "modules": {"helpers.py": "v = 1\n"},
            "check": "off",
        }
        done = await client.call_tool(RUN_CODE, options)
        assert done.structured_content is not None
        assert done.structured_content["value"] == 42, done.structured_content
        bad = await client.call_tool(RUN_CODE, {"code": "1", "globals": {"add": 1}})
        # a refused option is a run's result: run_code's output schema describes it
        assert bad.is_error and bad.structured_content is not None
        assert bad.structured_content["error"]["kind"] == "invalid_arguments"
        unknown = await client.call_tool(RUN_CODE, {"code": "1", "nope": 1})
        assert unknown.is_error


@pytest.mark.anyio
async def test_a_secret_quoted_by_a_diagnostic_is_replaced(
    make_project: Callable[..., Path], wasm_prepared: Any
) -> None:
    del wasm_prepared
    secret = os.environ["CANARY_SECRET"]
    root = make_project(tools=TOOLS, policy=policy() + '[env]\nsecret = ["CANARY_SECRET"]\n')
    async with Host.open(root) as host:
        result = await host.run_code(f"n: int = {secret!r}", check="refuse")
        assert result.check is not None and result.check.diagnostics
        assert result.error is not None
        assert secret not in result.check.diagnostics[0].message
        assert secret not in result.error.message
        assert "is not assignable to declared type" in result.check.diagnostics[0].message


@pytest.mark.anyio
async def test_the_checker_reads_no_file_outside_its_folder(
    proj: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agent code cannot have pyright read a file the host's user can read and quote its
    constants in a diagnostic: not by a relative import climbing out of the checker's
    folder (refused before pyright sees the code), nor by an absolute import of a module
    beside the host's packages (the folder above ``host``: a checkout or site-packages)."""
    from host.check import _checker

    secret = "whsec-" + os.urandom(8).hex()
    # Beside the checker's own folder (both in the temporary folder), with a name that
    # imports: a relative import of two dots reaches it from the checked document.
    beside = Path(tempfile.mkdtemp(prefix="checkerleak", dir=tempfile.gettempdir()))
    try:
        (beside / "webhooks.py").write_text(f"SIGNING = {secret!r}\n")
        real_parent = Path(_checker._HOST_PARENT)  # pyright: ignore[reportPrivateUsage]
        (beside / "host").symlink_to(real_parent / "host")  # it stands for the folder
        (beside / "capsule").symlink_to(real_parent / "capsule")  # that holds host/
        monkeypatch.setattr(_checker, "_HOST_PARENT", str(beside))
        async with Host.open(proj) as host:
            relative = await host.run_code(
                f"from ..{beside.name}.webhooks import SIGNING\nx: int = SIGNING", check="refuse"
            )
            absolute = await host.run_code(
                "from webhooks import SIGNING\nx: int = SIGNING", check="refuse"
            )
            stdlib = await host.run_code("import json\nx: int = json.dumps(1)", check="refuse")
    finally:
        shutil.rmtree(beside, ignore_errors=True)
    for result in (relative, absolute):
        assert result.check is not None
        shown = json.dumps(result.check.model_dump())
        assert secret not in shown and "whsec-" not in shown, shown
    assert relative.check is not None and relative.check.status == "errors"
    assert "relative imports are not available" in relative.check.diagnostics[0].message
    assert stdlib.check is not None and stdlib.check.status == "errors"  # still checked
    assert '"str"' in stdlib.check.diagnostics[0].message
