"""``python -m benchmarks.peers --quick`` runs end to end, so the peers' benchmark cannot rot.

Only with the ``bench`` extra installed (fastmcp, pydantic-monty, smolagents); it measures
nothing: it checks that every peer started, made its calls and opened a new session.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ("fastmcp", "pydantic_monty", "smolagents")
MISSING = [name for name in BENCH if importlib.util.find_spec(name) is None]


# Six peers each start real processes (two MCP servers, a host with a Wasm guest, a monty
# worker); on a loaded 2-core machine that takes more than the default 120 s.
@pytest.mark.subprocess
@pytest.mark.wasm
@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.skipif(
    bool(MISSING),
    reason=f"the bench extra is not installed ({', '.join(MISSING)} missing): "
    "pip install -e '.[bench]'",
)
def test_quick_run_measures_every_peer() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.peers", "--quick", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=380,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert result["skipped"] == {}
    measured = {(row["peer"], row["op"]) for row in result["calls"]}
    assert measured == {
        ("host", "add"),
        ("host", "customer"),
        ("serve", "add"),
        ("serve", "customer"),
        ("fastmcp", "add"),
        ("fastmcp", "customer"),
        ("run_code", "code-1"),
        ("run_code", "code-10"),
        ("run_code-off", "code-1"),
        ("run_code-off", "code-10"),
        ("monty", "code-1"),
        ("monty", "code-10"),
        ("smolagents", "code-1"),
        ("smolagents", "code-10"),
    }
    assert all(row["calls"] > 0 and row["median_us"] > 0 for row in result["calls"])
    for name in ("host", "serve", "fastmcp"):  # the concurrent peers ran a burst
        assert all("calls_per_s" in row for row in result["calls"] if row["peer"] == name)
    assert set(result["sessions"]) == {peer for peer, _ in measured}
    for name in ("host", "serve", "fastmcp", "run_code", "monty"):  # each has processes
        assert result["sessions"][name]["processes_per_session"] >= 1, result["sessions"][name]
        assert result["sessions"][name]["pss_per_session"] > 0, result["sessions"][name]
    # The report renders, with issue 25's targets as ratios of this run's rows.
    from benchmarks import peers

    text = peers.report(result)
    assert "issue 25's targets" in text
    assert "| warm run_code, 1 tool call, default settings |" in text
    assert len(result["machine"]["cpu"]) == 1  # every process on one CPU


def test_a_missing_peer_is_skipped_with_a_message() -> None:
    """A peer whose package is absent is skipped, named with the reason: no crash."""
    from benchmarks import peers

    peers.PEERS["absent"] = peers.PeerSpec(
        "absent", "a peer that is not installed", "none", "none", False, ("no_such_module_xyz",)
    )
    try:
        workers, skipped = peers.start(["absent"], ROOT, quiet=True, quick=True)
    finally:
        del peers.PEERS["absent"]
    assert workers == []
    assert "no_such_module_xyz not installed" in skipped["absent"]


@pytest.mark.subprocess
@pytest.mark.skipif(
    importlib.util.find_spec("pydantic_monty") is None,
    reason="pydantic-monty is not installed: pip install -e '.[bench]'",
)
def test_the_warm_monty_session_outlasts_its_default_limit_of_host_calls() -> None:
    """monty ends a checkout's feeds after 1,000 host calls by default; the warm session
    of a full run makes tens of thousands (here 1,200 in one batch)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.peers",
            "monty",
            "--json",
            "--rounds=1",
            "--warmup=0",
            "--calls=120",
            "--batch-time=60",
            "--sessions=1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = {row["op"]: row for row in json.loads(done.stdout)["calls"]}
    assert rows["code-10"]["calls"] == 120
