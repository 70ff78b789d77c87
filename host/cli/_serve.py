"""``toolhost serve``: the project's tools over MCP; ``toolhost inbox``: the inbox alone.

Over stdio (the default) one client talks to the host on this process's stdin and
stdout; escalations the client's user cannot answer (no elicitation) are denied, since
nobody can be asked on a terminal whose input is the protocol. Over HTTP
(``--transport http``) MCP is at ``http://HOST:PORT/mcp`` (uvicorn: asyncio only), one
session per client, each client known by its bearer token (``toolhost clients add NAME``;
``--auth none`` serves loopback clients without one), and the approval inbox at
``/inbox/``: escalations the client cannot answer (and those of rules with ``approvers =
["inbox"]``) wait for an answer there. Its URL, with the token a browser needs, goes to
stderr; ``/stats`` answers ``host.stats()``
as JSON to a request with that token. ``--reload`` follows changes to the
tool files. ``toolhost inbox`` serves the inbox of a project's store with no tools: it
answers what other host processes on that store wait for.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
import time
from pathlib import Path

from host.declare import resolve_project
from host.policy import DenyAll

from ._common import Subparsers, UsageError, open_host, project_dir

__all__ = ["SERVE_COMMANDS"]


def _loopback(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _warn_exposed(address: str, what: str) -> list[str]:
    if _loopback(address):
        return []
    print(
        f"toolhost: warning: serving on {address}, not loopback; {what}",
        file=sys.stderr,
    )
    return [f"{address}:*"]


async def _serve(args: argparse.Namespace) -> int:
    from host.serve import McpServer, ServeApp, run_http  # mcp is imported only to serve

    project = project_dir(args)
    if args.transport == "stdio":
        if args.host is not None or args.port is not None:
            raise UsageError("--host and --port are for --transport http")
        approver = DenyAll(
            "the MCP client cannot be asked (it does not support elicitation, or the rule "
            "excludes it) and no other approver serves toolhost serve over stdio"
        )
        async with (
            open_host(project, approver=approver) as host,
            McpServer(
                host, reload=args.reload, names=args.names, expose=args.expose
            ).running() as server,
        ):
            # One client per process: it takes the session the host opened, whose capsule
            # is already running, instead of a second one.
            await server.serve_stdio(session=host.default_session)
        return 0
    if args.backend != "asyncio":
        raise UsageError("--transport http runs on asyncio (uvicorn); drop --backend")
    address = args.host or "127.0.0.1"
    port = 8000 if args.port is None else args.port
    if args.auth == "none" and not _loopback(address):
        raise UsageError(
            f"--auth none serves without authentication: loopback only, not {address} "
            "(give each client a token: toolhost clients add NAME)"
        )
    if args.auth == "tokens":
        clients = _client_count(project)
        said = (
            f"MCP clients authenticate with their tokens ({clients} client"
            f"{'s' if clients != 1 else ''}; more: toolhost clients add NAME)"
        )
    else:
        said = "MCP takes no authentication (--auth none): loopback clients only"
    allowed = _warn_exposed(
        address,
        "use TLS in front of it (a reverse proxy): bearer tokens and the inbox's token "
        "travel in clear over plain HTTP",
    )
    async with open_host(project, approver="inbox") as host:
        serve = ServeApp(
            host=host,
            reload=args.reload,
            allowed_hosts=allowed,
            names=args.names,
            expose=args.expose,
            idle_timeout=args.idle_timeout or None,
            max_sessions=args.max_sessions or None,
            max_sessions_per_client=args.max_sessions_per_client or None,
            auth=args.auth,
        )

        def announce(base: str) -> None:
            print(f"toolhost: MCP at {base}/mcp", file=sys.stderr)
            print(f"toolhost: {said}", file=sys.stderr)
            print(f"toolhost: approval inbox at {serve.inbox_url(base)}", file=sys.stderr)
            print(
                f"toolhost: figures at {base}/stats (send the inbox's token: "
                "Authorization: Bearer TOKEN)",
                file=sys.stderr,
            )
            sys.stderr.flush()

        await run_http(serve.starlette(), host=address, port=port, on_ready=announce)
    return 0


def _client_count(project: Path) -> int:
    """How many clients may authenticate; none: a usage error that says what to do."""
    from host.serve import ClientTokens

    now = time.time()
    tokens = ClientTokens.of(resolve_project(project))
    count = sum(1 for c in tokens.clients() if not c.expired(now))
    if not count:
        raise UsageError(
            "no HTTP client can authenticate: give each client a token with "
            "'toolhost clients add NAME' (it prints the token the client sends as "
            "'Authorization: Bearer TOKEN'), or serve loopback clients without "
            "authentication with --auth none"
        )
    return count


async def _inbox(args: argparse.Namespace) -> int:
    from host.serve import Inbox, serve_inbox  # starlette is imported only to serve

    project = project_dir(args)
    address = args.host or "127.0.0.1"
    allowed = _warn_exposed(address, "the inbox's token travels in clear")

    def announce(url: str, inbox: Inbox) -> None:
        del inbox
        print(f"toolhost: approval inbox at {url}", file=sys.stderr, flush=True)

    await serve_inbox(
        project,
        host=address,
        port=8000 if args.port is None else args.port,
        allowed_hosts=[a.rsplit(":", 1)[0] for a in allowed],
        on_ready=announce,
    )
    return 0


def _add_serve(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "serve",
        parents=[common],
        help="serve the tools over MCP (stdio or streamable HTTP)",
        description="Serve the project's tools, and run_code, to MCP clients.",
    )
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", help="the address to listen on (http; default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="the port (http; default 8000, 0: any free)")
    parser.add_argument("--reload", action="store_true", help="follow changes to the tool files")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="http: close a session idle this long and release its capsules (default 300; "
        "0: never)",
    )
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=64,
        metavar="N",
        help="http: sessions open at once, all clients together (default 64; 0: no cap)",
    )
    parser.add_argument(
        "--max-sessions-per-client",
        type=int,
        default=16,
        metavar="N",
        help="http: sessions one client may have open (default 16; 0: no cap)",
    )
    parser.add_argument(
        "--auth",
        choices=["tokens", "none"],
        default="tokens",
        help="http: how clients authenticate: tokens (each its own bearer token, "
        "'toolhost clients add NAME'; the default) or none (loopback clients only)",
    )
    parser.add_argument(
        "--names",
        choices=["safe", "dotted"],
        default="safe",
        help="the tools' MCP names: safe (kanban_add, what every model API accepts; the "
        "default) or dotted (kanban.add, the names code mode uses)",
    )
    parser.add_argument(
        "--expose",
        choices=["all", "tools", "code"],
        default="all",
        help="what clients see: all (every tool, and run_code; the default), tools (every "
        "tool) or code (run_code, search_tools and read_declaration: a big project's "
        "declarations are found and read on demand)",
    )
    parser.add_argument(
        "--backend",
        choices=["asyncio", "trio"],
        default="asyncio",
        help="the event loop (stdio only: uvicorn runs on asyncio)",
    )
    parser.set_defaults(handler=_serve)


def _add_inbox(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "inbox",
        parents=[common],
        help="serve the approval inbox of the project's store (a web page)",
        description="Serve the approval inbox alone: answer what hosts on this project's "
        "store wait for. Its URL, with the token a browser needs, goes to stderr.",
    )
    parser.add_argument("--host", help="the address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="the port (default 8000, 0: any free)")
    parser.set_defaults(handler=_inbox)


SERVE_COMMANDS = [_add_serve, _add_inbox]
