"""Peers in the same run: this host beside FastMCP, pydantic-monty and smolagents.

    .venv/bin/pip install -e ".[bench]"        # fastmcp, pydantic-monty, smolagents, psutil
    .venv/bin/python -m benchmarks.peers        # every peer, ~3 minutes
    .venv/bin/python -m benchmarks.peers host fastmcp      # only these peers
    .venv/bin/python -m benchmarks.peers --quick           # a smoke run (seconds per peer)
    .venv/bin/python -m benchmarks.peers --json            # one JSON object on stdout

Tool calls: the trivial ``add(a, b)`` and ``customer(id)`` (a ~2 KB structured record),
from the same source file, through this host (the app's ``host.call``), through
``toolhost serve`` over stdio and through FastMCP over stdio (both with the official MCP
client). Code mode: a snippet making one and ten ``add`` calls through warm ``run_code``
(Wasm), pydantic-monty (a Rust interpreter in a worker process) and smolagents'
``LocalPythonExecutor`` (in-process, no isolation). Then new sessions of each: the time to
the first completed call, and the memory each holds (PSS).

Every process runs on one CPU (``--cpu N``, default the first this process may use;
``--cpu -1`` leaves them free), so
no peer gains from the second core. Then what a model reads: the tools/list of a
generated 100-tool project from ``toolhost serve`` and FastMCP, and in code mode on a
1,000-tool project (``benchmarks.catalog``; ``--no-lists`` skips it). Last, issue 25's
targets, each a ratio of two rows of this run.

Each peer runs in a worker process of its own (``benchmarks._peer_cases``, driven like the
workers of ``benchmarks.run``). Every round runs a batch of sequential calls of every
peer's every operation, then a burst with many in flight of each that allows it, in a
shuffled order; the first rounds are warm-up. New sessions come after, one per peer at a
time, in shuffled order, all held open until the memory is read. So load on the machine
hits every peer alike. A peer whose package is missing is skipped with a message.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from ._cases import CaseSpec, Worker
from ._peer_cases import write_folder
from .run import machine

_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class PeerSpec:
    name: str
    title: str
    boundary: str
    short: str
    """The boundary in a few words, for the tables."""
    concurrent: bool
    """Whether one session takes many calls in flight (bursts)."""
    needs: tuple[str, ...] = ()
    """Modules the peer imports; missing ones skip it."""


PEERS: dict[str, PeerSpec] = {
    spec.name: spec
    for spec in (
        PeerSpec(
            "host",
            "this host, the app's call (host.call)",
            "process: tool capsule (Landlock, no-new-privs); policy + audit per call",
            "process + policy + audit",
            True,
        ),
        PeerSpec(
            "serve",
            "toolhost serve, stdio, official MCP client",
            "process: server + tool capsule; policy + audit per call",
            "process (server + capsule) + policy + audit",
            True,
            ("mcp",),
        ),
        PeerSpec(
            "fastmcp",
            "FastMCP, stdio, official MCP client",
            "process: server, tools inside it; no policy, no audit",
            "process (server)",
            True,
            ("mcp", "fastmcp"),
        ),
        PeerSpec(
            "run_code",
            "this host, warm run_code",
            "Wasm guest in its own process; each call mediated to a tool capsule",
            "Wasm + process + policy + audit",
            False,
        ),
        PeerSpec(
            "run_code-off",
            "this host, warm run_code with check='off'",
            "as run_code, without checking the code against the declarations",
            "Wasm + process + policy + audit",
            False,
        ),
        PeerSpec(
            "monty",
            "pydantic-monty, AsyncMonty worker pool",
            "process: Rust interpreter in a worker; tools run in the caller, unmediated",
            "process (interpreter only)",
            False,
            ("pydantic_monty",),
        ),
        PeerSpec(
            "smolagents",
            "smolagents LocalPythonExecutor",
            "none: AST interpreter in the caller's process",
            "none",
            False,
            ("smolagents",),
        ),
    )
}

VERSIONS = ("mcp", "fastmcp", "pydantic-monty", "smolagents", "psutil")


class PeerWorker(Worker):
    """A worker of ``benchmarks._peer_cases``; the runner side of ``_cases.Worker``."""

    def __init__(self, spec: PeerSpec, folder: Path, *, quick: bool = False) -> None:
        # Not Worker.__init__: that one boots the trivial-call cases; the protocol is the same.
        self.spec = CaseSpec(spec.name, spec.title, spec.concurrent, True)
        self.tree = None
        boot = (
            f"import sys; sys.path[:0] = [{str(_ROOT)!r}]; "
            "from benchmarks._peer_cases import main; main(sys.argv[1:])"
        )
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-c", boot, spec.name, str(folder), *(["quick"] * quick)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            self.ops: list[str] = self._ask("start")
        except BaseException:
            self.close()
            raise

    def run_latency(self, op: int, calls: int, budget: float) -> tuple[list[int], int, int]:
        samples, me, children = self._ask("latency", op, calls, int(budget * 1e9))
        return samples, me, children

    def run_burst(
        self, op: int, calls: int, inflight: int, budget: float
    ) -> tuple[int, float, int, int]:
        (done, seconds), me, children = self._ask("burst", op, calls, inflight, int(budget * 1e9))
        return done, seconds, me, children

    def new_session(self) -> float:
        seconds: float = self._ask("session")
        return seconds

    def memory(self) -> dict[str, Any]:
        about: dict[str, Any] = self._ask("memory")
        return about


@dataclass
class Row:
    """What one operation of one peer measured over the counted rounds."""

    samples: list[int] = field(default_factory=list[int])
    cpu_caller: int = 0
    cpu_children: int = 0
    rates: list[float] = field(default_factory=list[float])

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.samples)
        out: dict[str, Any] = {
            "calls": len(ordered),
            "median_us": statistics.median(ordered) / 1000,
            "p99_us": ordered[math.ceil(0.99 * len(ordered)) - 1] / 1000,
            "cpu_caller_us": self.cpu_caller / len(ordered) / 1000,
            "cpu_children_us": self.cpu_children / len(ordered) / 1000,
        }
        if self.rates:
            out["calls_per_s"] = statistics.median(self.rates)
        return out


def start(
    names: list[str], folder: Path, *, quiet: bool, quick: bool
) -> tuple[list[PeerWorker], dict[str, str]]:
    """A worker per available peer; the reasons the others were skipped."""
    workers: list[PeerWorker] = []
    skipped: dict[str, str] = {}
    for name in names:
        spec = PEERS[name]
        missing = [m for m in spec.needs if importlib.util.find_spec(m) is None]
        if missing:
            skipped[name] = (
                f"{', '.join(missing)} not installed (pip install -e '.[bench]' brings it)"
            )
        else:
            try:
                workers.append(PeerWorker(spec, folder, quick=quick))
            except RuntimeError as exc:
                skipped[name] = f"it failed to start: {exc}"
        if name in skipped and not quiet:
            print(f"skipped {name}: {skipped[name]}", file=sys.stderr)
    return workers, skipped


def measure(
    workers: list[PeerWorker], args: argparse.Namespace
) -> tuple[dict[tuple[str, str], Row], dict[str, dict[str, Any]]]:
    rng = random.Random(args.seed)
    rows = {(w.spec.name, op): Row() for w in workers for op in w.ops}
    jobs = [(w, i) for w in workers for i in range(len(w.ops))]
    for round_no in range(args.warmup + args.rounds):
        counted = round_no >= args.warmup
        rng.shuffle(jobs)
        for worker, op in jobs:
            samples, me, children = worker.run_latency(op, args.calls, args.batch_time)
            if counted:
                row = rows[worker.spec.name, worker.ops[op]]
                row.samples += samples
                row.cpu_caller += me
                row.cpu_children += children
        rng.shuffle(jobs)
        for worker, op in jobs:
            if not worker.spec.concurrent or args.burst <= 0:
                continue
            done, seconds, _, _ = worker.run_burst(op, args.burst, args.inflight, args.burst_time)
            if counted:
                rows[worker.spec.name, worker.ops[op]].rates.append(done / seconds)
        if not args.json:
            print(f"\rround {round_no + 1}/{args.warmup + args.rounds}", end="", file=sys.stderr)
    if not args.json:
        print(file=sys.stderr)
    starts: dict[str, list[float]] = {w.spec.name: [] for w in workers}
    order = list(workers)
    for n in range(args.sessions):
        rng.shuffle(order)
        for worker in order:
            starts[worker.spec.name].append(worker.new_session())
        if not args.json:
            print(f"\rsessions {n + 1}/{args.sessions}", end="", file=sys.stderr)
    if not args.json:
        print(file=sys.stderr)
    sessions: dict[str, dict[str, Any]] = {}
    for worker in workers:
        times = starts[worker.spec.name]
        sessions[worker.spec.name] = {
            "first_call_ms": statistics.median(times) * 1000,
            "first_call_ms_all": [round(t * 1000, 1) for t in times],
        } | worker.memory()
    return rows, sessions


def _versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for dist in VERSIONS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def _lists() -> dict[str, Any]:
    """tools/list sizes and code mode's reading (``benchmarks.catalog``), 100 and 1,000."""
    import anyio

    from .catalog import measure as catalog_measure

    async def run() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="toolhost-lists-") as tmp:
            return {str(n): await catalog_measure(n, Path(tmp)) for n in (100, 1000)}

    return anyio.run(run)


def _row(result: dict[str, Any], peer: str, op: str) -> dict[str, Any] | None:
    for row in result["calls"]:
        if row["peer"] == peer and row["op"] == op:
            return row
    return None


def targets(result: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Issue 25's rows: (what, toolhost, peer, ratio, target) from this run's figures."""
    out: list[tuple[str, str, str, str, str]] = []

    def us(row: dict[str, Any] | None) -> str:
        return "-" if row is None else f"{row['median_us']:,.0f} us"

    def code(peer: str, op: str, what: str) -> None:
        ours, theirs = _row(result, peer, op), _row(result, "monty", op)
        ratio = "-" if not ours or not theirs else f"{ours['median_us'] / theirs['median_us']:.1f}x"
        out.append((what, us(ours), f"monty {us(theirs)}", ratio, "within 8x"))

    code("run_code", "code-1", "warm run_code, 1 tool call, default settings")
    code("run_code-off", "code-1", "same with check='off'")
    code("run_code", "code-10", "warm run_code, 10 tool calls, default settings")
    code("run_code-off", "code-10", "same with check='off'")
    serve, fast = _row(result, "serve", "add"), _row(result, "fastmcp", "add")
    if serve and fast:
        out.append(
            (
                "one MCP call over stdio, official client",
                us(serve),
                f"FastMCP {us(fast)}",
                f"{serve['median_us'] / fast['median_us']:.2f}x",
                "under 1x",
            )
        )
        if "calls_per_s" in serve and "calls_per_s" in fast:
            out.append(
                (
                    f"{result['config']['inflight']} MCP calls in flight, calls/s",
                    f"{serve['calls_per_s']:,.0f}",
                    f"FastMCP {fast['calls_per_s']:,.0f}",
                    f"{serve['calls_per_s'] / fast['calls_per_s']:.2f}x",
                    "over 1x",
                )
            )
    sessions = result["sessions"]
    if "serve" in sessions and "fastmcp" in sessions:
        a, b = sessions["serve"], sessions["fastmcp"]
        out.append(
            (
                "a new MCP stdio session: PSS, processes",
                f"{a['pss_per_session'] / 2**20:,.0f} MiB, {a['processes_per_session']:g}",
                f"FastMCP {b['pss_per_session'] / 2**20:,.0f} MiB, {b['processes_per_session']:g}",
                f"{a['pss_per_session'] / b['pss_per_session']:.2f}x",
                "under 1x",
            )
        )
    lists = result.get("lists")
    if lists:
        small = lists["100"]
        if small["list_fastmcp"]:
            out.append(
                (
                    "tools/list of a 100-tool project, characters",
                    f"{small['list_all']:,} ({small['list_tools']:,} without run_code)",
                    f"FastMCP {small['list_fastmcp']:,}",
                    f"{small['list_tools'] / small['list_fastmcp']:.2f}x",
                    "at most 1x",
                )
            )
        big = lists["1000"]["code_mode"]
        out.append(
            (
                "1,000 tools: characters read before the first useful call",
                f"{big['before_first_call_median']:,.0f} "
                f"(at most {big['before_first_call_max']:,})",
                f"model block {big['model_block']:,}",
                f"search top-1 {big['top1']}/{big['tasks']}, top-3 {big['top3']}/{big['tasks']}"
                + (
                    f" (second set {big['second_top1']}/{big['second_tasks']}, "
                    f"{big['second_top3']}/{big['second_tasks']})"
                    if "second_tasks" in big
                    else ""
                ),
                "under 8,000",
            )
        )
    if "run_code" in sessions:
        first = sessions["run_code"]["first_call_ms"]
        theirs = sessions.get("monty", {}).get("first_call_ms")
        out.append(
            (
                "new session to first run_code result",
                f"{first:,.1f} ms",
                "-" if theirs is None else f"monty {theirs:,.1f} ms",
                "-" if not theirs else f"{first / theirs:.0f}x",
                "under 40 ms",
            )
        )
    return out


def report(result: dict[str, Any]) -> str:
    m = result["machine"]
    cfg = result["config"]
    lines = [
        f"{m['date']}  {m['cpu']}, {m['cores']} cores, load average {m['load_average']} "
        f"at the start, {m['load_average_end']} at the end",
        f"Python {m['python']}, " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
        f"{cfg['rounds']} rounds (+{cfg['warmup']} warm-up) of batches of at most "
        f"{cfg['calls']} sequential calls or {cfg['batch_time'] * 1000:g} ms and bursts of at "
        f"most {cfg['burst']} calls or {cfg['burst_time'] * 1000:g} ms with {cfg['inflight']} "
        f"in flight; {cfg['sessions']} new sessions per peer",
        "",
        f"| peer | call | median us | p99 us | CPU us per call (caller + children) | "
        f"{cfg['inflight']} in flight, calls/s | boundary |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["calls"]:
        rate = f"{row['calls_per_s']:,.0f}" if "calls_per_s" in row else "one at a time"
        lines.append(
            f"| {row['peer']} | {row['op']} | {row['median_us']:,.0f} | {row['p99_us']:,.0f} | "
            f"{row['cpu_caller_us']:,.0f} + {row['cpu_children_us']:,.0f} | {rate} | "
            f"{PEERS[row['peer']].short} |"
        )
    lines += [
        "",
        "| peer | new session to first call, median ms | PSS per session, MiB | "
        "processes per session | boundary |",
        "|---|---|---|---|---|",
    ]
    for name, s in result["sessions"].items():
        # Without a process of its own a session has no PSS; its growth of the caller
        # (in the JSON) is within the allocator's noise.
        held = (
            f"{s['pss_per_session'] / 2**20:,.1f}" if s["processes_per_session"] else "no process"
        )
        lines.append(
            f"| {name} | {s['first_call_ms']:,.1f} | {held} | "
            f"{s['processes_per_session']:g} | {PEERS[name].short} |"
        )
    lists = result.get("lists")
    if lists:
        lines += [
            "",
            "| tools | tools/list: serve (all) | serve --expose tools | serve --expose code | "
            "FastMCP, same functions |",
            "|---|---|---|---|---|",
        ]
        for n, f in lists.items():
            lines.append(
                f"| {int(n):,} | {f['list_all']:,} | {f['list_tools']:,} | {f['list_code']:,} | "
                f"{f['list_fastmcp'] or '-':,} |"
            )
    lines += [
        "",
        "issue 25's targets, from this run:",
        "",
        "| what | toolhost | peer | ratio | target |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {' | '.join(row)} |" for row in targets(result)]
    lines += ["", "boundaries:"]
    lines += [f"  {name:<10} {PEERS[name].boundary}" for name in result["boundaries"]]
    for name, reason in result["skipped"].items():
        lines.append(f"skipped {name}: {reason}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__)
    parser.add_argument("peers", nargs="*", help=f"peers (default: all of {', '.join(PEERS)})")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="a smoke run: one short round")
    parser.add_argument("--rounds", type=int, default=20, help="counted rounds (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="rounds dropped first (default 2)")
    parser.add_argument("--calls", type=int, default=400, help="most sequential calls per batch")
    parser.add_argument("--batch-time", type=float, default=0.2, help="most seconds per batch")
    parser.add_argument("--burst", type=int, default=4000, help="most calls per burst (0: none)")
    parser.add_argument("--burst-time", type=float, default=0.5, help="most seconds per burst")
    parser.add_argument("--inflight", type=int, default=64, help="concurrent callers per burst")
    parser.add_argument("--sessions", type=int, default=8, help="new sessions per peer")
    parser.add_argument("--seed", type=int, default=1, help="seed of the shuffled order")
    parser.add_argument(
        "--cpu",
        type=int,
        default=min(os.sched_getaffinity(0)),
        help="the one CPU every process runs on (default: the first this process may use; -1: any)",
    )
    parser.add_argument(
        "--no-lists", action="store_true", help="skip the tools/list and code-mode reading"
    )
    args = parser.parse_args(argv)
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})  # the workers and their children inherit it
    if args.quick:
        args.rounds, args.warmup, args.calls, args.batch_time = 1, 0, 20, 0.05
        args.burst, args.burst_time, args.sessions = 100, 0.2, 1
    unknown = [name for name in args.peers if name not in PEERS]
    if unknown:
        parser.error(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    names = args.peers or list(PEERS)
    about = machine()
    about["versions"] |= _versions()
    with tempfile.TemporaryDirectory(prefix="toolhost-peers-") as tmp:
        folder = write_folder(Path(tmp))
        workers, skipped = start(names, folder, quiet=args.json, quick=args.quick)
        try:
            rows, sessions = measure(workers, args)
        finally:
            for worker in workers:
                worker.close()
    # What a model reads: with a full run (every peer), not a smoke run or a chosen few.
    lists = None if args.quick or args.no_lists or args.peers else _lists()
    result = {
        "machine": about
        | {
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "cpu": sorted(os.sched_getaffinity(0)),
        },
        "config": {
            k: getattr(args, k)
            for k in (
                "rounds",
                "warmup",
                "calls",
                "batch_time",
                "burst",
                "burst_time",
                "inflight",
                "sessions",
            )
        },
        "calls": [{"peer": peer, "op": op, **row.summary()} for (peer, op), row in rows.items()],
        "sessions": sessions,
        "boundaries": {name: PEERS[name].boundary for name in names},
        "skipped": skipped,
        "lists": lists,
    }
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
