"""``toolhost scope`` and ``toolhost prepare``: the declarations on the command line.

Neither starts a capsule or runs tool code: they discover the tools, build the scope (or
load it from the cache) and print it or write it to ``.agent/``. ``scope --format``:
``model`` (the block the LLM reads, the default), ``pyi``, ``manifest`` or ``schema``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import anyio.to_thread

from host.declare import Scope, discover, load_or_build_scope, resolve_project

from ._common import Subparsers, project_dir

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


async def _prepare(args: argparse.Namespace) -> int:
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
        "prepare", parents=[common], help="write .agent/tool_globals.pyi and .agent/manifest.json"
    )
    prepare.set_defaults(handler=_prepare)


SCOPE_COMMANDS = [add_scope, add_prepare]
"""The sub-commands this module adds to ``toolhost``."""
