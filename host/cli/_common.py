"""What every command shares: the usage error, JSON output, arguments, the project folder.

Each command module imports this one; nothing here imports a command, so there is no
circle between the entry point and the commands.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeAlias

from host._events import Event
from host.declare import default_project

__all__ = [
    "Subparsers",
    "UsageError",
    "dumps",
    "argument",
    "keywords",
    "project_dir",
    "print_events",
]


Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # pyright: ignore[reportPrivateUsage]


class UsageError(Exception):
    """Bad usage: exit status 2."""


def _bytes_as_json(value: object) -> Any:
    """For ``json.dumps``: bytes become ``{"$bytes": base64}``."""
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    raise TypeError(f"{type(value).__name__} is not plain data")


def dumps(value: Any, *, pretty: bool = False) -> str:
    # json's own walk, not a recursive copy first: a result may be nested 512 deep (the
    # wire's cap), which a Python recursion of two frames per level cannot reach.
    indent = 2 if pretty else None
    return json.dumps(value, ensure_ascii=False, indent=indent, default=_bytes_as_json)


def argument(text: str) -> Any:
    """A command-line argument: JSON if it parses, else the string itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def keywords(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"--kw takes NAME=VALUE, got {pair!r}")
        out[key] = argument(value)
    return out


def project_dir(args: argparse.Namespace) -> Path:
    """The project a command runs on: ``--project``, or the default (said on stderr)."""
    if args.project is not None:
        path = Path(args.project)
        if not path.is_dir():
            raise UsageError(f"--project {args.project}: no such folder")
        return path
    path, bundled = default_project()
    if bundled:
        print(
            f"toolhost: no tools/ here; using the bundled example project {path}", file=sys.stderr
        )
    return path


def print_events(event: Event) -> None:
    if event.kind == "console":
        sys.stderr.write(str(event.data.get("data", "")))
        sys.stderr.flush()
    elif event.kind in ("tool_file_failed", "capsule_crashed", "capsule_unavailable"):
        detail = event.data.get("reason", "")
        name = event.data.get("file")
        where = f" {name}.py" if name else ""
        print(f"toolhost: {event.kind.replace('_', ' ')}{where}: {detail}", file=sys.stderr)
    elif event.kind == "capsule_started" and event.data.get("restart"):
        print(f"toolhost: {event.data.get('message')}", file=sys.stderr)
