"""``toolhost call`` and ``toolhost run``: one mediated call, or a trusted script.

``call`` makes one call as caller ``app`` and prints its value (``--json``: one object,
``{"ok", "value"}`` or ``{"ok": false, "error"}``); ``run`` runs a script with every tool
as a global, as caller ``script``.
"""

from __future__ import annotations

import argparse
import ast
import sys
import traceback
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio

from host import errors
from host._host import Host
from host.errors import HostError

from ._common import (
    Subparsers,
    UsageError,
    argument,
    dumps,
    keywords,
    print_events,
    project_dir,
)

__all__ = ["CALL_COMMANDS"]


async def _call(args: argparse.Namespace) -> int:
    positional = [argument(a) for a in args.args]
    named = keywords(args.kw or [])
    async with Host.open(project_dir(args)) as host:
        host.on("*", print_events)
        try:
            value = await host.call(args.name, *positional, **named)
        except errors.CallError as exc:
            if args.json:
                print(dumps({"ok": False, "error": exc.to_data()}))
            else:
                print(f"error: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print(dumps({"ok": True, "value": value}))
    elif isinstance(value, str):
        print(value)
    else:
        print(dumps(value, pretty=True))
    return 0


def _script_globals(host: Host, path: Path) -> dict[str, Any]:
    scope: dict[str, Any] = {
        "__name__": "__main__",
        "__file__": str(path),
        "__builtins__": __builtins__,
    }
    scope.update({name: getattr(errors, name) for name in errors.__all__})
    scope.update(host.default_session.globals_for("script"))
    return scope


async def _run(args: argparse.Namespace) -> int:
    path = Path(args.script)
    try:
        source = await anyio.Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {args.script}: {exc.strerror}") from exc
    try:
        code = compile(source, str(path), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as exc:
        print(f"{path}:{exc.lineno}: syntax error: {exc.msg}", file=sys.stderr)
        return 2
    async with Host.open(project_dir(args)) as host:
        host.on("*", print_events)
        scope = _script_globals(host, path)
        try:
            result = eval(code, scope)  # a trusted script the user asked us to run
            if isinstance(result, Coroutine):
                await result
        except HostError as exc:
            traceback.print_exc()
            print(f"toolhost: the script failed: {exc}", file=sys.stderr)
            return 1
        except Exception:
            traceback.print_exc()
            return 1
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def _add_call(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    call = sub.add_parser("call", parents=[common], help="one mediated call (caller app)")
    call.add_argument("name", help="the tool name, e.g. add or kanban.add")
    call.add_argument("args", nargs="*", metavar="ARG", help="JSON if it parses, else a string")
    call.add_argument("--kw", action="append", metavar="K=V", help="a keyword argument")
    call.set_defaults(handler=_call)


def _add_run(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    run = sub.add_parser("run", parents=[common], help="a trusted script, every tool a global")
    run.add_argument("script", metavar="SCRIPT.py")
    run.set_defaults(handler=_run)


CALL_COMMANDS: list[Callable[[Subparsers, argparse.ArgumentParser], None]] = [_add_call, _add_run]
