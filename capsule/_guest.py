"""The code sandbox's guest: the agent's Python runs here, one run at a time.

REPL semantics: top-level ``await``; the last expression is the run's value; variables
and imports persist between runs; ``print`` is captured (capped). An exception returns
the traceback of the agent's own code only.

Every tool is a global (bare names, and ``tools.FILE.EXPORT[.MEMBER]``). A tool proxy is a
data-only stub: calling it returns an awaitable :class:`ToolCall` that, when awaited, can
only send a ``use`` frame (tool name, arguments) and wait for the answer. Nothing of the
host is behind it: the mediator, policy and credentials live in another process, which
authorises every frame itself and trusts nothing this process claims. A call that is never
awaited never runs; the run reports it as a warning with the tool's name and line.

The error classes of the host exist here by name (``except PolicyDenied``); an error from
the host is rebuilt from strings only. Runs under CPython-WASI (with the asyncio shim of
``capsule._wasi``) and under a normal CPython (the weaker subprocess fallback).
"""

from __future__ import annotations

import _ast  # the C module: ``ast.py`` itself costs start-up time under WASI
import asyncio
import builtins
import collections.abc
import linecache
import os
import sys
from collections.abc import Generator
from typing import Any, cast

from . import _wasi
from .protocol import (
    HEADER,
    K_DONE,
    K_DROP,
    K_ERR,
    K_OK,
    K_READY,
    K_RUN,
    K_SETUP,
    K_USE,
    MAX_FRAME,
    BadFrame,
    FrameDecoder,
    as_map,
    decode,
    encode,
)

__all__ = ["main", "ERRORS"]

_CO_COROUTINE = 0x80
_MAX_TEXT = 64 * 1024
_MAX_WARNINGS = 50


# -- the error classes, by name -----------------------------------------------------------


def _snake(name: str) -> str:
    out = [name[0].lower()]
    for ch in name[1:]:
        out.append("_" + ch.lower() if ch.isupper() else ch)
    return "".join(out)


class HostError(Exception):
    """The root of the host's errors (rebuilt here from data)."""

    kind = "host_error"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = _snake(cls.__name__)

    def __init__(self, message: str = "", **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        for key, value in fields.items():
            setattr(self, key, value)


class CallError(HostError):
    """A call did not produce a value."""


class ToolError(CallError):
    """The tool raised (``type_name``, ``error_message``)."""


class NotSerializable(CallError):
    """The tool returned something that is not plain data."""


class InvalidArguments(CallError):
    """The arguments do not fit the tool's signature, or are not plain data."""


class UnknownTool(CallError):
    """No tool has that name."""


class PolicyDenied(CallError):
    """A policy rule denied the call (``rule``, ``reason``)."""


class NotApproved(CallError):
    """A person denied the call, or nobody answered in time."""


class ToolTimeout(CallError):
    """The call outran its deadline."""


class CapsuleCrashed(CallError):
    """The tool's capsule died while the call was in flight."""


class ToolUnavailable(CallError):
    """The tool cannot be called now."""


class LimitExceeded(CallError):
    """A budget ran out (``limit`` names which)."""


class DeclarationError(HostError):
    """The tool files cannot be declared."""


class PolicyFileError(HostError):
    """A policy file is malformed."""


class ProtocolError(HostError):
    """A capsule broke the wire rules."""


ERRORS: dict[str, type[HostError]] = {
    cls.__name__: cls
    for cls in (
        HostError,
        CallError,
        ToolError,
        NotSerializable,
        InvalidArguments,
        UnknownTool,
        PolicyDenied,
        NotApproved,
        ToolTimeout,
        CapsuleCrashed,
        ToolUnavailable,
        LimitExceeded,
        DeclarationError,
        PolicyFileError,
        ProtocolError,
    )
}
_BY_KIND = {cls.kind: cls for cls in ERRORS.values()}
for _cls in ERRORS.values():
    _cls.__module__ = "builtins"  # tracebacks say ``ToolError: ...``, as for built-in errors


def _rebuild(data: dict[str, Any]) -> HostError:
    """A fresh sandbox-side error from the host's plain data (strings and numbers only)."""
    cls = _BY_KIND.get(str(data.get("kind")), HostError)
    fields: dict[str, Any] = {}
    for key, value in data.items():
        if key in ("kind", "message") or not key.isidentifier():
            continue
        if isinstance(value, (str, int, float, bool)) or value is None:
            fields["type_name" if key == "type" else key] = value
    return cls(str(data.get("message", "")), **fields)


class _OutputLimit(BaseException):
    """The run printed more than it may (a BaseException: ``except Exception`` misses it)."""


# -- tool proxies -----------------------------------------------------------------------


def _agent_line() -> int | None:
    """The line of the agent's code that is making the current call."""
    frame = sys._getframe(2)  # pyright: ignore[reportPrivateUsage]
    while frame is not None:
        if frame.f_code.co_filename.startswith("<run "):
            return frame.f_lineno
        frame = frame.f_back
    return None


class ToolCall(collections.abc.Coroutine[Any, Any, Any]):
    """One tool call, not yet sent. Awaiting it sends it; dropping it unawaited means it
    never runs (and the run's result says so)."""

    __slots__ = ("_steps", "args", "awaited", "kwargs", "line", "tool")

    def __init__(self, tool: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.tool = tool
        self.args = args
        self.kwargs = kwargs
        self.line = _agent_line()
        self.awaited = False
        self._steps: Generator[Any, None, Any] | None = None
        _SANDBOX.track(self)

    def __repr__(self) -> str:
        state = "awaited" if self.awaited else "not awaited: it has not run"
        return f"<call {self.tool}(...) {state}>"

    def __await__(self) -> Generator[Any, None, Any]:
        if self.awaited:
            raise RuntimeError(f"this call to {self.tool} was already awaited")
        self.awaited = True
        return (yield from _SANDBOX.use(self.tool, self.args, self.kwargs).__await__())

    def _gen(self) -> Generator[Any, None, Any]:
        if self._steps is None:
            self._steps = self.__await__()
        return self._steps

    def send(self, value: Any) -> Any:
        return self._gen().send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if val is None:
            val = typ if isinstance(typ, BaseException) else typ()
        return self._gen().throw(val)

    def close(self) -> None:
        if self._steps is not None:
            self._steps.close()


class Tool:
    """A tool as a global: calling it returns an awaitable :class:`ToolCall`."""

    __slots__ = ("_tool",)

    def __init__(self, name: str) -> None:
        self._tool = name

    def __call__(self, *args: Any, **kwargs: Any) -> ToolCall:
        return ToolCall(self._tool, args, kwargs)

    def __repr__(self) -> str:
        return f"<tool {self._tool}>"


class Namespace:
    """``tools.FILE.EXPORT[.MEMBER]`` and object exports: attribute access to tools."""

    __slots__ = ("_entries", "_label")

    def __init__(self, label: str, entries: dict[str, Any]) -> None:
        self._label = label
        self._entries = entries

    def __getattr__(self, name: str) -> Any:
        try:
            return self._entries[name]
        except KeyError:
            raise AttributeError(f"{self._label} has no attribute {name!r}") from None

    def __dir__(self) -> list[str]:
        return sorted(self._entries)

    def __repr__(self) -> str:
        return f"<{self._label}: {', '.join(sorted(self._entries))}>"


def _tool_globals(tools: list[Any]) -> dict[str, Any]:
    """``tools.FILE.EXPORT[.MEMBER]``, plus a global for every installed export."""
    functions: dict[str, dict[str, Any]] = {}
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    installed: set[str] = set()
    for name, file, export, member, is_global in tools:
        if member is None:
            functions.setdefault(file, {})[export] = Tool(name)
        else:
            objects.setdefault((file, export), {})[member] = Tool(name)
        if is_global:
            installed.add(export)
    for (file, export), members in objects.items():
        functions.setdefault(file, {})[export] = Namespace(export, members)
    scope: dict[str, Any] = {}
    tree: dict[str, Any] = {}
    for file, entries in functions.items():
        tree[file] = Namespace(f"tools.{file}", entries)
        scope.update((export, value) for export, value in entries.items() if export in installed)
    scope["tools"] = Namespace("tools", tree)
    return scope


# -- captured output --------------------------------------------------------------------


class _Capture:
    """``sys.stdout``/``sys.stderr`` during a run: keeps at most ``cap`` characters."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.size = 0
        self.parts: list[str] = []
        self.over = False

    def write(self, text: str) -> int:
        if type(text) is not str:  # the agent may pass anything
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        room = self.cap - self.size
        if len(text) > room:
            self.parts.append(text[: max(room, 0)])
            self.size = self.cap
            self.over = True
            raise _OutputLimit
        self.parts.append(text)
        self.size += len(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def text(self) -> str:
        return "".join(self.parts)


# -- the sandbox ------------------------------------------------------------------------


def _traceback(exc: BaseException) -> str:
    import traceback  # costly at start-up under WASI: only on the first error

    try:
        frames = [
            f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<run ")
        ]
        lines = traceback.format_list(frames)
        lines += traceback.format_exception_only(type(exc), exc)
        text = "Traceback (most recent call last):\n" + "".join(lines)
    except BaseException:  # a hostile __str__: never let it escape
        text = f"{type(exc).__name__}\n"
    return text[-_MAX_TEXT:]


def _text(obj: object) -> str:
    try:
        text = str(obj)
    except BaseException as exc:
        text = f"<unprintable: {type(exc).__name__}>"
    return text[:_MAX_TEXT]


def _error(exc: BaseException) -> dict[str, Any]:
    data: dict[str, Any] = {
        "kind": exc.kind if isinstance(exc, HostError) else "exception",
        "type": type(exc).__name__,
        "message": _text(exc),
        "traceback": _traceback(exc),
    }
    if isinstance(exc, LimitExceeded):
        data["limit"] = str(getattr(exc, "limit", ""))
    if isinstance(exc, MemoryError):
        data["kind"] = "limit_exceeded"
        data["limit"] = "code_memory"
    return data


class Sandbox:
    """The guest's state: the agent's namespace, the loop, the calls waiting on the host."""

    def __init__(self, proto_in: int = 0, proto_out: int = 1) -> None:
        self._in = proto_in
        self._out = proto_out
        self._decoder = FrameDecoder(MAX_FRAME)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed: asyncio.Future[None] | None = None
        self._server: asyncio.Task[Any] | None = None
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._run: int | None = None
        self._runs = 0
        self._calls: list[ToolCall] = []
        self.max_output = 1024 * 1024
        self.max_argument = 4 * 1024 * 1024
        self.namespace: dict[str, Any] = {}

    # -- frames ----------------------------------------------------------------------

    def send(self, value: dict[str, Any]) -> None:
        body = encode(value)
        view = memoryview(HEADER.pack(len(body)) + body)
        while view:
            view = view[os.write(self._out, view) :]

    def _read_first(self) -> dict[str, Any] | None:
        while True:
            data = os.read(self._in, 1 << 16)
            if not data:
                return None
            bodies = self._decoder.feed(data)
            if bodies:
                if len(bodies) > 1 or self._decoder.pending:
                    raise BadFrame("the host sent more than the setup frame before ready")
                return as_map(decode(bodies[0]))

    def setup(self) -> bool:
        """Read the ``setup`` frame, build the agent's globals, answer ``ready``."""
        msg = self._read_first()
        if msg is None:
            return False
        if msg.get("k") != K_SETUP:
            raise BadFrame(f"expected a setup frame, got {msg.get('k')!r}")
        self.max_output = int(msg.get("max_output", self.max_output))
        self.max_argument = int(msg.get("max_argument", self.max_argument))
        scope: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        scope.update(ERRORS)
        scope["asyncio"] = asyncio
        scope.update(_tool_globals(list(msg.get("tools", []))))
        self.namespace = scope
        self.send(
            {"k": K_READY, "pid": os.getpid(), "python": ".".join(map(str, sys.version_info[:3]))}
        )
        return True

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._closed = loop.create_future()
        self._server = asyncio.current_task()
        loop.add_reader(self._in, self._on_readable)
        try:
            await self._closed
        finally:
            loop.remove_reader(self._in)

    def _on_readable(self) -> None:
        assert self._closed is not None and self._loop is not None
        try:
            data = os.read(self._in, 1 << 18)
        except OSError:
            data = b""
        if not data:
            if not self._closed.done():
                self._closed.set_result(None)
            return
        for body in self._decoder.feed(data):
            msg = as_map(decode(body))
            kind = msg.get("k")
            if kind == K_RUN:
                self._loop.create_task(self._execute(int(msg["id"]), str(msg["source"])))
            elif kind in (K_OK, K_ERR):
                call_id = msg.get("id")
                future = self._waiting.pop(call_id, None) if type(call_id) is int else None
                if future is None or future.done():
                    continue  # the code stopped waiting: a late answer is dropped
                if kind == K_OK:
                    future.set_result(msg.get("value"))
                else:
                    future.set_exception(_rebuild(as_map(msg.get("error"))))
            else:
                raise BadFrame(f"unknown frame kind {kind!r}")

    # -- tool calls ------------------------------------------------------------------

    def track(self, call: ToolCall) -> None:
        if len(self._calls) < 100_000:
            self._calls.append(call)

    async def use(self, tool: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Send one call frame and wait for the host's answer."""
        if self._run is None or self._loop is None:
            raise RuntimeError("tools can only be called while a run is in progress")
        try:
            body = {"args": list(args), "kwargs": dict(kwargs)}
            size = len(encode(body))
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidArguments(
                f"invalid arguments for {tool}: pass plain data only "
                f"(None, bool, int, float, str, bytes, list, dict with str keys): {exc}",
                tool=tool,
            ) from None
        if size > self.max_argument:
            raise InvalidArguments(
                f"invalid arguments for {tool}: they take {size} bytes encoded, over the "
                f"limit of {self.max_argument}; pass a reference instead of the data",
                tool=tool,
            )
        self._next_id += 1
        call_id = self._next_id
        future: asyncio.Future[Any] = self._loop.create_future()
        self._waiting[call_id] = future
        self.send({"k": K_USE, "id": call_id, "run": self._run, "tool": tool, **body})
        try:
            return await future
        except asyncio.CancelledError:
            if self._waiting.pop(call_id, None) is not None:
                self.send({"k": K_DROP, "id": call_id})
            raise

    # -- runs ------------------------------------------------------------------------

    async def _execute(self, run_id: int, source: str) -> None:
        self._runs += 1
        filename = f"<run {self._runs}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        capture = _Capture(self.max_output)
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = capture
        self._run = run_id
        self._calls = []
        ok, value, error = True, None, None
        try:
            value = await self._evaluate(source, filename)
        except _OutputLimit:
            ok = False
            error = {
                "kind": "limit_exceeded",
                "type": "LimitExceeded",
                "message": f"the run printed more than {self.max_output} characters",
                "traceback": "",
                "limit": "code_max_output",
            }
        except BaseException as exc:  # the agent's error, whatever it is, is data
            ok = False
            error = _error(exc)
            if capture.over:
                error = {**error, "kind": "limit_exceeded", "limit": "code_max_output"}
        finally:
            sys.stdout, sys.stderr = saved
            self._run = None
        await self._settle()
        warnings = [
            f"line {c.line}: {c.tool}(...) was never awaited, so it did not run; "
            f"write `await {c.tool}(...)`"
            if c.line is not None
            else f"{c.tool}(...) was never awaited, so it did not run"
            for c in self._calls
            if not c.awaited
        ][:_MAX_WARNINGS]
        self._calls = []
        plain, note = self._plain(value) if ok else (None, None)
        if note:
            warnings.append(note)
        self.send(
            {
                "k": K_DONE,
                "id": run_id,
                "ok": ok,
                "value": plain,
                "stdout": capture.text(),
                "error": error,
                "warnings": warnings,
            }
        )

    async def _evaluate(self, source: str, filename: str) -> Any:
        flags = _ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        tree = compile(
            source, filename, "exec", flags=flags | _ast.PyCF_ONLY_AST, dont_inherit=True
        )
        assert isinstance(tree, _ast.Module)
        last: _ast.Expression | None = None
        tail = tree.body[-1] if tree.body else None
        if isinstance(tail, _ast.Expr):
            tree.body.pop()
            last = _ast.Expression(tail.value)
        code = compile(tree, filename, "exec", flags=flags, dont_inherit=True)
        result = eval(code, self.namespace)  # the agent's code, in this sandbox only
        if code.co_flags & _CO_COROUTINE:
            await result
        if last is None:
            return None
        code = compile(last, filename, "eval", flags=flags, dont_inherit=True)
        value = eval(code, self.namespace)
        if code.co_flags & _CO_COROUTINE:
            value = await value
        return value

    async def _settle(self) -> None:
        """Cancel what the run left running: no tool call happens outside a run."""
        keep = (asyncio.current_task(), self._server)
        left = [t for t in asyncio.all_tasks() if t not in keep and not t.done()]
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=1.0)
        for future in self._waiting.values():
            future.cancel()
        self._waiting.clear()

    def _plain(self, value: Any) -> tuple[Any, str | None]:
        kind = cast("type[object]", type(value))
        if value is None or kind is bool or kind is float:
            return value, None
        if kind is int and -(2**63) <= value < 2**64:
            return value, None
        if kind is str:
            return (value, None) if len(value) <= self.max_output else self._big()
        from ._convert import NotPlainData, to_plain  # on first use: it imports a lot

        try:
            plain = to_plain(value, "value")
        except NotPlainData as exc:
            try:
                text = _text(repr(value))
            except BaseException as error:  # a hostile or huge object: its repr fails
                text = f"<unrepresentable: {type(error).__name__}>"
            return text, (
                f"the value is a {exc.type_name}, which is not plain data; its repr is shown"
            )
        except BaseException as exc:  # a hostile object: never let it escape
            return None, f"the value could not be converted: {type(exc).__name__}"
        if len(encode(plain)) > self.max_output:
            return self._big()
        return plain, None

    def _big(self) -> tuple[None, str]:
        return None, f"the value is larger than {self.max_output} bytes; it is not returned"


_SANDBOX = Sandbox()


def main() -> None:
    """The guest's entry point: fds 0 and 1 are the protocol, fd 2 is the host's console."""
    sys.stdout = sys.stderr
    if not _SANDBOX.setup():
        return
    loop = _wasi.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_SANDBOX.serve())
    finally:
        loop.close()
