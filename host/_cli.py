"""``toolhost``: a thin command line over the public API (DESIGN.md section 5).

Exit status: 0 on success, 1 when the host reports an error (a tool, policy or load
error), 2 on bad usage (unknown options, a missing project, a malformed ``--kw``).
With ``--json`` the command prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import ast
import base64
import json
import sys
import traceback
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeAlias

import anyio

from . import errors
from ._cli_exec import EXEC_COMMANDS
from ._cli_policy import POLICY_COMMANDS
from ._cli_scope import SCOPE_COMMANDS
from ._events import Event
from ._host import Host
from ._project import default_project
from .errors import HostError

__all__ = ["main"]


Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # pyright: ignore[reportPrivateUsage]


class UsageError(Exception):
    """Bad usage: exit status 2."""


def _bytes_as_json(value: object) -> Any:
    """For ``json.dumps``: bytes become ``{"$bytes": base64}``."""
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    raise TypeError(f"{type(value).__name__} is not plain data")


def _dumps(value: Any, *, pretty: bool = False) -> str:
    # json's own walk, not a recursive copy first: a result may be nested 512 deep (the
    # wire's cap), which a Python recursion of two frames per level cannot reach.
    indent = 2 if pretty else None
    return json.dumps(value, ensure_ascii=False, indent=indent, default=_bytes_as_json)


def _argument(text: str) -> Any:
    """A command-line argument: JSON if it parses, else the string itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _keywords(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"--kw takes NAME=VALUE, got {pair!r}")
        out[key] = _argument(value)
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


def _print_events(event: Event) -> None:
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


# -- commands ------------------------------------------------------------------------------


async def _call(args: argparse.Namespace) -> int:
    positional = [_argument(a) for a in args.args]
    keywords = _keywords(args.kw or [])
    async with Host.open(project_dir(args)) as host:
        host.on("*", _print_events)
        try:
            value = await host.call(args.name, *positional, **keywords)
        except errors.CallError as exc:
            if args.json:
                print(_dumps({"ok": False, "error": exc.to_data()}))
            else:
                print(f"error: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print(_dumps({"ok": True, "value": value}))
    elif isinstance(value, str):
        print(value)
    else:
        print(_dumps(value, pretty=True))
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
        host.on("*", _print_events)
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


# -- entry point ---------------------------------------------------------------------------


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


COMMANDS: list[Callable[[Subparsers, argparse.ArgumentParser], None]] = [_add_call, _add_run]
"""Each adds one sub-command; commands of other modules append themselves here."""
COMMANDS.extend(EXEC_COMMANDS)
COMMANDS.extend(SCOPE_COMMANDS)
COMMANDS.extend(POLICY_COMMANDS)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--project", metavar="DIR", help="the project folder (default: see README)")
    common.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser = argparse.ArgumentParser(
        prog="toolhost", description="A sandboxed capsule tool host for LLM agents."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = _parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], Coroutine[Any, Any, int]] = args.handler
    try:
        status = anyio.run(handler, args)
    except UsageError as exc:
        print(f"toolhost: {exc}", file=sys.stderr)
        status = 2
    except HostError as exc:
        if getattr(args, "json", False):
            print(_dumps({"ok": False, "error": exc.to_data()}))
        else:
            print(f"toolhost: {exc}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        status = 130
    sys.exit(status)
