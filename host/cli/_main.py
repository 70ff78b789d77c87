"""``toolhost``: a thin command line over the public API.

Exit status: 0 on success, 1 when the host reports an error (a tool, policy or load
error), 2 on bad usage (unknown options, a missing project, a malformed ``--kw``).
With ``--json`` the command prints exactly one JSON object on stdout.

This module is the entry point: it builds the parser from each command module's list
of sub-commands and runs the one asked for.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NoReturn

import anyio

from host import __version__
from host.errors import HostError

from ._call import CALL_COMMANDS
from ._clients import CLIENTS_COMMANDS
from ._common import Subparsers, UsageError, dumps
from ._exec import EXEC_COMMANDS
from ._hooks import HOOKS_COMMANDS
from ._init import INIT_COMMANDS
from ._policy import POLICY_COMMANDS
from ._scope import SCOPE_COMMANDS
from ._serve import SERVE_COMMANDS
from ._store import STORE_COMMANDS

__all__ = ["main", "COMMANDS"]

COMMANDS: list[Callable[[Subparsers, argparse.ArgumentParser], None]] = [
    *INIT_COMMANDS,
    *CALL_COMMANDS,
    *EXEC_COMMANDS,
    *SCOPE_COMMANDS,
    *POLICY_COMMANDS,
    *HOOKS_COMMANDS,
    *SERVE_COMMANDS,
    *CLIENTS_COMMANDS,
    *STORE_COMMANDS,
]
"""Each adds one sub-command, in the order ``toolhost --help`` lists them."""


def _version() -> str:
    return f"toolhost {__version__} (Python {platform.python_version()}, {sys.executable})"


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--project",
        metavar="DIR",
        help="the project folder (default: . if it holds tools/ or src/tools/)",
    )
    common.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser = argparse.ArgumentParser(
        prog="toolhost", description="A sandboxed capsule tool host for LLM agents."
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = _parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], Coroutine[Any, Any, int]] = args.handler
    try:
        status = anyio.run(handler, args, backend=getattr(args, "backend", "asyncio"))
    except UsageError as exc:
        print(f"toolhost: {exc}", file=sys.stderr)
        status = 2
    except HostError as exc:
        if getattr(args, "json", False):
            print(dumps({"ok": False, "error": exc.to_data()}))
        else:
            print(f"toolhost: {exc}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        status = 130
    sys.exit(status)
