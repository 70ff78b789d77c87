"""The code sandbox's guest: the agent's Python runs here, one run at a time.

REPL semantics: top-level ``await``; the last expression is the run's value; variables
and imports persist between runs; ``print`` is captured (capped). An exception returns
the traceback of the agent's own code only. A run may bring modules (importable by name,
kept in this process only), plain-data globals, a function to call once the code has
loaded (``execute``) and the file name its tracebacks show; the host checked them all.

Every tool is a global (bare names, and ``tools.FILE.EXPORT[.MEMBER]``). A tool proxy is a
data-only stub: calling it returns an awaitable :class:`ToolCall` that, when awaited, can
only send a ``use`` frame (tool name, arguments) and wait for the answer. Nothing of the
host is behind it: the mediator, policy and credentials live in another process, which
authorises every frame itself and trusts nothing this process claims. A call that is never
awaited never runs; the run reports it as a warning with the tool's name and line.

The error classes of the host exist here by name (``except PolicyDenied``); an error from
the host is rebuilt from strings only. Runs under CPython-WASI (with the asyncio shim of
``capsule._wasi``) and under a normal CPython (the weaker subprocess fallback).

One file on purpose, although it has seams (the error classes, the tool proxies, reading
frames, a run's output as data, the driver): every part is needed before the guest
answers its setup frame or first run, and in the unoptimised WASI build each module
imported at start costs about half a millisecond, whatever its size. Split into a driver
and three modules (2026-12-01), importing it took 4.7 -> 6.3 ms of CPU and a new sandbox
was ready 1-3 ms later at the fast end (of 25-35 ms), the call path unchanged; so it
stays whole. ``asyncio``, ``_ast``, ``traceback`` and ``capsule._convert`` are imported
on first use or while the guest idles.
"""

from __future__ import annotations

import _collections_abc  # what ``collections.abc`` re-exports, without importing ``collections``
import builtins
import os
import sys

from . import _wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    from collections.abc import Coroutine, Generator
    from typing import Any

    _CoroutineBase = Coroutine[Any, Any, Any]
else:
    _CoroutineBase = _collections_abc.Coroutine

# The frame kinds of ``capsule.protocol`` (which imports msgpack: too slow to load here).
K_SETUP = "setup"
K_READY = "ready"
K_RUN = "run"
K_USE = "use"
K_DROP = "drop"
K_DONE = "done"
K_OK = "ok"
K_ERR = "err"
MAX_FRAME = 16 * 1024 * 1024
PyCF_ONLY_AST = 0x400  # the ``_ast`` constants: importing ``_ast`` costs ~40 ms under WASI
PyCF_ALLOW_TOP_LEVEL_AWAIT = 0x2000

__all__ = ["main", "ERRORS"]

_CO_COROUTINE = 0x80
_MAX_TEXT = 64 * 1024
_TB_ENDS = 100
"""Frames of agent code a traceback shows at each end of the stack; the middle is counted."""
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


class ToolCall(_CoroutineBase):
    """One tool call, not yet sent. Awaiting it sends it; dropping it unawaited means it
    never runs (and the run's result says so).

    Awaited while the run is driven by hand, it yields itself to the driver (the request:
    tool, arguments), which makes the call and sends the answer back."""

    __slots__ = ("_steps", "args", "awaited", "kwargs", "line", "tool")

    def __init__(self, tool: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.tool = tool
        self.args = args
        self.kwargs = kwargs
        self.awaited = False
        self._steps: Generator[Any, None, Any] | None = None
        # The line of the agent's code making the call (for the never-awaited warning):
        # usually the caller of ``Tool.__call__``, the first frame looked at. Inline: a
        # call costs more than the loop in the unoptimised build.
        try:
            frame = sys._getframe(2)  # pyright: ignore[reportPrivateUsage]
        except ValueError:
            frame = None
        files = _SANDBOX.agent_files
        while frame is not None and frame.f_code.co_filename not in files:
            frame = frame.f_back
        self.line = None if frame is None else frame.f_lineno
        calls = _SANDBOX.calls  # the run's calls: the never-awaited ones are reported
        if len(calls) < 100_000:
            calls.append(self)

    def __repr__(self) -> str:
        state = "awaited" if self.awaited else "not awaited: it has not run"
        return f"<call {self.tool}(...) {state}>"

    def __await__(self) -> Generator[Any, None, Any]:
        if self.awaited:
            raise RuntimeError(f"this call to {self.tool} was already awaited")
        self.awaited = True
        if _SANDBOX.loop_mode:  # inside asyncio's loop
            if _SANDBOX.alone():  # nothing else could run meanwhile: made in place
                return _SANDBOX.call_in_place(self)
            return (yield from _SANDBOX.use(self.tool, self.args, self.kwargs).__await__())
        # Driven by the run itself: the driver makes the call and sends the answer back.
        return (yield self)

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


class _Adopt:
    """Hands a run that the driver started over to asyncio's loop, mid-flight: yields what
    the run's coroutine yields (to the task running this), and makes the one pending
    :class:`ToolCall` (if the switch happened there) a call through the loop."""

    __slots__ = ("_coro", "_pending")

    def __init__(self, coro: Coroutine[Any, Any, Any], pending: object) -> None:
        self._coro = coro
        self._pending = pending

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, step = self._coro, self._pending
        while True:
            try:
                if type(step) is ToolCall:
                    try:
                        use = _SANDBOX.use(step.tool, step.args, step.kwargs)
                        value = yield from use.__await__()
                    except BaseException as exc:
                        step = coro.throw(exc)
                    else:
                        step = coro.send(value)
                else:
                    try:
                        value = yield step
                    except BaseException as exc:
                        step = coro.throw(exc)
                    else:
                        step = coro.send(value)
            except StopIteration as stop:
                return stop.value


async def _adopt(coro: Coroutine[Any, Any, Any], pending: object) -> Any:
    return await _Adopt(coro, pending)


async def _adopt_later(coro: Coroutine[Any, Any, Any], pending: list[object]) -> Any:
    """:func:`_adopt` for a run's task made before its hand-over (``pending[0]`` is set
    then: see :meth:`Sandbox.run_task`)."""
    return await _Adopt(coro, pending[0])


def _lend_tasks(asyncio: Any) -> None:
    """Make ``asyncio.current_task()`` answer for a run stepped by hand.

    Such a run has no task (the driver steps its coroutine itself), so ``asyncio.timeout``,
    ``wait_for`` and ``TaskGroup``, which ask for the current task, would fail. Asked while
    a run is stepped by hand, the sandbox makes the run's task then (:meth:`Sandbox.run_task`)
    and the rest of the run goes on in it, on the loop.
    """
    real = asyncio.tasks.current_task

    def current_task(loop: Any = None) -> Any:
        task = real(loop)
        asked = loop is None or loop is _SANDBOX.loop
        if task is None and _SANDBOX.stepping is not None and asked:
            task = _SANDBOX.run_task()
        return task

    asyncio.tasks.current_task = current_task
    asyncio.current_task = current_task


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
    """``tools.FILE.EXPORT[.MEMBER]``, a global for every installed export, and
    ``toolhost.search`` and ``toolhost.declaration``."""
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
    # The helpers that find and read declarations (``host.declare._catalog``): answered
    # by the host from the declarations, never by a tool.
    scope["toolhost"] = Namespace(
        "toolhost",
        {"search": Tool("toolhost.search"), "declaration": Tool("toolhost.declaration")},
    )
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
    try:
        import traceback  # costly at start-up under WASI: warmed up when idle, or now

        _SANDBOX.share_sources()
        files = _SANDBOX.agent_files
        ours: list[tuple[Any, int]] = []  # (frame, line) of the agent's own code
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename in files:
                ours.append((tb.tb_frame, tb.tb_lineno))
            tb = tb.tb_next
        # A deep recursion leaves 10**5 frames or more: reading the source lines of each
        # took seconds in the guest. The ends of the stack say where it went wrong.
        cut = len(ours) - 2 * _TB_ENDS
        ends = [ours[:_TB_ENDS], ours[-_TB_ENDS:]] if cut > 0 else [ours]
        lines: list[str] = []
        for i, part in enumerate(ends):
            if i:
                lines.append(f"  ... {cut} more frames of the same run ...\n")
            lines += traceback.StackSummary.extract(iter(part)).format()
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


_NOT_UNICODE = (
    "the value holds text that is not valid Unicode (a lone surrogate), "
    "so its repr is shown, with the surrogates escaped"
)


def _valid(text: str) -> str:
    """``text`` with lone surrogates (which UTF-8 cannot carry) as ``\\udXXX`` escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _valid_done(done: dict[str, Any], max_output: int) -> dict[str, Any]:
    """A ``done`` frame that would not encode (text holding lone surrogates: in a print,
    an error message, the value), with every text made valid, and the value shown as its
    repr (escaped) with a warning if it was the culprit."""
    value = done["value"]
    warnings = [_valid(w) for w in done["warnings"]]
    try:
        _wire.encode(value)
    except (ValueError, TypeError, OverflowError):
        value = _valid(_text(repr(value)))
        if len(value) > max_output:
            value = None
        warnings.append(_NOT_UNICODE)
    error = done["error"]
    if error is not None:
        error = {k: _valid(v) if type(v) is str else v for k, v in error.items()}
    return {
        **done,
        "value": value,
        "stdout": _valid(done["stdout"]),
        "error": error,
        "warnings": warnings,
    }


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


class _HostGone(BaseException):
    """The host closed the protocol pipe: the guest ends."""


class _HostBroke(BaseException):
    """The host sent bytes that are not a frame: the guest ends (the host sees it die)."""


class _Frames:
    """Frame bodies from the host's pipe: a 4-byte big-endian length, then the body."""

    __slots__ = ("_bodies", "_buf", "_fd")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buf = b""
        self._bodies: list[bytes] = []

    @property
    def pending(self) -> bool:
        return bool(self._bodies)

    @property
    def empty(self) -> bool:
        """Nothing read and not yet taken: no frame, no part of one."""
        return not self._bodies and not self._buf

    def read(self) -> bytes:
        """One ``read`` of the pipe (it must be readable, or this blocks), not yet fed."""
        try:
            data = os.read(self._fd, 1 << 18)
        except OSError:
            data = b""
        if not data:
            raise _HostGone
        return data

    def feed(self, data: bytes | None = None) -> None:
        """Split ``data`` (else one :meth:`read`) into frames."""
        if data is None:
            data = self.read()
        buf = self._buf + data if self._buf else data
        start, end = 0, len(buf)
        while end - start >= 4:
            size = int.from_bytes(buf[start : start + 4], "big")
            if size > MAX_FRAME:
                raise _HostBroke(f"a frame of {size} bytes is over the cap")
            if end - start - 4 < size:
                break
            self._bodies.append(buf[start + 4 : start + 4 + size])
            start += 4 + size
        self._buf = buf[start:]

    def next_body(self) -> bytes:
        """The next frame's body, reading (blocking) as needed."""
        while not self._bodies:
            self.feed()
        return self._bodies.pop(0)

    def next(self) -> dict[str, Any]:
        """The next frame, reading (blocking) as needed."""
        return _frame_map(self.next_body())


def _frame_map(body: bytes) -> dict[str, Any]:
    try:
        msg = _wire.decode(body)
    except _wire.WireError as exc:
        raise _HostBroke(str(exc)) from None
    if type(msg) is not dict:
        raise _HostBroke("a frame must be a map")
    return msg  # pyright: ignore[reportUnknownVariableType]


_OK_HEAD = b"\x83\xa1k\xa2ok\xa2id"
"""How the host's ``{"k": "ok", "id": ..., "value": ...}`` begins (msgpack keeps order)."""
_USE_TAIL = b"\x80\xa4args"
_USE_TAIL_WAIT = b"\x80\xa4wait\xc3\xa4args"
"""A ``use`` frame's end, from its empty kwargs to its args' key."""


_WARM_UP = (
    # Imported while the sandbox is idle, one at a time between frames, so that the first
    # run needing them does not wait: ``_ast`` for multi-statement runs, ``traceback`` for
    # the first error, then ``asyncio`` (about half a second in the unoptimised build) in
    # pieces, its heaviest dependencies first.
    "_ast",
    "linecache",
    "traceback",
    "inspect",
    "logging",
    "concurrent.futures",
    "socket",
    "selectors",
    "subprocess",
    "asyncio",
)
_IDLE = 0.05
"""Seconds without a frame before the next warm-up step."""


def _names(code: Any, into: set[str]) -> set[str]:
    """Every name a code object and the code nested in it refer to."""
    into.update(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            _names(const, into)
    return into


class _LoaderThen:
    """A module's own loader, then a callback once the module has run."""

    __slots__ = ("_loader", "_then")

    def __init__(self, loader: Any, then: Any) -> None:
        self._loader = loader
        self._then = then

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self._loader  # no trace of this wrapper
        self._then()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _WhenAsyncio:
    """On ``sys.meta_path`` until ``asyncio`` is first imported, however that happens
    (``import asyncio``, ``__import__``, ``importlib``, another module): then the sandbox
    makes its event loop at once, so a run that reached asyncio finds it running."""

    def __init__(self, then: Any) -> None:
        self._then = then

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "asyncio":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _LoaderThen(spec.loader, self._then)
                return spec
        return None


class _Siblings:
    """On ``sys.meta_path``: the modules a run gave (``modules=``), importable by name.
    Their source lives in this process only; the host checked their names (no dots, no
    standard-library or tools names), so nothing else is shadowed."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if path is not None or name not in self._sandbox.modules:
            return None
        import importlib.util

        loader: Any = self
        return importlib.util.spec_from_loader(name, loader, origin=self._sandbox.modules[name][0])

    def create_module(self, spec: Any) -> Any:
        return None

    def exec_module(self, module: Any) -> None:
        filename, source = self._sandbox.modules[module.__name__]
        module.__file__ = filename
        for name, value in self._sandbox.tool_scope.items():  # tools are its globals too
            module.__dict__.setdefault(name, value)
        code = compile(source, filename, "exec", dont_inherit=True)
        exec(code, module.__dict__)  # the agent's own module, in this sandbox only


class Sandbox:
    """The guest's state: the agent's namespace, the calls waiting on the host, the loop.

    A run is driven by :meth:`_drive`: the run's coroutine is stepped by hand, and each tool
    call it awaits is one frame out and one frame back, with no event loop in between.
    Only when the code needs asyncio (``gather``, ``sleep``, tasks) is the run handed to
    asyncio's loop (:class:`_Adopt`), where calls wait on futures and run concurrently.
    ``asyncio`` is imported when a run names it, or while the sandbox is idle.
    """

    def __init__(self, proto_in: int = 0, proto_out: int = 1) -> None:
        self._in = proto_in
        self._out = proto_out
        self._frames = _Frames(proto_in)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._run: int | None = None
        self._heads: dict[str, bytes] = {}
        self._heads_run: int | None = None
        self._runs = 0
        self.calls: list[ToolCall] = []
        self._sources: dict[str, tuple[int, None, list[str], str]] = {}
        self._warm = list(_WARM_UP)
        self._hook: _WhenAsyncio | None = None
        self.loop_mode = False
        self.stepping: Coroutine[Any, Any, Any] | None = None
        """The run's coroutine while :meth:`_drive` steps it by hand."""
        self._task: tuple[Any, Any, list[object]] | None = None
        """The run's task made while it is stepped by hand (:meth:`run_task`): the task,
        its first step (held back), and the step the hand-over leaves pending."""
        self.max_output = 1024 * 1024
        self.max_argument = 4 * 1024 * 1024
        self.namespace: dict[str, Any] = {}
        self.agent_files: set[str] = set()
        """The file names of the agent's code (its runs, its modules): what tracebacks
        show, and where the line of a call never awaited is looked for."""
        self.modules: dict[str, tuple[str, str]] = {}
        """Module name -> (file name, source) of the modules runs gave (``modules=``)."""
        self._siblings: _Siblings | None = None
        self.tool_scope: dict[str, Any] = {}
        """The tool globals and the error classes (what a module of the run sees too)."""

    # -- frames ----------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        self._write_all(len(data).to_bytes(4, "big") + data)

    def _write_all(self, data: bytes) -> None:
        """Write a whole frame (its length prefix included)."""
        done = os.write(self._out, data)
        if done < len(data):  # a pipe takes up to 64 KiB at once
            view = memoryview(data)[done:]
            while view:
                view = view[os.write(self._out, view) :]

    def send(self, value: dict[str, Any]) -> None:
        self._write(_wire.encode(value))

    def setup(self) -> bool:
        """Read the ``setup`` frame, build the agent's globals, answer ``ready``."""
        try:
            msg = self._frames.next()
        except _HostGone:
            return False
        if msg.get("k") != K_SETUP or self._frames.pending:
            raise _HostBroke(f"expected one setup frame first, got {msg.get('k')!r}")
        if "asyncio" not in sys.modules:
            self._hook = _WhenAsyncio(self._asyncio_imported)
            sys.meta_path.insert(0, self._hook)
        self.max_output = int(msg.get("max_output", self.max_output))
        self.max_argument = int(msg.get("max_argument", self.max_argument))
        scope: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        scope.update(ERRORS)
        scope.update(_tool_globals(list(msg.get("tools", []))))
        self.tool_scope = {k: v for k, v in scope.items() if k not in ("__name__", "__builtins__")}
        self.namespace = scope
        self.send(
            {"k": K_READY, "pid": os.getpid(), "python": ".".join(map(str, sys.version_info[:3]))}
        )
        return True

    def serve(self) -> None:
        """Run what the host sends, one run at a time, until it closes the pipe."""
        try:
            while True:
                if not self._frames.pending:
                    self._idle()
                msg = self._frames.next()
                kind = msg.get("k")
                if kind == K_RUN:
                    self._execute(int(msg["id"]), str(msg["source"]), msg)
                elif kind not in (K_OK, K_ERR):  # a late answer to a dropped call is fine
                    raise _HostBroke(f"unknown frame kind {kind!r}")
        except _HostGone:
            pass

    def _idle(self) -> None:
        """Warm up (one import at a time) until a frame arrives or nothing is left."""
        while self._warm:
            import select  # a C module: cheap

            if select.select([self._in], [], [], _IDLE)[0]:
                return
            name = self._warm.pop(0)
            try:
                __import__(name)
            except BaseException:  # a warm-up only: the run that needs it will say why
                continue
            if name == "asyncio":
                self._event_loop()

    def _asyncio_imported(self) -> None:
        """``asyncio`` was just imported: the loop exists from now on, and a run driven by
        hand sees it running, as it would had the loop existed when the run began."""
        hook, self._hook = self._hook, None
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
        if self._run is None or self.loop_mode:
            return  # between runs (the warm-up) the loop is made by whoever imported it
        loop = self._event_loop()
        import asyncio

        asyncio.events._set_running_loop(loop)  # pyright: ignore[reportPrivateUsage]

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            import asyncio

            from . import _wasi

            if self._loop is None:  # importing asyncio may have made it (_asyncio_imported)
                self._loop = _wasi.new_event_loop()
                asyncio.set_event_loop(self._loop)
                _lend_tasks(asyncio)
        return self._loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    def run_task(self) -> Any:
        """The task of the run stepped by hand, made now (something asked for the current
        task): current from now on, its first step held back until the hand-over, where
        it takes the run over (:meth:`_hand_over`); dropped if the run ends by hand."""
        import asyncio

        loop: Any = self._event_loop()
        ready: Any = loop._ready  # the stock loop's queue of callbacks
        pending: list[object] = [None]
        coro = self.stepping
        assert coro is not None
        wrapper = _adopt_later(coro, pending)
        before = len(ready)
        task = asyncio.Task(wrapper, loop=loop)  # not the loop's factory: no eager start
        if len(ready) != before + 1:  # not a stock loop: nothing to hold back
            wrapper.close()
            return None
        step: Any = ready.pop()
        asyncio.tasks._enter_task(loop, task)  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]
        self._task = (task, step, pending)
        return task

    def _drop_task(self) -> None:
        """The run ended by hand: its task (never started) ends cancelled."""
        held, self._task = self._task, None
        if held is None:
            return
        import asyncio

        task, step, _ = held
        loop: Any = self._loop
        asyncio.tasks._leave_task(loop, task)  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]
        task.cancel()
        step._run()  # its first step: the wrapper is cancelled before it starts

    def _on_readable(self) -> None:
        """While the loop runs: answers to the calls waiting on futures."""
        try:
            self._answers()
        except _HostGone:  # the loop would only log it: end here
            os._exit(0)
        except _HostBroke as exc:
            os.write(2, f"toolhost sandbox: the host broke the protocol: {exc}\n".encode())
            os._exit(1)

    def alone(self) -> bool:
        """On asyncio's loop: whether nothing else could run while a call waits (no call
        in flight, no callback ready, no timer), so the call may be made in place, as a run
        driven by hand makes it: one frame out, one back, no future and no trip through the
        loop. Any other task, callback or timer (``gather``, ``wait_for``, ``sleep`` in a
        task) keeps calls on futures, where they run concurrently and can be cancelled."""
        return not self._waiting and self._loop is not None and not self._loop_busy()

    def call_in_place(self, call: ToolCall) -> Any:
        """:meth:`_call_now` from inside the loop; a host that is gone or broke the
        protocol ends the guest here (as :meth:`_on_readable` does), never as an exception
        the agent's code could catch."""
        try:
            return self._call_now(call)
        except _HostGone:
            os._exit(0)
        except _HostBroke as exc:
            os.write(2, f"toolhost sandbox: the host broke the protocol: {exc}\n".encode())
            os._exit(1)

    def _answers(self) -> None:
        self._frames.feed()
        while self._frames.pending:
            msg = self._frames.next()
            kind = msg.get("k")
            if kind not in (K_OK, K_ERR):
                raise _HostBroke(f"unexpected frame kind {kind!r} during a run")
            call_id = msg.get("id")
            future = self._waiting.pop(call_id, None) if type(call_id) is int else None
            if future is None or future.done():
                continue  # the code stopped waiting: a late answer is dropped
            if kind == K_OK:
                future.set_result(msg.get("value"))
            else:
                future.set_exception(_rebuild(_as_dict(msg.get("error"))))

    # -- tool calls ------------------------------------------------------------------

    def _use_frame(
        self, tool: str, args: tuple[Any, ...], kwargs: dict[str, Any], wait: bool
    ) -> bytes:
        """Send one ``use`` frame; returns its id, packed. ``wait``: nothing else is sent
        until its answer is read (the host may then make the call without starting a task)."""
        run = self._run
        if run is None:
            raise RuntimeError("tools can only be called while a run is in progress")
        try:
            packed_args = _wire.encode_args(args)
            packed_kwargs = _wire.encode(kwargs) if kwargs else b"\x80"
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidArguments(
                f"invalid arguments for {tool}: pass plain data only "
                f"(None, bool, int, float, str, bytes, list, dict with str keys): {exc}",
                tool=tool,
            ) from None
        size = len(packed_args) + len(packed_kwargs)
        if size > self.max_argument:
            raise InvalidArguments(
                f"invalid arguments for {tool}: they take {size} bytes encoded, over "
                f"the limit of {self.max_argument}; pass a reference instead of the data",
                tool=tool,
            )
        self._next_id = call_id = self._next_id + 1
        packed_id = _wire.encode_int(call_id)
        # {"k": "use", "run", "tool", "id", "kwargs"[, "wait": true], "args"} by hand: the
        # arguments are encoded once, "k", "run" and "tool" once per run and tool, and the
        # rest is constants and the id.
        if run != self._heads_run:
            self._heads, self._heads_run = {}, run
        head = self._heads.get(tool)
        if head is None:
            head = self._heads[tool] = b"".join(
                (b"\xa1k\xa3use\xa3run", _wire.encode_int(run), b"\xa4tool", _wire.encode(tool))
            )
        if packed_kwargs == b"\x80":
            tail = _USE_TAIL_WAIT if wait else _USE_TAIL
        else:
            tail = b"".join((packed_kwargs, b"\xa4wait\xc3\xa4args" if wait else b"\xa4args"))
        size = 1 + len(head) + 3 + len(packed_id) + 7 + len(tail) + len(packed_args)
        self._write_all(
            b"".join(
                (
                    size.to_bytes(4, "big"),
                    b"\x87" if wait else b"\x86",
                    head,
                    b"\xa2id",
                    packed_id,
                    b"\xa6kwargs",
                    tail,
                    packed_args,
                )
            )
        )
        return packed_id

    def _call_now(self, call: ToolCall) -> Any:
        """Make one call while the run is driven by hand: frame out, wait, frame back."""
        packed_id = self._use_frame(call.tool, call.args, call.kwargs, True)
        frames = self._frames
        if frames.empty:  # the usual case: one read brings exactly the answer
            data = frames.read()
            ok = b"".join((_OK_HEAD, packed_id, b"\xa5value"))
            if int.from_bytes(data[:4], "big") == len(data) - 4 and data.startswith(ok, 4):
                try:
                    value, end = _wire.decode_from(data, 4 + len(ok))
                except _wire.WireError as exc:
                    raise _HostBroke(str(exc)) from None
                if end == len(data):
                    return value
            frames.feed(data)
        call_id = _wire.decode(packed_id)
        while True:
            body = frames.next_body()
            msg = _frame_map(body)
            kind = msg.get("k")
            if kind not in (K_OK, K_ERR):
                raise _HostBroke(f"unexpected frame kind {kind!r} during a run")
            if msg.get("id") != call_id:
                continue  # a late answer to a call an earlier run dropped
            if kind == K_OK:
                return msg.get("value")
            raise _rebuild(_as_dict(msg.get("error")))

    async def use(self, tool: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Send one call frame and wait for the host's answer, on the loop."""
        import asyncio

        call_id = _wire.decode(self._use_frame(tool, args, kwargs, False))
        future: asyncio.Future[Any] = self._event_loop().create_future()
        self._waiting[call_id] = future
        try:
            return await future
        except asyncio.CancelledError:
            if self._waiting.pop(call_id, None) is not None:
                self.send({"k": K_DROP, "id": call_id})
            raise

    # -- runs ------------------------------------------------------------------------

    def share_sources(self) -> None:
        """The runs' sources for ``linecache`` (tracebacks), once something loaded it."""
        linecache = sys.modules.get("linecache")
        if linecache is not None:
            linecache.cache.update(self._sources)

    def _add_modules(self, modules: dict[str, Any]) -> None:
        """Make the run's modules importable; one given again with new source is
        imported afresh on its next import."""
        if self._siblings is None:
            self._siblings = _Siblings(self)
            sys.meta_path.insert(0, self._siblings)
        for file, source in modules.items():
            name = str(file)[:-3]
            entry = (str(file), str(source))
            if self.modules.get(name) != entry:
                sys.modules.pop(name, None)
            self.modules[name] = entry
            self.agent_files.add(entry[0])
            self._sources[entry[0]] = (len(entry[1]), None, entry[1].splitlines(True), entry[0])

    def _execute(self, run_id: int, source: str, msg: dict[str, Any]) -> None:
        self._runs += 1
        filename = msg.get("filename")
        if type(filename) is not str or not filename:
            filename = f"<run {self._runs}>"
        self.agent_files.add(filename)
        self._sources[filename] = (len(source), None, source.splitlines(True), filename)
        modules = msg.get("modules")
        if type(modules) is dict and modules:
            self._add_modules(modules)  # pyright: ignore[reportUnknownArgumentType]
        bound = msg.get("globals")
        if type(bound) is dict:
            self.namespace.update(bound)  # pyright: ignore[reportUnknownArgumentType]
        execute = msg.get("execute")
        self.share_sources()
        capture = _Capture(self.max_output)
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = capture
        self._run = run_id
        self.calls = []
        ok, value, error = True, None, None
        try:
            value = self._drive(self._evaluate(source, filename, _as_dict(execute)))
        except (_HostGone, _HostBroke):
            raise
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
            if isinstance(exc, MemoryError):
                # The host replaces this sandbox: free the agent's data first, so that
                # reporting the error (which may import ``traceback``) has memory to use.
                self.namespace.clear()
            error = _error(exc)
            if capture.over:
                error = {**error, "kind": "limit_exceeded", "limit": "code_max_output"}
        finally:
            sys.stdout, sys.stderr = saved
            self._run = None
        self._settle()
        warnings = [
            f"line {c.line}: {c.tool}(...) was never awaited, so it did not run; "
            f"write `await {c.tool}(...)`"
            if c.line is not None
            else f"{c.tool}(...) was never awaited, so it did not run"
            for c in self.calls
            if not c.awaited
        ][:_MAX_WARNINGS]
        self.calls = []
        plain, note = self._plain(value) if ok else (None, None)
        if note:
            warnings.append(note)
        done = {
            "k": K_DONE,
            "id": run_id,
            "ok": ok,
            "value": plain,
            "stdout": capture.text(),
            "error": error,
            "warnings": warnings,
        }
        try:
            body = _wire.encode(done)
        except (ValueError, TypeError, OverflowError):  # lone surrogates: no UTF-8 for them
            body = _wire.encode(_valid_done(done, self.max_output))
        self._write(body)

    def _compile(self, source: str, filename: str) -> tuple[Any, Any]:
        """(statements, last expression or None) compiled, top-level ``await`` allowed."""
        flags = PyCF_ALLOW_TOP_LEVEL_AWAIT
        try:  # one expression, the usual snippet: no syntax tree needed
            return None, compile(source, filename, "eval", flags=flags, dont_inherit=True)
        except SyntaxError:
            pass
        import _ast

        tree = compile(source, filename, "exec", flags=flags | PyCF_ONLY_AST, dont_inherit=True)
        assert isinstance(tree, _ast.Module)
        last: _ast.Expression | None = None
        tail = tree.body[-1] if tree.body else None
        if isinstance(tail, _ast.Expr):
            tree.body.pop()
            last = _ast.Expression(tail.value)
        code = compile(tree, filename, "exec", flags=flags, dont_inherit=True)
        if last is None:
            return code, None
        return code, compile(last, filename, "eval", flags=flags, dont_inherit=True)

    async def _evaluate(self, source: str, filename: str, execute: dict[str, Any]) -> Any:
        code, last = self._compile(source, filename)
        names: set[str] = set()
        for part in (code, last):
            if part is not None:
                _names(part, names)
        if "asyncio" in names:  # the code uses asyncio: make it importable and a global
            import asyncio

            self._event_loop()
            self.namespace.setdefault("asyncio", asyncio)
        if code is not None:
            result = eval(code, self.namespace)  # the agent's code, in this sandbox only
            if code.co_flags & _CO_COROUTINE:
                await result
        value = None
        if last is not None:
            value = eval(last, self.namespace)
            if last.co_flags & _CO_COROUTINE:
                value = await value
        if execute:
            value = await self._call_entry(execute)
        return value

    async def _call_entry(self, execute: dict[str, Any]) -> Any:
        """``execute=``: the named function of the code, called once it has loaded, with
        the run's arguments; awaited when it returns an awaitable (an ``async def``)."""
        name = str(execute.get("fn"))
        fn = self.namespace.get(name)
        if fn is None:
            raise NameError(f"execute: the code defines no function named {name!r}")
        if not callable(fn):
            raise TypeError(f"execute: {name!r} is a {type(fn).__name__}, not a function")
        value: Any = fn(*list(execute.get("args") or ()), **_as_dict(execute.get("kwargs")))
        if hasattr(type(value), "__await__"):  # pyright: ignore[reportUnknownArgumentType]
            value = await value
        return value

    def _drive(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Step the run by hand while it only awaits tool calls; else hand it to the loop."""
        loop = self._loop
        if loop is not None:
            # asyncio's functions (create_task, sleep, gather) find this loop while the run
            # is driven here; the loop itself runs only after a hand-over.
            import asyncio

            asyncio.events._set_running_loop(loop)  # pyright: ignore[reportPrivateUsage]
        self.stepping = coro
        handed = False
        try:
            value: Any = None
            error: BaseException | None = None
            while True:
                try:
                    step = coro.send(value) if error is None else coro.throw(error)
                except StopIteration as stop:
                    return stop.value
                value = error = None
                if type(step) is not ToolCall:
                    break
                loop = self._loop  # as _loop_busy(), without its calls
                if loop is not None and (loop._ready or loop._scheduled):  # pyright: ignore
                    break
                try:
                    value = self._call_now(step)
                except (_HostGone, _HostBroke):
                    raise
                except BaseException as exc:  # the call's error, raised where it was awaited
                    error = exc
            handed = True
        finally:
            self.stepping = None
            if not handed:
                self._drop_task()
            if self._loop is not None:  # also when the run itself imported asyncio
                import asyncio

                asyncio.events._set_running_loop(None)  # pyright: ignore[reportPrivateUsage]
        return self._hand_over(coro, step)

    def _loop_busy(self) -> bool:
        """Whether something is scheduled on the loop (a task, a timer) that must run
        while the run waits: then the run waits on the loop, not by hand."""
        loop = self._loop
        return loop is not None and bool(
            getattr(loop, "_ready", None) or getattr(loop, "_scheduled", None)
        )

    def _hand_over(self, coro: Coroutine[Any, Any, Any], step: object) -> Any:
        loop = self._event_loop()
        held, self._task = self._task, None
        self.loop_mode = True
        loop.add_reader(self._in, self._on_readable)
        try:
            if held is None:
                return loop.run_until_complete(_adopt(coro, step))
            # The run already has its task (something asked for it): it goes on there.
            import asyncio

            task, first, pending = held
            pending[0] = step
            # From 3.14, leaving a task is checked against the running loop: set it for that.
            asyncio.events._set_running_loop(loop)  # pyright: ignore[reportPrivateUsage]
            try:
                asyncio.tasks._leave_task(loop, task)  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]
            finally:
                asyncio.events._set_running_loop(None)  # pyright: ignore[reportPrivateUsage]
            stock: Any = loop
            stock._ready.appendleft(first)  # its first step, first: it takes the run over
            return loop.run_until_complete(task)
        finally:
            loop.remove_reader(self._in)
            self.loop_mode = False

    def _settle(self) -> None:
        """Cancel what the run left running: no tool call happens outside a run."""
        loop = self._loop
        if loop is None:
            return
        import asyncio

        left = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in left:
            task.cancel()
        if left or self._loop_busy():
            self.loop_mode = True
            loop.add_reader(self._in, self._on_readable)
            try:
                loop.run_until_complete(asyncio.wait(left, timeout=1.0) if left else _nothing())
            finally:
                loop.remove_reader(self._in)
                self.loop_mode = False
        for future in self._waiting.values():
            future.cancel()
        self._waiting.clear()

    def _plain(self, value: Any) -> tuple[Any, str | None]:
        kind: type[object] = type(value)  # pyright: ignore[reportUnknownVariableType]
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
            if len(text) > self.max_output:
                return self._big()
            return text, (
                f"the value is a {exc.type_name}, which is not plain data; its repr is shown"
            )
        except BaseException as exc:  # a hostile object: never let it escape
            return None, f"the value could not be converted: {type(exc).__name__}"
        try:
            size = len(_wire.encode(plain))
        except (ValueError, TypeError, OverflowError):  # lone surrogates in its text
            text = _valid(_text(repr(value)))
            if len(text) > self.max_output:
                return self._big()
            return text, _NOT_UNICODE
        if size > self.max_output:
            return self._big()
        return plain, None

    def _big(self) -> tuple[None, str]:
        return None, f"the value is larger than {self.max_output} bytes; it is not returned"


async def _nothing() -> None:
    pass


def _as_dict(value: object) -> dict[str, Any]:
    if type(value) is dict:
        return value  # pyright: ignore[reportUnknownVariableType]
    return {}


_SANDBOX = Sandbox()


def main() -> None:
    """The guest's entry point: fds 0 and 1 are the protocol, fd 2 is the host's console."""
    sys.stdout = sys.stderr
    try:
        if _SANDBOX.setup():
            _SANDBOX.serve()
    except _HostGone:
        pass
