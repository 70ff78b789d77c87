"""The official MCP conformance suite against ``toolhost serve --transport http``.

``@modelcontextprotocol/conformance`` (pinned in ``tests/conformance/package-lock.json``,
with the Node 22 it needs; ``.ci/run`` installs both with ``npm ci``) runs every server
scenario against a project whose tool files are the suite's fixture tools
(``tests/conformance/project``). Only the scenarios ``expected-failures.yml`` lists, each
with its reason, may fail, and one listed that passes fails the run too. Then, once the
idle timeout has passed, the sessions the suite left open (it never sends DELETE) are
closed and no capsule of theirs is left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import psutil
import pytest

from .inbox_helpers import wait_until

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

HERE = Path(__file__).resolve().parent / "conformance"
BIN = HERE / "node_modules" / ".bin"
IDLE = 5.0


def _suite() -> Path:
    runner = BIN / "conformance"
    if not runner.exists() or not (BIN / "node").exists():
        pytest.fail(
            "the conformance suite is not installed: npm ci --prefix tests/conformance "
            "(.ci/run does it)"
        )
    return runner


def _descendants(server: psutil.Process) -> int:
    """How many processes the server has under it now (its capsules among them)."""
    return len(server.children(recursive=True))


def _capsules(stats: dict[str, Any]) -> int:
    """The capsules the host counts (tool capsules and code sandboxes)."""
    counts: dict[str, int] = stats["capsules"]
    return sum(counts.values())


@pytest.mark.timeout(600)
def test_the_conformance_suite_passes_but_for_what_a_tool_host_does_not_serve(
    tmp_path: Path,
) -> None:
    runner = _suite()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    server = subprocess.Popen(
        [
            *(sys.executable, "-c", "from host.cli import main; main()", "serve"),
            *("--transport", "http", "--port", "0", "--project", str(HERE / "project")),
            *("--idle-timeout", str(IDLE)),
            # The suite's scenarios speak to an open server (its auth scenarios are not
            # in the baseline check): loopback without authentication.
            *("--auth", "none"),
            # The suite opens a session per scenario (31) within seconds and ends none:
            # more than one client may hold (16, tested in test_serve_sessions.py).
            *("--max-sessions-per-client", "64"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        base = inbox = ""
        while not (base and inbox):
            line = server.stderr.readline()
            assert line, "toolhost serve ended before it listened"
            if m := re.search(r"MCP at (http://\S+)/mcp", line):
                base = m.group(1)
            if m := re.search(r"approval inbox at (\S+)", line):
                inbox = m.group(1)
        token = inbox.split("token=", 1)[1]
        process = psutil.Process(server.pid)

        def stats() -> dict[str, Any]:
            response = httpx2.get(
                f"{base}/stats", headers={"authorization": f"Bearer {token}"}, timeout=30
            )
            return json.loads(response.text)

        before = stats()
        processes = _descendants(process)

        done = subprocess.run(
            [
                str(runner),
                *("server", "--url", f"{base}/mcp"),
                *("--expected-failures", str(HERE / "expected-failures.yml")),
                *("--output-dir", str(tmp_path / "results")),
            ],
            cwd=HERE,
            env=env,
            capture_output=True,
            text=True,
            timeout=480,
        )
        report = done.stdout[-8000:] + done.stderr[-4000:]
        assert done.returncode == 0, report
        assert "Baseline check passed" in done.stdout, report
        for scenario in ("tools-call-audio", "logging-set-level", "tools-call-with-logging"):
            assert re.search(rf"✓ {re.escape(scenario)}: \d+ passed, 0 failed", done.stdout), (
                scenario,
                report,
            )

        # The suite ends no session: they hold capsules until the idle time has passed,
        # and then nothing it opened is left.
        left = stats()
        assert left["sessions"] > before["sessions"], (before, left)
        assert _capsules(left) > _capsules(before), (before, left)
        assert _descendants(process) > processes

        def released() -> bool:
            now = stats()
            return (
                now["sessions"] <= before["sessions"]
                and _capsules(now) <= _capsules(before)
                and _descendants(process) <= processes
            )

        start = time.monotonic()
        wait_until(released, 60)
        assert time.monotonic() - start < IDLE + 30
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if server.stderr is not None:
            server.stderr.close()
