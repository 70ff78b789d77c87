"""Benchmark the declarations: scope builds cold and warm, beside a bare pyright run.

    .venv/bin/python -m benchmarks.declarations                # 10 and 100 files, 3 rounds
    .venv/bin/python -m benchmarks.declarations --files 10 --rounds 5
    .venv/bin/python -m benchmarks.declarations --json

For each size it generates a project of N tool files with ~10 tools each (inferred dict
returns, TypedDicts, dataclasses, Literal aliases, types shared through a private file)
and measures, in interleaved rounds so machine noise hits every row alike:

* ``bare pyright``: the pyright command line over the same probe file and tool files,
  with the same configuration, and nothing else (no discovery, no parsing of its JSON);
* ``cold``: ``load_or_build_scope`` with an empty cache (discovery, probe, one pyright
  run, the ast index, referenced types, writing the cache);
* ``warm``: a host start's declarations with an unchanged tools folder: discovery (which
  ``Host.open`` runs anyway), then the scope: the cache key over the files and reading the
  cached scope (``warm scope``, the part this cache decides);
* ``schemas (scope)``: every tool's input and output JSON Schema from the scope model;
* ``schemas (helper)``: the alternative: a short-lived process that imports the tools and
  builds each input schema with ``pydantic.create_model`` over the signature.

Targets (issue 3): 100 files cold within 1.2x of bare pyright; warm under 100 ms. Speed is
measured here, never asserted by a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from host.declare import _pyright
from host.declare._build import _ROOT, PROBE, probe_source  # pyright: ignore[reportPrivateUsage]
from host.declare._cache import load_or_build_scope
from host.declare._discovery import discover
from host.declare._typeindex import TypeIndex

SHARED = '''
"""Types shared by the generated tool files."""
from dataclasses import dataclass
from typing import Literal

from typing_extensions import TypedDict  # the helper's pydantic refuses typing's on 3.11

Level = Literal["low", "mid", "high"]


class Record(TypedDict):
    id: int
    name: str
    level: Level


@dataclass
class Box:
    width: float
    height: float
    tags: list[str]
'''

TOOL_FILE = '''
"""Generated tool file {n}."""
from __future__ import annotations

from dataclasses import dataclass

from ._shared import Box, Level, Record


@dataclass
class Result{n}:
    ok: bool
    count: int


def lookup_{n}(key: str, level: Level = "mid") -> Record:
    """Look a record up.

    Args:
        key: the record's key.
        level: how hard to look.
    """
    return {{"id": 1, "name": key, "level": level}}


def stats_{n}(values: list[float]):
    return {{"count": len(values), "mean": sum(values) / max(len(values), 1)}}


async def fetch_{n}(url: str, timeout: float = 2.0, retries: int = 3):
    return {{"url": url, "status": 200, "ok": True}}


def box_{n}(width: float, height: float) -> Box:
    return Box(width, height, [])


def result_{n}(flag: bool = False):
    return Result{n}(flag, 1)


def pair_{n}(a: int, b: int = 0):
    return (a, str(b))


def tags_{n}(*names: str, sep: str = ","):
    return sep.join(names)


def many_{n}(records: list[Record]) -> dict[str, Record]:
    return {{r["name"]: r for r in records}}


async def level_{n}(level: Level | None = None) -> Level:
    return level or "low"


def echo_{n}(text: str, /, times: int = 1, **meta: str) -> list[str]:
    return [text] * times
'''

HELPER = """
import importlib, inspect, json, sys, types, typing
import pydantic
tools_dir, names = sys.argv[1], sys.argv[2:]
package = types.ModuleType("tools"); package.__path__ = [tools_dir]; sys.modules["tools"] = package
schemas = {}
for name in names:
    module = importlib.import_module("tools." + name)
    for export, fn in vars(module).items():
        if export.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != module.__name__:
            continue
        hints = typing.get_type_hints(fn)
        fields = {}
        for p in inspect.signature(fn).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            default = ... if p.default is p.empty else p.default
            fields[p.name] = (hints.get(p.name, typing.Any), default)
        schemas[export] = pydantic.create_model(export, **fields).model_json_schema()
print(len(schemas))
"""


def write_project(root: Path, files: int) -> Path:
    tools = root / "tools"
    tools.mkdir(parents=True)
    (tools / "_shared.py").write_text(textwrap.dedent(SHARED))
    for n in range(files):
        (tools / f"t{n:03d}.py").write_text(textwrap.dedent(TOOL_FILE).format(n=n))
    return tools


def bare_pyright(tools: Path) -> Callable[[], None]:
    """The pyright command line alone, over the same probe and configuration."""
    discovery = discover(tools)
    probe, _ = probe_source(discovery, TypeIndex(tools))
    folder = Path(tempfile.mkdtemp(prefix="bench-pyright-"))
    (folder / PROBE).write_text(probe)
    config = {
        **_pyright.SETTINGS,
        "include": [PROBE, os.path.relpath(tools.resolve(), folder)],
        "extraPaths": [str(tools.parent.resolve()), str(_ROOT)],
        "pythonVersion": f"{sys.version_info.major}.{sys.version_info.minor}",
    }
    (folder / "pyrightconfig.json").write_text(json.dumps(config))
    command = [sys.executable, "-m", "pyright", "--outputjson", "-p", str(folder)]
    command += ["--pythonpath", sys.executable]
    env = {**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"}

    def run() -> None:
        subprocess.run(command, env=env, capture_output=True, check=False)

    return run


def measure(files: int, rounds: int, warm_repeats: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"bench-decl-{files}-"))
    tools = write_project(root / "project", files)
    bare = bare_pyright(tools)
    times: dict[str, list[float]] = {"bare pyright": [], "cold": []}
    cache = root / "cache"
    scope = None
    for i in range(rounds):
        for name in ["bare pyright", "cold"] if i % 2 == 0 else ["cold", "bare pyright"]:
            if name == "cold":
                directory = cache / f"round{i}"
                start = time.perf_counter()
                scope = load_or_build_scope(discover(tools), directory=directory)
            else:
                start = time.perf_counter()
                bare()
            times[name].append(time.perf_counter() - start)
    assert scope is not None
    warm: list[float] = []
    warm_scope: list[float] = []
    discovering: list[float] = []
    for _ in range(warm_repeats):
        start = time.perf_counter()
        discovery = discover(tools)
        middle = time.perf_counter()
        load_or_build_scope(discovery, directory=cache / "round0")
        end = time.perf_counter()
        warm.append(end - start)
        warm_scope.append(end - middle)
        discovering.append(middle - start)
    schemas: list[float] = []
    for _ in range(warm_repeats):
        start = time.perf_counter()
        scope.schemas()
        schemas.append(time.perf_counter() - start)
    helper: list[float] = []
    modules = sorted(p.stem for p in tools.glob("t*.py"))
    for _ in range(max(1, rounds)):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", HELPER, str(tools), *modules], check=True, capture_output=True
        )
        helper.append(time.perf_counter() - start)
    median = {k: statistics.median(v) for k, v in times.items()}
    return {
        "files": files,
        "tools": len(scope.tools),
        "types": len(scope.types),
        "bare_pyright_s": median["bare pyright"],
        "cold_s": median["cold"],
        "cold_over_bare": median["cold"] / median["bare pyright"],
        "warm_ms": statistics.median(warm) * 1000,
        "warm_scope_ms": statistics.median(warm_scope) * 1000,
        "discover_ms": statistics.median(discovering) * 1000,
        "schemas_scope_ms": statistics.median(schemas) * 1000,
        "schemas_helper_ms": statistics.median(helper) * 1000,
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="*", default=[10, 100])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", type=int, default=20, help="repeats of the warm start")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [measure(n, args.rounds, args.warm) for n in args.files]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"pyright {_pyright.version()}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(
        "| files | tools | bare pyright | cold | cold / bare | warm scope | discovery "
        "| schemas (scope) | schemas (helper) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['files']} | {r['tools']} | {r['bare_pyright_s']:.2f} s | {r['cold_s']:.2f} s "
            f"| {r['cold_over_bare']:.2f}x | {r['warm_scope_ms']:.0f} ms "
            f"| {r['discover_ms']:.0f} ms "
            f"| {r['schemas_scope_ms']:.0f} ms | {r['schemas_helper_ms']:.0f} ms |"
        )


if __name__ == "__main__":
    main()
