"""The host as an ASGI app: MCP at ``/mcp``, the approval inbox at ``/inbox/``, the
host's figures at ``/stats``.

:class:`ServeApp` opens the host, the MCP server, the SDK's HTTP session manager and the
inbox in its :meth:`~ServeApp.lifespan`, and routes requests to them. ``asgi_app()`` is the
Starlette app ``toolhost serve --transport http`` runs. To mount it in an app of your
own, enter its lifespan in yours (Starlette never runs a mounted app's lifespan)::

    serve = ServeApp("agent_src")

    @asynccontextmanager
    async def lifespan(app):
        async with serve.lifespan():
            yield

    app = Starlette(routes=[*serve.routes(), Route("/", home)], lifespan=lifespan)

The inbox's event streams stay open until it closes: stop a server with
:meth:`ServeApp.close_streams` first (``run_http`` does), or it waits for them until its
graceful-shutdown timeout.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import AsyncGenerator, Callable, Container, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Final, Literal

import anyio
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.auth.routes import build_resource_metadata_url, create_protected_resource_routes
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from host._host import Host
from host.errors import HostError
from host.policy import Approver

from ._auth import SCOPE, ClientTokens, RefusalNotes, client_of
from ._inbox import Inbox
from ._inbox_guard import Guard, Refused, SecurityHeaders
from ._server import McpServer
from ._tools import Expose, NameStyle

__all__ = [
    "ServeApp",
    "asgi_app",
    "run_http",
    "IDLE_TIMEOUT",
    "MAX_SESSIONS",
    "MAX_SESSIONS_PER_CLIENT",
]

IDLE_TIMEOUT: Final = 300.0
"""Seconds an HTTP session may sit with no request in flight before it is closed and its
capsules released. Clients often end without a DELETE; 30 minutes kept one capsule per
such client for that long."""
MAX_SESSIONS: Final = 64
"""HTTP sessions open at once, all clients together (each has its own capsules)."""
MAX_SESSIONS_PER_CLIENT: Final = 16
"""HTTP sessions one client may have open at once."""

Auth = Literal["tokens", "none"] | TokenVerifier
"""How ``/mcp`` knows its clients: ``"tokens"`` (the project's client tokens, ``toolhost
clients add``), a ``TokenVerifier`` of the app's (OAuth 2.1: JWT or introspection), or
``"none"`` (no authentication: loopback clients only)."""


def _loopback(scope: Scope) -> bool:
    client = scope.get("client")
    try:
        return client is not None and ipaddress.ip_address(str(client[0])).is_loopback
    except ValueError:
        return False


class _Verifier:
    """The running app's verifier, for the bearer check built with the routes."""

    def __init__(self) -> None:
        self.current: TokenVerifier | None = None

    async def verify_token(self, token: str) -> AccessToken | None:
        current = self.current
        return None if current is None else await current.verify_token(token)


class _McpEndpoint:
    """``/mcp``: hands each request to the session manager of the running app, holding
    each client to ``max_sessions_per_client`` open sessions (the manager holds the total).

    A client is the one its bearer token names (its address without authentication, when
    only loopback is served). A new session is a POST without ``Mcp-Session-Id``; its id
    is read from the response, and a session the manager no longer has (ended by DELETE
    or by the idle timeout) no longer counts.
    """

    def __init__(self, app: ServeApp) -> None:
        self._app = app
        self._owners: dict[str, str] = {}
        """Session id -> the client that opened it."""
        self._opening: dict[str, int] = {}
        """Client -> sessions it is opening now (their ids are not known yet)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app.auth == "none" and not _loopback(scope):
            response = PlainTextResponse(
                "this server takes no authentication, so it answers loopback clients only",
                status_code=403,
            )
            await response(scope, receive, send)
            return
        manager = self._app.manager
        if manager is None:
            response = PlainTextResponse("the MCP server is not running", status_code=503)
            await response(scope, receive, send)
            return
        headers = {k.lower() for k, _ in scope.get("headers", [])}
        if scope.get("method") != "POST" or b"mcp-session-id" in headers:
            await manager.handle_request(scope, receive, send)
            return
        key = client_of(scope)
        if key is None:
            client = scope.get("client")
            key = f"address {client[0]}" if client else "unknown"
        live = _live_sessions(manager)
        for ended in [sid for sid in self._owners if sid not in live]:
            del self._owners[ended]
        held = sum(1 for owner in self._owners.values() if owner == key)
        held += self._opening.get(key, 0)
        cap = self._app.max_sessions_per_client
        if cap is not None and held >= cap:
            await _refuse_session(
                f"this client already has {held} open MCP sessions (the most one client "
                f"may have: {cap}); end one (DELETE /mcp) or wait until an idle one is "
                "closed",
                scope,
                receive,
                send,
            )
            return

        opening = True  # counted in _opening until its session id is known

        def opened() -> None:
            nonlocal opening
            if opening:
                opening = False
                self._opening[key] -= 1
                if not self._opening[key]:
                    del self._opening[key]

        async def record(message: Message) -> None:
            if message["type"] == "http.response.start":
                for name, value in message.get("headers", []):
                    if name.lower() == b"mcp-session-id":
                        self._owners[value.decode("latin-1")] = key
                opened()  # owned now (or refused): the request may stream on for long
            await send(message)

        self._opening[key] = self._opening.get(key, 0) + 1
        try:
            await manager.handle_request(scope, receive, record)
        finally:
            opened()


def _live_sessions(manager: StreamableHTTPSessionManager) -> Container[str]:
    """The ids of the sessions the manager holds. The SDK keeps them in a private dict
    (the one other place besides ``connection_of`` that reaches inside it: mcp is pinned
    to a narrow range in pyproject.toml)."""
    return manager._server_instances  # pyright: ignore[reportPrivateUsage]


async def _refuse_session(message: str, scope: Scope, receive: Receive, send: Send) -> None:
    """429 with a JSON-RPC error body, as the SDK answers its own session limit."""
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}}
    response = JSONResponse(body, status_code=429, headers={"retry-after": "5"})
    await response(scope, receive, send)


class _InboxEndpoint:
    """``/inbox/``: hands each request to the inbox of the running app."""

    def __init__(self, app: ServeApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        inbox = self._app.inbox
        if inbox is None:
            response = PlainTextResponse("the approval inbox is not running", status_code=503)
            await response(scope, receive, send)
            return
        await inbox(scope, receive, send)


class _StatsEndpoint:
    """``/stats``: ``host.stats()`` as JSON, for whoever holds the inbox's token.

    The token goes in an ``Authorization: Bearer TOKEN`` header, never in the URL (where
    logs keep it); the inbox's browser cookie (a ``__Host-`` cookie for ``/``, so sent
    here too) does not count: a request carrying a cookie and no token is refused like
    any other.
    The ``Host`` header is checked as the inbox checks it (DNS rebinding).
    """

    def __init__(self, app: ServeApp, guard: Guard) -> None:
        self._app = app
        self._guard = guard
        self._asgi = SecurityHeaders(self._serve)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._asgi(scope, receive, send)

    def _check(self, request: Request) -> None:
        guard = self._guard
        guard.check_host(request)
        kind, _, given = request.headers.get("authorization", "").partition(" ")
        if kind.lower() == "bearer" and given:
            if not guard.token_matches(given.strip()):
                guard.refused.append((request.url.path, "wrong token"))
                raise Refused(403, "wrong token: send the inbox's token")
            return
        guard.refused.append((request.url.path, "no token"))
        raise Refused(401, "send the inbox's token: Authorization: Bearer TOKEN")

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            self._check(request)
        except Refused as refused:
            response = refused.response()
            if refused.status == 401:
                response.headers["www-authenticate"] = "Bearer"
            await response(scope, receive, send)
            return
        host = self._app.host
        if host is None:
            response = PlainTextResponse("the host is not running", status_code=503)
        else:
            stats = await host.stats()
            response = Response(stats.model_dump_json(), media_type="application/json")
        await response(scope, receive, send)


class ServeApp:
    """MCP over streamable HTTP for one project, as routes plus a lifespan.

    Args:
        project: the project folder, as for ``Host.open``; or pass ``host``, an open host.
        host: serve this open host instead of opening one (its approver then answers
            the escalations the MCP client cannot; ``Host.open(approver="inbox")`` makes
            that the inbox).
        reload: watch the tool files; a change rebuilds the declarations, restarts the
            capsules and tells clients the tool list changed.
        approver: who answers escalations the MCP client's user cannot (no elicitation,
            or the rule excludes the ``mcp`` channel); default: the inbox when it is
            served, else as ``Host.open``.
        inbox: serve the approval inbox at ``/inbox/`` (default: yes). Its URL, with the
            token a browser needs, is :meth:`inbox_url`.
        inbox_token: the inbox's token (default: a random one per ``ServeApp``).
        allowed_hosts: ``host:port`` patterns accepted besides loopback (``Host`` and
            ``Origin`` headers are checked against DNS rebinding).
        idle_timeout: seconds after which an MCP session with no request in flight (and
            no open event stream) is closed and its capsules released (None: never).
        max_sessions: MCP sessions open at once, all clients together (None: no cap).
        max_sessions_per_client: MCP sessions one client may have open (None: no cap).
        auth: how ``/mcp`` knows its clients. ``"tokens"`` (default): each client sends
            ``Authorization: Bearer TOKEN`` with a token of its own (``toolhost clients
            add NAME``; digests in ``.agent/clients.json``). A ``TokenVerifier`` (the MCP
            SDK's protocol): the app's OAuth 2.1 tokens (JWT or introspection), with
            ``resource_url`` and ``authorization_servers``. ``"none"``: no
            authentication; requests from other than loopback are refused.
        resource_url: with a ``TokenVerifier``: the public URL of ``/mcp``. Only tokens
            issued for it (their RFC 8707 resource) count, and its protected-resource
            metadata (RFC 9728) is served at ``/.well-known/oauth-protected-resource...``
            naming ``authorization_servers``.
        authorization_servers: with ``resource_url``: the OAuth servers that issue its
            tokens.
        required_scopes: scopes every token must grant (default: ``mcp`` for client
            tokens, none for a verifier's).
        names: the tools' MCP names: ``safe`` (``kanban_add``, what every model API
            accepts) or ``dotted`` (the canonical ``kanban.add``).
        expose: what clients see: ``all`` (every tool, and ``run_code``), ``tools`` (every
            tool) or ``code`` (``run_code``, ``search_tools`` and ``read_declaration``:
            a big project's declarations read on demand).
        host_options: more keyword arguments for ``Host.open``.
    """

    def __init__(
        self,
        project: str | os.PathLike[str] = "agent_src",
        *,
        host: Host | None = None,
        reload: bool = False,
        approver: Approver | Literal["inbox"] | None = None,
        inbox: bool = True,
        inbox_token: str | None = None,
        allowed_hosts: list[str] | None = None,
        idle_timeout: float | None = IDLE_TIMEOUT,
        max_sessions: int | None = MAX_SESSIONS,
        max_sessions_per_client: int | None = MAX_SESSIONS_PER_CLIENT,
        names: NameStyle = "safe",
        expose: Expose = "all",
        auth: Auth = "tokens",
        resource_url: str | None = None,
        authorization_servers: Sequence[str] = (),
        required_scopes: Sequence[str] | None = None,
        host_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(auth, str) and auth not in ("tokens", "none"):
            raise HostError(f"auth={auth!r}: use 'tokens', 'none' or a TokenVerifier")
        if (resource_url is not None or authorization_servers) and isinstance(auth, str):
            raise HostError(
                "resource_url and authorization_servers describe an OAuth resource server: "
                "give auth a TokenVerifier that checks that server's tokens"
            )
        if resource_url is not None and not authorization_servers:
            raise HostError("resource_url needs authorization_servers (who issues its tokens)")
        self.auth: Auth = auth
        self._resource = AnyHttpUrl(resource_url) if resource_url is not None else None
        self._authorization_servers = [AnyHttpUrl(u) for u in authorization_servers]
        if required_scopes is None:
            required_scopes = [SCOPE] if auth == "tokens" else []
        self._scopes = list(required_scopes)
        self._verifier = _Verifier()
        if not isinstance(auth, str):
            self._verifier.current = auth
        self._notes: RefusalNotes | None = None
        self.clients: ClientTokens | None = None
        """The project's client tokens (``auth="tokens"``), while the lifespan runs."""
        self._names: NameStyle = names
        self._expose: Expose = expose
        self._project = project
        self._given = host
        self._reload = reload
        self._approver: Approver | Literal["inbox"] | None = approver
        if approver is None and inbox:
            self._approver = "inbox"
        self._allowed_hosts = allowed_hosts
        host_names = [h.rsplit(":", 1)[0] for h in allowed_hosts or []]
        self._guard = Guard(inbox_token, host_names) if inbox else None
        self._idle_timeout = idle_timeout
        self._max_sessions = max_sessions
        self.max_sessions_per_client = max_sessions_per_client
        self._host_options = dict(host_options or {})
        self.host: Host | None = None
        """The open host, while the lifespan runs."""
        self.mcp: McpServer | None = None
        self.manager: StreamableHTTPSessionManager | None = None
        self.inbox: Inbox | None = None
        """The approval inbox, while the lifespan runs (None when not served)."""

    def routes(self) -> list[BaseRoute]:
        """The routes to mount: ``/mcp`` (behind the bearer check unless ``auth="none"``),
        the protected-resource metadata with ``resource_url``, and the inbox under
        ``/inbox/`` and ``/stats`` (both need the inbox's token; without the inbox, neither
        is served)."""
        routes: list[BaseRoute] = [
            Route("/mcp", endpoint=self._mcp_app(), methods=["GET", "POST", "DELETE"])
        ]
        if self._resource is not None:
            routes.extend(
                create_protected_resource_routes(
                    self._resource,
                    self._authorization_servers,
                    scopes_supported=self._scopes or None,
                    resource_name="toolhost",
                )
            )
        if self._guard is not None:
            routes.append(Mount("/inbox", app=_InboxEndpoint(self)))
            routes.append(
                Route("/stats", endpoint=_StatsEndpoint(self, self._guard), methods=["GET"])
            )
        return routes

    def _mcp_app(self) -> ASGIApp:
        """``/mcp``: the SDK's bearer check (Starlette's authentication middleware over
        the verifier, then ``RequireAuthMiddleware``), refusals said as events."""
        endpoint = _McpEndpoint(self)
        if self.auth == "none":
            return endpoint
        metadata = build_resource_metadata_url(self._resource) if self._resource else None
        required = RequireAuthMiddleware(endpoint, self._scopes, metadata)
        self._notes = RefusalNotes(required)
        backend = BearerAuthBackend(self._verifier, resource_server_url=self._resource)
        return AuthenticationMiddleware(self._notes, backend=backend)

    def inbox_url(self, base: str) -> str:
        """The inbox's URL with its token, for a server at ``base``
        (``http://127.0.0.1:8000``). Raises HostError when the inbox is not served."""
        if self._guard is None:
            raise HostError("this app does not serve the inbox (inbox=False)")
        return f"{base.rstrip('/')}/inbox/?token={self._guard.token}"

    def close_streams(self) -> None:
        """End the inbox's event streams (before the server stops: it waits for them)."""
        if self.inbox is not None:
            self.inbox.close()

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
        async with (
            self._host() as host,
            McpServer(
                host, reload=self._reload, names=self._names, expose=self._expose
            ).running() as mcp,
        ):
            manager = mcp.session_manager(
                allowed_hosts=self._allowed_hosts,
                idle_timeout=self._idle_timeout,
                max_sessions=self._max_sessions,
            )
            if self.auth == "tokens":
                self.clients = ClientTokens.of(host.project, host.events)
                self._verifier.current = self.clients
            if self._notes is not None:
                self._notes.events = host.events
            async with AsyncExitStack() as stack:
                await stack.enter_async_context(manager.run())
                if self._guard is not None:
                    inbox = Inbox(host.store, redact=host.mediator.redact, guard=self._guard)
                    self.inbox = await stack.enter_async_context(inbox.running())
                self.host, self.mcp, self.manager = host, mcp, manager
                try:
                    yield
                finally:
                    self.host = self.mcp = self.manager = self.inbox = None
                    if self.auth == "tokens":
                        self._verifier.current = self.clients = None

    def starlette(self) -> Starlette:
        """A Starlette app with :meth:`routes` and :meth:`lifespan`."""
        app = Starlette(routes=self.routes(), lifespan=self.lifespan)
        app.state.toolhost = self
        return app


def asgi_app(project: str | os.PathLike[str] = "agent_src", **options: Any) -> Starlette:
    """The Starlette app ``toolhost serve --transport http`` runs: MCP at ``/mcp``, the
    approval inbox at ``/inbox/`` (``app.state.toolhost.inbox_url(base)`` is its URL).

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
    on_exit: Callable[[], None] | None = None,
) -> None:
    """Serve ``app`` with uvicorn (asyncio only) until interrupted.

    The socket is bound first, so ``port=0`` picks a free port; ``on_ready(base)`` is
    called with the server's URL (``http://127.0.0.1:PORT``; MCP is at ``base + "/mcp"``)
    once the server accepts connections. ``on_exit()`` is called
    as the server starts to stop (``ServeApp.close_streams``: the inbox's event streams
    end, so the server need not wait for them); by default, that of
    ``app.state.toolhost`` when it is a ``ServeApp``.
    """
    import uvicorn

    if on_exit is None:
        serve = getattr(app.state, "toolhost", None)
        if isinstance(serve, ServeApp):
            on_exit = serve.close_streams

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if on_exit is not None:
                on_exit()
            super().handle_exit(sig, frame)

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        app, lifespan="on", log_level="warning", timeout_graceful_shutdown=2, access_log=False
    )
    server = Server(config)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}"

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
