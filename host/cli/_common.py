"""What every command shares: the usage error, JSON output, arguments, the project folder.

Each command module imports this one; nothing here imports a command, so there is no
circle between the entry point and the commands.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import sys
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any, Literal, TypeAlias, cast

from capsule.context import Attachment, Result
from host._events import Event
from host._host import Host
from host.declare import default_project
from host.policy import Approver, DenyAll, TerminalApprover

__all__ = [
    "add_approver_option",
    "approver_of",
    "Subparsers",
    "UsageError",
    "dumps",
    "argument",
    "text_argument",
    "keywords",
    "call_arguments",
    "add_call_arguments",
    "project_dir",
    "print_events",
    "note",
    "open_host",
    "files_data",
    "split_files",
    "print_files",
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


def text_argument(text: str, what: str) -> str:
    """``text`` if it is valid Unicode, else a :class:`UsageError` naming ``what``.

    Python decodes the command line (and stdin, in the C locale) with ``surrogateescape``:
    bytes that are not UTF-8 arrive as lone surrogates, which nothing downstream can
    encode.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(
            f"{what} is not valid UTF-8 (a byte 0x{ord(text[exc.start]) & 0xFF:02x} "
            f"at character {exc.start}); pass UTF-8 text"
        ) from None
    return text


def argument(text: str, what: str = "an argument") -> Any:
    """A command-line argument: JSON if it parses, else the string itself."""
    text_argument(text, what)
    try:
        return json.loads(text)
    except RecursionError:
        raise UsageError(
            f"{what} is JSON nested too deeply to read; pass a flatter value"
        ) from None
    except ValueError:
        return text


def keywords(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"--kw takes NAME=VALUE, got {text_argument(pair, '--kw')!r}")
        out[key] = argument(value, f"--kw {key}")
    return out


def call_arguments(args: argparse.Namespace) -> tuple[list[Any], dict[str, Any]]:
    """A call's positional and keyword arguments: ``ARG ...`` and ``--kw K=V``, or
    ``--args-file F`` (a JSON list of positional arguments or an object of keyword
    arguments; ``-`` reads stdin) for arguments too large for a command line."""
    file: str | None = getattr(args, "args_file", None)
    if file is None:
        positional = [argument(a, f"argument {i}") for i, a in enumerate(args.args, 1)]
        return positional, keywords(args.kw or [])
    if args.args or args.kw:
        raise UsageError("--args-file gives all the arguments: leave out ARG and --kw")
    try:
        data = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--args-file {file}: cannot read it: {exc}") from exc
    try:
        value = json.loads(text)
    except RecursionError:
        raise UsageError(
            f"--args-file {file}: JSON nested too deeply to read; pass a flatter value"
        ) from None
    except ValueError as exc:
        raise UsageError(f"--args-file {file}: not JSON: {exc}") from exc
    if isinstance(value, list):
        return cast("list[Any]", value), {}
    if isinstance(value, dict):
        named = cast("dict[str, Any]", value)
        return [], named
    raise UsageError(
        f"--args-file {file}: give a JSON list (positional arguments) or an object "
        f"(keyword arguments), not {type(value).__name__}"
    )


def add_call_arguments(parser: argparse.ArgumentParser) -> None:
    """``ARG ...``, ``--kw K=V`` and ``--args-file F`` (see :func:`call_arguments`)."""
    parser.add_argument("args", nargs="*", metavar="ARG", help="JSON if it parses, else a string")
    parser.add_argument("--kw", action="append", metavar="K=V", help="a keyword argument")
    parser.add_argument(
        "--args-file",
        metavar="F",
        help="the arguments as JSON: a list (positional) or an object (keywords); '-': stdin",
    )


def project_dir(args: argparse.Namespace) -> Path:
    """The project a command runs on: ``--project``, or the default (said on stderr)."""
    if args.project is not None:
        path = Path(args.project)
        if not path.is_dir():
            raise UsageError(f"--project {args.project}: no such folder")
        return path
    path, bundled = default_project()
    if bundled and not path.is_dir():  # an installed wheel: the example lives in the repository
        raise UsageError(
            "no project here (no tools/ or src/tools/ in this folder): start one with "
            "'toolhost init DIR' and run from it, or name one with --project DIR"
        )
    if bundled:
        print(
            f"toolhost: no tools/ here; using the bundled example project {path}", file=sys.stderr
        )
    return path


class _Console:
    """Tool output on the command line's stderr, both streams of it, in whole lines.

    The capsule's stdout and stderr arrive in chunks that may end inside a line; written
    as they come, two streams would cut each other's lines. A stream's text is written as
    it comes while no other stream has a line open on the terminal; else it waits until
    that line ends (or too much waits: then the open line is ended where it is).
    """

    open: str | None = None
    """The stream whose line is open on the terminal (its text ended without a newline)."""
    cut: str | None = None
    """The stream whose open line was ended by a newline of ours: its own newline, when it
    comes first, is not printed again (no blank line)."""
    waiting: dict[str, str] = {}  # noqa: RUF012 - one terminal per process
    _LIMIT = 1 << 20  # the capsule's console budget bounds how fast this can fill

    @classmethod
    def write(cls, stream: str, text: str) -> None:
        if cls.cut == stream:
            cls.cut = None
            if text.startswith("\n"):
                text = text[1:]
                if not text:
                    return
        if cls.open is not None and cls.open != stream:
            pending = cls.waiting.get(stream, "") + text
            if len(pending) <= cls._LIMIT:
                cls.waiting[stream] = pending
                return
            cls.end_line()  # too much waits behind a line that does not end
            cls.waiting.pop(stream, None)
            text = pending
        cls._out(stream, text)
        if cls.open is None:
            for other in list(cls.waiting):
                if cls.open is not None:
                    break
                cls._out(other, cls.waiting.pop(other))
        sys.stderr.flush()

    @classmethod
    def _out(cls, stream: str, text: str) -> None:
        sys.stderr.write(text)
        cls.open = None if text.endswith("\n") else stream

    @classmethod
    def end_line(cls) -> None:
        """Before a line of the command line's own: end a tool's open line."""
        if cls.open is not None:
            sys.stderr.write("\n")
            cls.cut, cls.open = cls.open, None

    @classmethod
    def finish(cls) -> None:
        """At the end: what still waits, then a newline after a last open line."""
        for stream in list(cls.waiting):
            cls.end_line()
            cls._out(stream, cls.waiting.pop(stream))
        cls.end_line()
        sys.stderr.flush()


def _size(count: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if count >= 10 * scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def note(text: str) -> None:
    """A line of the command line's own on stderr, never glued to a tool's open line."""
    _Console.end_line()
    print(f"toolhost: {text}", file=sys.stderr)


def print_events(event: Event) -> None:
    """Show an event on stderr: capsule output as it is, the rest as ``toolhost:`` lines."""
    data = event.data
    if event.kind == "console":
        text = str(data.get("data", ""))
        if text:
            _Console.write(str(data.get("stream")), text)
    elif event.kind == "console_dropped":
        note(
            f"{_size(int(data.get('dropped_bytes', 0)))} of tool output dropped here "
            f"(over the capsule's console budget of {data.get('budget', '?')})"
        )
    elif event.kind == "tool_log":
        note(f"[{data.get('tool')}] {data.get('level')}: {data.get('message')}")
    elif event.kind in ("tool_file_failed", "capsule_crashed", "capsule_unavailable"):
        detail = data.get("reason", "")
        name = data.get("file")
        where = f" {name}.py" if name else ""
        note(f"{event.kind.replace('_', ' ')}{where}: {detail}")
    elif (
        event.kind == "capsule_started" and data.get("restart")
    ) or event.kind == "policy_missing":
        note(str(data.get("message")))
    elif event.kind == "landlock_unavailable":
        note(f"warning: {data.get('message')}")
    elif event.kind == "policy_warning":
        note(f"policy warning: {data.get('text')}")
    elif event.kind == "policy_reload_failed":
        note(f"the policy did not reload: {data.get('error')}")
    elif event.kind == "hook_failed":
        note(f"hook {data.get('hook')} ({data.get('hook_kind')}) failed: {data.get('error')}")
    elif event.kind == "hook_timed_out":
        note(
            f"{data.get('hook_kind')} hooks of {data.get('tool')} still running after "
            f"{data.get('timeout')} s: the call went on"
        )


@contextlib.asynccontextmanager
async def open_host(project: Path, **options: Any) -> AsyncGenerator[Host]:
    """``Host.open(project, **options)``, its events printed on stderr: those of its start
    (a tool file that failed, a policy warning), every new one, and those of its close."""
    try:
        async with Host.open(project, **options) as host:
            for event in list(host.events.recent):
                print_events(event)
            host.on("*", print_events)
            yield host
    finally:
        _Console.finish()


def add_approver_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--approver",
        choices=["terminal", "deny", "inbox"],
        help="who answers escalations: the terminal, nobody (deny), or the approval inbox "
        "(toolhost inbox, or toolhost serve --transport http, on this project); default: "
        "the terminal when stdin is one, else deny",
    )


def approver_of(args: argparse.Namespace) -> Approver | Literal["inbox"] | None:
    """The ``--approver`` asked for (None: the host's default)."""
    choice = getattr(args, "approver", None)
    if choice == "terminal":
        return TerminalApprover()
    if choice == "deny":
        return DenyAll()
    if choice == "inbox":
        print(
            "toolhost: escalations wait for an answer in the approval inbox "
            "(toolhost inbox --project ... prints its URL)",
            file=sys.stderr,
        )
        return "inbox"
    return None


def files_data(files: Sequence[Attachment]) -> list[dict[str, Any]]:
    """Attachments as ``--json`` shows them: their metadata and where the host keeps them."""
    return [{**f.info(), "path": f.path} for f in files]


def split_files(value: Any) -> tuple[Any, list[Attachment]]:
    """A call's value and its files: a ``Result``'s value, an ``Attachment`` alone's None."""
    if isinstance(value, Result):
        result: Result[Any] = value  # pyright: ignore[reportUnknownVariableType]
        return result.value, list(result.attachments)
    if isinstance(value, Attachment):
        return None, [value]
    return value, []


def print_files(files: Sequence[Attachment]) -> None:
    """One line per file, after the value: ``attachment: NAME (TYPE, SIZE) at PATH``."""
    for f in files:
        size = f"{f.width}x{f.height}, " if f.width and f.height else ""
        print(f"attachment: {f.name} ({f.mime_type}, {size}{f.size} bytes) at {f.path}")
