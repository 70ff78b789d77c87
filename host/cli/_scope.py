"""``toolhost scope`` and ``toolhost prepare``: the declarations on the command line.

Neither starts a capsule or runs tool code: they discover the tools, build the scope (or
load it from the cache) and print it or write it to ``.agent/``. ``scope --format``:
``model`` (the block the LLM reads, the default), ``pyi``, ``manifest`` or ``schema``.
``prepare --runtime NAME`` instead compiles a Wasm runtime for code mode into the cache
ahead of time (minutes for ``data``, once), with a progress display.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio.to_thread

from host.capsules import RUNTIMES, Prepared, WasmUnavailable, prepare_runtime, wasm_cache
from host.declare import Scope, discover, load_or_build_scope, resolve_project

from ._common import Subparsers, UsageError, project_dir

__all__ = ["SCOPE_COMMANDS", "add_scope", "add_prepare", "write_agent_files"]

FORMATS = ("model", "pyi", "manifest", "schema")


def _scope_of(root: Path) -> Scope:
    project = resolve_project(root)
    return load_or_build_scope(discover(project.tools_dir))


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_agent_files(scope: Scope, state_dir: Path) -> list[Path]:
    """Write ``tool_globals.pyi`` and ``manifest.json`` into ``state_dir`` (``.agent/``)."""
    pyi = state_dir / "tool_globals.pyi"
    manifest = state_dir / "manifest.json"
    _atomic_write(pyi, scope.render_pyi())
    _atomic_write(manifest, _dump(scope.manifest()) + "\n")
    return [pyi, manifest]


async def _scope(args: argparse.Namespace) -> int:
    root = project_dir(args)
    scope = await anyio.to_thread.run_sync(_scope_of, root)
    fmt: str = args.format
    value: Any
    if fmt == "model":
        value = scope.render_model()
    elif fmt == "pyi":
        value = scope.render_pyi()
    elif fmt == "manifest":
        value = scope.manifest()
    else:
        value = scope.schemas()
    if args.json:
        print(json.dumps({"ok": True, "format": fmt, "scope": value}, ensure_ascii=False))
    else:
        print(
            value if isinstance(value, str) else _dump(value),
            end="" if isinstance(value, str) else "\n",
        )
    return 0


_STEPS = {
    "check": "checking the cache",
    "compile": "compiling (once; minutes for data)",
    "library": "building the guest library",
}


async def _prepare_runtime(name: str, as_json: bool) -> int:
    """Compile the runtime ``name`` into the cache, with a progress display (stderr)."""
    import time

    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    started = time.monotonic()
    console = Console(stderr=True)
    progress = Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TimeElapsedColumn(),
        console=console,
        disable=as_json,
        transient=False,
    )
    task = progress.add_task(f"{name}: {_STEPS['check']}", total=len(_STEPS))

    def on_step(step: str) -> None:
        done = list(_STEPS).index(step) if step in _STEPS else 0
        progress.update(task, completed=done, description=f"{name}: {_STEPS.get(step, step)}")

    with progress:
        try:
            prepared: Prepared = await prepare_runtime(name, on_step)
        except WasmUnavailable as exc:
            progress.stop()
            if as_json:
                print(json.dumps({"ok": False, "runtime": name, "error": str(exc)}))
            else:
                print(f"toolhost: {exc}", file=sys.stderr)
            return 1
        progress.update(task, completed=len(_STEPS), description=f"{name}: ready")
    seconds = round(time.monotonic() - started, 1)
    if as_json:
        print(
            json.dumps(
                {
                    "ok": True,
                    "runtime": name,
                    "python": prepared.python,
                    "cache": str(Path(prepared.cwasm).parent),
                    "module": prepared.cwasm,
                    "library": prepared.lib,
                    "rejected": list(prepared.rejected),
                    "seconds": seconds,
                }
            )
        )
    else:
        for reason in prepared.rejected:
            print(f"rebuilt: {reason}")
        print(f"runtime {name} (Python {prepared.python}) ready in {seconds} s")
        print(f"cache: {wasm_cache()} (compiled module and guest library, each MAC-checked)")
    return 0


async def _prepare(args: argparse.Namespace) -> int:
    runtime: str | None = args.runtime
    if runtime is not None:
        if args.project is not None:
            raise UsageError("prepare --runtime prepares a runtime for every project: no --project")
        return await _prepare_runtime(runtime, bool(args.json))
    root = project_dir(args)
    scope = await anyio.to_thread.run_sync(_scope_of, root)
    project = resolve_project(root)
    written = await anyio.to_thread.run_sync(write_agent_files, scope, project.state_dir)
    if args.json:
        print(json.dumps({"ok": True, "written": [str(p) for p in written]}))
    else:
        for path in written:
            print(f"wrote {path}")
    return 0


def add_scope(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    scope = sub.add_parser("scope", parents=[common], help="print the declarations")
    scope.add_argument(
        "--format", choices=FORMATS, default="model", help="what to print (default: model)"
    )
    scope.set_defaults(handler=_scope)


def add_prepare(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    prepare = sub.add_parser(
        "prepare",
        parents=[common],
        help="write .agent/tool_globals.pyi and .agent/manifest.json; or, with --runtime, "
        "compile a code-mode runtime ahead of time",
    )
    prepare.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=None,
        help="compile this Wasm runtime for code mode into the cache (data: a few minutes, "
        "once), instead of writing the agent files",
    )
    prepare.set_defaults(handler=_prepare)


SCOPE_COMMANDS = [add_scope, add_prepare]
"""The sub-commands this module adds to ``toolhost``."""
