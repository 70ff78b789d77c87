"""``toolhost serve``: the project's tools over MCP, on stdio or streamable HTTP.

Over stdio (the default) one client talks to the host on this process's stdin and
stdout; escalations the client's user cannot answer (no elicitation) are denied, since
nobody can be asked on a terminal whose input is the protocol. Over HTTP
(``--transport http``) MCP is at ``http://HOST:PORT/mcp`` (uvicorn: asyncio only), one
session per client; escalations the client cannot answer go to the default approver
(the terminal when there is one). ``--reload`` follows changes to the tool files.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

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


def _announce(url: str) -> None:
    print(f"toolhost: MCP at {url}", file=sys.stderr, flush=True)


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
            McpServer(host, reload=args.reload).running() as server,
        ):
            await server.serve_stdio()
        return 0
    if args.backend != "asyncio":
        raise UsageError("--transport http runs on asyncio (uvicorn); drop --backend")
    address = args.host or "127.0.0.1"
    port = 8000 if args.port is None else args.port
    allowed: list[str] = []
    if not _loopback(address):
        allowed.append(f"{address}:*")
        print(
            f"toolhost: warning: serving on {address}, not loopback; MCP has no "
            "authentication here: whoever reaches the port calls tools as the agent",
            file=sys.stderr,
        )
    async with open_host(project) as host:
        app = ServeApp(host=host, reload=args.reload, allowed_hosts=allowed).starlette()
        await run_http(
            app,
            host=address,
            port=port,
            on_ready=_announce,
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
        "--backend",
        choices=["asyncio", "trio"],
        default="asyncio",
        help="the event loop (stdio only: uvicorn runs on asyncio)",
    )
    parser.set_defaults(handler=_serve)


SERVE_COMMANDS = [_add_serve]
