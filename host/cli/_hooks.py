"""``toolhost hooks``: the project's hooks in the order they run, without starting a host.

The hooks files are imported (trusted project code, as the host does); no capsule starts
and no tool code runs. Hooks an app registers with ``host.hook`` are not in the files, so
they are not listed.
"""

from __future__ import annotations

import argparse
import json

from host.declare import resolve_project
from host.hooks import load_hook_files

from ._common import Subparsers, project_dir

__all__ = ["HOOKS_COMMANDS", "add_hooks"]


async def _hooks(args: argparse.Namespace) -> int:
    project = resolve_project(project_dir(args))
    folder = project.tools_dir.parent / "hooks"
    hooks = load_hook_files(folder)
    if args.json:
        listed = [h.to_data() for h in hooks]
        print(json.dumps({"ok": True, "folder": str(folder), "hooks": listed}))
        return 0
    if not hooks:
        print(f"no hooks (put @hook functions in {folder}/*.py)")
        return 0
    width = max(len(h.id) for h in hooks)
    kinds = max(len(h.kind) for h in hooks)
    for item in hooks:
        print(f"{item.id:<{width}}  {item.kind:<{kinds}}  {item.source}")
    return 0


def add_hooks(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    hooks = sub.add_parser(
        "hooks", parents=[common], help="list the project's hooks in the order they run"
    )
    hooks.set_defaults(handler=_hooks)


HOOKS_COMMANDS = [add_hooks]
"""The sub-commands this module adds to ``toolhost``."""
