"""``toolhost exec (-c CODE | FILE)``: agent code in the code sandbox.

The code runs as ``run_code`` runs it: in the session's sandbox, every tool an awaitable
global, each call made as caller ``agent`` through the mediator. Without ``--json`` the
captured output goes to stdout, then the value of the last expression (if any); the error
(the agent's own traceback) and warnings go to stderr. With ``--json``: one object,
``{"ok", "value", "stdout", "calls": [{"tool", "decision", "ok"}], "error", "warnings"}``.
Exit status 0 when the code ran to its end, 1 when it failed, 2 on bad usage.

The options of ``run_code`` are flags: ``--module FILE`` (repeatable: importable by its
file name), ``--globals JSON``, ``--execute FN`` with ``--args JSON`` and ``--kwargs JSON``,
``--memory-limit SIZE``, ``--filename NAME`` and ``--check warn|refuse|off``. What the check
found goes to stderr (``toolhost: check: line L, column C: ...``), and to ``"check"`` with
``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import anyio

from host.capsules import CodeResult
from host.check import check_lines

from ._common import (
    Subparsers,
    UsageError,
    add_approver_option,
    approver_of,
    dumps,
    files_data,
    open_host,
    print_files,
    project_dir,
    text_argument,
)

__all__ = ["EXEC_COMMANDS", "result_data"]


def result_data(result: CodeResult) -> dict[str, Any]:
    """The ``exec --json`` shape."""
    error = None
    if result.error is not None:
        error = result.error.model_dump(exclude_none=True)
    return (
        {
            "ok": result.ok,
            "value": result.value,
            "stdout": result.stdout,
            "calls": [
                {"tool": c.tool, "decision": c.decision, "ok": c.ok}
                | ({"error": c.error} if c.error else {})
                for c in result.calls
            ],
            "error": error,
            "warnings": result.warnings,
        }
        | ({"check": result.check.model_dump()} if result.check is not None else {})
        | ({"attachments": files_data(result.attachments)} if result.attachments else {})
    )


async def _source(args: argparse.Namespace) -> str:
    if args.code is not None:
        return text_argument(str(args.code), "the code (-c)")
    if args.file == "-":
        try:
            return sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"the code on stdin is not valid UTF-8: {exc}") from None
    try:
        return await anyio.Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {args.file}: {exc}") from exc


def _json_option(text: str | None, flag: str, kind: type) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{flag} takes JSON: {exc}") from None
    if not isinstance(value, kind):
        raise UsageError(f"{flag} takes a JSON {'object' if kind is dict else 'array'}")
    return value


async def _options(args: argparse.Namespace) -> dict[str, Any]:
    """``run_code``'s options from the flags (the host checks their values)."""
    options: dict[str, Any] = {}
    if args.modules:
        modules: dict[str, str] = {}
        for file in args.modules:
            try:
                modules[Path(file).name] = await anyio.Path(file).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise UsageError(f"cannot read the module {file}: {exc}") from exc
        options["modules"] = modules
    bound = _json_option(args.globals, "--globals", dict)
    if bound is not None:
        options["globals"] = bound
    if args.execute is not None:
        options["execute"] = {
            "fn": args.execute,
            "args": _json_option(args.args, "--args", list) or [],
            "kwargs": _json_option(args.kwargs, "--kwargs", dict) or {},
        }
    elif args.args is not None or args.kwargs is not None:
        raise UsageError("--args and --kwargs go with --execute FN")
    if args.memory_limit is not None:
        options["memory_limit"] = args.memory_limit
    if args.filename is not None:
        options["filename"] = args.filename
    if args.check is not None:
        options["check"] = args.check
    return options


async def _exec(args: argparse.Namespace) -> int:
    source = await _source(args)
    options = await _options(args)
    project: Path = project_dir(args)
    async with open_host(project, approver=approver_of(args)) as host:
        result = await host.run_code(source, **options)
    if args.json:
        print(dumps(result_data(result)))
        return 0 if result.ok else 1
    sys.stdout.write(result.stdout)
    if result.stdout and not result.stdout.endswith("\n"):
        sys.stdout.write("\n")  # what follows starts a line of its own
    if result.ok and result.value is not None:
        value = result.value
        print(value if isinstance(value, str) else dumps(value, pretty=True))
    print_files(result.attachments)
    for warning in result.warnings:
        print(f"toolhost: warning: {warning}", file=sys.stderr)
    refused = result.error is not None and result.error.kind == "check_failed"
    if result.check is not None and not refused:  # a refusal's message lists them
        for line in check_lines(result.check):
            print(f"toolhost: {line}", file=sys.stderr)
    if result.error is not None:
        error = result.error
        if error.kind == "limit_exceeded":
            # The message says which limit and by how much, once; the agent's own
            # traceback (where the code was) comes first when there is one.
            if error.traceback:
                print(error.traceback, end="", file=sys.stderr)
            print(f"toolhost: {error.message}", file=sys.stderr)
        elif error.traceback:
            print(error.traceback, end="", file=sys.stderr)
        else:
            print(f"{error.type}: {error.message}", file=sys.stderr)
    sys.stdout.flush()
    return 0 if result.ok else 1


def _add_exec(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "exec",
        parents=[common],
        help="agent code in the code sandbox (caller agent)",
        description="Run agent code in the code sandbox: every tool is an awaitable global.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("-c", dest="code", metavar="CODE", help="the code to run")
    source.add_argument("file", nargs="?", metavar="FILE", help="a file of code ('-': stdin)")
    parser.add_argument(
        "--module",
        dest="modules",
        action="append",
        metavar="FILE",
        help="a module the code can import by its file name (repeatable)",
    )
    parser.add_argument("--globals", metavar="JSON", help="a JSON object bound as globals")
    parser.add_argument("--execute", metavar="FN", help="call this function of the code")
    parser.add_argument("--args", metavar="JSON", help="--execute's arguments (a JSON array)")
    parser.add_argument("--kwargs", metavar="JSON", help="--execute's keywords (JSON object)")
    parser.add_argument(
        "--memory-limit", metavar="SIZE", help="memory for this run ('64MiB'; <= code_memory)"
    )
    parser.add_argument("--filename", metavar="NAME", help="the file name tracebacks show")
    parser.add_argument(
        "--check",
        choices=("warn", "refuse", "off"),
        help="check the code against the tools before it runs ([limits] code_check)",
    )
    add_approver_option(parser)
    parser.set_defaults(handler=_exec)


EXEC_COMMANDS = [_add_exec]
