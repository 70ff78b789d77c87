"""Benchmark the check of agent code before it runs (issue 18).

    .venv/bin/python -m benchmarks.check                 # every figure, 3 hosts
    .venv/bin/python -m benchmarks.check --hosts 5 --json
    .venv/bin/python -m benchmarks.check --warm-only     # works on a tree without the check

Through the public API, with the Wasm sandbox, over a project of 10 typed tools:

* ``first check``: a new host's first check (starting pyright's language server, its
  initialisation, then the check), one per host;
* ``warm check``: ``host.checker.check`` of a 50-line snippet using the tools, once the
  server is warm (the snippet changes each time, so nothing is cached by text);
* ``warm run_code, check off`` and ``warn``: ``run_code`` of a snippet making one tool call
  (as ``benchmarks.sandbox``'s target), with ``code_check = "off"`` and ``"warn"``,
  interleaved. On a tree without the check (``--warm-only``), only the first is measured,
  as it always was: run it on ``main`` to get the "before" figure.

Targets (issue 18): warm check under 150 ms median; first check under 2 s; no effect on
the warm ``run_code`` figure with the check off. Medians on a shared machine: compare
figures taken side by side. Never run by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT))

TOOLS = '''
from typing import TypedDict


class Ticket(TypedDict):
    id: str
    title: str
    points: int


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def scale(value: float, factor: float = 2.0) -> float:
    return value * factor


def ticket(ticket_id: str) -> Ticket:
    return {"id": ticket_id, "title": "t", "points": 3}


def tickets(owner: str, *, limit: int = 10) -> list[Ticket]:
    return [ticket(f"{owner}-{i}") for i in range(limit)]


def close(ticket_id: str, reason: str = "done") -> bool:
    return True


def tag(ticket_id: str, tags: list[str]) -> list[str]:
    return tags


def search(query: str, fields: dict[str, str] | None = None) -> list[str]:
    return [query]


def count(owner: str) -> int:
    return 1


def note(text: str) -> str:
    return text


def total(values: list[int]) -> int:
    return sum(values)
'''


def snippet(n: int) -> str:
    """A 50-line snippet using the tools, different for each ``n``."""
    lines = [
        f"owner = 'team-{n}'",
        "found = await tickets(owner, limit=5)",
        "points = 0",
        "for t in found:",
        "    points += t['points']",
        "    await tag(t['id'], ['seen', owner])",
        "async def close_all(items: list[Ticket]) -> int:",
        "    closed = 0",
        "    for item in items:",
        "        if await close(item['id'], reason='bulk'):",
        "            closed += 1",
        "    return closed",
        "closed = await close_all(found)",
    ]
    i = 0
    while len(lines) < 48:
        lines.append(f"v{i} = await add({n}, {i})")
        lines.append(f"s{i} = await scale(v{i} * 1.5, factor={i + 1}.0)")
        i += 1
    lines.append("summary = {'points': points, 'closed': closed, 'last': s0}")
    lines.append("summary")
    return "\n".join(lines) + "\n"


def _project(root: Path) -> Path:
    (root / "tools").mkdir(parents=True)
    (root / "tools" / "desk.py").write_text(TOOLS)
    (root / "policy.toml").write_text('version = 1\n[defaults]\nagent = "allow"\n')
    return root


def _has_check() -> bool:
    from host.settings import Limits

    return "code_check" in Limits.model_fields


async def measure(hosts: int, warm_only: bool) -> dict[str, Any]:
    from host import Host, SQLiteStore

    supported = _has_check()
    has_check = supported and not warm_only
    first: list[float] = []
    warm: list[float] = []
    run_off: list[float] = []
    run_warn: list[float] = []
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = _project(Path(tmp) / "p")
        for _ in range(hosts):
            store = SQLiteStore(root / ".agent" / "state.db", durability="process")
            limits: dict[str, Any] = {"code_max_calls": 1000}
            if supported:
                limits["code_check"] = "off"
            async with Host.open(root, limits=limits, store=store) as host:
                assert (await host.run_code("await add(1, 2)")).value == 3  # boot the sandbox
                if has_check:
                    n += 1
                    t = time.perf_counter()
                    result = await host.checker.check(snippet(n), mode="warn")
                    first.append(time.perf_counter() - t)
                    assert result.status == "clean", result
                    for _ in range(20):
                        n += 1
                        t = time.perf_counter()
                        result = await host.checker.check(snippet(n), mode="warn")
                        warm.append(time.perf_counter() - t)
                        assert result.status == "clean", result
                for _ in range(30):  # interleaved: off, then warn
                    t = time.perf_counter()
                    result = await host.run_code("await add(1, 2)")
                    run_off.append(time.perf_counter() - t)
                    assert result.ok and result.value == 3
                    if has_check:
                        t = time.perf_counter()
                        result = await host.run_code("await add(1, 2)", check="warn")
                        run_warn.append(time.perf_counter() - t)
                        assert result.ok and result.check is not None
    out: dict[str, Any] = {
        "load": os.getloadavg(),
        "warm_run_code_off_ms": statistics.median(run_off) * 1000,
    }
    if has_check:
        out.update(
            {
                "first_check_ms": [round(x * 1000) for x in first],
                "warm_check_50_lines_ms": statistics.median(warm) * 1000,
                "warm_check_p90_ms": sorted(warm)[int(len(warm) * 0.9)] * 1000,
                "warm_run_code_warn_ms": statistics.median(run_warn) * 1000,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--warm-only", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import anyio

    found = anyio.run(measure, args.hosts, args.warm_only)
    if args.json:
        print(json.dumps(found, indent=2))
        return
    for key, value in found.items():
        if isinstance(value, float):
            print(f"{key:28} {value:10.1f}")
        else:
            print(f"{key:28} {value}")


if __name__ == "__main__":
    main()
