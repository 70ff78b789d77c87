"""The capsule transport interface, and the framing client every real transport shares.

A transport is a started capsule: :attr:`Transport.report` says what loaded, ``call``
sends one call and waits for its reply, ``kill`` ends the capsule and its processes.
Above this interface nothing knows whether the capsule is a subprocess, a Wasm guest or
the in-process twin (``host.testing``).

:class:`Connection` multiplexes many calls over one pair of pipes by call id.
A reply is matched only to a call id still waiting; an unknown, duplicate or late reply
is dropped and logged, so it can never complete another call. Any breach of the wire
rules is a protocol error: the capsule is treated as compromised and killed.

A tool's context reaches the host as ``ctx`` and ``event`` frames naming a call id. The
connection serves them only for a call it has in flight *and* that it sent with a
context; anything else is refused (answered with an error, and reported to the
:class:`ContextHandler`, which audits it). What a request may do is the handler's
business: it answers from the host's own record of the call, never from the frame.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import anyio
import anyio.abc

from capsule import protocol as p
from capsule.context import Attachment, Result, files_from_wire, files_to_wire
from host._events import EventBus
from host.errors import (
    CapsuleCrashed,
    HostError,
    LimitExceeded,
    NotSerializable,
    ProtocolError,
    ToolError,
    ToolTimeout,
)

from ._pipes import PipeReader, Wakeup, clock, wakeups, write_all

__all__ = [
    "LoadRequest",
    "FileReport",
    "LoadReport",
    "Transport",
    "TransportFactory",
    "Connection",
    "CapsuleDied",
    "LoadFailed",
    "ContextHandler",
    "ContextFailure",
]

logger = logging.getLogger("toolhost.capsule")

CLOSED_OUTPUT = "the capsule closed its output"
"""Why calls in flight fail when the capsule's output ends, as far as the connection
knows: the process owner, which learns the exit status a moment later, says better."""


@dataclass(frozen=True, slots=True)
class LoadRequest:
    """What a capsule is asked to load."""

    tools_dir: str
    files: Sequence[str]
    """Module names to import, in order."""
    tools: Mapping[str, tuple[str, list[str], list[tuple[str, int]], str | None]]
    """Tool name -> (module, attribute path, parameter (name, kind) pairs, the name of its
    context parameter or None). A context parameter is among the pairs, in its place."""
    cwd: str
    env: Mapping[str, str]
    load_timeout: float = 30.0
    max_frame: int = p.MAX_FRAME
    session: str | None = None
    max_attachment: int = p.MAX_FRAME
    """Bytes of files one call's result may carry (``[limits] max_attachment_size``)."""
    context: ContextHandler | None = None
    """Who serves the requests of tool contexts (None: every request is refused)."""


@dataclass(slots=True)
class FileReport:
    """How one tool file loaded."""

    exports: list[str] | None = None
    error: str | None = None
    """Why the file is unavailable (import error, hang, crash, export mismatch)."""


@dataclass(slots=True)
class LoadReport:
    """What a capsule reported while loading."""

    files: dict[str, FileReport] = field(default_factory=dict[str, FileReport])
    pid: int | None = None
    python: str | None = None
    culprit: str | None = None
    """The file being imported when the capsule died or hung, if it did."""
    culprit_reason: str | None = None


class CapsuleDied(Exception):
    """Internal: the capsule ended while loading."""


class LoadFailed(Exception):
    """A capsule could not finish loading; ``report.culprit`` names the file, if any."""

    def __init__(self, reason: str, report: LoadReport) -> None:
        super().__init__(reason)
        self.reason = reason
        self.report = report


class ContextFailure(Exception):
    """A context request the handler refuses: ``kind`` (``env_not_allowed``,
    ``context_limit``, ``context_error``) and a message that says what to do."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class ContextHandler(Protocol):
    """The host's side of tool contexts, for one session (``host._context``)."""

    async def request(self, call: int, op: str, args: dict[str, Any]) -> Any:
        """Serve one request of call ``call`` (in flight, sent with a context); return
        its value, or raise :class:`ContextFailure` or a ``HostError``."""
        ...

    def event(self, call: int, op: str, args: dict[str, Any]) -> None:
        """One event of call ``call`` (``emit``, ``progress``)."""
        ...

    async def refused(self, call: int, op: str, reason: str) -> None:
        """A request or event for a call that cannot make one (audited)."""
        ...


_CTX_PER_CALL = 16
"""Context requests one call may have waiting at once; more are refused."""
_CTX_PER_CAPSULE = 64
"""Context requests one capsule may have waiting at once; more are refused."""
_REFUSALS_BURST = 20.0
_REFUSALS_RATE = 1.0
"""Refused context frames audited one by one: a burst, then this many per second (the
rest are counted in one ``context_refused`` event)."""


class Transport(Protocol):
    """A started capsule."""

    @property
    def report(self) -> LoadReport: ...

    @property
    def alive(self) -> bool: ...

    async def call(
        self,
        call_id: int,
        tool: str,
        encoded: bytes,
        timeout: float,
        context: Mapping[str, Any] | None = None,
    ) -> Any:
        """Run one call; return its plain-data value (or a ``Result``/``Attachment`` the
        tool returned) or raise a :class:`CallError`.

        ``context``: for a tool that takes a ``ToolContext``, the host's record of the
        call that the capsule builds it from (only such calls may make context requests).
        Raises :class:`ToolTimeout` when no reply came within ``timeout`` seconds; the
        caller then kills the capsule.
        """
        ...

    async def kill(self, reason: str) -> None:
        """End the capsule and every process it started; fail calls in flight."""
        ...


TransportFactory = Callable[[LoadRequest, EventBus, anyio.abc.TaskGroup], Any]
"""``async (request, events, task_group) -> Transport``: starts a capsule."""


class _Waiter:
    __slots__ = ("deadline", "event", "outcome", "sent", "tool", "value")

    def __init__(self, tool: str, deadline: float, event: Wakeup) -> None:
        self.event = event
        self.sent = False
        self.outcome: str = ""
        self.value: Any = None
        self.tool = tool
        self.deadline = deadline


def _text(error: Mapping[str, Any], key: str) -> str:
    value = error.get(key, "")
    if not isinstance(value, str):
        raise p.BadFrame(f"error field {key!r} must be a string")
    return value


_IOV_MAX = 1024
"""Most buffers one ``writev`` takes (POSIX guarantees at least 16; Linux takes 1024)."""


class _Broken(Exception):
    """Internal: the pipe to the capsule is closed."""


class Connection:
    """Calls multiplexed over a capsule's pipes (raw, non-blocking file descriptors).

    Writes go straight to the pipe when it has room; what does not fit waits in a
    backlog that a writer task flushes, so a call never blocks on a full pipe and frames
    stay in order. A call made while others are in flight queues its frame for the
    writer too, so the calls started in one turn of the loop cost one write (and one
    wake-up of the capsule) between them. Reads happen in :meth:`run`, which never
    writes, so large frames in both directions cannot deadlock. Call deadlines are
    checked by a watchdog task every ``TICK`` seconds, so no per-call timer is armed on
    the hot path.
    """

    TICK = 0.05

    def __init__(
        self,
        write_fd: int,
        read_fd: int,
        *,
        events: EventBus,
        session: str | None,
        on_violation: Callable[[str], None],
        max_frame: int = p.MAX_FRAME,
    ) -> None:
        os.set_blocking(write_fd, False)
        os.set_blocking(read_fd, False)
        self._wfd = write_fd
        self._rfd = read_fd
        self._events = events
        self._session = session
        self._on_violation = on_violation
        self._decoder = p.FrameDecoder(max_frame)
        self._pending: dict[int, _Waiter] = {}
        self._ready: list[bytes] = []
        self._backlog: list[bytes | memoryview] = []
        self._wakeup = wakeups()
        self._clock = clock()
        self._flush = self._wakeup()
        self._coalesce = False
        self._wake = anyio.Event()
        self._closed = False
        self._reader = PipeReader(read_fd, self._on_data)
        self.dead: str | None = None
        self.max_attachment = p.MAX_FRAME
        """Bytes of files one result may carry: more is a breach (the capsule checks)."""
        self.context: ContextHandler | None = None
        self.peer_max_frame = max_frame
        """The capsule's own frame cap (what an answer to it may take)."""
        self._contexts: dict[int, set[anyio.CancelScope]] = {}
        """Calls in flight that were sent with a context -> their requests being served."""
        self._ctx_waiting = 0
        self._tg: anyio.abc.TaskGroup | None = None
        self._refusals = _REFUSALS_BURST
        self._refusals_stamp = 0.0
        self._refusals_dropped = 0

    # -- raw I/O -----------------------------------------------------------------------

    def _write(self, data: bytes, *, queue: bool = False) -> None:
        """Send whole frames without blocking; ``queue`` leaves them to the writer task."""
        if self._closed:
            raise _Broken
        if self._backlog or queue:
            if not self._backlog:
                self._flush.set()
            self._backlog.append(data)
            return
        try:
            written = os.write(self._wfd, data)
        except BlockingIOError:
            written = 0
        except OSError:
            raise _Broken from None
        if written < len(data):
            self._backlog.append(memoryview(data)[written:])
            self._flush.set()

    async def _writer(self) -> None:
        backlog = self._backlog
        while True:
            await self._flush.wait()
            self._flush = self._wakeup()
            self._coalesce = False
            while backlog:
                batch = backlog[:_IOV_MAX]
                try:
                    written = os.writev(self._wfd, batch)
                except BlockingIOError:
                    written = 0
                except OSError:
                    backlog.clear()
                    return
                done = 0
                while done < len(batch) and written >= len(batch[done]):
                    written -= len(batch[done])
                    done += 1
                del backlog[:done]
                if written:
                    backlog[0] = memoryview(backlog[0])[written:]
                if done < len(batch):  # the pipe is full
                    await anyio.wait_writable(self._wfd)

    async def _read(self) -> bytes:
        """The next chunk from the capsule; ``b""`` at the end."""
        while True:
            if self._closed:
                return b""
            try:
                return os.read(self._rfd, 1 << 18)
            except BlockingIOError:
                await anyio.wait_readable(self._rfd)
            except OSError:
                return b""

    # -- loading -----------------------------------------------------------------------

    async def _next_message(self) -> dict[str, Any]:
        while not self._ready:
            data = await self._read()
            if not data:
                raise CapsuleDied(CLOSED_OUTPUT)
            self._ready.extend(self._decoder.feed(data))
        return p.as_map(p.decode(self._ready.pop(0)))

    async def load(self, request: LoadRequest, report: LoadReport) -> None:
        """Send the load frame and read the capsule's answers up to ``ready``.

        Raises :class:`CapsuleDied` (``report.culprit`` names the file being imported) or
        :class:`TimeoutError` when loading outruns ``request.load_timeout``.
        """
        frame = p.frame(
            {
                "k": p.K_LOAD,
                "dir": request.tools_dir,
                "files": list(request.files),
                "tools": {k: list(v) for k, v in request.tools.items()},
                "max_frame": request.max_frame,
                "max_attachment": request.max_attachment,
            }
        )
        self.max_attachment = request.max_attachment
        self.context = request.context
        with anyio.fail_after(request.load_timeout):
            try:  # whole, before the writer task runs: it can outgrow the pipe's 64 KiB
                await write_all(self._wfd, frame, lambda: self._closed)
            except OSError:
                raise CapsuleDied("the capsule closed its input") from None
            while True:
                msg = await self._next_message()
                kind = msg.get("k")
                if kind == p.K_LOADING:
                    report.culprit = str(msg.get("file"))
                elif kind == p.K_LOADED:
                    exports = msg.get("exports")
                    if not isinstance(exports, list) or not all(
                        isinstance(e, str)
                        for e in exports  # pyright: ignore[reportUnknownVariableType]
                    ):
                        raise p.BadFrame("loaded.exports must be a list of strings")
                    report.files[str(msg.get("file"))] = FileReport(exports=list(exports))  # pyright: ignore[reportUnknownArgumentType]
                    report.culprit = None
                elif kind == p.K_FAILED:
                    error = p.as_map(msg.get("error"))
                    name = str(msg.get("file"))
                    text = _text(error, "traceback") or (
                        f"{_text(error, 'type')}: {_text(error, 'message')}"
                    )
                    report.files[name] = FileReport(error=f"importing it raised:\n{text}")
                    report.culprit = None
                elif kind == p.K_READY:
                    pid, python = msg.get("pid"), msg.get("python")
                    report.pid = pid if isinstance(pid, int) else None
                    report.python = python if isinstance(python, str) else None
                    report.culprit = None
                    return
                elif kind == p.K_CONSOLE:
                    self._console(msg)
                else:
                    raise p.BadFrame(f"unexpected frame {kind!r} while loading")

    # -- serving -----------------------------------------------------------------------

    def _on_data(self, data: bytes) -> None:
        bodies = self._decoder.feed(data)
        if len(bodies) > 1:  # many calls were in flight: their callers will call again
            self._coalesce = True
        for body in bodies:
            self._handle(body)

    async def run(self) -> None:
        """Read replies until the capsule's output ends; then fail everything in flight."""
        reason = CLOSED_OUTPUT
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._writer)
                tg.start_soon(self._watchdog)
                try:
                    for body in self._ready:
                        self._handle(body)
                    self._ready.clear()
                    await self._reader.run()
                except p.BadFrame as exc:
                    # Caught inside the task group: outside it, it would arrive wrapped
                    # in an exception group and never match.
                    reason = f"it broke the wire protocol ({exc})"
                    self._events.emit("protocol_error", self._session, error=str(exc))
                    logger.warning("capsule protocol error: %s", exc)
                    self._on_violation(reason)
                finally:
                    tg.cancel_scope.cancel()
        finally:
            self.fail_all(reason)

    async def _watchdog(self) -> None:
        """Fail calls whose deadline passed (the supervisor then kills the capsule)."""
        while True:
            if not self._pending:
                await self._wake.wait()
                self._wake = anyio.Event()
            await anyio.sleep(self.TICK)
            now = self._clock()
            for call_id, waiter in list(self._pending.items()):
                if waiter.deadline <= now:
                    del self._pending[call_id]
                    waiter.outcome = "timeout"
                    waiter.event.set()

    def _console(self, msg: Mapping[str, Any]) -> None:
        data = msg.get("data")
        stream = msg.get("stream")
        if not isinstance(data, str) or stream not in ("stdout", "stderr"):
            raise p.BadFrame("console frames carry a stream name and a string")
        self._events.emit("console", self._session, stream=stream, data=data)

    def _handle(self, body: bytes) -> None:
        msg = p.as_map(p.decode(body))
        kind = msg.get("k")
        if kind == p.K_CONSOLE:
            self._console(msg)
            return
        call_id = msg.get("id")
        if type(call_id) is not int:
            raise p.BadFrame(f"reply id must be an int, not {type(call_id).__name__}")
        if kind == p.K_OK:
            value = msg.get("value")
            p.check_plain(value)
            if "files" in msg:
                value = self._files(value, msg)
            outcome = "ok"
        elif kind == p.K_ERR:
            value = p.as_map(msg.get("error"))
            if value.get("kind") not in p.ERROR_KINDS:
                raise p.BadFrame("err frames carry an error map with a known kind")
            for key in ("type", "message", "traceback", "path"):
                _text(value, key)
            outcome = "err"
        elif kind == p.K_CTX or kind == p.K_EVENT:
            self._context_frame(call_id, kind, msg)
            return
        else:
            raise p.BadFrame(f"unknown frame kind {kind!r}")
        waiter = self._pending.pop(call_id, None)
        if waiter is None:
            logger.warning("dropped a reply for call %d, which is not waiting", call_id)
            self._events.emit("reply_dropped", self._session, call_id=call_id)
            return
        waiter.outcome = outcome
        waiter.value = value
        waiter.event.set()

    def _files(self, value: Any, msg: Mapping[str, Any]) -> Result[Any] | Attachment:
        """The files of an ``ok`` frame, checked: a capsule checks their size itself, so
        more than ``max_attachment`` bytes is a breach."""
        try:
            result = files_from_wire(value, msg.get("files"), msg.get("as"))
        except (TypeError, ValueError) as exc:
            raise p.BadFrame(f"malformed files in a result: {exc}") from None
        files = (result,) if isinstance(result, Attachment) else result.attachments
        size = sum(f.size for f in files)
        if size > self.max_attachment:
            raise p.BadFrame(
                f"a result carries {size} bytes of files, over the limit of {self.max_attachment}"
            )
        return result

    def fail_all(self, reason: str) -> None:
        """Fail every call in flight: the capsule is gone."""
        if self.dead is None:
            self.dead = reason
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            waiter.outcome = "dead"
            waiter.value = reason
            waiter.event.set()
        contexts, self._contexts = self._contexts, {}
        for scopes in contexts.values():
            for scope in scopes:
                scope.cancel()

    async def call(
        self,
        call_id: int,
        tool: str,
        encoded: bytes,
        timeout: float,
        context: Mapping[str, Any] | None = None,
    ) -> Any:
        """Send one call and wait for its reply, at most ``timeout`` seconds (+ ``TICK``).

        ``context``: the host's record of the call for a tool that takes a context; only
        such a call may make context requests, and only while it is in flight.
        """
        if self.dead is not None:
            raise CapsuleCrashed(tool, reason=self.dead, may_have_executed=False)
        waiter = _Waiter(tool, self._clock() + timeout, self._wakeup())
        if not self._pending:
            self._wake.set()
        self._pending[call_id] = waiter
        frame: dict[str, Any] = {"k": p.K_CALL, "id": call_id, "tool": tool, "args": encoded}
        if context is not None:
            frame["ctx"] = dict(context)
            self._contexts[call_id] = set()
        try:
            self._write(p.frame(frame), queue=self._coalesce or len(self._pending) > 1)
        except _Broken:
            self._pending.pop(call_id, None)
            self._end_context(call_id)
            raise CapsuleCrashed(
                tool, reason=self.dead or "its input is closed", may_have_executed=False
            ) from None
        waiter.sent = True
        try:
            await waiter.event.wait()
        except BaseException:
            if self._pending.pop(call_id, None) is not None and self.dead is None:
                with contextlib.suppress(_Broken):
                    self._write(p.frame({"k": p.K_CANCEL, "id": call_id}))
            raise
        finally:
            if self._contexts:
                self._end_context(call_id)
        return self._result(waiter, timeout)

    # -- tool contexts -----------------------------------------------------------------

    def _end_context(self, call_id: int) -> None:
        """The call is over: its context requests still being served are cancelled."""
        scopes = self._contexts.pop(call_id, None)
        for scope in scopes or ():
            scope.cancel()

    def _context_frame(self, call_id: int, kind: str, msg: Mapping[str, Any]) -> None:
        """A ``ctx`` or ``event`` frame: checked here, served by the handler."""
        op, args = msg.get("op"), msg.get("args")
        ops = p.CTX_REQUESTS if kind == p.K_CTX else p.CTX_EVENTS
        if type(op) is not str or op not in ops:
            raise p.BadFrame(f"{kind} frames carry an op in {sorted(ops)}")
        if not isinstance(args, dict):
            raise p.BadFrame(f"{kind} frames carry their args as a map")
        p.check_plain(args)
        arguments: dict[str, Any] = args  # pyright: ignore[reportUnknownVariableType]
        req: Any = msg.get("req") if kind == p.K_CTX else None
        if kind == p.K_CTX and (type(req) is not int or req <= 0):
            raise p.BadFrame("ctx frames carry a positive int req")
        handler = self.context
        scopes = self._contexts.get(call_id)
        if handler is None or scopes is None:
            why = (
                f"call {call_id} is not in flight on this capsule"
                if call_id not in self._pending
                else f"call {call_id} was sent without a context (its tool takes none)"
            )
            self._refuse(call_id, req, op, why)
            return
        if req is None:
            try:
                handler.event(call_id, op, arguments)
            except Exception:  # a host bug: logged; the capsule and its calls go on
                logger.exception("serving a context event of call %d failed", call_id)
            return
        if len(scopes) >= _CTX_PER_CALL or self._ctx_waiting >= _CTX_PER_CAPSULE:
            limit = _CTX_PER_CALL if len(scopes) >= _CTX_PER_CALL else _CTX_PER_CAPSULE
            self._answer(
                req,
                False,
                {
                    "kind": "context_limit",
                    "message": f"ctx.{op}: more than {limit} context requests are waiting "
                    "for the host: await them before making more",
                },
            )
            return
        assert self._tg is not None
        self._tg.start_soon(self._serve_context, handler, call_id, req, op, arguments)

    async def _serve_context(
        self, handler: ContextHandler, call_id: int, req: int, op: str, args: dict[str, Any]
    ) -> None:
        scopes = self._contexts.get(call_id)
        if scopes is None:  # the call ended before this request was picked up
            self._refuse(call_id, req, op, f"call {call_id} is not in flight on this capsule")
            return
        self._ctx_waiting += 1
        with anyio.CancelScope() as scope:
            scopes.add(scope)
            try:
                value = await handler.request(call_id, op, args)
            except ContextFailure as exc:
                self._answer(req, False, {"kind": exc.kind, "message": exc.message})
            except HostError as exc:
                self._answer(req, False, exc.to_data())
            except Exception:  # a host bug: the tool gets an error, the log the detail
                logger.exception("serving ctx.%s of call %d failed", op, call_id)
                message = f"ctx.{op}: the host failed to serve it (its log has the detail)"
                self._answer(req, False, {"kind": "context_error", "message": message})
            else:
                self._answer(req, True, value)
            finally:
                scopes.discard(scope)
                self._ctx_waiting -= 1

    def _answer(self, req: int, ok: bool, value: Any) -> None:
        """Send the answer to context request ``req`` (nothing if the pipe is gone)."""
        frame: dict[str, Any] = {"k": p.K_ANSWER, "req": req, "ok": ok}
        if not ok:
            error: dict[str, Any] = value
            frame["error"] = {
                k: v
                for k, v in error.items()
                if isinstance(v, (str, int, float, bool)) or v is None
            }
        elif isinstance(value, (Result, Attachment)):
            inner, files, shape = files_to_wire(cast("Result[Any] | Attachment", value))
            frame.update(value=inner, files=files, **{"as": shape})
        else:
            frame["value"] = value
        try:
            data = p.frame(frame)
        except (TypeError, ValueError, OverflowError) as exc:
            data = p.frame(
                {
                    "k": p.K_ANSWER,
                    "req": req,
                    "ok": False,
                    "error": {"kind": "context_error", "message": f"unencodable answer: {exc}"},
                }
            )
        if len(data) - 4 > self.peer_max_frame:
            data = p.frame(
                {
                    "k": p.K_ANSWER,
                    "req": req,
                    "ok": False,
                    "error": {
                        "kind": "limit_exceeded",
                        "limit": "max_frame",
                        "message": f"the answer takes {len(data) - 4} bytes, over the "
                        f"capsule's frame cap of {self.peer_max_frame} ([limits] max_frame)",
                    },
                }
            )
        with contextlib.suppress(_Broken):
            self._write(data)

    def _refuse(self, call_id: int, req: int | None, op: str, why: str) -> None:
        """Refuse a context frame for a call that cannot make one; audit it (within a
        budget: a capsule that floods these cannot flood the audit)."""
        if req is not None:
            self._answer(
                req,
                False,
                {"kind": "context_closed", "message": f"ctx.{op} refused: {why}"},
            )
        now = self._clock()
        self._refusals = min(
            _REFUSALS_BURST, self._refusals + (now - self._refusals_stamp) * _REFUSALS_RATE
        )
        self._refusals_stamp = now
        handler = self.context
        if self._refusals < 1 or handler is None or self._tg is None:
            self._refusals_dropped += 1
            self._events.emit(
                "context_refused",
                self._session,
                call=call_id,
                op=op,
                reason=why,
                unaudited=self._refusals_dropped,
            )
            return
        self._refusals -= 1
        self._tg.start_soon(handler.refused, call_id, op, why)

    @staticmethod
    def _result(waiter: _Waiter, timeout: float) -> Any:
        if waiter.outcome == "ok":
            return waiter.value
        tool = waiter.tool
        if waiter.outcome == "timeout":
            raise ToolTimeout(tool, timeout=timeout)
        if waiter.outcome == "dead":
            raise CapsuleCrashed(tool, reason=waiter.value, may_have_executed=waiter.sent)
        error: dict[str, str] = waiter.value
        kind = error["kind"]
        if kind == p.E_TOOL:
            raise ToolError(
                tool,
                type_name=error.get("type", ""),
                error_message=error.get("message", ""),
                traceback=error.get("traceback", ""),
            )
        if kind == p.E_NOT_SERIALIZABLE:
            raise NotSerializable(tool, type_name=error.get("type", ""), path=error.get("path", ""))
        if kind == p.E_TOO_LARGE:
            limit = error.get("type", "")
            limit = limit if limit in ("max_frame", "max_attachment_size") else "max_frame"
            raise LimitExceeded(limit, error.get("message", ""), tool=tool)
        raise ProtocolError(f"the capsule could not run {tool}: {error.get('message', '')}")

    def close(self) -> None:
        """Close both pipes (waking any task waiting on them)."""
        if self._closed:
            return
        self._closed = True
        self._reader.close()
        for fd in (self._wfd, self._rfd):
            anyio.notify_closing(fd)
            with contextlib.suppress(OSError):
                os.close(fd)
