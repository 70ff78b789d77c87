"""Serve: the host over the Model Context Protocol, and the approval inbox.

Owns the MCP server (the official ``mcp`` SDK's low-level server: one host session per
client connection, every tool an MCP tool plus ``run_code``, escalations asked of the
client's user by elicitation, progress and log notifications, ``--reload``), the
approval inbox (a Starlette web page over the store: pending approvals live, grants,
the audit; ``toolhost inbox`` serves it alone), and the ASGI app that serves both over
HTTP (MCP at ``/mcp``, the inbox at ``/inbox/``).

Sits above the orchestrator, below the command line: may import the orchestrator
(``_host``) and every wing under it; only ``cli`` imports it. ``mcp`` and ``starlette``
are imported here and nowhere else in the host.
"""

from ._auth import CLIENTS_FILE as CLIENTS_FILE
from ._auth import Client as Client
from ._auth import ClientTokens as ClientTokens
from ._http import ServeApp as ServeApp
from ._http import asgi_app as asgi_app
from ._http import run_http as run_http
from ._inbox import Inbox as Inbox
from ._inbox import inbox_app as inbox_app
from ._server import APPROVAL_SCHEMA as APPROVAL_SCHEMA
from ._server import McpServer as McpServer
from ._standalone import serve_inbox as serve_inbox
from ._tools import READ_DECLARATION as READ_DECLARATION
from ._tools import RUN_CODE as RUN_CODE
from ._tools import SEARCH_TOOLS as SEARCH_TOOLS
from ._tools import Expose as Expose

__all__ = [
    "CLIENTS_FILE",
    "Client",
    "ClientTokens",
    "ServeApp",
    "asgi_app",
    "run_http",
    "Inbox",
    "inbox_app",
    "serve_inbox",
    "APPROVAL_SCHEMA",
    "McpServer",
    "RUN_CODE",
    "SEARCH_TOOLS",
    "READ_DECLARATION",
    "Expose",
]
