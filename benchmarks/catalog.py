"""Big tool sets: what a model reads before its first useful call, and whether search finds.

    .venv/bin/python -m benchmarks.catalog              # 1,000 and 100 tools, ~1 minute
    .venv/bin/python -m benchmarks.catalog --json

Generates the 1,000-tool project of ``benchmarks._big_project`` (25 files of business
tools with typed parameters and docstrings) and its first 100 tools, builds their
declarations (one pyright run each), and measures, with the official MCP client talking
to ``McpServer`` in memory:

* **tools/list**, the characters of the JSON a client receives (every tool's name,
  description and schemas), for ``serve`` (``--expose all``: every tool and
  ``run_code``), ``--expose tools`` and ``--expose code`` (``run_code``,
  ``search_tools``, ``read_declaration``); and FastMCP 4's tools/list of the same
  functions (when ``fastmcp`` is installed: ``pip install -e ".[bench]"``);
* **before the first useful call** in code mode: tools/list (``--expose code``, its JSON),
  plus one ``search_tools`` result (five hits) for a task, plus ``read_declaration`` of
  the tool it needs (the text content of each: what a model reads), per task (median and
  most);
* **search** over the plain-language tasks of ``_big_project.TASKS``: how often the tool
  a task needs is first (top-1), in the first three (top-3) and five (top-5), and the
  time of one search; and top-1 and top-3 over a second set (``TASKS_SECOND``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import types

from benchmarks._big_project import TASKS, TASKS_SECOND, write_project
from host import Host
from host.serve import READ_DECLARATION, SEARCH_TOOLS, McpServer
from tests.mcp_helpers import connect

POLICY = 'version = 1\n[defaults]\nagent = "allow"\n'


def _chars(model: Any) -> int:
    return len(model.model_dump_json(by_alias=True, exclude_none=True))


def _text(result: types.CallToolResult) -> int:
    """What a model reads of a result: its text content (the structured copy of a
    search's hits is the same data, for programs)."""
    return sum(len(c.text) for c in result.content if isinstance(c, types.TextContent))


async def _listed(project: Path, expose: Any) -> tuple[int, int]:
    async with (
        Host.open(project) as host,
        McpServer(host, expose=expose).running() as server,
        connect(server) as client,
    ):
        listed = await client.list_tools()
        return _chars(listed), len(listed.tools)


async def _fastmcp_listed(project: Path) -> tuple[int, int] | None:
    if importlib.util.find_spec("fastmcp") is None:
        return None
    from fastmcp import Client, FastMCP

    server = FastMCP("bench")
    for path in sorted((project / "tools").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"bench_tools_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name, fn in vars(module).items():
            if callable(fn) and getattr(fn, "__module__", None) == module.__name__:
                server.tool(fn, name=name)
    async with Client(server) as client:
        tools = await client.list_tools()
    return _chars(types.ListToolsResult(tools=tools)), len(tools)


async def _code_mode(project: Path) -> dict[str, Any]:
    async with (
        Host.open(project) as host,
        McpServer(host, expose="code").running() as server,
        connect(server) as client,
    ):
        listed = _chars(await client.list_tools())
        before: list[int] = []
        ranks: list[int | None] = []
        took: list[float] = []
        for task, want in TASKS:
            found = await client.call_tool(SEARCH_TOOLS, {"query": task, "limit": 5})
            assert found.structured_content is not None, found
            hits = [h["name"] for h in found.structured_content["result"]]
            ranks.append(hits.index(want) + 1 if want in hits else None)
            read = await client.call_tool(READ_DECLARATION, {"name": want})
            before.append(listed + _text(found) + _text(read))
            start = time.perf_counter()
            for _ in range(20):
                host.scope.search(task, 5)
            took.append((time.perf_counter() - start) / 20 * 1e6)
        misses = [(t, w) for (t, w), r in zip(TASKS, ranks, strict=True) if r is None or r > 3]
        second: list[int | None] = []
        for task, want in TASKS_SECOND:
            hits = [h["name"] for h in host.scope.search(task, 5)]
            second.append(hits.index(want) + 1 if want in hits else None)
        return {
            "tools_list": listed,
            "before_first_call_median": statistics.median(before),
            "before_first_call_max": max(before),
            "top1": sum(1 for r in ranks if r == 1),
            "top3": sum(1 for r in ranks if r is not None and r <= 3),
            "top5": sum(1 for r in ranks if r is not None),
            "tasks": len(TASKS),
            "second_top1": sum(1 for r in second if r == 1),
            "second_top3": sum(1 for r in second if r is not None and r <= 3),
            "second_tasks": len(TASKS_SECOND),
            "search_us_median": statistics.median(took),
            "missed_top3": misses,
            "model_block": len(host.scope.render_model()),
            "index": len(host.scope.render_index()),
        }


async def measure(count: int, folder: Path) -> dict[str, Any]:
    project = write_project(folder / f"p{count}", count)
    start = time.perf_counter()
    async with Host.open(project):  # builds the declarations (one pyright run)
        pass
    out: dict[str, Any] = {"tools": count, "first_open_s": time.perf_counter() - start}
    for expose in ("all", "tools", "code"):
        out[f"list_{expose}"], _ = await _listed(project, expose)
    peer = await _fastmcp_listed(project)
    out["list_fastmcp"] = None if peer is None else peer[0]
    if count >= 1000:
        out["code_mode"] = await _code_mode(project)
    return out


def _print(results: list[dict[str, Any]]) -> None:
    print("| tools | tools/list: all | tools | code | FastMCP (same functions) | tools / FastMCP |")
    print("|---|---|---|---|---|---|")
    for r in results:
        peer = r["list_fastmcp"]
        ratio = f"{r['list_tools'] / peer:.2f}x" if peer else "-"
        print(
            f"| {r['tools']:,} | {r['list_all']:,} | {r['list_tools']:,} | {r['list_code']:,} "
            f"| {peer or '-':,} | {ratio} |"
        )
    for r in results:
        code = r.get("code_mode")
        if not code:
            continue
        print()
        print(f"code mode, {r['tools']:,} tools (--expose code):")
        print(f"  full model block {code['model_block']:,} chars; the index {code['index']:,}")
        print(
            f"  before the first useful call: median {code['before_first_call_median']:,.0f}, "
            f"at most {code['before_first_call_max']:,} chars (tools/list "
            f"{code['tools_list']:,} + a search + one declaration)"
        )
        print(
            f"  search over {code['tasks']} tasks: top-1 {code['top1']}, top-3 {code['top3']}, "
            f"top-5 {code['top5']}; {code['search_us_median']:.0f} us per search"
        )
        print(
            f"  the second set, {code['second_tasks']} tasks: top-1 {code['second_top1']}, "
            f"top-3 {code['second_top3']}"
        )
        for task, want in code["missed_top3"]:
            print(f"  not in the top 3: {task!r} (needs {want})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)

    async def run() -> list[dict[str, Any]]:
        with tempfile.TemporaryDirectory(prefix="toolhost-catalog-") as tmp:
            return [await measure(n, Path(tmp)) for n in (100, 1000)]

    results = anyio.run(run)
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        print()
    else:
        _print(results)


if __name__ == "__main__":
    main()
