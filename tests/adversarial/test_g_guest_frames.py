"""G. Frames forged by agent code that reaches the guest's own driver (issue 12, finding 7).

Agent code can do anything the guest process can, including write frames to the host on
the protocol pipe. The host checks every frame itself; one that breaks the rules ends the
run with a ``protocol_error`` (and that sandbox with it), one that claims more than the
limits allow is cut to them, and the next run gets a working sandbox. On the real Wasm
guest and on the labelled subprocess fallback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import host.capsules._sandbox as sandbox_module
from host import CodeResult, Host
from tests.fixtures.e2e.helpers import wait_gone, wait_until
from tests.test_wasm import wasm_data_prepared, wasm_prepared

from ._code import KINDS, guest_pid, ok, project

pytestmark = pytest.mark.anyio
__all__ = ["wasm_data_prepared", "wasm_prepared"]

MakeProject = Callable[..., Path]

DRIVER = "import sys\nsb = sys.modules['capsule._guest']._SANDBOX\n"
"""Agent code's way to the guest's driver: ``sb.send`` writes a frame to the host."""


def done(**fields: str) -> str:
    """Agent code sending a ``done`` frame for the run in progress, with ``fields``
    (Python expressions) over sane defaults."""
    frame = {
        "'k'": "'done'",
        "'id'": "sb._run",
        "'ok'": "True",
        "'value'": "None",
        "'stdout'": "''",
        "'error'": "None",
        "'warnings'": "[]",
    }
    frame.update({repr(k): v for k, v in fields.items()})
    return DRIVER + "sb.send({" + ", ".join(f"{k}: {v}" for k, v in frame.items()) + "})\n"


BROKEN = {
    "stdout not text": done(stdout="5"),
    "error not a map": done(error="'bad'"),
    "error kind a list": done(error="{'kind': ['x'], 'message': 'm'}"),
    "error limit a list": done(error="{'kind': 'limit_exceeded', 'limit': [1]}"),
    "warnings not a list": done(warnings="5"),
    "a warning not text": done(warnings="[1, 2]"),
    "ok not a bool": done(ok="'yes'"),
    "another run's id": done(id="sb._run + 7"),
    "a drop with a list for its id": DRIVER + "sb.send({'k': 'drop', 'id': [1]})\n",
    "a use for another run": (
        DRIVER + "sb.send({'k': 'use', 'id': 5, 'run': sb._run + 1, 'tool': 'count', "
        "'args': [], 'kwargs': {}})\n"
    ),
    "a use reusing an id in flight": (
        DRIVER + "for _ in range(2):\n"
        "    sb.send({'k': 'use', 'id': 5, 'run': sb._run, 'tool': 'slow', "
        "'args': [30], 'kwargs': {}})\n"
    ),
    "an unknown kind": DRIVER + "sb.send({'k': 'ready', 'pid': 1})\n",
}


async def spoke_between_runs(host: Host) -> None:
    """Wait until the sandbox has sent something since its run ended (the guest's own
    done frame, after a forged one), so that the next run sees it before it begins."""
    code: Any = host.default_session.code
    await wait_until(lambda: code._guest.has_output(), what="a frame between runs")


async def fresh_after(host: Host, result: CodeResult, pid: int) -> None:
    """The broken sandbox is gone, and the next run gets a fresh one that works."""
    assert result.error is not None, result
    assert result.error.kind == "protocol_error", result.error
    assert "were lost" in result.error.message
    assert result.value is None
    await wait_gone([pid], timeout=10)
    assert ok(await host.run_code("'kept' in globals()")) is False
    assert ok(await host.run_code("await add(20, 22)")) == 42


@pytest.mark.parametrize("kind", KINDS)
async def test_a_broken_frame_ends_that_sandbox_and_the_next_run_works(
    make_project: MakeProject, request: pytest.FixtureRequest, kind: str
) -> None:
    proj = project(make_project, kind, request)
    async with Host.open(proj) as host:
        for name, code in BROKEN.items():
            assert ok(await host.run_code("kept = 1")) is None, name
            pid = guest_pid(host)
            result = await host.run_code(code + "import time\ntime.sleep(30)")
            if name == "a use reusing an id in flight":  # the first one: listed, cut short
                assert [(c.tool, c.decision, c.error) for c in result.calls] == [
                    ("slow", "allow", "cancelled")
                ]
            await fresh_after(host, result, pid)
        # Nothing the forged use frames asked for ran.
        assert await host.call("count") == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_the_host_enforces_the_output_limits_itself(
    make_project: MakeProject, request: pytest.FixtureRequest, kind: str
) -> None:
    """Forged ``done`` frames claim a 15 MiB value, 15 MiB of output, 2,000 warnings of
    5,000 characters: none of it passes the host's limits (before, the value came back
    whole)."""
    proj = project(make_project, kind, request)
    big = "'v' * (15 << 20)"
    async with Host.open(proj, limits={"code_max_output": "1MiB"}) as host:
        assert ok(await host.run_code("kept = 1")) is None
        value = await host.run_code(done(value=big))
        assert value.ok and value.value is None
        assert any("larger than 1048576 bytes" in w for w in value.warnings)
        # The guest's own done frame follows the forged one: the next run sees that the
        # sandbox spoke between runs, and gets a fresh one (and is told so).
        await spoke_between_runs(host)
        after = await host.run_code("'kept' in globals()")
        assert ok(after) is False
        assert any("were lost" in w for w in after.warnings)
        nested = await host.run_code(done(value=f"[{{'k': {big}}}]"))
        assert nested.ok and nested.value is None
        await spoke_between_runs(host)
        warned = await host.run_code(done(warnings="['w' * 5000] * 2000"))
        assert sum(w.startswith("www") for w in warned.warnings) == 60
        assert "1940 more warnings were left out" in warned.warnings
        assert all(len(w) <= 1000 for w in warned.warnings)
        await spoke_between_runs(host)
        printed = await host.run_code(done(stdout=big))
        assert printed.error is not None and printed.error.limit == "code_max_output"
        assert len(printed.stdout) == 1 << 20
        assert ok(await host.run_code("await add(1, 1)")) == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_a_forged_done_then_frames_between_runs(
    make_project: MakeProject, request: pytest.FixtureRequest, kind: str
) -> None:
    """A valid forged ``done`` ends the run early; what the code sends after it arrives
    between runs, where a sandbox has nothing to say. If it came before the next run,
    that run gets a fresh sandbox (and is told so); if it comes during the next run, that
    run ends with a ``protocol_error``, having run nothing, and the one after is fresh."""
    proj = project(make_project, kind, request)
    async with Host.open(proj) as host:
        # Before the next run: the stale frame is waiting when it starts.
        assert ok(await host.run_code("kept = 1")) is None
        pid = guest_pid(host)
        assert ok(await host.run_code(done(value="'forged'") + "await count()\n'real'")) == (
            "forged"
        )
        await spoke_between_runs(host)
        after = await host.run_code("await add(2, 2)")
        assert ok(after) == 4
        assert any("were lost" in w for w in after.warnings)
        assert any("after its run had ended" in w for w in after.warnings)
        await wait_gone([pid], timeout=10)
        assert ok(await host.run_code("'kept' in globals()")) is False
        # During the next run: the code sleeps first, so the next run has begun.
        assert ok(await host.run_code("kept = 1")) is None
        late = done(value="'forged'") + "import time\ntime.sleep(3)\nawait count()\n'real'"
        assert ok(await host.run_code(late)) == "forged"
        broken = await host.run_code("await add(3, 3)")
        assert broken.error is not None and broken.error.kind == "protocol_error"
        assert broken.calls == []
        assert ok(await host.run_code("[await add(4, 4), 'kept' in globals()]")) == [8, False]
        assert await host.call("count") == 1  # neither stale call ran


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
async def test_code_still_computing_after_a_forged_done_is_stopped(
    make_project: MakeProject,
    request: pytest.FixtureRequest,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a forged ``done`` the code computes on, outside any run: the host kills the
    guest once it has used ``code_timeout`` plus the idle allowance (5 s; 1 s here, so
    the spinning guest does not take a core for ten seconds) of CPU between runs."""
    monkeypatch.setattr(sandbox_module, "_WARM_UP", 1.0)
    proj = project(make_project, kind, request)
    code = done(value="'forged'") + "while True:\n    pass"
    async with Host.open(proj, limits={"code_timeout": "1s"}) as host:
        assert ok(await host.run_code("kept = 1")) is None
        pid = guest_pid(host)
        assert ok(await host.run_code(code)) == "forged"
        await wait_gone([pid], timeout=90)
        after = await host.run_code("await add(2, 2)")
        assert ok(after) == 4
        assert any("kept computing" in w for w in after.warnings), after.warnings


@pytest.mark.parametrize("kind", KINDS)
def test_exec_json_prints_json_for_a_forged_frame(
    make_project: MakeProject, request: pytest.FixtureRequest, kind: str
) -> None:
    proj = project(make_project, kind, request)
    script = Path(sys.executable).with_name("toolhost")
    command = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "from host.cli import main; main()"]
    )
    done_ = subprocess.run(
        [*command, "exec", "--json", "-c", done(stdout="5")],
        cwd=proj,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
        check=False,
    )
    assert done_.returncode == 1, done_.stderr
    assert "Traceback" not in done_.stderr
    out = json.loads(done_.stdout)
    assert out["ok"] is False and out["error"]["kind"] == "protocol_error"
