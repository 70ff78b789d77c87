"""What secrets tools set cost the host, once their sessions closed (issue 24).

    .venv/bin/python -m benchmarks.session_secrets            # 30 sessions (~1 minute)
    .venv/bin/python -m benchmarks.session_secrets --sessions 10

One after another, ``--sessions`` sessions each call a tool that sets 256 secrets of 64
KB through its context (``ctx.set_env``), and close. The host's resident memory
(``VmRSS``) is read after every tenth session, and one agent call's time (a trivial tool,
300 calls after 30 warm ones) before the first and after the last. Before issue 24's fix
every such secret stayed in the host's one redactor, scanned in every redaction.

Speed is measured here, never asserted by a test; note the load average beside it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from host import Host

TOOLS = """
import os

from capsule.context import ToolContext


async def hide_many(count: int, ctx: ToolContext) -> int:
    for i in range(count):
        await ctx.set_env(f"S{i}", f"sec-{os.getpid()}-{i:05d}-" + "x" * 65000)
    return count


def echo(text: str) -> str:
    return text
"""


def _rss() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def _per_call(session: Any, calls: int = 300) -> float:
    for _ in range(30):
        await session.call_as("agent", "echo", ("hello world",), {})
    start = time.perf_counter()
    for _ in range(calls):
        await session.call_as("agent", "echo", ("hello world",), {})
    return (time.perf_counter() - start) / calls * 1000


async def _measure(root: Path, sessions: int) -> None:
    (root / "tools").mkdir(parents=True)
    (root / "tools" / "secrets.py").write_text(TOOLS, encoding="utf-8")
    (root / "policy.toml").write_text(
        'version = 1\n[defaults]\nagent = "allow"\napp = "allow"\n', encoding="utf-8"
    )
    async with Host.open(root) as host:
        async with host.session() as first:
            before_ms = await _per_call(first)
        before = _rss()
        marks: list[str] = []
        for i in range(1, sessions + 1):
            async with host.session() as session:
                await session.call("hide_many", 256)
            if i % 10 == 0:
                marks.append(f"{i}: {_rss():.0f}")
        async with host.session() as last:
            after_ms = await _per_call(last)
            held = len(host.mediator.redactor_for(last.id))
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"host RSS: {before:.0f} MiB at start; after N sessions, MiB: {', '.join(marks)}")
    print(f"one agent call: {before_ms:.3f} ms before, {after_ms:.3f} ms after")
    print(f"secrets a new session's redactions scan: {held}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sessions", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        anyio.run(_measure, Path(folder) / "project", args.sessions)


if __name__ == "__main__":
    main()
