"""The capsule's serve loop: read call frames, run tools, write result frames.

Async tools run as tasks on this process's event loop, so many are in flight at once;
sync tools run on worker threads so a slow one does not stall the rest. A worker thread
converts and writes its own reply (one thread hop per call, not three). Every frame is
written whole under one lock (workers and the console forwarder write frames too). A tool's
exception crosses as data only: its type name, its message and the traceback of the
tool's own frames.

A tool that takes a ``ToolContext`` gets one per call, built from what the host sent with
the call; the capsule is its channel: its requests go out as ``ctx`` frames and wait for
the host's ``answer``, its events go out as ``event`` frames. A result with files
(``Result``, ``Attachment``) crosses in its ``ok`` frame, its bytes checked against the
host's ``max_attachment`` first.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import itertools
import os
import queue
import sys
import types
from collections.abc import Callable
from typing import Any

from . import _registry
from ._convert import NotPlainData, to_plain
from .context import (
    Attachment,
    ContextLimitExceeded,
    Result,
    ToolContext,
    files_from_wire,
    files_to_wire,
)
from .protocol import (
    DECODE_RATIO,
    E_BAD_CALL,
    E_NOT_SERIALIZABLE,
    E_TOO_LARGE,
    E_TOOL,
    HEADER,
    K_ANSWER,
    K_CALL,
    K_CANCEL,
    K_CTX,
    K_ERR,
    K_EVENT,
    K_FAILED,
    K_LOAD,
    K_LOADED,
    K_LOADING,
    K_OK,
    K_READY,
    MAX_FRAME,
    BadFrame,
    FrameDecoder,
    as_map,
    decode,
    encode,
    packer,
    within_budget,
)

__all__ = ["Capsule"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_MAX_WORKERS = 64
_MAX_TEXT = 64 * 1024
_CHECKED = 64 * 1024
"""Replies larger than this are checked against the frame cap and the decoding budget."""
_MAX_EVENT = 64 * 1024
"""Most bytes one context event may take (the host refuses more)."""


def _text(obj: object) -> str:
    """``str(obj)`` that survives a hostile ``__str__`` and stays bounded."""
    try:
        text = str(obj)
    except BaseException as exc:  # a user __str__ may raise anything
        text = f"<unprintable: {type(exc).__name__}>"
    return text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT] + "...[truncated]"


def error_data(exc: BaseException) -> dict[str, Any]:
    """An exception as plain data: type name, message, and the tool's own traceback."""
    import traceback  # imported on first error only: costly at start-up under WASI

    try:
        frames = [
            f
            for f in traceback.extract_tb(exc.__traceback__)
            if not os.path.abspath(f.filename).startswith(_HERE + os.sep)
        ]
        lines = traceback.format_list(frames)
        lines += traceback.format_exception_only(type(exc), exc)
        text = "Traceback (most recent call last):\n" + "".join(lines)
    except BaseException:  # formatting calls user __str__; never let it escape
        text = ""
    return {
        "kind": E_TOOL,
        "type": type(exc).__qualname__,
        "message": _text(exc),
        "traceback": text[-_MAX_TEXT:],
        "path": "",
    }


def split_arguments(
    params: tuple[tuple[str, int], ...], bound: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Turn the bound-by-name argument map back into ``*args, **kwargs`` for the call."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    positional = True
    for name, kind in params:
        if name not in bound:
            if kind in (0, 1):
                positional = False  # a gap: later parameters must go by name
            continue
        value = bound[name]
        if kind == 0 or (kind == 1 and positional):
            args.append(value)
        elif kind == 1 or kind == 3:
            kwargs[name] = value
        elif kind == 2:
            args.extend(value)
        elif kind == 4:
            kwargs.update(value)
    return args, kwargs


_Job = tuple[int, "_registry.Target", bytes, Any]
_FILES: tuple[type, ...] = (Result, Attachment)
"""Results that carry files (exact types only)."""
_EAGER: dict[str, Any] = {"eager_start": True} if sys.version_info >= (3, 12) else {}
_NO_ARGS: tuple[Any, ...] = ()
_Pack = Callable[[Any], bytes]


def _ready_queue(loop: asyncio.AbstractEventLoop) -> collections.deque[asyncio.Handle] | None:
    """The stock loop's queue of callbacks to run, where a task's first step is put.

    None on 3.12+ (tasks start eagerly there) and for any other loop: then a task's first
    step waits for the loop's next turn.
    """
    if _EAGER:
        return None
    ready = getattr(loop, "_ready", None)
    return ready if type(ready) is collections.deque else None  # pyright: ignore[reportUnknownVariableType]


class Capsule:
    """One capsule process: the tool modules plus the frame loop around them."""

    def __init__(self, proto_in: int, proto_out: int, *, max_frame: int = MAX_FRAME) -> None:
        import threading

        self._in = proto_in
        self._out = proto_out
        self._max_frame = max_frame
        self._decoder = FrameDecoder(max_frame)
        self._lock = threading.Lock()
        self._targets: dict[str, _registry.Target] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._outbox: list[bytes] = []
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._workers = 0
        self._free = 0  # workers minus sync calls queued or running (see _submit)
        self._count = threading.Lock()  # guards _workers and _free
        self._threads = sys.platform != "wasi"
        self._closed: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: collections.deque[asyncio.Handle] | None = None
        self._batch = False  # dispatching one read's frames: replies wait for its end
        self._flush_soon = False  # a _flush is scheduled on the loop
        self._pack: _Pack = packer()  # the loop thread's own (a worker has its own)
        self._max_attachment = MAX_FRAME
        self._requests = itertools.count(1)
        self._answers: dict[int, asyncio.Future[tuple[bool, Any]]] = {}
        """Context requests waiting for the host's answer, by request id."""
        self.settle: Callable[[], None] | None = None
        """Waits until what tools wrote to the console so far has been forwarded, so a
        result never overtakes the print that came before it (set by ``__main__``)."""

    # -- writing -----------------------------------------------------------------------

    def write(self, body: bytes, *, console: bool = False) -> None:
        """Write one frame (any thread); ``console``: a frame of the console's forwarder."""
        self._write_frames(HEADER.pack(len(body)) + body, console=console)

    def _write_frames(self, data: bytes, *, console: bool = False) -> None:
        """Write whole frames, never interleaved with another thread's, and never ahead
        of what tools wrote to the console before them (:attr:`settle`)."""
        if not console and self.settle is not None:
            self.settle()
        with self._lock:
            written = os.write(self._out, data)
            if written < len(data):
                view = memoryview(data)[written:]
                while view:
                    view = view[os.write(self._out, view) :]

    def _reply(self, body: bytes, others: bool) -> None:
        """Send a reply from the loop thread; ``others``: other calls are in flight.

        Replies made while one read's frames are dispatched go out together when they
        all are, and replies of tasks that finish in the same turn of the loop while
        others are in flight go out together on the next turn: one write and one wake-up
        of the host instead of one per call.
        """
        data = HEADER.pack(len(body)) + body
        if self._batch:
            self._outbox.append(data)
        elif others or self._outbox:
            self._outbox.append(data)
            if not self._flush_soon:
                self._flush_soon = True
                assert self._loop is not None
                self._loop.call_soon(self._flush)
        else:
            self._write_frames(data)

    def _flush(self) -> None:
        self._flush_soon = False
        outbox = self._outbox
        if outbox:
            data = outbox[0] if len(outbox) == 1 else b"".join(outbox)
            outbox.clear()
            self._write_frames(data)

    def send(self, value: dict[str, Any]) -> None:
        self.write(encode(value))

    # -- loading -----------------------------------------------------------------------

    def _read_frame_blocking(self) -> dict[str, Any] | None:
        while True:
            data = os.read(self._in, 1 << 16)
            if not data:
                return None
            bodies = self._decoder.feed(data)
            if bodies:
                if len(bodies) > 1 or self._decoder.pending:
                    raise BadFrame("the host sent more than the load frame before ready")
                return decode(bodies[0])

    def load(self) -> bool:
        """Read the ``load`` frame, import every file, answer ``ready``. False on EOF."""
        msg = self._read_frame_blocking()
        if msg is None:
            return False
        if msg.get("k") != K_LOAD:
            raise BadFrame(f"expected a load frame, got {msg.get('k')!r}")
        max_frame = msg.get("max_frame")
        if isinstance(max_frame, int) and max_frame > 0:
            self._max_frame = max_frame
            self._decoder.max_frame = max_frame
        max_attachment = msg.get("max_attachment")
        if isinstance(max_attachment, int) and max_attachment >= 0:
            self._max_attachment = max_attachment
        _registry.install_package(msg["dir"], msg.get("package", _registry.PACKAGE))
        modules: dict[str, Any] = {}
        for file in msg["files"]:
            self.send({"k": K_LOADING, "file": file})
            try:
                module = _registry.import_file(file)
                exports = _registry.runtime_exports(module)
            except BaseException as exc:  # import-time failures of any kind stay data
                self.send({"k": K_FAILED, "file": file, "error": error_data(exc)})
                continue
            modules[file] = module
            self.send({"k": K_LOADED, "file": file, "exports": exports})
        tools: dict[str, Any] = msg["tools"]
        for name, (file, path, params, *rest) in tools.items():
            module = modules.get(file)
            if module is None:
                continue
            try:
                context = rest[0] if rest else None
                self._targets[name] = _registry.resolve(module, name, path, params, context)
            except Exception as exc:  # reported; the host refuses the file
                self.send({"k": K_FAILED, "file": file, "error": error_data(exc)})
        self.send(
            {
                "k": K_READY,
                "pid": os.getpid(),
                "python": ".".join(map(str, sys.version_info[:3])),
            }
        )
        return True

    # -- serving -----------------------------------------------------------------------

    async def serve(self) -> None:
        """Serve calls until the host closes the pipe."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._ready = _ready_queue(loop)
        self._closed = loop.create_future()
        self._dispatch_all(self._decoder.feed(b""))
        loop.add_reader(self._in, self._on_readable)
        try:
            await self._closed
        finally:
            loop.remove_reader(self._in)

    def _on_readable(self) -> None:
        assert self._closed is not None
        try:
            data = os.read(self._in, 1 << 18)
        except OSError:
            data = b""
        if not data:
            if not self._closed.done():
                self._closed.set_result(None)
            return
        try:
            self._dispatch_all(self._decoder.feed(data))
        except BadFrame as exc:
            # The host's stream is broken from here on: reading on would take the rest
            # of it out of step. Serving ends with the error (a loop callback's own
            # exception would only be logged, and the capsule would read on).
            if not self._closed.done():
                self._closed.set_exception(exc)

    def _dispatch_all(self, bodies: list[bytes]) -> None:
        """Dispatch the frames of one read; their replies made meanwhile go out together."""
        self._batch = True
        try:
            for body in bodies:
                self._dispatch(as_map(decode(body)))
        finally:
            self._batch = False
            if self._outbox:
                self._flush()

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg.get("k")
        if kind == K_CALL:
            call_id: int = msg.get("id")  # pyright: ignore[reportAssignmentType]
            tool = msg.get("tool")
            if (
                type(call_id) is not int
                or type(tool) is not str
                or type(msg.get("args")) is not bytes
            ):
                raise BadFrame("call frames carry an int id, a tool name and args as bytes")
            target = self._targets.get(tool)
            if target is None:
                self._reply_error(call_id, E_BAD_CALL, f"no tool {tool!r} in this capsule")
                return
            if not target.is_async and self._threads:
                self._submit((call_id, target, msg["args"], msg.get("ctx")))
                return
            assert self._loop is not None
            # The task's first step runs at once, so a tool that does not wait is answered
            # in this turn of the loop, without another select call and its bookkeeping.
            # On 3.12+ asyncio does it (eager_start). On 3.11 asyncio.Task schedules that
            # step with call_soon, which appends it to the loop's ready queue: the handle
            # is taken back and run here, inside the task as usual (current_task(), its
            # own context, cancellation).
            task = asyncio.Task(
                self._run(call_id, target, msg["args"], msg.get("ctx")), loop=self._loop, **_EAGER
            )
            ready = self._ready
            if ready:
                handle = ready[-1]
                if getattr(handle._callback, "__self__", None) is task:  # pyright: ignore[reportUnknownMemberType, reportAttributeAccessIssue]
                    ready.pop()
                    handle._run()  # pyright: ignore[reportPrivateUsage]
            # The task forgets itself when it ends (see _run): no done callback, which
            # would cost one more turn of the loop per call after the reply is written.
            if not task.done():
                self._tasks[call_id] = task
        elif kind == K_CANCEL:
            call_id = msg.get("id")  # pyright: ignore[reportAssignmentType]
            if type(call_id) is not int:
                raise BadFrame("cancel frames carry the int id of a call")
            task = self._tasks.get(call_id)
            if task is not None:
                task.cancel()
                # A task cancelled before its first step never runs _run's cleanup.
                task.add_done_callback(lambda t, i=call_id: self._forget(i, t))
        elif kind == K_ANSWER:
            self._answer(msg)
        else:
            raise BadFrame(f"unknown frame kind {kind!r}")

    def _forget(self, call_id: int, task: asyncio.Task[None]) -> None:
        if self._tasks.get(call_id) is task:
            del self._tasks[call_id]

    def _submit(self, job: _Job) -> None:
        """Queue a sync call; start a worker unless one is free for it.

        ``_free`` is the number of workers minus the calls queued or running (negative: a
        backlog, once ``_MAX_WORKERS`` run). It is counted here, when a call is queued,
        not when a worker picks it up: a worker that has taken a slow call but not yet
        said so must not be counted free for the next one.
        """
        with self._count:
            self._free -= 1
            start = self._free < 0 and self._workers < _MAX_WORKERS
            if start:
                self._workers += 1
                self._free += 1
        self._jobs.put(job)
        if start:
            import threading

            threading.Thread(target=self._worker, daemon=True, name="tool").start()

    def _worker(self) -> None:
        pack = packer()
        jobs = self._jobs
        count = self._count
        while True:
            job = jobs.get()
            if job is None:
                return
            try:
                body = self._execute(*job, pack)
                if body is not None:
                    self.write(body)
            finally:
                with count:
                    self._free += 1

    def _execute(
        self, call_id: int, target: _registry.Target, raw_args: bytes, info: Any, pack: _Pack
    ) -> bytes | None:
        """Run a sync tool on this (worker) thread; return the reply frame's body."""
        ctx: ToolContext | None = None
        try:
            bound = decode(raw_args)
            if target.context is not None:
                ctx = self._context(call_id, info)
                bound[target.context] = ctx
            args, kwargs = _arguments(target, bound)
        except Exception as exc:  # a host bug, reported as data
            return self._error_body(call_id, E_BAD_CALL, f"bad arguments frame: {exc}")
        try:
            result = target.fn(*args, **kwargs)
            if inspect.isawaitable(result):
                assert self._loop is not None
                result = asyncio.run_coroutine_threadsafe(_await(result), self._loop).result()
            return self._result_body(call_id, result, pack)
        except NotPlainData as exc:
            return self._error_body(
                call_id, E_NOT_SERIALIZABLE, str(exc), type=exc.type_name, path=exc.path
            )
        except BaseException as exc:  # SystemExit, KeyboardInterrupt too: a tool error
            return encode({"k": K_ERR, "id": call_id, "error": error_data(exc)})
        finally:
            if ctx is not None:
                ctx._close()  # pyright: ignore[reportPrivateUsage]

    async def _run(
        self, call_id: int, target: _registry.Target, raw_args: bytes, info: Any = None
    ) -> None:
        """Run an async tool (or any tool, where there are no threads) on the loop."""
        ctx: ToolContext | None = None
        try:
            try:
                bound = decode(raw_args)
                if target.context is not None:
                    ctx = self._context(call_id, info)
                    bound[target.context] = ctx
                if target.by_name and type(bound) is dict:
                    args: Any = _NO_ARGS
                    kwargs: dict[str, Any] = bound  # pyright: ignore[reportUnknownVariableType]
                else:
                    args, kwargs = split_arguments(target.params, bound)
            except Exception as exc:  # a host bug, reported as data
                body = self._error_body(call_id, E_BAD_CALL, f"bad arguments frame: {exc}")
                self._reply(body, len(self._tasks) - (call_id in self._tasks) > 0)
                return
            try:
                result = target.fn(*args, **kwargs)
                if type(result) is types.CoroutineType or inspect.isawaitable(result):
                    result = await result  # pyright: ignore[reportGeneralTypeIssues, reportUnknownVariableType]
                if type(result) in _FILES:  # pyright: ignore[reportUnknownArgumentType]
                    body = self._files_body(call_id, result, self._pack)  # pyright: ignore[reportUnknownArgumentType]
                else:
                    body = self._pack({"k": K_OK, "id": call_id, "value": to_plain(result)})
                    if len(body) > _CHECKED:
                        body = self._checked(call_id, body)
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    return  # the host gave up on this call; it expects no reply
                body = encode({"k": K_ERR, "id": call_id, "error": error_data(exc)})
            except NotPlainData as exc:
                body = self._error_body(
                    call_id, E_NOT_SERIALIZABLE, str(exc), type=exc.type_name, path=exc.path
                )
            except BaseException as exc:  # SystemExit, KeyboardInterrupt too: a tool error
                body = encode({"k": K_ERR, "id": call_id, "error": error_data(exc)})
            self._reply(body, len(self._tasks) - (call_id in self._tasks) > 0)
        finally:
            self._tasks.pop(call_id, None)
            if ctx is not None:
                ctx._close()  # pyright: ignore[reportPrivateUsage]

    def _error_body(self, call_id: int, kind: str, message: str, **extra: str) -> bytes:
        error = {"kind": kind, "type": "", "message": message, "traceback": "", "path": ""}
        error.update(extra)
        return encode({"k": K_ERR, "id": call_id, "error": error})

    def _reply_error(self, call_id: int, kind: str, message: str, **extra: str) -> None:
        self._reply(self._error_body(call_id, kind, message, **extra), True)

    def _result_body(self, call_id: int, result: Any, pack: _Pack) -> bytes:
        if type(result) in _FILES:
            return self._files_body(call_id, result, pack)
        body = pack({"k": K_OK, "id": call_id, "value": to_plain(result)})
        return body if len(body) <= _CHECKED else self._checked(call_id, body)

    def _files_body(self, call_id: int, result: Any, pack: _Pack) -> bytes:
        """The reply for a tool that returned a ``Result`` or an ``Attachment``."""
        value, files, shape = files_to_wire(result)
        size = sum(len(f[2]) for f in files)
        if size > self._max_attachment:
            message = (
                f"the attachments take {size} bytes, over the limit of {self._max_attachment} "
                "([limits] max_attachment_size)"
            )
            return self._error_body(call_id, E_TOO_LARGE, message, type="max_attachment_size")
        reply = {"k": K_OK, "id": call_id, "value": to_plain(value), "files": files, "as": shape}
        return self._checked(call_id, pack(reply))

    def _checked(self, call_id: int, body: bytes) -> bytes:
        """A large reply as it is, or a ``too_large`` error if the host would refuse it."""
        if len(body) > self._max_frame:
            message = f"the result is {len(body)} bytes, over the frame cap of {self._max_frame}"
        elif not within_budget(body):
            message = (
                f"the result is too dense to decode: more than {DECODE_RATIO} bytes of "
                "containers per byte of it (many tiny lists or dicts)"
            )
        else:
            return body
        return self._error_body(call_id, E_TOO_LARGE, message, type="max_frame")

    # -- the tool context ----------------------------------------------------------------

    def _context(self, call_id: int, info: Any) -> ToolContext:
        """The context for one call, from the host's record of it (sent with the call)."""
        if type(info) is not dict:
            raise BadFrame("a call to a tool that takes a context carries its ctx map")
        record: dict[str, Any] = info  # pyright: ignore[reportUnknownVariableType]
        chain: list[Any] = record.get("chain") or []
        metadata: dict[str, Any] = record.get("metadata") or {}
        return ToolContext(
            tool=str(record.get("tool", "")),
            call_id=str(record.get("call_id", "")),
            session=str(record.get("session", "")),
            caller=str(record.get("caller", "")),
            chain=[str(c) for c in chain],
            metadata=metadata,
            channel=self,
            call=call_id,
        )

    def request(self, call: int, op: str, args: dict[str, Any]) -> Any:
        """Send a context request for ``call``; an awaitable of the host's answer.

        Awaitable on the loop that awaits it: the capsule's own (async tools), or one a
        sync tool runs on its worker thread (``asyncio.run``).
        """
        loop = asyncio.get_running_loop()
        req = next(self._requests)
        body = encode({"k": K_CTX, "id": call, "req": req, "op": op, "args": args})
        if len(body) > self._max_frame or (len(body) > _CHECKED and not within_budget(body)):
            raise ContextLimitExceeded(
                f"ctx.{op}: the request takes {len(body)} bytes, over the frame cap of "
                f"{self._max_frame} ([limits] max_frame)"
            )
        future: asyncio.Future[tuple[bool, Any]] = loop.create_future()
        self._answers[req] = future
        try:
            self.write(body)
        except BaseException:
            self._answers.pop(req, None)
            raise
        return self._answer_of(req, future)

    async def _answer_of(self, req: int, future: asyncio.Future[tuple[bool, Any]]) -> Any:
        try:
            return await future
        finally:
            self._answers.pop(req, None)

    def notify(self, call: int, op: str, args: dict[str, Any]) -> None:
        """Send a context event for ``call`` (any thread); nothing comes back."""
        body = encode({"k": K_EVENT, "id": call, "op": op, "args": args})
        if len(body) > min(self._max_frame, _MAX_EVENT):
            raise ContextLimitExceeded(
                f"ctx.{op}: the event takes {len(body)} bytes, over {_MAX_EVENT} bytes"
            )
        self.write(body)

    def _answer(self, msg: dict[str, Any]) -> None:
        """The host answered a context request: wake whoever waits for it."""
        req: Any = msg.get("req")
        future = self._answers.pop(req, None) if type(req) is int else None
        if future is None or future.done():
            return  # the tool stopped waiting (its call was cancelled)
        answer: tuple[bool, Any]
        if msg.get("ok") is True:
            value = msg.get("value")
            if "files" in msg:
                try:
                    value = files_from_wire(value, msg.get("files"), msg.get("as"))
                except (TypeError, ValueError) as exc:
                    answer = (False, {"kind": "protocol_error", "message": str(exc)})
                else:
                    answer = (True, value)
            else:
                answer = (True, value)
        else:
            error: Any = msg.get("error")
            answer = (False, error)
        loop = future.get_loop()
        if loop is self._loop:
            future.set_result(answer)
        else:  # a sync tool's own loop, on its worker thread
            loop.call_soon_threadsafe(_settle, future, answer)


def _arguments(target: _registry.Target, bound: Any) -> tuple[Any, dict[str, Any]]:
    """``*args, **kwargs`` for a call from its bound argument map."""
    if target.by_name and type(bound) is dict:
        return _NO_ARGS, bound  # pyright: ignore[reportUnknownVariableType]
    return split_arguments(target.params, bound)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _settle(future: asyncio.Future[tuple[bool, Any]], answer: tuple[bool, Any]) -> None:
    if not future.done():
        future.set_result(answer)
