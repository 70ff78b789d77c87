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

This module is the driver (:class:`Sandbox`: setup, runs, the calls' frames, the hand-over
to asyncio's loop) and the entry point, :func:`main`. Its parts: ``_guest_tools`` (what
agent code sees of the tools), ``_guest_errors`` (the host's errors by name, rebuilt from
data), ``_guest_io`` (frames read from the host; a run's output, error and value as data).
The guest imports all three at its start, each about half a millisecond in the unoptimised
WASI build, so parts are not split further; :class:`Sandbox` stays whole because the call
path runs through its state. Names on the call path are imported by name, so a call looks
up no more globals than when all of it was one file. ``asyncio``, ``_ast``, ``traceback``
and ``capsule._convert`` are imported on first use or while the guest idles.
"""

from __future__ import annotations

import builtins
import os
import sys

from . import _wire
from ._guest_errors import ERRORS, InvalidArguments, as_dict, rebuild
from ._guest_io import (
    K_DONE,
    K_DROP,
    K_ERR,
    K_OK,
    K_READY,
    K_RUN,
    K_SETUP,
    Capture,
    Frames,
    HostBroke,
    HostGone,
    OutputLimit,
    as_plain,
    error_data,
    frame_map,
    share_sources,
)
from ._guest_tools import ToolCall, attach, tool_globals

TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    from collections.abc import Coroutine, Generator
    from typing import Any

PyCF_ONLY_AST = 0x400  # the ``_ast`` constants: importing ``_ast`` costs ~40 ms under WASI
PyCF_ALLOW_TOP_LEVEL_AWAIT = 0x2000

__all__ = ["main"]

_CO_COROUTINE = 0x80
_MAX_WARNINGS = 50

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
        self._frames = Frames(proto_in)
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
        self.max_output = 1024 * 1024
        self.max_argument = 4 * 1024 * 1024
        self.namespace: dict[str, Any] = {}

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
        except HostGone:
            return False
        if msg.get("k") != K_SETUP or self._frames.pending:
            raise HostBroke(f"expected one setup frame first, got {msg.get('k')!r}")
        if "asyncio" not in sys.modules:
            self._hook = _WhenAsyncio(self._asyncio_imported)
            sys.meta_path.insert(0, self._hook)
        self.max_output = int(msg.get("max_output", self.max_output))
        self.max_argument = int(msg.get("max_argument", self.max_argument))
        scope: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        scope.update(ERRORS)
        scope.update(tool_globals(list(msg.get("tools", []))))
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
                    self._execute(int(msg["id"]), str(msg["source"]))
                elif kind not in (K_OK, K_ERR):  # a late answer to a dropped call is fine
                    raise HostBroke(f"unknown frame kind {kind!r}")
        except HostGone:
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
        return self._loop

    def _on_readable(self) -> None:
        """While the loop runs: answers to the calls waiting on futures."""
        try:
            self._answers()
        except HostGone:  # the loop would only log it: end here
            os._exit(0)
        except HostBroke as exc:
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
        except HostGone:
            os._exit(0)
        except HostBroke as exc:
            os.write(2, f"toolhost sandbox: the host broke the protocol: {exc}\n".encode())
            os._exit(1)

    def _answers(self) -> None:
        self._frames.feed()
        while self._frames.pending:
            msg = self._frames.next()
            kind = msg.get("k")
            if kind not in (K_OK, K_ERR):
                raise HostBroke(f"unexpected frame kind {kind!r} during a run")
            call_id = msg.get("id")
            future = self._waiting.pop(call_id, None) if type(call_id) is int else None
            if future is None or future.done():
                continue  # the code stopped waiting: a late answer is dropped
            if kind == K_OK:
                future.set_result(msg.get("value"))
            else:
                future.set_exception(rebuild(as_dict(msg.get("error"))))

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
                    raise HostBroke(str(exc)) from None
                if end == len(data):
                    return value
            frames.feed(data)
        call_id = _wire.decode(packed_id)
        while True:
            body = frames.next_body()
            msg = frame_map(body)
            kind = msg.get("k")
            if kind not in (K_OK, K_ERR):
                raise HostBroke(f"unexpected frame kind {kind!r} during a run")
            if msg.get("id") != call_id:
                continue  # a late answer to a call an earlier run dropped
            if kind == K_OK:
                return msg.get("value")
            raise rebuild(as_dict(msg.get("error")))

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

    def _execute(self, run_id: int, source: str) -> None:
        self._runs += 1
        filename = f"<run {self._runs}>"
        self._sources[filename] = (len(source), None, source.splitlines(True), filename)
        share_sources(self._sources)
        capture = Capture(self.max_output)
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = capture
        self._run = run_id
        self.calls = []
        ok, value, error = True, None, None
        try:
            value = self._drive(self._evaluate(source, filename))
        except (HostGone, HostBroke):
            raise
        except OutputLimit:
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
            error = error_data(exc, self._sources)
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
        plain, note = as_plain(value, self.max_output) if ok else (None, None)
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

    async def _evaluate(self, source: str, filename: str) -> Any:
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
        if last is None:
            return None
        value = eval(last, self.namespace)
        if last.co_flags & _CO_COROUTINE:
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
                except (HostGone, HostBroke):
                    raise
                except BaseException as exc:  # the call's error, raised where it was awaited
                    error = exc
        finally:
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
        self.loop_mode = True
        loop.add_reader(self._in, self._on_readable)
        try:
            return loop.run_until_complete(_adopt(self, coro, step))
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


class _Adopt:
    """Hands a run that the driver started over to asyncio's loop, mid-flight: yields what
    the run's coroutine yields (to the task running this), and makes the one pending
    :class:`ToolCall` (if the switch happened there) a call through the loop."""

    __slots__ = ("_coro", "_pending", "_sandbox")

    def __init__(self, sandbox: Sandbox, coro: Coroutine[Any, Any, Any], pending: object) -> None:
        self._sandbox = sandbox
        self._coro = coro
        self._pending = pending

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, step = self._coro, self._pending
        while True:
            try:
                if type(step) is ToolCall:
                    try:
                        use = self._sandbox.use(step.tool, step.args, step.kwargs)
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


async def _adopt(sandbox: Sandbox, coro: Coroutine[Any, Any, Any], pending: object) -> Any:
    return await _Adopt(sandbox, coro, pending)


async def _nothing() -> None:
    pass


_SANDBOX = Sandbox()
attach(_SANDBOX)  # the sandbox every tool call talks to


def main() -> None:
    """The guest's entry point: fds 0 and 1 are the protocol, fd 2 is the host's console."""
    sys.stdout = sys.stderr
    try:
        if _SANDBOX.setup():
            _SANDBOX.serve()
    except HostGone:
        pass
