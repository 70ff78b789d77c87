"""The PostgreSQL store against SQLite, in one run; and how fast replicas see each other.

    .venv/bin/python -m benchmarks.store                  # a throw-away server (pgserver)
    .venv/bin/python -m benchmarks.store --url URL        # an existing database (emptied)
    .venv/bin/python -m benchmarks.store --json

Measures, rounds interleaved so machine noise hits both stores alike:

* ``host``: ``await host.call("add", 1, 2)`` through ``Host.open`` (subprocess capsule,
  asyncio) on each store: an allowed call, the figure that should not move (the decision
  rides on the journal; the database is written by the writer process, off the path);
* ``store``: the store's own share of a call: ``record(durable=True)`` then ``finish``;
* ``grant``: a grant added on replica A until replica B's ``find_grants`` returns it;
* ``answer``: an answer given on replica B until the waiter on replica A reads it (A is
  woken by NOTIFY; without it A would read again only after ``catch_up``).

Replicas A and B are two stores in this process, each with its own pool, listener
thread, journal and writer process, as two hosts would have. Speed is measured here,
never asserted by a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from host import Host
from host.audit import AuditRecord, Grant, PendingAnswer, PendingApproval, store_for

from ._cases import write_project

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _stats(samples: list[float]) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "median_us": statistics.median(ordered) * 1e6,
        "p90_us": ordered[int(len(ordered) * 0.9)] * 1e6,
        "n": len(ordered),
    }


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


async def _host_calls(project: Path, url: str | None, calls: int) -> tuple[list[float], float]:
    """Latencies of ``calls`` sequential calls, and the host process's CPU per call."""
    samples: list[float] = []
    async with Host.open(project, store=url) as host:
        for _ in range(20):
            await host.call("add", 1, 2)
        cpu = _cpu()
        for _ in range(calls):
            start = time.perf_counter()
            await host.call("add", 1, 2)
            samples.append(time.perf_counter() - start)
        cpu = (_cpu() - cpu) / calls
    return samples, cpu


def _record(n: int, host: str) -> AuditRecord:
    return AuditRecord(
        call_id=f"{host}.{n}",
        host_id=host,
        started=time.time(),
        session="s",
        caller="app",
        tool="add",
        outcome="started",
        decision="allow",
        rule="r",
        args_sha256="ab" * 32,
        args_size=8,
        args_summary="1, 2",
    )


async def _store_calls(folder: Path, url: str | None, count: int) -> list[float]:
    store = store_for(url, folder)
    host = f"b{os.getpid()}{'p' if url else 's'}"
    await store.start(host)
    samples: list[float] = []
    try:
        for n in range(count):
            start = time.perf_counter()
            await store.record(_record(n, host), durable=True)
            await store.finish(f"{host}.{n}", "ok", error_kind=None, error=None)
            samples.append(time.perf_counter() - start)
        await store.flush()
    finally:
        await store.aclose()
    return samples


async def _replicas(folder: Path, url: str, count: int) -> dict[str, list[float]]:
    a: Any = store_for(url, folder / "a")
    b: Any = store_for(url, folder / "b")
    a._catch_up = b._catch_up = 3600.0  # only a notification wakes a waiter
    await a.start("ra")
    await b.start("rb")
    grants: list[float] = []
    answers: list[float] = []
    try:
        for n in range(count):
            start = time.perf_counter()
            await a.add_grant(Grant(f"tool{n}", "app", True, None))
            while not await b.find_grants(f"tool{n}", "app", "cd" * 32):
                pass
            grants.append(time.perf_counter() - start)
        for n in range(count):
            now = time.time()
            pending = PendingApproval(
                id=f"p{n}", host_id="ra", created=now, expires=now + 60, call_id=f"ra.{n}",
                session="s", caller="app", tool="add", rule="r", reason=None,
                args_sha256="ab" * 32, rendered="1, 2",
            )  # fmt: skip
            await a.add_pending(pending)
            await a.offer_pending(pending.id)
            seen = a.pending_version()
            done = anyio.Event()
            took: list[float] = []

            async def wait(
                pending_id: str = pending.id,
                seen: int = seen,
                took: list[float] = took,
                done: anyio.Event = done,
            ) -> None:
                version = seen
                while True:
                    row = await a.get_pending(pending_id)
                    if row is not None and row.answer is not None:
                        took.append(time.perf_counter())
                        done.set()
                        return
                    version = await a.pending_changed(version, 3600)

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await anyio.sleep(0.01)  # the waiter is waiting
                start = time.perf_counter()
                await b.answer_pending(pending.id, PendingAnswer(allow=True))
                await done.wait()
            answers.append(took[0] - start)
            await a.remove_pending(pending.id)
    finally:
        await b.aclose()
        await a.aclose()
    return {"grant": grants, "answer": answers}


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    server: Any = None
    url = args.url
    if url is None:
        sys.path.insert(0, _ROOT)
        from tests.pg_helpers import PgServer

        server = await anyio.to_thread.run_sync(PgServer().start)
        url = server.url(await anyio.to_thread.run_sync(server.create_database))
    results: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="thbench-") as tmp:
            root = Path(tmp)
            samples: dict[str, list[float]] = {}
            cpus: dict[str, list[float]] = {}
            for name in ("sqlite", "postgresql"):
                write_project(root / name)
            for _ in range(args.rounds):  # interleaved: noise hits both alike
                for name, which in (("sqlite", None), ("postgresql", url)):
                    got, cpu = await _host_calls(root / name, which, args.calls)
                    samples.setdefault(f"host {name}", []).extend(got)
                    cpus.setdefault(f"host {name}", []).append(cpu)
                    got = await _store_calls(root / f"s-{name}", which, args.calls)
                    samples.setdefault(f"store {name}", []).extend(got)
            for key, values in samples.items():
                results[key] = _stats(values)
                if key in cpus:
                    results[key]["cpu_us"] = statistics.median(cpus[key]) * 1e6
            for key, values in (await _replicas(root / "r", url, args.replicas)).items():
                results[f"{key} across replicas"] = _stats(values)
    finally:
        if server is not None:
            await anyio.to_thread.run_sync(server.close)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a postgresql:// database to use (its tables are reused)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--replicas", type=int, default=100, help="grants and answers timed")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    results = anyio.run(_main, args)
    info = {
        "python": platform.python_version(),
        "load_before": load,
        "load_after": os.getloadavg()[0],
    }
    if args.json:
        print(json.dumps({"info": info, "results": results}))
        return
    print(f"load average {info['load_before']:.1f} -> {info['load_after']:.1f}")
    print(f"{'':28} {'median us':>10} {'p90 us':>10} {'n':>6} {'host CPU us/call':>17}")
    for key, row in results.items():
        cpu = f"{row['cpu_us']:17.0f}" if "cpu_us" in row else ""
        print(f"{key:28} {row['median_us']:10.0f} {row['p90_us']:10.0f} {row['n']:6d} {cpu}")


if __name__ == "__main__":
    main()
