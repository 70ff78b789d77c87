"""The MCP server over a host: one host session per client connection.

:class:`McpServer` is the official SDK's low-level server (``mcp`` 2.3) with two
handlers, ``tools/list`` and ``tools/call``. Everything else is the host's:

* **Connections are sessions.** The first call of a client connection opens a host
  :class:`~host.Session` (its own tool capsule, code sandbox and session grants); it is
  closed when the connection ends (end of input on stdio, the client's ``DELETE`` or the
  idle timeout on HTTP, the server stopping). The SDK keeps per-connection state only
  in the handshake era of the protocol (``initialize`` first), so the server serves that
  era alone: a client that starts with the 2026 era's sessionless requests is told which
  versions to use and falls back to ``initialize`` (the SDK's own client does).
* **Calls are made as caller ``agent``**, through the full mediator. Tool errors come
  back as results with ``isError`` (``_tools``); a request the server cannot take (an
  unknown tool) is a protocol error; a failure of the host itself is a protocol error
  that says nothing of the host's insides (the log has the detail).
* **Escalations ask the client's user** (elicitation) when the client can be asked and
  the rule lets the ``mcp`` channel answer; otherwise the approver the host had before
  the server wrapped it decides.
* **Events that concern a call or a connection reach the client**: a ``progress``
  event of a call (``call_id``, and ``fraction`` in 0..1 and/or ``message``) is an MCP
  progress notification when the request carried a progress token; policy decisions of
  its calls, and capsule restarts of its session, are log notifications.
* **Reload**: with ``reload=True`` the tool files are watched; a change rebuilds the
  declarations, restarts every session's capsules and tells every client that the tool
  list changed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import AsyncGenerator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal, get_args

import anyio
import anyio.abc
import mcp.types as types
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.runner import serve_loop
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from host._display import escape_text
from host._events import Event
from host._host import Host, Session
from host.declare import helper_call
from host.errors import HostError, InvalidArguments
from host.policy import Approval, ApprovalRequest, Approver, Channel, channel_of

from ._stdio import stdio_streams
from ._tools import (
    RUN_CODE,
    RUN_CODE_OPTIONS,
    Expose,
    Listing,
    NameStyle,
    ToolEntry,
    call_arguments,
    code_result,
    error_result,
    listing,
    value_result,
)

__all__ = ["McpServer", "APPROVAL_SCHEMA", "connection_of"]

logger = logging.getLogger("toolhost.serve")

APPROVAL_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "decision": {
            "type": "string",
            "title": "Decision",
            "description": "Let this tool call run?",
            "oneOf": [
                {"const": "approve_once", "title": "Approve once"},
                {"const": "approve_session", "title": "Approve for this session"},
                {"const": "approve_always", "title": "Always approve"},
                {"const": "deny", "title": "Deny"},
            ],
        }
    },
    "required": ["decision"],
}
"""What the client's user is asked when a call escalates (a flat form, as MCP wants):
titled choices (``oneOf`` of ``const``), which protocol versions from 2025-11-25 define."""

LEGACY_APPROVAL_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "decision": {
            "type": "string",
            "title": "Decision",
            "description": "Let this tool call run?",
            "enum": [c["const"] for c in APPROVAL_SCHEMA["properties"]["decision"]["oneOf"]],
            "enumNames": [c["title"] for c in APPROVAL_SCHEMA["properties"]["decision"]["oneOf"]],
        }
    },
    "required": ["decision"],
}
"""The same question for a client that negotiated 2025-06-18, the first version with
elicitation: an ``enum`` of the choices (``enumNames`` their titles), and no ``mode``."""

_TITLED_CHOICES: Final = "2025-11-25"
"""The first protocol version whose elicitation has ``mode`` and titled choices."""

_ANSWERS: Final[dict[str, tuple[bool, Literal["once", "session", "always"]]]] = {
    "approve_once": (True, "once"),
    "approve_session": (True, "session"),
    "approve_always": (True, "always"),
    "deny": (False, "once"),
}
_OUTBOX: Final = 256
"""Notifications a connection holds unsent; more are dropped (a flood never blocks)."""
_DRAIN: Final = 5.0
"""Seconds a call's result waits for its own notifications to go out first."""

LogLevel = Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]
_LEVELS: Final[tuple[LogLevel, ...]] = get_args(LogLevel)
"""RFC 5424's levels as MCP uses them, least severe first."""


def connection_of(ctx: ServerRequestContext[Any, Any]) -> Connection:
    """The SDK's object for the client connection a request came on.

    ``ctx.session`` is a new proxy for every request; the per-connection ``Connection``
    (with its ``state`` and the ``exit_stack`` unwound when the connection ends) has no
    public route from a low-level handler in mcp 2.3, only the proxy's private
    ``_connection``. This is the one place that reaches for it, and why ``mcp`` is
    pinned to ``>=2.3,<2.4`` (pyproject.toml).
    """
    return ctx.session._connection  # pyright: ignore[reportPrivateUsage]


async def _log(
    session: ServerSession,
    level: LogLevel,
    data: Any,
    related: types.RequestId | None,
    logger: str = "toolhost",
) -> None:
    """A log notification. The SDK marks logging deprecated (for the 2026 era) and warns
    when the method is called; the warning is silenced around the call only."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        sending = session.send_log_message(  # pyright: ignore[reportDeprecated]
            level, data, logger=logger, related_request_id=related
        )
    await sending


async def _handshake_only(
    ctx: ServerRequestContext[Any, Any], call_next: CallNext
) -> HandlerResult:
    """Refuse the 2026 era's sessionless requests, naming the versions served."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        raise MCPError(
            code=types.UNSUPPORTED_PROTOCOL_VERSION,
            message="toolhost serves one session per connection: start with initialize",
            data={"supported": list(HANDSHAKE_PROTOCOL_VERSIONS)},
        )
    return await call_next(ctx)


class _Server(Server[dict[str, Any]]):
    """The SDK's low-level server, advertising ``tools.listChanged`` on every transport
    (the HTTP session manager asks for the default options)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


@dataclass(slots=True)
class _Note:
    """One notification waiting to go out on a connection."""

    kind: Literal["log", "progress", "tools_changed"]
    request: _Request | None = None
    level: LogLevel = "info"
    data: Any = None
    logger: str = "toolhost"
    progress: float = 0.0
    total: float | None = None
    message: str | None = None


class _Request:
    """One ``tools/call`` in flight: the calls it makes and its pending notifications."""

    __slots__ = ("calls", "conn", "ctx", "drained", "last", "pending", "steps", "wants_progress")

    def __init__(self, conn: _Connection, ctx: ServerRequestContext[Any, Any]) -> None:
        self.conn = conn
        self.ctx = ctx
        self.calls: list[str] = []
        self.pending = 0
        self.drained: anyio.Event | None = None
        self.steps = 0
        self.last = 0.0
        self.wants_progress = bool(ctx.meta and ctx.meta.get("progress_token") is not None)

    def sent(self) -> None:
        self.pending -= 1
        if self.pending <= 0 and self.drained is not None:
            self.drained.set()

    async def drain(self) -> None:
        """Wait (bounded) until this request's notifications went out before its result."""
        if self.pending > 0:
            self.drained = anyio.Event()
            with anyio.move_on_after(_DRAIN):
                await self.drained.wait()


class _Connection:
    """One client connection: its host session, opened on first use, and its outbox."""

    def __init__(
        self,
        server: McpServer,
        session: ServerSession,
        can_elicit: bool,
        given: Session | None = None,
    ) -> None:
        self._server = server
        self.proxy = session
        """The first request's session proxy: it keeps the connection for notifications
        outside any request (the connection's own channel)."""
        self.can_elicit = can_elicit
        self.session: Session | None = None
        self.session_id: str | None = None
        self._given = given
        """A session the connection was given (``serve_streams(session=...)``): used, not
        opened, and left open when the connection ends."""
        self.closed = False
        self.dropped = 0
        self.min_level = 0
        """The least severe level this client's log messages have (``logging/setLevel``;
        until it says, every level)."""
        self._lock = anyio.Lock()
        self._stack = AsyncExitStack()
        self._send, self._receive = anyio.create_memory_object_stream[_Note](_OUTBOX)

    async def open_session(self) -> Session:
        session = self.session
        if session is not None:
            return session
        async with self._lock:
            if self.session is None:
                if self.closed:
                    raise HostError("the connection is closed")
                if self._given is not None:
                    session = self._given
                else:
                    session = await self._stack.enter_async_context(self._server.host.session())
                self.session_id = session.id
                self._server.bind(self, session.id)
                self.session = session
            return self.session

    async def open_quietly(self) -> None:
        try:
            await self.open_session()
        except Exception as exc:  # the first call says why
            logger.debug("the session of a new connection did not open: %r", exc)

    def push(self, note: _Note) -> None:
        if self.closed:
            return
        if note.kind == "log" and _LEVELS.index(note.level) < self.min_level:
            return  # below the level the client set
        try:
            self._send.send_nowait(note)
        except anyio.WouldBlock:
            self.dropped += 1
            return
        if note.request is not None:
            note.request.pending += 1

    def log(
        self, request: _Request | None, level: LogLevel, data: Any, logger: str = "toolhost"
    ) -> None:
        self.push(_Note("log", request, level, data, logger=logger))

    async def pump(self) -> None:
        """Send the outbox in order until the connection closes."""
        async with self._receive:
            async for note in self._receive:
                try:
                    await self._deliver(note)
                except Exception as exc:  # a connection going away: nothing to tell
                    logger.debug("notification not delivered: %r", exc)
                finally:
                    if note.request is not None:
                        note.request.sent()

    async def _deliver(self, note: _Note) -> None:
        request = note.request
        if note.kind == "tools_changed":
            await self.proxy.send_tool_list_changed()
        elif note.kind == "progress" and request is not None:
            await request.ctx.session.report_progress(note.progress, note.total, note.message)
        elif request is not None:
            await _log(
                request.ctx.session, note.level, note.data, request.ctx.request_id, note.logger
            )
        else:
            await _log(self.proxy, note.level, note.data, None)

    async def aclose(self) -> None:
        self.closed = True
        self._send.close()
        async with self._lock:
            with anyio.CancelScope(shield=True):
                await self._stack.aclose()
        self._server.unbind(self)


_GIVEN: Final = "toolhost.session"
"""The key of the session ``serve_streams(session=...)`` gives its connection, in the
lifespan state of that connection's serve loop (the one thing per connection the SDK
hands every handler; a context variable would be the sender's, not the connection's)."""

_REQUEST: ContextVar[_Request | None] = ContextVar("toolhost_mcp_request", default=None)
"""The ``tools/call`` being served: set in its handler, inherited by the tasks it starts
(the code sandbox's calls), read by the approver and the event listener."""


class _Router:
    """The host's approver while it serves MCP: the client's user when it can be asked
    and the rule lets the ``mcp`` channel answer, else the approver from before."""

    def __init__(self, fallback: Approver) -> None:
        self.fallback = fallback
        decide = getattr(fallback, "decide", None)
        self._ask: Any = decide if callable(decide) else fallback
        self._channel: Channel = channel_of(fallback)

    def __repr__(self) -> str:
        return f"<mcp approver, else {self.fallback!r}>"

    async def decide(self, request: ApprovalRequest) -> Approval | bool:
        current = _REQUEST.get()
        if (
            current is not None
            and current.conn.can_elicit
            and current.conn.session_id == request.session_id
            and (request.approvers is None or "mcp" in request.approvers)
        ):
            return await _elicit(current, request)
        answer = await self._ask(request)
        if type(answer) is bool:
            return Approval(answer, request_id=request.id, channel=self._channel)
        if isinstance(answer, Approval) and answer.channel is None:
            return replace(answer, channel=self._channel)
        return answer  # anything else: the escalation denies it


_FULL_TEXT: Final = 32 * 1024
"""Characters of arguments an MCP question shows in full when the bounded view cuts them;
longer ones cannot be approved over MCP (the inbox or the terminal pages them)."""

_CONFIRM: Final = "confirm"
"""The form's field an allow of a request with warnings needs, set to true."""


@dataclass(frozen=True, slots=True)
class _Shown:
    """The arguments as an MCP question shows them (rendered once per question)."""

    text: str
    whole: bool
    """Whether ``text`` is all of the arguments: else no allow over MCP counts."""
    size: int
    """Characters of the arguments in full."""


def _shown(request: ApprovalRequest) -> _Shown:
    """The arguments as the question shows them.

    A view cut for length is never what is approved in one step: the full text replaces
    it when it fits in a question, and otherwise no allow over MCP counts."""
    if not request.elided:
        return _Shown(request.rendered, True, len(request.rendered))
    full = request.full_text()
    if len(full) <= _FULL_TEXT:
        return _Shown(full, True, len(full))
    return _Shown(request.rendered, False, len(full))


def _question(request: ApprovalRequest, shown: _Shown) -> str:
    whole = shown.whole
    lines = [
        f"Let the agent call {request.tool}?",
        f"rule: {request.rule}" + (f": {request.reason}" if request.reason else ""),
        "arguments, exactly as the tool will receive them"
        + (", in full:" if request.elided and whole else ":"),
        shown.text,
    ]
    lines.extend(f"warning: {w}" for w in request.warnings)
    if not whole:
        lines.append(
            f"The arguments are too long to show here in full ({shown.size} "
            "characters): an allow from this client is refused. Answer in the approval "
            "inbox or at the terminal, which show all of them."
        )
    elif request.warnings:
        lines.append(f"To allow it, also set {_CONFIRM} after reading the warnings above.")
    lines.append(f"Without an answer within {request.timeout:g} s the call is denied.")
    return "\n".join(lines)


def _schema(base: dict[str, Any], request: ApprovalRequest) -> dict[str, Any]:
    """The form: the decision, and for a request with warnings the confirmation."""
    if not request.warnings:
        return base
    confirm = {
        "type": "boolean",
        "title": "I have read the warnings",
        "description": "An allow counts only with this set: the arguments carry warnings.",
        "default": False,
    }
    return {**base, "properties": {**base["properties"], _CONFIRM: confirm}}


async def _elicit(current: _Request, request: ApprovalRequest) -> Approval:
    """Ask the user of the client that made the call, on that call's own stream."""
    ctx = current.ctx
    shown = _shown(request)
    if ctx.session.protocol_version >= _TITLED_CHOICES:  # versions are dates: they sort
        result = await ctx.session.elicit_form(
            _question(request, shown),
            _schema(APPROVAL_SCHEMA, request),
            related_request_id=ctx.request_id,
        )
    else:  # the form 2025-06-18 defines: no mode, an enum of the choices
        params = types.ElicitRequestFormParams.model_construct(
            message=_question(request, shown),
            requested_schema=_schema(LEGACY_APPROVAL_SCHEMA, request),
            mode=None,
        )  # mode None: left out of the request, which drops None fields
        result = await ctx.session.send_request(
            types.ElicitRequest(params=params),
            types.ElicitResult,
            metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
        )
    if result.action != "accept":
        return Approval(
            False,
            request_id=request.id,
            note=f"the user of the MCP client answered {result.action}",
            channel="mcp",
        )
    choice = (result.content or {}).get("decision")
    answer = _ANSWERS.get(choice) if isinstance(choice, str) else None
    if answer is None:
        return Approval(
            False, request_id=request.id, note="the answer was none of the choices", channel="mcp"
        )
    allow, remember = answer
    if allow and not shown.whole:
        return Approval(
            False,
            request_id=request.id,
            note="the arguments are too long to approve over MCP; answer in the approval "
            "inbox or at the terminal",
            channel="mcp",
        )
    if allow and request.warnings and (result.content or {}).get(_CONFIRM) is not True:
        return Approval(
            False,
            request_id=request.id,
            note=f"an allow was not confirmed ({_CONFIRM} was not set, and the arguments "
            "carry warnings)",
            channel="mcp",
        )
    note = None if allow else "the user of the MCP client denied it"
    return Approval(allow, remember, request_id=request.id, note=note, channel="mcp")


def _tool_signature(tools_dir: Path) -> tuple[tuple[str, int, int, int], ...]:
    """What ``--reload`` compares: every Python file under the tools folder."""
    out: list[tuple[str, int, int, int]] = []
    for folder, dirs, files in os.walk(tools_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    out.append((path, st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


_SESSION_EVENTS: Final[dict[str, tuple[LogLevel, tuple[str, ...]]]] = {
    "capsule_crashed": ("error", ("reason",)),
    "capsule_unavailable": ("error", ("reason",)),
    "tool_file_failed": ("error", ("file", "reason")),
    "call_timed_out": ("warning", ("tool", "timeout")),
    "sandbox_reset": ("warning", ("reason", "limit")),
    "tools_reloaded": ("notice", ("message", "tools", "state_lost")),
    "session_released": ("notice", ("message", "idle", "capsules", "state_lost")),
}
"""Events of a session its client is told about (as log notifications), and the fields
it sees; ``capsule_started`` is told when it is a restart."""


_INSTRUCTIONS: Final[dict[Expose, str]] = {
    "all": "Tools of a toolhost project, each call decided by its policy. run_code runs "
    "Python with every tool as an awaitable global; its description lists them.",
    "tools": "Tools of a toolhost project, each call decided by its policy.",
    "code": "A toolhost project in code mode: run_code runs Python with every tool of the "
    "project as an awaitable global, each call decided by its policy. Find the tools with "
    "search_tools and read their declarations with read_declaration (or, inside run_code, "
    "toolhost.search and toolhost.declaration).",
}


class McpServer:
    """The tools of a host, and ``run_code``, served over MCP.

    Use it open: ``async with McpServer(host).running() as server:``, then
    :meth:`serve_stdio`, :meth:`serve_streams` (one connection over a pair of streams)
    or :meth:`session_manager` (streamable HTTP, see ``host.serve.asgi_app``).
    """

    def __init__(
        self,
        host: Host,
        *,
        reload: bool = False,
        reload_interval: float = 0.3,
        name: str = "toolhost",
        names: NameStyle = "safe",
        expose: Expose = "all",
    ) -> None:
        self.host = host
        self._reload = reload
        self._interval = reload_interval
        self._names: NameStyle = names
        self._expose: Expose = expose
        self._listing: Listing = listing(host.scope, host.discovery.tools, names, expose)
        self._connections: set[_Connection] = set()
        self._by_session: dict[str, _Connection] = {}
        self._calls: dict[str, _Request] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self.reloads = 0
        """How many times the tool files were reloaded with a change."""
        # The SDK warns that logging is deprecated in the 2026 era; the handshake versions
        # served here define it (clients set its level), so the warning is silenced here.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            self.server: Server[dict[str, Any]] = _Server(  # pyright: ignore[reportDeprecated]
                name,
                version="0.1.0",
                instructions=_INSTRUCTIONS[expose],
                on_list_tools=self._list_tools,
                on_call_tool=self._call_tool,
                on_set_logging_level=self._set_level,  # which declares the logging capability
            )
        self.server.middleware.insert(0, _handshake_only)
        self.server.add_notification_handler(
            "notifications/initialized", types.NotificationParams, self._on_initialized
        )

    def __repr__(self) -> str:
        return f"<McpServer {self.host!r} connections={len(self._connections)}>"

    @property
    def sessions(self) -> list[str]:
        """The ids of the host sessions of the open client connections."""
        return sorted(self._by_session)

    @property
    def tools(self) -> list[types.Tool]:
        """The MCP tools served now."""
        return list(self._listing.tools)

    # -- lifetime -----------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncGenerator[McpServer]:
        """Serve: route escalations, follow events, watch the tool files if asked."""
        escalations = self.host.mediator.escalations
        previous = escalations.approver
        async with anyio.create_task_group() as tg:
            self._tg = tg
            unsubscribe = self.host.events.subscribe(self._on_event)
            escalations.approver = _Router(previous)
            if self._reload:
                tg.start_soon(self._watch)
            try:
                yield self
            finally:
                escalations.approver = previous
                unsubscribe()
                with anyio.CancelScope(shield=True):
                    for conn in list(self._connections):
                        await conn.aclose()
                self._tg = None
                tg.cancel_scope.cancel()

    def _options(self) -> InitializationOptions:
        return self.server.create_initialization_options()

    async def serve_streams(
        self,
        read: Any,
        write: Any,
        *,
        session: Session | None = None,
    ) -> None:
        """Serve one client connection over a pair of streams, until it ends: ``read``
        yields ``SessionMessage | Exception``, ``write`` takes ``SessionMessage`` (anyio
        memory object streams, or the SDK's own, as ``stdio_server`` gives).

        Args:
            session: the host session the client's calls run in, left open when the
                connection ends (``toolhost serve`` over stdio gives the host's default
                session: its one client then needs no second capsule); default: a new
                session, opened on first use and closed with the connection.
        """
        state: dict[str, Any] = {} if session is None else {_GIVEN: session}
        await serve_loop(
            self.server, read, write, lifespan_state=state, init_options=self._options()
        )

    async def serve_stdio(self, *, session: Session | None = None) -> None:
        """Serve one client on this process's stdin and stdout until end of input, in
        ``session`` if one is given (as :meth:`serve_streams`).

        While it serves, file descriptors 0 and 1 point elsewhere (``_stdio``; the SDK's
        transport, with ``TOOLHOST_SDK_STDIO=1``, does the same), so a stray ``print``
        cannot break the protocol.
        """
        if os.environ.get("TOOLHOST_SDK_STDIO") == "1":  # the SDK's threaded transport
            async with stdio_server() as (read, write):
                await self.serve_streams(read, write, session=session)
            return
        async with stdio_streams() as (read, write):
            await self.serve_streams(read, write, session=session)

    def session_manager(
        self,
        *,
        allowed_hosts: list[str] | None = None,
        idle_timeout: float | None = 300.0,
        max_sessions: int | None = 64,
    ) -> StreamableHTTPSessionManager:
        """The streamable HTTP transport (stateful: one session per ``Mcp-Session-Id``).

        Its ``run()`` must be entered by the ASGI app's lifespan. Host and Origin headers
        are checked (DNS rebinding): loopback names, plus ``allowed_hosts``.
        """
        hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*", *(allowed_hosts or [])]
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=hosts,
            allowed_origins=[f"http://{h}" for h in hosts],
        )
        return StreamableHTTPSessionManager(
            app=self.server,
            stateless=False,
            json_response=False,
            security_settings=security,
            session_idle_timeout=idle_timeout,
            max_sessions=max_sessions,
        )

    # -- connections --------------------------------------------------------------------

    def _connection(self, ctx: ServerRequestContext[Any, Any]) -> _Connection:
        conn = connection_of(ctx)
        state = conn.state.get("toolhost")
        if isinstance(state, _Connection):
            return state
        if self._tg is None:
            raise MCPError(code=types.INTERNAL_ERROR, message="the server is not running")
        session = ctx.session
        can_elicit = session.can_send_request and session.check_client_capability(
            types.ClientCapabilities(elicitation=types.ElicitationCapability())
        )
        given = ctx.lifespan_context.get(_GIVEN)  # serve_streams' own, per connection
        state = _Connection(self, session, can_elicit, given)
        conn.state["toolhost"] = state
        conn.exit_stack.push_async_callback(state.aclose)
        self._connections.add(state)
        self._tg.start_soon(state.pump)
        return state

    def bind(self, conn: _Connection, session_id: str) -> None:
        self._by_session[session_id] = conn

    def unbind(self, conn: _Connection) -> None:
        self._connections.discard(conn)
        if conn.session_id is not None:
            self._by_session.pop(conn.session_id, None)

    # -- handlers -----------------------------------------------------------------------

    async def _on_initialized(
        self, ctx: ServerRequestContext[Any, Any], params: types.NotificationParams | None
    ) -> None:
        """A client connected: open its session now, so its capsule starts while the
        client lists the tools (a failure to start is reported by the first call)."""
        del params
        conn = self._connection(ctx)
        if self._tg is not None:
            self._tg.start_soon(conn.open_quietly)

    async def _set_level(
        self, ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        """``logging/setLevel``: this connection's log messages from that level up."""
        self._connection(ctx).min_level = _LEVELS.index(params.level)
        return types.EmptyResult()

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        del params
        self._connection(ctx)  # so that it hears of changes to the list
        return types.ListToolsResult(tools=self._listing.tools)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        entry = self._listing.entries.get(params.name)
        if entry is None:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"Unknown tool: {escape_text(params.name[:200])}",
            )
        request = _Request(self._connection(ctx), ctx)
        token = _REQUEST.set(request)
        try:
            result = await self._run(entry, request, params.arguments or {})
        except HostError as exc:  # the session or sandbox cannot start, bad arguments
            result = error_result(exc, self.host.mediator.redact)
        except Exception:
            logger.exception("the host failed on a call of %s", entry.tool.name)
            raise MCPError(
                code=types.INTERNAL_ERROR,
                message="the host failed on this call (its log says why); the call may not "
                "have run",
            ) from None
        finally:
            _REQUEST.reset(token)
            for call_id in request.calls:
                self._calls.pop(call_id, None)
        await request.drain()
        return result

    async def _run(
        self, entry: ToolEntry, request: _Request, arguments: Mapping[str, Any]
    ) -> types.CallToolResult:
        if entry.helper is not None:  # search_tools, read_declaration: the declarations
            value = helper_call(self.host.scope.catalog, entry.helper, [], dict(arguments))
            return value_result(entry, value, self.host.mediator.redact)
        session = await request.conn.open_session()
        spec = entry.spec
        if spec is None:  # run_code
            code = arguments.get("code")
            unknown = sorted(set(arguments) - {"code", *RUN_CODE_OPTIONS})
            if not isinstance(code, str) or unknown:
                raise InvalidArguments(
                    RUN_CODE,
                    "run_code takes code (a string) and optionally "
                    + ", ".join(RUN_CODE_OPTIONS)
                    + (f"; not {', '.join(unknown)}" if unknown else ""),
                )
            options = {k: arguments[k] for k in RUN_CODE_OPTIONS if k in arguments}
            return code_result(await session.run_code(code, **options))
        args, kwargs = call_arguments(entry, arguments)
        try:
            value = await session.call_as("agent", spec.name, args, kwargs)
        except HostError as exc:
            return error_result(exc, self.host.mediator.redact)
        return value_result(entry, value, self.host.mediator.redact)

    # -- events -------------------------------------------------------------------------

    def _request_for(self, event: Event) -> _Request | None:
        found = self._calls.get(str(event.data.get("call_id")))
        if found is not None:
            return found
        current = _REQUEST.get()
        if current is not None and current.conn.session_id == event.session:
            return current
        return None

    def _on_event(self, event: Event) -> None:
        kind = event.kind
        data = event.data
        redact = self.host.mediator.redact
        if kind == "policy_decision":
            current = _REQUEST.get()
            if current is None or current.conn.session_id != event.session:
                return
            call_id = str(data.get("call_id"))
            current.calls.append(call_id)
            self._calls[call_id] = current
            decision = data.get("decision")
            level: LogLevel = (
                "info" if decision == "allow" else "notice" if decision == "escalate" else "warning"
            )
            fields = ("call_id", "tool", "decision", "rule", "policy_version")
            current.conn.log(current, level, _fields(kind, data, fields, redact))
        elif kind in ("policy_denied", "policy_escalation"):
            request = self._request_for(event)
            if request is not None:
                fields = ("call_id", "tool", "rule", "error", "request_id")
                level = "warning" if kind == "policy_denied" else "notice"
                request.conn.log(request, level, _fields(kind, data, fields, redact))
        elif kind == "progress":
            request = self._request_for(event)
            if request is not None and request.wants_progress:
                self._progress(request, data)
        elif kind == "tool_log":  # ctx.log: to the client of that call only
            request = self._request_for(event)
            said = data.get("level")
            if request is not None and said in _LEVELS:
                text = redact(str(data.get("message")))[:1000]
                level = _LEVELS[_LEVELS.index(said)]
                request.conn.log(request, level, text, logger=str(data.get("tool")))
        elif kind in _SESSION_EVENTS or (kind == "capsule_started" and data.get("restart")):
            conn = self._by_session.get(event.session or "")
            if conn is not None:
                level, fields = _SESSION_EVENTS.get(kind, ("warning", ("message", "state_lost")))
                conn.log(None, level, _fields(kind, data, fields, redact))

    def _progress(self, request: _Request, data: Mapping[str, Any]) -> None:
        fraction: Any = data.get("fraction")
        message = data.get("message")
        text = self.host.mediator.redact(str(message))[:1000] if message is not None else None
        if type(fraction) in (int, float) and 0 <= fraction <= 1:
            progress, total = max(float(fraction), request.last), 1.0
            request.last = progress
        else:  # a message alone: count the steps
            request.steps += 1
            progress, total = float(request.steps), None
        request.conn.push(_Note("progress", request, progress=progress, total=total, message=text))

    # -- reload -------------------------------------------------------------------------

    async def _watch(self) -> None:
        tools_dir = self.host.project.tools_dir
        last = _tool_signature(tools_dir)
        while True:
            await anyio.sleep(self._interval)
            now = _tool_signature(tools_dir)
            if now == last:
                continue
            last = now
            while True:  # an editor writes in several steps: wait until it settles
                await anyio.sleep(self._interval)
                now = _tool_signature(tools_dir)
                if now == last:
                    break
                last = now
            await self.reload()

    async def reload(self) -> bool:
        """Read the tool files again; on a change, restart the sessions' capsules and
        tell every client that the tool list changed. Returns whether it changed."""
        try:
            changed = await self.host.reload_tools()
            if changed:
                self._listing = listing(
                    self.host.scope, self.host.discovery.tools, self._names, self._expose
                )
        except HostError as exc:
            text = self.host.mediator.redact(str(exc))
            for conn in list(self._connections):
                conn.log(
                    None,
                    "error",
                    {
                        "event": "tools_reload_failed",
                        "error": text,
                        "message": "the tools served before stay until the files can be declared",
                    },
                )
            return False
        if not changed:
            return False
        self.reloads += 1
        for conn in list(self._connections):
            conn.push(_Note("tools_changed"))
        return True


def _fields(
    kind: str, data: Mapping[str, Any], names: tuple[str, ...], redact: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {"event": kind}
    for name in names:
        value = data.get(name)
        if value is None:
            continue
        out[name] = redact(value)[:2000] if isinstance(value, str) else value
    return out
