"""What a session costs: memory per idle session, time to its first call, and many at once.

    .venv/bin/python -m benchmarks.sessions                 # all three parts (~3 minutes)
    .venv/bin/python -m benchmarks.sessions --many 0        # without the 1,000 sessions
    .venv/bin/python -m benchmarks.sessions --json          # one JSON object on stdout

Through the public API on a copy of the bundled ``agent_src`` project, with the host's
defaults (capsules forked from the zygote; ``TOOLHOST_ZYGOTE=0`` in the environment
starts each with ``exec`` instead, to compare):

* **memory per idle session**: ``--idle`` sessions are opened, each makes one tool call
  (with ``--idle`` more, one ``run_code`` as well, so each has a code sandbox), then the
  proportional set size of every process below the host (``/proc/PID/smaps_rollup``) is
  summed; the figure is the growth over the host with its default session, per session.
  The keeper (and zygote) and the Wasm fork server are counted in the base, once.
* **new session to first call**: ``--first`` times, a new session is opened and one call
  made (``add``; with a code sandbox, ``run_code`` of a snippet awaiting ``add``), timed
  from before ``host.session()`` to the call's result; the session's close is not timed.
* **many sessions**: ``--many`` sessions are opened at once; once all are open each makes
  ``--calls`` sequential calls, all sessions concurrently. Every call's latency, the
  memory of the host and its children with all of them open (PSS), and after the host
  closes, whether any process it started is left.

Speed is measured here, never asserted by a test. Medians on a noisy shared machine:
note the load average beside every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from host import Host

_ROOT = Path(__file__).resolve().parent.parent
_CODE = "x = await add(1, 2)\nx"
_GONE_DEADLINE = 15.0


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            parent = int(stat[stat.rfind(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def _pss(pid: int) -> int:
    """The proportional set size of ``pid`` in bytes (0 if it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _memory() -> dict[str, float]:
    """PSS (MiB) of this process and of all its descendants, and how many there are."""
    kids = _descendants(os.getpid())
    return {
        "host_mib": _pss(os.getpid()) / 2**20,
        "children_mib": sum(_pss(pid) for pid in kids) / 2**20,
        "children": float(len(kids)),
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _project(folder: Path) -> Path:
    root = folder / "agent_src"
    shutil.copytree(
        _ROOT / "agent_src", root, ignore=shutil.ignore_patterns(".agent", "__pycache__")
    )
    return root


async def _settle() -> None:
    """Let the children finish starting (their pages settle) before a reading."""
    await anyio.sleep(1.0)  # a benchmark's pause, not a wait for a task


async def _idle(host: Host, count: int, code: bool) -> dict[str, float]:
    await _settle()
    before = _memory()
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(count):
            session = await stack.enter_async_context(host.session())
            assert await session.call("add", 1, 2) == 3
            if code:
                result = await session.run_code(_CODE)
                assert result.ok, result
        await _settle()
        after = _memory()
    grown = after["host_mib"] + after["children_mib"] - before["host_mib"] - before["children_mib"]
    return {
        "sessions": count,
        "children_per_session": (after["children_mib"] - before["children_mib"]) / count,
        "total_per_session": grown / count,
        "processes_per_session": (after["children"] - before["children"]) / count,
        "base_children_mib": before["children_mib"],
        "host_mib": before["host_mib"],
    }


def _cpu_ns(pid: int) -> int:
    """CPU time ``pid`` has run so far, all its threads (``/proc/PID/task/*/schedstat``)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def _session_pids(session: Any) -> list[int]:
    """The processes a session started: its capsule, and its code sandbox's guest."""
    pids: list[int] = []
    transport: Any = session.supervisor.transport
    if transport is not None:
        pids.append(transport.pid)
    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                line = f.read()
        except OSError:
            continue
        if b"_wasm_child.py" in line and pid not in pids:
            pids.append(pid)
    return pids


async def _first(host: Host, count: int, code: bool) -> dict[str, float]:
    """Wall time from ``host.session()`` to the first result, and the CPU time the host's
    process and the session's own processes spent on it (which the machine's load does
    not change; the keeper's and fork server's share of a fork is left out)."""
    times: list[float] = []
    cpu: list[float] = []
    for _ in range(count):
        before = set(_descendants(os.getpid()))
        start = time.perf_counter()
        host_cpu = time.process_time()
        async with host.session() as session:
            if code:
                result = await session.run_code(_CODE)
                assert result.ok, result
            else:
                assert await session.call("add", 1, 2) == 3
            times.append((time.perf_counter() - start) * 1000)
            spent = (time.process_time() - host_cpu) * 1e9
            spent += sum(_cpu_ns(pid) for pid in _session_pids(session) if pid not in before)
            cpu.append(spent / 1e6)
    return {
        "count": count,
        "median_ms": statistics.median(times),
        "p99_ms": _percentile(times, 0.99),
        "min_ms": min(times),
        "cpu_median_ms": statistics.median(cpu),
    }


async def _many(host: Host, count: int, calls: int, pace: float) -> dict[str, Any]:
    """``count`` sessions open at once; each makes ``calls`` calls at an agent's pace (a
    random pause of 0 to ``2 * pace`` seconds before each), then ``calls`` more back to
    back, all sessions together (the worst case: ``count`` calls in flight)."""
    paced: list[float] = []
    burst: list[float] = []
    failures: list[str] = []
    phases = {"open": anyio.Event(), "paced": anyio.Event(), "done": anyio.Event()}
    counts = dict.fromkeys(phases, 0)
    release = anyio.Event()
    rng = random.Random(16)

    def arrived(phase: str) -> None:
        counts[phase] += 1
        if counts[phase] == count:
            phases[phase].set()

    async def calls_of(session: Any, index: int, into: list[float], wait: bool) -> None:
        for call in range(calls):
            if wait:
                await anyio.sleep(rng.uniform(0, 2 * pace))
            start = time.perf_counter()
            try:
                value = await session.call("add", index, call)
            except Exception as exc:  # counted, and the others go on
                failures.append(f"{type(exc).__name__}: {exc}")
                continue
            into.append((time.perf_counter() - start) * 1000)
            if value != index + call:
                failures.append(f"add({index}, {call}) returned {value!r}")

    async def one(index: int) -> None:
        reached: list[str] = []

        async def arrive(phase: str) -> None:
            reached.append(phase)
            arrived(phase)
            await phases[phase].wait()

        try:
            async with host.session() as session:
                await arrive("open")
                await calls_of(session, index, paced, wait=True)
                await arrive("paced")
                await calls_of(session, index, burst, wait=False)
                reached.append("done")
                arrived("done")
                await release.wait()
        except Exception as exc:
            failures.append(f"session {index}: {type(exc).__name__}: {exc}")
            for phase in phases:
                if phase not in reached:
                    arrived(phase)

    started = time.perf_counter()
    memory: dict[str, float] = {}
    open_s = 0.0
    async with anyio.create_task_group() as tg:
        for index in range(count):
            tg.start_soon(one, index)
        await phases["open"].wait()
        open_s = time.perf_counter() - started
        await phases["done"].wait()
        memory = _memory()
        release.set()

    def summary(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"calls": 0, "median_ms": None, "p99_ms": None, "max_ms": None}
        return {
            "calls": len(values),
            "median_ms": statistics.median(values),
            "p99_ms": _percentile(values, 0.99),
            "max_ms": max(values),
        }

    return {
        "sessions": count,
        "pace_s": pace,
        "paced": summary(paced),
        "burst": summary(burst),
        "failures": len(failures),
        "first_failures": failures[:5],
        "open_all_s": open_s,
        "host_mib": memory["host_mib"],
        "children_mib": memory["children_mib"],
        "total_gib": (memory["host_mib"] + memory["children_mib"]) / 1024,
        "processes": int(memory["children"]),
    }


async def _gone() -> list[int]:
    """The processes this one started that are still alive once the host has closed."""
    deadline = time.monotonic() + _GONE_DEADLINE
    left = _descendants(os.getpid())
    while left and time.monotonic() < deadline:
        await anyio.sleep(0.1)
        left = _descendants(os.getpid())
    return left


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_start": os.getloadavg(),
        "python": platform.python_version(),
        "zygote": os.environ.get("TOOLHOST_ZYGOTE", "1") != "0",
    }
    with tempfile.TemporaryDirectory(prefix="toolhost-sessions-") as folder:
        root = _project(Path(folder))
        async with Host.open(root) as host:
            assert await host.call("add", 1, 2) == 3
            result = await host.run_code(_CODE)  # the fork server and the module: warm
            assert result.ok, result
            if args.first:
                await _first(host, 3, code=False)  # warm-up
                results["first_call"] = await _first(host, args.first, code=False)
                results["first_code"] = await _first(host, args.first, code=True)
            if args.idle:
                results["idle"] = await _idle(host, args.idle, code=False)
                results["idle_code"] = await _idle(host, args.idle, code=True)
            if args.many:
                results["many"] = await _many(host, args.many, args.calls, args.pace)
        left = await _gone()
        if args.many:
            results["many"]["left_after_close"] = len(left)
    results["load_end"] = os.getloadavg()
    return results


def _print(results: dict[str, Any]) -> None:
    load = ", ".join(f"{x:.1f}" for x in results["load_start"])
    print(f"{results['date']}, Python {results['python']}, zygote {results['zygote']}")
    print(f"load average at the start {load}")
    for key, title in (("first_call", "subprocess capsule"), ("first_code", "with run_code")):
        if key in results:
            row = results[key]
            print(
                f"new session to first call, {title:18}: median {row['median_ms']:6.1f} ms, "
                f"p99 {row['p99_ms']:6.1f} ms, min {row['min_ms']:6.1f} ms ({row['count']} runs); "
                f"CPU {row['cpu_median_ms']:5.1f} ms (median)"
            )
    for key, title in (("idle", "subprocess capsule"), ("idle_code", "with code sandbox")):
        if key in results:
            row = results[key]
            print(
                f"idle session, {title:18}: {row['total_per_session']:5.1f} MiB PSS per session "
                f"(children {row['children_per_session']:5.1f} MiB, "
                f"{row['processes_per_session']:.1f} processes; {row['sessions']} sessions; "
                f"base: host {row['host_mib']:.1f} MiB, children "
                f"{row['base_children_mib']:.1f} MiB)"
            )
    many = results.get("many")
    if many:
        print(
            f"{many['sessions']} sessions open at once (opening all took "
            f"{many['open_all_s']:.1f} s): {many['failures']} calls failed; host "
            f"{many['host_mib']:.0f} MiB + children {many['children_mib']:.0f} MiB = "
            f"{many['total_gib']:.2f} GiB PSS in {many['processes']} processes; "
            f"left after close: {many['left_after_close']}"
        )
        for key, title in (
            ("paced", f"at an agent's pace (mean {many['pace_s']:g} s between calls)"),
            ("burst", "back to back, all sessions at once"),
        ):
            row = many[key]
            if row["calls"]:
                print(
                    f"  {row['calls']} calls {title}: p50 {row['median_ms']:.1f} ms, "
                    f"p99 {row['p99_ms']:.1f} ms, max {row['max_ms']:.1f} ms"
                )
        for failure in many["first_failures"]:
            print(f"  failure: {failure}")
    load = ", ".join(f"{x:.1f}" for x in results["load_end"])
    print(f"load average at the end {load}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="What a session costs")
    parser.add_argument("--idle", type=int, default=40, help="sessions for memory (0: skip)")
    parser.add_argument("--first", type=int, default=100, help="new sessions timed (0: skip)")
    parser.add_argument("--many", type=int, default=1000, help="concurrent sessions (0: skip)")
    parser.add_argument("--calls", type=int, default=10, help="calls per concurrent session")
    parser.add_argument(
        "--pace", type=float, default=1.0, help="mean seconds between an agent's calls"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    if not sys.platform.startswith("linux"):
        print("benchmarks.sessions reads /proc: Linux only", file=sys.stderr)
        return 2
    results = anyio.run(measure, args)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        _print(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
