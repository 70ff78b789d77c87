"""The host as an ASGI app: MCP at ``/mcp`` (and, later, the approval inbox beside it).

:class:`ServeApp` opens the host, the MCP server and the SDK's HTTP session manager in
its :meth:`~ServeApp.lifespan`, and routes requests to them. ``asgi_app()`` is the
Starlette app ``toolhost serve --transport http`` runs. To mount it in an app of your
own, enter its lifespan in yours (Starlette never runs a mounted app's lifespan)::

    serve = ServeApp("agent_src")

    @asynccontextmanager
    async def lifespan(app):
        async with serve.lifespan():
            yield

    app = Starlette(routes=[*serve.routes(), Route("/", home)], lifespan=lifespan)

Other front ends (the inbox) add their routes to :meth:`ServeApp.routes` and reach the
open host as :attr:`ServeApp.host` while the lifespan runs.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncGenerator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from host._host import Host
from host.errors import HostError
from host.policy import Approver

from ._server import McpServer

__all__ = ["ServeApp", "asgi_app", "run_http"]


class _McpEndpoint:
    """``/mcp``: hands each request to the session manager of the running app."""

    def __init__(self, app: ServeApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        manager = self._app.manager
        if manager is None:
            response = PlainTextResponse("the MCP server is not running", status_code=503)
            await response(scope, receive, send)
            return
        await manager.handle_request(scope, receive, send)


class ServeApp:
    """MCP over streamable HTTP for one project, as routes plus a lifespan.

    Args:
        project: the project folder, as for ``Host.open``; or pass ``host``, an open host.
        host: serve this open host instead of opening one (its approver then answers
            the escalations the MCP client cannot).
        reload: watch the tool files; a change rebuilds the declarations, restarts the
            capsules and tells clients the tool list changed.
        approver: who answers escalations the MCP client's user cannot (no elicitation,
            or the rule excludes the ``mcp`` channel); default: as ``Host.open``.
        allowed_hosts: ``host:port`` patterns accepted besides loopback (``Host`` and
            ``Origin`` headers are checked against DNS rebinding).
        idle_timeout: seconds after which an idle MCP session is closed (None: never).
        host_options: more keyword arguments for ``Host.open``.
    """

    def __init__(
        self,
        project: str | os.PathLike[str] = "agent_src",
        *,
        host: Host | None = None,
        reload: bool = False,
        approver: Approver | None = None,
        allowed_hosts: list[str] | None = None,
        idle_timeout: float | None = 1800.0,
        host_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._project = project
        self._given = host
        self._reload = reload
        self._approver = approver
        self._allowed_hosts = allowed_hosts
        self._idle_timeout = idle_timeout
        self._host_options = dict(host_options or {})
        self.host: Host | None = None
        """The open host, while the lifespan runs."""
        self.mcp: McpServer | None = None
        self.manager: StreamableHTTPSessionManager | None = None

    def routes(self) -> list[BaseRoute]:
        """The routes to mount: ``/mcp``."""
        return [Route("/mcp", endpoint=_McpEndpoint(self), methods=["GET", "POST", "DELETE"])]

    @asynccontextmanager
    async def _host(self) -> AsyncGenerator[Host]:
        if self._given is not None:
            yield self._given
            return
        options = dict(self._host_options)
        if self._approver is not None:
            options["approver"] = self._approver
        async with Host.open(self._project, **options) as host:
            yield host

    @asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncGenerator[None]:
        """Open the host and serve MCP until the ASGI server stops.

        The session manager is built here, inside the running event loop (it makes
        locks bound to the loop that builds it).
        """
        del app
        if self.manager is not None:
            raise HostError("this app is already running; make one ServeApp per server")
        async with self._host() as host, McpServer(host, reload=self._reload).running() as mcp:
            manager = mcp.session_manager(
                allowed_hosts=self._allowed_hosts, idle_timeout=self._idle_timeout
            )
            async with manager.run():
                self.host, self.mcp, self.manager = host, mcp, manager
                try:
                    yield
                finally:
                    self.host = self.mcp = self.manager = None

    def starlette(self) -> Starlette:
        """A Starlette app with :meth:`routes` and :meth:`lifespan`."""
        app = Starlette(routes=self.routes(), lifespan=self.lifespan)
        app.state.toolhost = self
        return app


def asgi_app(project: str | os.PathLike[str] = "agent_src", **options: Any) -> Starlette:
    """The Starlette app ``toolhost serve --transport http`` runs: MCP at ``/mcp``.

    Options are those of :class:`ServeApp`; ``app.state.toolhost`` is the ``ServeApp``.
    Run it with any ASGI server whose lifespan support is on (uvicorn: asyncio only).
    """
    return ServeApp(project, **options).starlette()


async def run_http(
    app: Starlette,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    on_ready: Any = None,
) -> None:
    """Serve ``app`` with uvicorn (asyncio only) until interrupted.

    The socket is bound first, so ``port=0`` picks a free port; ``on_ready(url)`` is
    called with the MCP URL once the server accepts connections.
    """
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        app, lifespan="on", log_level="warning", timeout_graceful_shutdown=2, access_log=False
    )
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/mcp"

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await anyio.sleep(0.02)
        if on_ready is not None:
            on_ready(url)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(announce)
            await server.serve(sockets=[sock])
            tg.cancel_scope.cancel()
    finally:
        sock.close()
