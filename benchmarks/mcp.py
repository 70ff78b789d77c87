"""MCP over stdio: ``toolhost serve`` against FastMCP, the same trivial tool, one client.

Run by hand (never by pytest)::

    .venv/bin/pip install -e ".[bench]"          # fastmcp, psutil
    .venv/bin/python -m benchmarks.mcp            # both servers, ~1 minute
    .venv/bin/python -m benchmarks.mcp --profile  # and where toolhost's time goes (cProfile)

Both servers run as processes on stdio and serve ``echo(x: int) -> int`` (async); the
client is the official ``mcp`` SDK's ``ClientSession`` under asyncio, one per server,
both open for the whole run. Every round runs a batch of sequential calls (one in
flight) and a burst of 64 concurrent callers on each server, in a shuffled order, so
load on the machine hits both alike; the first two rounds are warm-up. Reported: the
median and p99 of the sequential calls, calls/s of the bursts (median over rounds), and
CPU per call of each server's whole process tree (for toolhost: the host and its tool
capsule), from ``psutil``.

toolhost's call is the full one: caller ``agent``, the policy decides (an allow rule),
the decision is journaled for the audit, the capsule runs ``echo``; FastMCP runs
``echo`` in its own process. So the ratio is the price of mediation and isolation on
top of the MCP layer the two share.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import psutil
from mcp import ClientSession, StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parent.parent

TOOL = '''
async def echo(x: int) -> int:
    """Return x."""
    return x
'''
POLICY = """\
version = 1

[[rules]]
tools = ["echo"]
decision = "allow"
"""
FASTMCP = """\
from fastmcp import FastMCP

mcp = FastMCP("bench")


@mcp.tool
async def echo(x: int) -> int:
    \"\"\"Return x.\"\"\"
    return x


mcp.run(show_banner=False)
"""
PROFILED = """\
import cProfile
import signal
import sys

from host.cli import main

profile = cProfile.Profile()
signal.signal(signal.SIGUSR1, lambda *_: profile.enable())  # after the warm-up
try:
    main(sys.argv[2:])
except SystemExit:
    pass
finally:
    profile.disable()
    profile.dump_stats(sys.argv[1])
"""


def _project(folder: Path) -> Path:
    (folder / "tools").mkdir(parents=True)
    (folder / "tools" / "bench.py").write_text(textwrap.dedent(TOOL))
    (folder / "policy.toml").write_text(POLICY)
    return folder


class Server:
    """One server process and the client session talking to it."""

    def __init__(self, name: str, params: StdioServerParameters) -> None:
        self.name = name
        self.params = params
        self.client: ClientSession | None = None
        self.process: psutil.Process | None = None
        self.latencies: list[float] = []
        self.rates: list[float] = []
        self.cpu_seq: list[float] = []
        self.cpu_burst: list[float] = []

    async def open(self, stack: AsyncExitStack) -> None:
        before = {p.pid for p in psutil.Process().children()}
        read, write = await stack.enter_async_context(stdio_client(self.params))
        self.client = await stack.enter_async_context(ClientSession(read, write))
        await self.client.initialize()
        new = [p for p in psutil.Process().children() if p.pid not in before]
        self.process = new[0]

    def cpu(self) -> float:
        assert self.process is not None
        total = 0.0
        for proc in [self.process, *self.process.children(recursive=True)]:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total

    async def call(self, value: int) -> None:
        assert self.client is not None
        result = await self.client.call_tool("echo", {"x": value})
        if result.is_error or result.structured_content != {"result": value}:
            raise RuntimeError(f"{self.name}: unexpected result {result}")

    async def batch(self, calls: int, budget: float, keep: bool) -> None:
        started = time.perf_counter()
        cpu = self.cpu()
        made = 0
        for i in range(calls):
            t0 = time.perf_counter()
            await self.call(i)
            if keep:
                self.latencies.append(time.perf_counter() - t0)
            made += 1
            if time.perf_counter() - started > budget:
                break
        if keep:
            self.cpu_seq.append((self.cpu() - cpu) / made)

    async def burst(self, inflight: int, calls: int, budget: float, keep: bool) -> None:
        made = 0
        deadline = time.perf_counter() + budget
        cpu = self.cpu()

        async def caller() -> None:
            nonlocal made
            while made < calls and time.perf_counter() < deadline:
                made += 1
                await self.call(made)

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(inflight):
                tg.start_soon(caller)
        elapsed = time.perf_counter() - started
        if keep:
            self.rates.append(made / elapsed)
            self.cpu_burst.append((self.cpu() - cpu) / made)


async def _run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    project = _project(workdir / "project")
    (workdir / "fast.py").write_text(FASTMCP)
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    toolhost = Server(
        "toolhost",
        StdioServerParameters(
            command=sys.executable,
            args=["-c", "from host.cli import main; main()", "serve", "--project", str(project)],
            cwd=str(ROOT),
            env=env,
        ),
    )
    fast = Server(
        "fastmcp",
        StdioServerParameters(command=sys.executable, args=[str(workdir / "fast.py")], env=env),
    )
    servers = [toolhost, fast]
    if args.sdk_stdio:  # toolhost on the SDK's threaded stdio transport, side by side
        servers.append(
            Server(
                "toolhost-sdk-stdio",
                StdioServerParameters(
                    command=sys.executable,
                    args=toolhost.params.args,
                    cwd=str(ROOT),
                    env={**env, "TOOLHOST_SDK_STDIO": "1"},
                ),
            )
        )
    async with AsyncExitStack() as stack:
        for server in servers:
            await server.open(stack)
        for round_ in range(args.rounds + 2):
            keep = round_ >= 2
            jobs: list[Callable[[], Awaitable[None]]] = []
            for server in servers:
                jobs.append(lambda s=server, k=keep: s.batch(args.calls, args.batch_time, k))
                jobs.append(
                    lambda s=server, k=keep: s.burst(args.inflight, args.burst, args.burst_time, k)
                )
            random.shuffle(jobs)
            for job in jobs:
                await job()
    out: dict[str, Any] = {}
    for server in servers:
        lat = sorted(server.latencies)
        out[server.name] = {
            "median_us": statistics.median(lat) * 1e6,
            "p99_us": lat[int(len(lat) * 0.99) - 1] * 1e6,
            "calls": len(lat),
            "cpu_us_per_call": statistics.median(server.cpu_seq) * 1e6,
            "inflight": args.inflight,
            "calls_per_s": statistics.median(server.rates),
            "cpu_us_per_call_inflight": statistics.median(server.cpu_burst) * 1e6,
        }
    return out


async def _profile(args: argparse.Namespace, workdir: Path) -> str:
    """Run toolhost under cProfile for a sequential load, then group its time."""
    import pstats

    project = _project(workdir / "profiled")
    script = workdir / "profiled.py"
    script.write_text(PROFILED)
    stats_file = workdir / "serve.prof"
    server = Server(
        "toolhost",
        StdioServerParameters(
            command=sys.executable,
            args=[str(script), str(stats_file), "serve", "--project", str(project)],
            cwd=str(ROOT),
        ),
    )
    async with AsyncExitStack() as stack:
        await server.open(stack)
        for i in range(200):  # warm-up: imports, first-call paths
            await server.call(i)
        assert server.process is not None
        server.process.send_signal(signal.SIGUSR1)
        for i in range(args.profile_calls):
            await server.call(i)
    with anyio.fail_after(60):
        while not stats_file.exists():  # noqa: ASYNC110 - written by another process
            await anyio.sleep(0.05)
    if args.profile_out:
        await anyio.Path(args.profile_out).write_bytes(await anyio.Path(stats_file).read_bytes())
    stats = pstats.Stats(str(stats_file))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    groups: dict[str, float] = {}
    total = 0.0
    for (filename, _, function), (_, _, tottime, _, _) in raw.items():
        total += tottime
        group = _group(filename, function)
        groups[group] = groups.get(group, 0.0) + tottime
    lines = [
        f"{args.profile_calls} sequential calls after a warm-up; own time by package "
        "(cProfile tottime of the host process's main thread; 'waiting' is the event "
        "loop's poll and lock waits, i.e. idle):"
    ]
    for name, spent in sorted(groups.items(), key=lambda kv: -kv[1]):
        share = spent / total if total else 0.0
        lines.append(
            f"  {name:<22} {spent:7.2f} s {share:6.1%}  "
            f"{spent / args.profile_calls * 1e6:7.0f} us/call"
        )
    top = sorted(raw.items(), key=lambda kv: -kv[1][2])[:25]
    lines.append("top functions by own time:")
    for (filename, line, function), (_, calls, tottime, _, _) in top:
        where = f"{_group(filename, function)}: {Path(filename).name}:{line} {function}"
        lines.append(f"  {tottime:7.2f} s {calls:9d}  {where}")
    return "\n".join(lines)


def _group(filename: str, function: str = "") -> str:
    if "select.epoll" in function or "_thread.lock" in function:
        return "waiting"
    path = filename.replace(os.sep, "/")
    for key, name in (
        ("/mcp_types/", "mcp_types"),
        ("/mcp/", "mcp"),
        ("/pydantic_core/", "pydantic"),
        ("/pydantic/", "pydantic"),
        ("/jsonschema", "jsonschema"),
        ("/anyio/", "anyio"),
        ("/opentelemetry/", "opentelemetry"),
        ("/asyncio/", "asyncio"),
        ("/host/", "host"),
        ("/capsule/", "capsule"),
        ("/json/", "json"),
        ("/msgpack/", "msgpack"),
    ):
        if key in path:
            return name
    return "other" if "/" in path else "builtins (C)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=300, help="sequential calls per batch")
    parser.add_argument("--batch-time", type=float, default=1.0)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--burst", type=int, default=2000, help="calls per burst")
    parser.add_argument("--burst-time", type=float, default=2.0)
    parser.add_argument("--profile", action="store_true", help="also profile toolhost serve")
    parser.add_argument("--profile-calls", type=int, default=3000)
    parser.add_argument("--profile-out", metavar="FILE", help="keep the cProfile stats here")
    parser.add_argument(
        "--sdk-stdio",
        action="store_true",
        help="also toolhost serve on the MCP SDK's stdio transport (TOOLHOST_SDK_STDIO=1)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as tmp:
        figures = anyio.run(_run, args, Path(tmp))
        profile = anyio.run(_profile, args, Path(tmp)) if args.profile else None
    figures["load_average"] = [load, os.getloadavg()[0]]
    if args.json:
        print(json.dumps(figures | ({"profile": profile} if profile else {}), indent=2))
        return
    print(f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print(
        "| server | median us | p99 us | CPU us per call | "
        f"{args.inflight} in flight, calls/s | CPU us per call, {args.inflight} in flight |"
    )
    print("|---|---|---|---|---|---|")
    for name in ("toolhost", "fastmcp", "toolhost-sdk-stdio"):
        f = figures.get(name)
        if f is None:
            continue
        print(
            f"| {name} | {f['median_us']:,.0f} | {f['p99_us']:,.0f} | "
            f"{f['cpu_us_per_call']:,.0f} | {f['calls_per_s']:,.0f} | "
            f"{f['cpu_us_per_call_inflight']:,.0f} |"
        )
    t, m = figures["toolhost"], figures["fastmcp"]
    print(
        f"toolhost / fastmcp: {t['median_us'] / m['median_us']:.2f}x the latency, "
        f"{t['calls_per_s'] / m['calls_per_s']:.2f}x the calls/s with {args.inflight} in flight"
    )
    if profile:
        print()
        print(profile)


if __name__ == "__main__":
    main()
