"""Benchmark runner: the trivial-call case, every variant measured side by side in one run.

    .venv/bin/python -m benchmarks.run                 # every case, the full run (~1 min)
    .venv/bin/python -m benchmarks.run pipe host       # only these cases
    .venv/bin/python -m benchmarks.run --json          # one JSON object on stdout
    .venv/bin/python -m benchmarks.run --list          # the cases
    .venv/bin/python -m benchmarks.run host --baseline /tmp/before   # before/after

Each case runs in a worker process of its own (see ``_cases``). ``--baseline DIR`` adds a
row ``NAME@base`` for every selected case that runs our code, importing ``host`` and
``capsule`` from ``DIR`` instead (a copy of those two folders from before a change).

Each round runs a short batch of sequential calls of every selected case, then a burst
with many calls in flight of every case that supports it, in a shuffled order; the first
rounds are warm-up and dropped. So machine noise (other work, frequency changes) hits
every case alike, and ratios come from one run, never from figures taken at different
times. Speed is measured here, never asserted by a test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from ._cases import SPECS, Worker, write_project

RATIO_TARGET = 3.0
"""The host's median at most this many times the bare pipe's median."""
THROUGHPUT_TARGET = 20_000.0
"""Calls per second the host sustains with ``--inflight`` calls in flight."""
TARGET_ROWS = (
    "host",
    "host-sync",
    "host-trio",
    "host-trio-sync",
    "host-nostore",
    "host-trio-nostore",
    "transport",
    "transport-trio",
)
"""The rows the targets are computed for. ``host`` (asyncio, async tool) is the headline;
the others show where the time goes (no audit store; the capsule transport alone)."""


@dataclass
class Stats:
    """What one case measured over the counted rounds."""

    samples: list[int] = field(default_factory=list[int])
    round_medians: list[float] = field(default_factory=list[float])
    rates: list[float] = field(default_factory=list[float])
    cpu_client: int = 0
    cpu_server: int = 0
    burst_calls: int = 0
    burst_cpu_client: int = 0
    burst_cpu_server: int = 0

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.samples:
            ordered = sorted(self.samples)
            out["calls"] = len(ordered)
            out["median_us"] = statistics.median(ordered) / 1000
            out["p99_us"] = ordered[math.ceil(0.99 * len(ordered)) - 1] / 1000
            out["min_us"] = ordered[0] / 1000
            out["cpu_client_us"] = self.cpu_client / len(ordered) / 1000
            out["cpu_server_us"] = self.cpu_server / len(ordered) / 1000
        if self.rates:
            out["calls_per_s"] = statistics.median(self.rates)
            out["calls_per_s_min"] = min(self.rates)
            out["calls_per_s_max"] = max(self.rates)
            out["burst_cpu_client_us"] = self.burst_cpu_client / self.burst_calls / 1000
            out["burst_cpu_server_us"] = self.burst_cpu_server / self.burst_calls / 1000
        return out


def machine() -> dict[str, Any]:
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions: dict[str, str] = {}
    for dist in ("msgpack", "anyio", "trio"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "absent"
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": model,
        "cores": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
    }


def _name(worker: Worker) -> str:
    return worker.spec.name if worker.tree is None else worker.spec.name + "@base"


def measure(workers: list[Worker], args: argparse.Namespace) -> dict[str, Stats]:
    rng = random.Random(args.seed)
    stats = {_name(w): Stats() for w in workers}
    order = list(workers)
    for round_no in range(args.warmup + args.rounds):
        counted = round_no >= args.warmup
        rng.shuffle(order)
        for worker in order:
            samples, cpu_client, cpu_server = worker.latency(args.calls, args.batch_time)
            if counted:
                row = stats[_name(worker)]
                row.samples += samples
                row.round_medians.append(statistics.median(samples))
                row.cpu_client += cpu_client
                row.cpu_server += cpu_server
        rng.shuffle(order)
        for worker in order:
            if not worker.spec.concurrent or args.burst <= 0:
                continue
            done, seconds, cpu_client, cpu_server = worker.burst(
                args.burst, args.inflight, args.burst_time
            )
            if counted:
                row = stats[_name(worker)]
                row.rates.append(done / seconds)
                row.burst_calls += done
                row.burst_cpu_client += cpu_client
                row.burst_cpu_server += cpu_server
        if not args.json:
            print(f"\rround {round_no + 1}/{args.warmup + args.rounds}", end="", file=sys.stderr)
    if not args.json:
        print(file=sys.stderr)
    return stats


def targets(stats: dict[str, Stats], inflight: int) -> list[dict[str, Any]]:
    """The target figures of every host row measured, each with PASS or MISS."""
    out: list[dict[str, Any]] = []
    pipe = stats.get("pipe")
    for name in [n for n in stats if n.split("@")[0] in TARGET_ROWS]:
        row = stats[name]
        if pipe is not None and row.samples and pipe.samples:
            ratio = statistics.median(row.samples) / statistics.median(pipe.samples)
            per_round = [h / b for h, b in zip(row.round_medians, pipe.round_medians, strict=True)]
            out.append(
                {
                    "case": name,
                    "target": f"median <= {RATIO_TARGET:g}x the bare pipe median",
                    "value": ratio,
                    "per_round_min": min(per_round),
                    "per_round_max": max(per_round),
                    "pass": ratio <= RATIO_TARGET,
                }
            )
        if row.rates:
            rate = statistics.median(row.rates)
            out.append(
                {
                    "case": name,
                    "target": f">= {THROUGHPUT_TARGET:,.0f} calls/s with {inflight} in flight",
                    "value": rate,
                    "pass": rate >= THROUGHPUT_TARGET,
                }
            )
    return out


def report(result: dict[str, Any]) -> str:
    m = result["machine"]
    cfg = result["config"]
    inflight = cfg["inflight"]
    w = max(19, *(len(name) for name in result["cases"]))
    lines = [
        f"{m['date']}  {m['cpu']}, {m['cores']} cores, load average {m['load_average']} "
        f"at the start, {m['load_average_end']} at the end",
        f"Python {m['python']}, "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + f"; {cfg['rounds']} rounds of batches of at most {cfg['calls']} sequential calls "
        f"or {cfg['batch_time'] * 1000:g} ms, bursts of at most {cfg['burst']} calls or "
        f"{cfg['burst_time'] * 1000:g} ms with {cfg['inflight']} in flight",
        "cpu: CPU microseconds per call of the caller's process + the child processes",
        "",
        f"{'':<{w}} {'one call in flight':^46} {f'{inflight} in flight':^22}",
        f"{'case':<{w}} {'median us':>10} {'p99 us':>9} {'x pipe':>7} {'cpu us':>17} "
        f"{'calls/s':>9} {'cpu us':>13}",
    ]
    pipe = result["cases"].get("pipe", {}).get("median_us")
    titles: list[str] = []
    for name, row in result["cases"].items():
        median = row["median_us"]
        ratio = f"{median / pipe:7.2f}" if pipe else f"{'':7}"
        cpu = f"{row['cpu_client_us']:8.1f}+{row['cpu_server_us']:8.1f}"
        if "calls_per_s" in row:
            burst = (
                f"{row['calls_per_s']:9,.0f} "
                f"{row['burst_cpu_client_us']:6.1f}+{row['burst_cpu_server_us']:6.1f}"
            )
        else:
            burst = ""
        lines.append(f"{name:<{w}} {median:10.1f} {row['p99_us']:9.1f} {ratio} {cpu} {burst}")
        titles.append(f"  {name:<{w}} {row['title']}")
    lines += ["", "cases:", *titles]
    if result["targets"]:
        lines.append("")
    for t in result["targets"]:
        verdict = "PASS" if t["pass"] else "MISS"
        if "per_round_min" in t:
            figure = f"{t['value']:.2f}x (rounds {t['per_round_min']:.2f}-{t['per_round_max']:.2f})"
        else:
            figure = f"{t['value']:,.0f} calls/s"
        lines.append(f"{verdict}  {t['case']:<{w}} {t['target']}: {figure}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--rounds", type=int, default=30, help="counted rounds (default 30)")
    parser.add_argument("--warmup", type=int, default=2, help="rounds dropped first (default 2)")
    parser.add_argument(
        "--calls", type=int, default=400, help="most sequential calls per batch (default 400)"
    )
    parser.add_argument(
        "--batch-time", type=float, default=0.05, help="most seconds per batch (default 0.05)"
    )
    parser.add_argument(
        "--burst", type=int, default=4000, help="most calls per burst (default 4000; 0: none)"
    )
    parser.add_argument(
        "--burst-time", type=float, default=0.15, help="most seconds per burst (default 0.15)"
    )
    parser.add_argument("--inflight", type=int, default=64, help="concurrent callers per burst")
    parser.add_argument("--seed", type=int, default=1, help="seed of the shuffled order")
    parser.add_argument(
        "--baseline", type=Path, help="a folder holding host/ and capsule/ to compare against"
    )
    args = parser.parse_args(argv)

    if args.list:
        for name, spec in SPECS.items():
            print(f"{name:<15} {spec.title}")
        return 0
    unknown = [name for name in args.cases if name not in SPECS]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; --list shows them")
    if args.baseline is not None and not (args.baseline / "host").is_dir():
        parser.error(f"{args.baseline} holds no host/ folder")
    specs = [s for n, s in SPECS.items() if not args.cases or n in args.cases]
    trees: list[Path | None] = [None] if args.baseline is None else [None, args.baseline.resolve()]
    about = machine()
    with tempfile.TemporaryDirectory(prefix="toolhost-bench-") as tmp:
        project = write_project(Path(tmp))
        workers: list[Worker] = []
        try:
            for spec in specs:
                for tree in trees:
                    if tree is None or spec.ours:
                        workers.append(Worker(spec, project, tree))
            stats = measure(workers, args)
        finally:
            for worker in workers:
                worker.close()

    result = {
        "machine": about | {"load_average_end": [round(x, 2) for x in os.getloadavg()]},
        "config": {
            k: getattr(args, k)
            for k in ("rounds", "warmup", "calls", "batch_time", "burst", "burst_time", "inflight")
        }
        | {"baseline": str(args.baseline) if args.baseline else None},
        "cases": {
            name: {"title": SPECS[name.split("@")[0]].title, **s.summary()}
            for name, s in stats.items()
        },
        "targets": targets(stats, args.inflight),
    }
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
