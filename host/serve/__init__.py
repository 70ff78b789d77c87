"""Serve: the host over the Model Context Protocol (``toolhost serve``).

Owns the MCP server (the official ``mcp`` SDK's low-level server: one host session per
client connection, every tool an MCP tool plus ``run_code``, escalations asked of the
client's user by elicitation, progress and log notifications, ``--reload``), and the
ASGI app that serves it over streamable HTTP at ``/mcp`` (with room for the approval
inbox beside it).

Sits above the orchestrator, below the command line: may import the orchestrator
(``_host``) and every wing under it; only ``cli`` imports it. ``mcp`` and ``starlette``
are imported here and nowhere else in the host.
"""

from ._http import ServeApp as ServeApp
from ._http import asgi_app as asgi_app
from ._http import run_http as run_http
from ._server import APPROVAL_SCHEMA as APPROVAL_SCHEMA
from ._server import McpServer as McpServer
from ._tools import RUN_CODE as RUN_CODE

__all__ = ["ServeApp", "asgi_app", "run_http", "APPROVAL_SCHEMA", "McpServer", "RUN_CODE"]
