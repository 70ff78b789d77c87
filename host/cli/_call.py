"""``toolhost call`` and ``toolhost run``: one mediated call, or a trusted script.

``call`` makes one call as caller ``app`` and prints its value (``--json``: one object,
``{"ok", "value"}`` or ``{"ok": false, "error"}``, plus ``"attachments"`` when the tool
returned files: their metadata and where the host keeps them); ``run`` runs a script with
every tool as a global, as caller ``script``.
"""

from __future__ import annotations

import argparse
import ast
import asyncio  # noqa: TID251 - the script's own `asyncio` global; the CLI runs on asyncio
import contextlib
import io
import os
import sys
import traceback
from collections.abc import Callable, Coroutine, Mapping
from contextvars import ContextVar
from pathlib import Path
from types import CodeType
from typing import Any

import anyio

from host import errors
from host._events import Event
from host._host import Host
from host.errors import HostError
from host.settings import Caller

from ._common import (
    Subparsers,
    UsageError,
    add_approver_option,
    add_call_arguments,
    approver_of,
    call_arguments,
    dumps,
    files_data,
    open_host,
    print_files,
    project_dir,
    split_files,
)

__all__ = ["CALL_COMMANDS"]


async def _call(args: argparse.Namespace) -> int:
    positional, named = call_arguments(args)
    async with open_host(project_dir(args), approver=approver_of(args)) as host:
        try:
            value = await host.call(args.name, *positional, **named)
        except errors.CallError as exc:
            if args.json:
                print(dumps({"ok": False, "error": exc.to_data()}))
            else:
                print(f"error: {exc}", file=sys.stderr)
            return 1
    value, files = split_files(value)
    if args.json:
        print(
            dumps(
                {"ok": True, "value": value} | ({"attachments": files_data(files)} if files else {})
            )
        )
        return 0
    if isinstance(value, str):
        print(value)
    elif value is not None or not files:
        print(dumps(value, pretty=True))
    print_files(files)
    return 0


class _Calls:
    """The tool calls a script makes, for ``run --json``: ``{tool, decision, ok}`` each.

    The decision comes from the mediator's ``policy_decision`` event, which is emitted in
    the calling task, so a context variable set around the call collects it.
    """

    _decided: ContextVar[list[str] | None] = ContextVar("toolhost_run_decisions", default=None)

    def __init__(self, host: Host) -> None:
        self._session = host.default_session
        self.records: list[dict[str, Any]] = []
        host.on("policy_decision", self._on_decision)

    def _on_decision(self, event: Event) -> None:
        slot = self._decided.get()
        if slot is not None:
            slot.append(str(event.data.get("decision")))

    async def call(
        self, caller: Caller, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        decided: list[str] = []
        token = self._decided.set(decided)
        try:
            value = await self._session.call_as(caller, name, args, kwargs)
        except HostError as exc:
            self.records.append(
                {"tool": name, "decision": _decision(exc, decided), "ok": False, "error": exc.kind}
            )
            raise
        finally:
            self._decided.reset(token)
        self.records.append({"tool": name, "decision": _decision(None, decided), "ok": True})
        return value


def _decision(exc: HostError | None, decided: list[str]) -> str | None:
    """What policy decided about a call: its event, else what the error implies."""
    if decided:
        return decided[0]
    if isinstance(exc, errors.UnknownTool | errors.InvalidArguments):
        return None  # refused before policy was asked
    return "deny" if isinstance(exc, errors.PolicyDenied) else "allow"


def _script_globals(host: Host, path: Path, calls: _Calls | None) -> dict[str, Any]:
    scope: dict[str, Any] = {
        "__name__": "__main__",
        "__file__": str(path),
        "__builtins__": __builtins__,
        "asyncio": asyncio,  # a global, as in code mode and the generated .pyi
    }
    scope.update({name: getattr(errors, name) for name in errors.__all__})
    session = host.default_session
    scope.update(session.globals_for("script", call=calls.call if calls else None))
    return scope


_VALUE = "__toolhost_value__"
_HIDDEN = tuple(
    str(Path(module.__file__ or "").resolve().parent) + os.sep
    for module in (errors, anyio, asyncio)
)
"""Frames of these packages are the host's own: a script's traceback leaves them out."""


def _compile(source: str, path: Path) -> CodeType:
    """The script, its last line's value kept when it is an expression (``--json``)."""
    tree = ast.parse(source, str(path))
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        tree.body[-1] = ast.Assign(targets=[ast.Name(id=_VALUE, ctx=ast.Store())], value=last.value)
        ast.copy_location(tree.body[-1], last)
        ast.fix_missing_locations(tree)
    return compile(tree, str(path), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def script_traceback(exc: BaseException) -> str:
    """The traceback of an error that ended a script: the script's own frames only (no
    host, anyio or asyncio frames) and, for a :class:`ToolError`, the tool's own lines
    from its capsule, shown the way Python shows a chained exception."""
    shown = traceback.TracebackException.from_exception(exc)
    shown.stack = traceback.StackSummary.from_list(
        [f for f in shown.stack if not f.filename.startswith(_HIDDEN)]
    )
    if isinstance(exc, HostError):
        shown.__cause__ = shown.__context__ = None  # the host's own chain of causes
    lines = list(shown.format())
    if isinstance(exc, HostError):  # named as the script names it: ToolError, not host.errors.
        lines[-1] = lines[-1].replace(f"{type(exc).__module__}.", "", 1)
    text = "".join(lines)
    if isinstance(exc, errors.ToolError) and exc.traceback:
        tool = exc.traceback if exc.traceback.endswith("\n") else exc.traceback + "\n"
        text = (
            f"{tool}\nThe above exception was raised by the tool {exc.tool} in its capsule, "
            "and reached the script as:\n\n" + text
        )
    return text


def _error_data(exc: BaseException, text: str) -> dict[str, Any]:
    kind = exc.kind if isinstance(exc, HostError) else "exception"
    return {"kind": kind, "type": type(exc).__name__, "message": str(exc), "traceback": text}


async def _run(args: argparse.Namespace) -> int:
    path = Path(args.script)
    try:
        source = await anyio.Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {args.script}: {exc.strerror}") from exc
    try:
        code = _compile(source, path)
    except SyntaxError as exc:
        print(f"{path}:{exc.lineno}: syntax error: {exc.msg}", file=sys.stderr)
        return 2
    as_json: bool = args.json
    async with open_host(project_dir(args), approver=approver_of(args)) as host:
        calls = _Calls(host) if as_json else None
        scope = _script_globals(host, path, calls)
        out = io.StringIO()
        status, error, text = 0, None, ""
        with contextlib.redirect_stdout(out) if as_json else contextlib.nullcontext():
            try:
                result = eval(code, scope)  # a trusted script the user asked us to run
                if isinstance(result, Coroutine):
                    await result
            except Exception as exc:
                status, text = 1, script_traceback(exc)
                error = _error_data(exc, text)
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if status:
                    message = f"the script exited with status {status}"
                    error = {"kind": "exit", "type": "SystemExit", "message": message}
    if not as_json:
        sys.stdout.flush()  # what the script printed comes before its traceback
        if text:
            print(text, end="", file=sys.stderr)
        return status
    value = scope.get(_VALUE) if status == 0 else None
    data = {
        "ok": status == 0,
        "value": value,
        "stdout": out.getvalue(),
        "calls": calls.records if calls is not None else [],
        "error": error,
        "warnings": [],
    }
    try:
        print(dumps(data))
    except TypeError:  # the last line's value is not plain data: show it as exec does
        data["value"] = repr(value)
        data["warnings"] = [f"the value is not plain data ({type(value).__name__}): its repr"]
        print(dumps(data))
    return status


def _add_call(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    call = sub.add_parser("call", parents=[common], help="one mediated call (caller app)")
    call.add_argument("name", help="the tool name, e.g. add or kanban.add")
    add_call_arguments(call)
    add_approver_option(call)
    call.set_defaults(handler=_call)


def _add_run(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    run = sub.add_parser(
        "run",
        parents=[common],
        help="a trusted script, every tool a global (caller script)",
        description="Run a trusted script: every tool and asyncio are globals, top-level "
        "await works. --json prints one object: ok, value (of the last line, when it is an "
        "expression), stdout, calls, error, warnings.",
    )
    run.add_argument("script", metavar="SCRIPT.py")
    add_approver_option(run)
    run.set_defaults(handler=_run)


CALL_COMMANDS: list[Callable[[Subparsers, argparse.ArgumentParser], None]] = [_add_call, _add_run]
