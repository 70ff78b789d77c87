"""The tool context, and results that carry files: what a tool may ask of the host.

A tool asks for its context with a parameter annotated ``ToolContext``::

    from capsule.context import Attachment, Result, ToolContext

    async def forecast(city: str, ctx: ToolContext) -> Result[dict]:
        key = await ctx.env("WEATHER_API_KEY")       # only names the policy's [env] gives
        await ctx.progress("calling the API", 0.5)   # an event on the host's stream
        await ctx.set_value("last_city", city)       # the session's durable key-value store
        geo = await ctx.call("geo.lookup", city)     # a nested call through the full gate
        return Result({"city": city}, attachments=[Attachment("map.png", "image/png", png)])

That parameter is *hidden*: the host recognises it by its annotation (``ToolContext``,
``ToolContext | None`` or ``Optional[ToolContext]``, imported from this module), and it
is absent from every declaration and schema the model sees and from argument binding, so
no caller can pass it. The capsule fills it in for each call with what the host sent for
that call, and every request a context makes crosses to the host as a frame naming only
the call it belongs to: the host answers from its own record of that call (its tool,
session, caller and chain), never from anything the capsule claims, and refuses a request
for a call that is not in flight on that capsule.

A tool may return a :class:`Result` (a value plus files) or an :class:`Attachment` alone;
the files cross as bytes and are kept in the session's file area by the host.

Standard library only: this module is imported by tool files inside a capsule (CPython or
CPython-WASI), read by the host's type analysis, and imported by the host for the
:class:`Attachment` and :class:`Result` types.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, Generic, Literal, Protocol, TypeVar, cast, get_args

__all__ = [
    "ToolContext",
    "LogLevel",
    "Result",
    "Attachment",
    "ContextError",
    "EnvNotAllowed",
    "ContextLimitExceeded",
    "ContextClosed",
    "CallFailed",
]

_T = TypeVar("_T")

MAX_NAME: Final = 255
"""Longest attachment name and MIME type, in characters."""
MAX_FILES: Final = 64
"""Most attachments one result may carry."""
_MIME: Final = re.compile(r"[A-Za-z0-9][\w.+-]*/[\w.+-]+", re.ASCII)
_DIMENSION: Final = 1 << 31


class ContextError(Exception):
    """A context request the host refused; ``kind`` says why, the message what to do."""

    kind = "context_error"

    def __init__(self, message: str = "", kind: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind

    def __str__(self) -> str:
        return self.message


class EnvNotAllowed(ContextError, KeyError):
    """``ctx.env(name)`` for a name the policy's ``[env]`` neither passes nor sets (and the
    session did not set): the message names the policy key to add."""

    kind = "env_not_allowed"


class ContextLimitExceeded(ContextError):
    """A context request over one of its limits (a value too large, a store too full)."""

    kind = "context_limit"


class ContextClosed(ContextError):
    """The call this context belongs to is over: its context can do nothing more."""

    kind = "context_closed"


class CallFailed(Exception):
    """A nested call (``ctx.call``) that did not produce a value.

    ``kind`` is the host error's kind (``policy_denied``, ``not_approved``,
    ``tool_error``, ``limit_exceeded``, ...), as in ``toolhost call --json``; the error's
    own fields are attributes (``tool``, ``rule``, ``reason``, ``type_name``, ...).
    """

    def __init__(self, kind: str, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        for key, value in fields.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


_CONTEXT_ERRORS: Final[dict[str, type[ContextError]]] = {
    cls.kind: cls for cls in (ContextError, EnvNotAllowed, ContextLimitExceeded, ContextClosed)
}


def _check_dimension(value: object, what: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not 0 < value < _DIMENSION:
        raise ValueError(f"an attachment's {what} is a positive int or None, not {value!r}")
    return value


class Attachment:
    """A file a tool returns, alone or in a :class:`Result`.

    Args:
        name: the file's name (``chart.png``); the host keeps only a safe base name.
        mime_type: its media type (``image/png``, ``text/csv``).
        data: its bytes (``bytes``, ``bytearray`` or ``memoryview``).
        width: for an image, its width in pixels (optional).
        height: for an image, its height in pixels (optional).

    Host-side, an attachment a caller receives also has :attr:`path`: where the host
    keeps it (``.agent/files/SESSION/CALL/NAME``).
    """

    __slots__ = ("data", "height", "mime_type", "name", "path", "width")

    def __init__(
        self,
        name: str,
        mime_type: str,
        data: bytes | bytearray | memoryview,
        width: int | None = None,
        height: int | None = None,
    ) -> None:
        if type(name) is not str or not name or len(name) > MAX_NAME:
            raise ValueError(f"an attachment's name is a str of 1 to {MAX_NAME} characters")
        if (
            type(mime_type) is not str
            or len(mime_type) > MAX_NAME
            or not _MIME.fullmatch(mime_type)
        ):
            raise ValueError(f"an attachment's mime_type is a type/subtype, not {mime_type!r}")
        if isinstance(data, memoryview):
            data = data.tobytes()
        elif isinstance(data, bytearray):
            data = bytes(data)
        elif type(data) is not bytes:
            raise TypeError(f"an attachment's data is bytes, not {type(data).__name__}")
        self.name = name
        self.mime_type = mime_type
        self.data: bytes = data
        self.width = _check_dimension(width, "width")
        self.height = _check_dimension(height, "height")
        self.path: str | None = None
        """Where the host keeps the file (set host-side; None inside a capsule)."""

    @property
    def size(self) -> int:
        """Bytes of :attr:`data`."""
        return len(self.data)

    @property
    def sha256(self) -> str:
        """The SHA-256 of :attr:`data`, in hex."""
        import hashlib

        return hashlib.sha256(self.data).hexdigest()

    def info(self) -> dict[str, Any]:
        """The attachment's metadata as plain data (what agent code sees): ``name``,
        ``mime_type``, ``size``, ``width``, ``height``, ``sha256``; never the bytes, never
        a host path."""
        return {
            "name": self.name,
            "mime_type": self.mime_type,
            "size": self.size,
            "width": self.width,
            "height": self.height,
            "sha256": self.sha256,
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Attachment):
            return NotImplemented
        return (self.name, self.mime_type, self.data, self.width, self.height) == (
            other.name,
            other.mime_type,
            other.data,
            other.width,
            other.height,
        )

    __hash__ = None  # pyright: ignore[reportAssignmentType]  # mutable, compared by value

    def __repr__(self) -> str:
        size = f"{self.width}x{self.height}, " if self.width and self.height else ""
        return f"Attachment({self.name!r}, {self.mime_type!r}, {size}{self.size} bytes)"


class Result(Generic[_T]):
    """A tool's value with files: ``Result(value, attachments=[Attachment(...)])``.

    Declarations show the value's type (and say that files may come along). The app and
    scripts receive the ``Result`` itself, its attachments kept by the host; agent code
    receives the value, and the files go to the run's result.
    """

    __slots__ = ("attachments", "value")

    def __init__(self, value: _T, attachments: Sequence[Attachment] = ()) -> None:
        files = tuple(attachments)
        for item in files:
            if type(item) is not Attachment:
                raise TypeError(f"attachments are Attachment objects, not {type(item).__name__}")
        if len(files) > MAX_FILES:
            raise ValueError(f"a result carries at most {MAX_FILES} attachments")
        self.value: _T = value
        self.attachments: tuple[Attachment, ...] = files

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Result):
            return NotImplemented
        mine: Result[Any] = self
        theirs: Result[Any] = other  # pyright: ignore[reportUnknownVariableType]
        return (mine.value, mine.attachments) == (theirs.value, theirs.attachments)

    __hash__ = None  # pyright: ignore[reportAssignmentType]

    def __repr__(self) -> str:
        return f"Result({self.value!r}, attachments={list(self.attachments)!r})"


class Channel(Protocol):
    """How a context reaches the host (the capsule's serve loop, or the in-process twin).

    Internal: a tool never needs it.
    """

    def request(self, call: int, op: str, args: dict[str, Any]) -> Any:
        """Send a request for call ``call``; returns an awaitable of the host's answer
        (a ``(True, value)`` or ``(False, error data)`` pair)."""
        ...

    def notify(self, call: int, op: str, args: dict[str, Any]) -> None:
        """Send an event for call ``call``; nothing comes back."""
        ...


_EVENT_NAME: Final = re.compile(r"[A-Za-z][\w.-]{0,63}", re.ASCII)

LogLevel = Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]
"""The levels of :meth:`ToolContext.log`: RFC 5424's, least severe first, as MCP uses them."""
_LOG_LEVELS: Final[tuple[str, ...]] = get_args(LogLevel)


class ToolContext:
    """What the host tells a tool about its call, and what the tool may ask of the host.

    Attributes:
        tool: the canonical name of the tool being called (``kanban.close``).
        call_id: the host's id for this call, as in the audit trail.
        session: the id of the session the call belongs to.
        caller: ``agent``, ``script``, ``app`` or ``tool``.
        chain: the callers above this call, outermost first: the caller that started it
            all, then each tool whose context made the next call (``("agent",)`` for a call
            from agent code, ``("agent", "send_email")`` for a call ``send_email`` made).
        metadata: read-only values the app gave the session
            (``host.session(metadata={...})``); a fresh copy for each call.

    The awaitable methods need the capsule's event loop: use them from ``async`` tools.
    A context belongs to one call: once the call is over it refuses every request
    (:class:`ContextClosed`), and the host refuses requests for calls it does not have in
    flight on that capsule.
    """

    __slots__ = (
        "_call",
        "_channel",
        "_open",
        "call_id",
        "caller",
        "chain",
        "metadata",
        "session",
        "tool",
    )

    def __init__(
        self,
        *,
        tool: str,
        call_id: str,
        session: str,
        caller: str,
        chain: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
        channel: Channel | None = None,
        call: int = 0,
    ) -> None:
        self.tool = tool
        self.call_id = call_id
        self.session = session
        self.caller = caller
        self.chain: tuple[str, ...] = tuple(chain)
        self.metadata: Mapping[str, Any] = MappingProxyType(dict(metadata or {}))
        self._channel = channel
        self._call = call
        self._open = channel is not None

    def __repr__(self) -> str:
        return (
            f"ToolContext(tool={self.tool!r}, call_id={self.call_id!r}, "
            f"session={self.session!r}, caller={self.caller!r}, chain={self.chain!r})"
        )

    def __reduce__(self) -> Any:
        raise TypeError("a ToolContext belongs to one call: it cannot be copied or passed on")

    def _close(self) -> None:
        """The call is over (the capsule says so)."""
        self._open = False

    def _channel_for(self, op: str) -> Channel:
        channel = self._channel
        if channel is None or not self._open:
            why = "it is not connected to a host" if channel is None else "its call is over"
            raise ContextClosed(f"ctx.{op}: this context can do nothing more: {why}")
        return channel

    async def _ask(self, op: str, args: dict[str, Any]) -> Any:
        ok, value = await self._channel_for(op).request(self._call, op, args)
        if ok:
            return value
        raise _rebuild(value)

    # -- environment -------------------------------------------------------------------

    async def env(self, name: str) -> str:
        """The value of ``name`` from the policy's ``[env]`` (or set for this session by
        :meth:`set_env`). Raises :class:`EnvNotAllowed` (a ``KeyError``) for any other
        name, naming the policy key that would allow it."""
        return await self._ask("env", {"name": name})

    async def env_type(self, name: str) -> Literal["text", "secret"]:
        """``"secret"`` if the value of ``name`` is never shown (the policy's ``[env]
        secret``, or :meth:`set_env` with ``secret=True``), else ``"text"``; raises as
        :meth:`env` does."""
        return await self._ask("env_type", {"name": name})

    async def set_env(self, name: str, value: str, *, secret: bool = True) -> None:
        """Set ``name`` for the rest of this session (read back with :meth:`env`, by any
        tool of the session). Secret unless ``secret=False``: its value is then replaced
        wherever the host shows text. Names the policy's ``[env]`` passes or sets cannot
        be changed."""
        await self._ask("set_env", {"name": name, "value": value, "secret": secret})

    # -- the session's key-value store -------------------------------------------------

    async def get_value(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key`` for this session, or ``default``."""
        found = await self._ask("get", {"key": key})
        return default if found is None else found

    async def set_value(self, key: str, value: Any) -> None:
        """Store plain data under ``key`` for this session (``None`` removes the key).

        Durable: it survives a capsule restart and a host restart that reopens the same
        session id. Raises :class:`ContextLimitExceeded` over the policy's
        ``[limits] max_value_size`` or ``max_session_store``, ``TypeError`` for a value
        that is not plain data.
        """
        await self._ask("set", {"key": key, "value": _plain(value, "ctx.set_value")})

    # -- events ------------------------------------------------------------------------

    def emit(self, event: str, data: Any = None) -> None:
        """Send a ``tool_event`` to the host's event stream (``event`` names it: letters,
        digits, ``_.-``, at most 64 characters; ``data`` is plain data). Nothing comes
        back; the host drops events beyond its rate limit."""
        if type(event) is not str or not _EVENT_NAME.fullmatch(event):
            raise ValueError(
                f"an event name is a letter then up to 63 of [A-Za-z0-9_.-], not {event!r}"
            )
        self._channel_for("emit").notify(
            self._call, "emit", {"event": event, "data": _plain(data, "ctx.emit")}
        )

    async def log(self, message: str, level: LogLevel = "info") -> None:
        """Log ``message`` for this call: a ``tool_log`` event on the host's stream, and over
        MCP a log message to the client that made the call (at the level it asked for,
        ``logging/setLevel``), never to another session's. ``level`` is one of RFC 5424's,
        as MCP uses them: ``debug``, ``info``, ``notice``, ``warning``, ``error``,
        ``critical``, ``alert``, ``emergency``. Secrets are replaced as in every event;
        the host drops logs beyond its event rate limit."""
        if level not in _LOG_LEVELS:
            raise ValueError(f"level is one of {', '.join(_LOG_LEVELS)}, not {level!r}")
        if type(message) is not str:
            raise TypeError(f"message is a str, not {type(message).__name__}")
        self._channel_for("log").notify(self._call, "log", {"message": message, "level": level})

    async def progress(self, message: str, fraction: float | None = None) -> None:
        """Report progress: a ``progress`` event (and, over MCP, a progress notification to
        the client that made the call). ``fraction`` from 0 to 1, if known."""
        if fraction is not None and (type(fraction) not in (int, float) or not 0 <= fraction <= 1):
            raise ValueError(f"fraction is a number from 0 to 1 or None, not {fraction!r}")
        if type(message) is not str:
            raise TypeError(f"message is a str, not {type(message).__name__}")
        self._channel_for("progress").notify(
            self._call, "progress", {"message": message, "fraction": fraction}
        )

    # -- nested calls ------------------------------------------------------------------

    async def call(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Call another tool through the host's full gate, as caller ``tool``.

        The host decides it against the rules for caller ``tool`` and for the caller at
        the top of :attr:`chain` (the stricter decision wins), refuses it if this tool's
        ``__uses__`` does not list ``name``, if the chain is already 8 tools deep, or if
        ``name`` is already in the chain, and audits it with its chain. Returns the
        tool's value (a :class:`Result` or :class:`Attachment` if it returned files);
        raises :class:`CallFailed` (its ``kind`` says why: ``policy_denied``,
        ``tool_error``, ...).
        """
        return await self._ask(
            "call",
            {
                "name": name,
                "args": _plain(list(args), "ctx.call"),
                "kwargs": _plain(kwargs, "ctx.call"),
            },
        )


def _plain(value: Any, where: str) -> Any:
    """``value`` as plain data for a request, or ``TypeError`` saying why not."""
    from ._convert import NotPlainData, to_plain

    try:
        return to_plain(value, "value")
    except NotPlainData as exc:
        if exc.type_name.endswith("ToolContext"):
            raise TypeError(
                f"{where}: a ToolContext cannot be passed on: the host gives every call its "
                "own context"
            ) from None
        raise TypeError(f"{where}: not plain data: {exc}") from None


def _rebuild(data: Any) -> Exception:
    """The exception a tool sees for the host's error data (strings and numbers only)."""
    error = cast("dict[str, Any]", data) if isinstance(data, dict) else {}
    kind = str(error.get("kind", ""))
    message = str(error.get("message", ""))
    context = _CONTEXT_ERRORS.get(kind)
    if context is not None:
        return context(message)
    fields = {
        ("type_name" if key == "type" else key): value
        for key, value in error.items()
        if key not in ("kind", "message") and key.isidentifier() and not key.startswith("_")
        if value is None or isinstance(value, (str, int, float, bool))
    }
    return CallFailed(kind or "host_error", message, **fields)


# -- on the wire -------------------------------------------------------------------------
# A result with files crosses as its value plus ``files``, a list of ``[name, mime_type,
# data, width, height]``, and ``as``: ``"result"`` or ``"file"`` (an attachment alone).


def files_to_wire(result: Result[Any] | Attachment) -> tuple[Any, list[list[Any]], str]:
    """``(value, files, as)`` for a result with files (the value not yet converted).

    Only the exact types count, and their fields are checked again here: a tool may have
    changed them after building the object.
    """
    if type(result) is Attachment:
        files, value, shape = (result,), None, "file"
    else:
        assert type(result) is Result
        files, value, shape = result.attachments, result.value, "result"
        if type(files) is not tuple or len(files) > MAX_FILES:  # pyright: ignore[reportUnnecessaryComparison]
            raise ValueError(f"a result carries at most {MAX_FILES} attachments, in a tuple")
    out: list[list[Any]] = []
    for item in files:
        if type(item) is not Attachment:
            raise TypeError(f"attachments are Attachment objects, not {type(item).__name__}")
        checked = Attachment(item.name, item.mime_type, item.data, item.width, item.height)
        out.append([checked.name, checked.mime_type, checked.data, checked.width, checked.height])
    return value, out, shape


def files_from_wire(value: Any, files: Any, shape: Any) -> Result[Any] | Attachment:
    """The :class:`Result` or :class:`Attachment` a frame carries. Raises ``ValueError``
    (or ``TypeError``) for anything malformed."""
    if not isinstance(files, list):
        raise ValueError("files is a list")
    entries = cast("list[Any]", files)
    if len(entries) > MAX_FILES:
        raise ValueError(f"files is a list of at most {MAX_FILES} attachments")
    built: list[Attachment] = []
    for item in entries:
        fields = cast("list[Any]", item) if isinstance(item, list) else []
        if len(fields) != 5:
            raise ValueError("each file is [name, mime_type, data, width, height]")
        name, mime, data, width, height = fields
        if type(data) is not bytes:
            raise ValueError("a file's data is bytes")
        built.append(Attachment(name, mime, data, width, height))
    if shape == "file":
        if len(built) != 1 or value is not None:
            raise ValueError("an attachment alone is one file and no value")
        return built[0]
    if shape != "result":
        raise ValueError("as is 'result' or 'file'")
    return Result[Any](value, built)
