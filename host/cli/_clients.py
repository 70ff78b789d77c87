"""``toolhost clients add|list|revoke``: who may use ``toolhost serve --transport http``.

Each HTTP client has a name and a bearer token of its own. ``add NAME`` prints the token
once (on stdout, alone, so it can be piped into a secret store); the project keeps only
its SHA-256 digest in ``.agent/clients.json``. ``add`` on an existing name gives it a new
token (the old one stops counting); ``revoke NAME`` removes it. A running server reads
the file again when it changes.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from host.declare import resolve_project

from ._common import Subparsers, UsageError, dumps, project_dir

if TYPE_CHECKING:
    from host.serve import ClientTokens

__all__ = ["CLIENTS_COMMANDS"]


def _tokens(args: argparse.Namespace) -> ClientTokens:
    from host.serve import ClientTokens  # mcp is imported only here

    return ClientTokens.of(resolve_project(project_dir(args)))


def _when(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


async def _add(args: argparse.Namespace) -> int:
    if args.expires is not None and args.expires <= 0:
        raise UsageError("--expires takes a number of days above 0")
    expires = time.time() + args.expires * 86400 if args.expires is not None else None
    tokens = _tokens(args)
    token = tokens.add(args.name, expires=expires)
    if args.json:
        print(dumps({"ok": True, "client": args.name, "token": token, "expires": _when(expires)}))
    else:
        print(token)
        print(
            f"toolhost: the token of client {args.name!r} (shown this once; it is not kept): "
            "the client sends it as 'Authorization: Bearer TOKEN'",
            file=sys.stderr,
        )
    return 0


async def _list(args: argparse.Namespace) -> int:
    now = time.time()
    clients = _tokens(args).clients()
    rows = [
        {
            "name": c.name,
            "created": _when(c.created),
            "expires": _when(c.expires),
            "expired": c.expired(now),
        }
        for c in clients
    ]
    if args.json:
        print(dumps({"ok": True, "clients": rows}))
        return 0
    if not rows:
        print("no HTTP clients: add one with 'toolhost clients add NAME'", file=sys.stderr)
    for row in rows:
        state = " (expired)" if row["expired"] else ""
        until = f", until {row['expires']}" if row["expires"] else ""
        print(f"{row['name']}: since {row['created']}{until}{state}")
    return 0


async def _revoke(args: argparse.Namespace) -> int:
    removed = _tokens(args).revoke(args.name)
    if args.json:
        print(dumps({"ok": removed, "client": args.name}))
    elif removed:
        print(
            f"toolhost: client {args.name!r} removed; its token no longer counts", file=sys.stderr
        )
    else:
        print(f"toolhost: no client {args.name!r}", file=sys.stderr)
    return 0 if removed else 1


def _add_clients(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    clients = sub.add_parser(
        "clients",
        help="the HTTP clients of toolhost serve and their tokens",
        description="Who may use toolhost serve --transport http: each client has a bearer "
        "token of its own; the project keeps only its digest (.agent/clients.json).",
    )
    actions = clients.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser(
        "add", parents=[common], help="make a client (or give it a new token); prints the token"
    )
    add.add_argument("name", help="the client's name (letters, digits, '_', '.', '-')")
    add.add_argument(
        "--expires", type=float, metavar="DAYS", help="the token stops counting after DAYS"
    )
    add.set_defaults(handler=_add)
    listing = actions.add_parser("list", parents=[common], help="the clients (never tokens)")
    listing.set_defaults(handler=_list)
    revoke = actions.add_parser("revoke", parents=[common], help="remove a client and its token")
    revoke.add_argument("name")
    revoke.set_defaults(handler=_revoke)


CLIENTS_COMMANDS = [_add_clients]
"""The sub-commands this module adds to ``toolhost``."""
