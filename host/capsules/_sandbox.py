"""Agent code in a sandbox: ``session.run_code(source)`` -> :class:`CodeResult`.

Each session has one code sandbox, started on its first run: a Wasm guest (CPython-WASI
under wasmtime, one process per guest, forked by the host's fork server while any
sandbox holds a lease on it: ``host/_forkserver.py``) or, when ``[capsules] code = "subprocess"``,
the weaker fallback, a CPython child with rlimits. The guest (``capsule._guest``) runs the
code with every tool as an awaitable global; each tool call arrives here as a ``use`` frame
and is made as caller ``agent`` through the session's full mediator. The host decides
everything from the frame alone: the tool name is looked up, the arguments are bound and
checked, and nothing the sandbox claims (who it is, what was approved) counts.

Limits (``[limits]``), each enforced here, whatever the guest does or claims:
``code_timeout`` is counted by :meth:`CodeSandbox._guard` (one task per guest): wall time
while no tool call is in flight, and the guest's own CPU time (``_cpu.py``) while one is,
so waiting on tools and approvals does not count but computing always does.
``code_max_calls`` is counted here. ``code_memory`` caps the guest's memory (the store's
limit; RLIMIT_AS in the fallback). ``code_max_output`` caps captured output and the run's
value (``check_done``). A run that hits one fails with ``LimitExceeded`` naming it; the
guest is killed (never abandoned), the calls it had in flight are cancelled, and the next
run is told its variables were lost. The source itself may take ``max_argument_size``
bytes.

The guest is treated as hostile: agent code can write to the protocol pipe itself. Every
frame is checked here (types, ids, sizes); one that breaks the rules ends the run with a
``protocol_error`` and the sandbox with it. Between runs a guest has nothing to say and
little to compute: one that sends anything is replaced before the next run, and one that
keeps computing (code still running after a ``done`` frame it forged) is killed once it
has used ``code_timeout`` plus :data:`_WARM_UP` seconds of CPU.
The replacement (also after ``reset_code``) boots in the background at once, so it is
usually ready by the time the agent runs code again.

Here: :class:`CodeSandbox`, which starts guests and serves their runs. The guest's pipes
and its frames are ``_guest_pipe.py``'s; the result models, ``_code_results.py``'s.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.abc

from capsule import protocol as p
from capsule.context import Attachment, Result
from host._events import Event, EventBus
from host.declare import HELPERS, ToolSpec
from host.errors import HostError, ToolUnavailable, UnknownTool
from host.settings import CodeRuntime, Limits

from . import _forkserver, _keeper, _wasm, _wasm_cache
from ._code_results import (
    LOST,
    MAX_TEXT,
    CodeCall,
    CodeError,
    CodeResult,
    Done,
    SandboxKind,
    check_done,
    decision_of,
    limit_error,
)
from ._cpu import CpuMeter, rearm_cpu_limit
from ._guest_pipe import Dead, Guest
from ._process import kill_tree, spawn_piped
from ._refill import Refill
from ._run_options import RunOptions

__all__ = ["CodeSandbox", "SandboxPool"]

logger = logging.getLogger("toolhost.sandbox")

AgentCall = Callable[[str, tuple[Any, ...], Mapping[str, Any]], Awaitable[Any]]
Helper = Callable[[str, list[Any], dict[str, Any]], Any]
"""Answers a call of one of code mode's helpers (``host.declare.HELPERS``) at once."""

_CAPSULE_PARENT = str(Path(__file__).resolve().parents[2])
_GUEST_MAIN = "from capsule._guest import main; main()"
_TICK = 0.05
"""Seconds between two looks at a run's time (and, for :data:`_LINGER` after one, at
whether the next has begun)."""
_IDLE_TICK = 0.5
"""Seconds between two looks at the guest's CPU time between runs, once it is quiet."""
_LINGER = 1.0
"""Seconds after a run during which the guest's guard keeps ticking at :data:`_TICK`, so
that a run soon after it is seen on time without waking the guard (a wake costs a task
switch per run; code run back to back pays none)."""
_WARM_UP = 5.0
"""CPU seconds a guest may use between runs on top of ``code_timeout``: its imports while
idle (``asyncio`` takes about half a second in the unoptimised build)."""
_MAX_SOURCE = p.MAX_FRAME - 64 * 1024
"""Bytes of source the guest can take in one frame (its cap, less the envelope)."""
_FLAT: frozenset[type] = frozenset({str, int, float, bool, bytes, type(None)})
"""Exact types of values :func:`capsule.protocol.check_plain` accepts as they are."""

_DECISIONS: ContextVar[list[str] | None] = ContextVar("toolhost_code_decisions", default=None)
"""Set while a tool call from agent code runs: collects the ``policy_decision`` events that
the mediator emits for it (listeners run in the emitting task, so in this context)."""


class _Spare:
    """A replacement sandbox booting in the background after one was discarded."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.guest: Guest | None = None


_CallRecord = tuple[str, Literal["allow", "deny", "escalate"] | None, bool, str | None]
"""A :class:`CodeCall`'s fields: tool, decision, ok, error."""
_Pending = tuple[anyio.CancelScope, int, int, str, list[Any], dict[str, Any]]
"""A call waiting for a task of its own: scope, slot, call id, tool, args, kwargs."""


class _Run:
    """The host's view of one run in progress."""

    def __init__(self, run_id: int) -> None:
        self.id = run_id
        self.inflight = 0
        self.calls: list[_CallRecord] = []
        """Every call made, in the order the code made them, as the fields of its
        :class:`CodeCall` (see :meth:`records`); each gets its slot when it is made and
        its outcome when it ends, whatever ends the run."""
        self.made = 0
        self.scopes: dict[int, anyio.CancelScope] = {}
        self.done: Done | None = None
        self.failure: CodeError | None = None
        self.files: list[Attachment] = []
        """The files the run's calls returned (the code saw their values only)."""
        self.stop: anyio.CancelScope | None = None
        """Cancels everything the run is doing on the host's side (its calls too)."""
        self.started = 0.0
        """When the run began, on the event loop's clock (set as it starts)."""

    def records(self) -> list[CodeCall]:
        """The calls as the result shows them, built once per distinct call (frozen)."""
        built: dict[_CallRecord, CodeCall] = {}
        out: list[CodeCall] = []
        for fields in self.calls:
            call = built.get(fields)
            if call is None:
                tool, decision, ok, error = fields
                call = built[fields] = CodeCall(tool=tool, decision=decision, ok=ok, error=error)
            out.append(call)
        return out


def _mib(size: int) -> str:
    return f"{size / 1024**2:g} MiB" if size >= 1024**2 else f"{size} bytes"


def _guest_limit(limit: str | None, message: str, limits: Limits, memory: int) -> str:
    """What a limit the guest ran into means, in words (its own message may be empty:
    a ``MemoryError`` has none); ``memory`` is the guest's cap."""
    if limit == "code_memory":
        what = (
            f"the code needed more memory than code_memory allows ({_mib(limits.code_memory)}; "
            "raise [limits] code_memory to allow more)"
            if memory >= limits.code_memory
            else f"the code needed more memory than the run's memory_limit allows "
            f"({_mib(memory)}; ask for more, up to code_memory, {_mib(limits.code_memory)})"
        )
        return f"{what}: {message}" if message.strip() else what
    return message.strip() or f"the run went over {limit}"


def _error_for_guest(exc: HostError) -> dict[str, Any]:
    """The error as the agent's code may see it: its own fields, no host traceback."""
    data: dict[str, Any] = {}
    for key, value in exc.to_data().items():
        if key == "traceback":
            continue  # a tool's traceback names host paths: the agent gets type and message
        if isinstance(value, (str, int, float, bool)) or value is None:
            data[key] = value[:MAX_TEXT] if isinstance(value, str) else value
    return data


class CodeSandbox:
    """One session's code sandbox: started on first use, replaced after a limit or crash."""

    def __init__(
        self,
        *,
        kind: SandboxKind,
        tools: Mapping[str, ToolSpec],
        call: AgentCall,
        canonical: Callable[[str], str],
        limits: Limits,
        events: EventBus,
        session: str,
        task_group: anyio.abc.TaskGroup,
        runtime: CodeRuntime = "default",
        helper: Helper | None = None,
        pool: SandboxPool | None = None,
        quiet: bool = False,
    ) -> None:
        self.kind: SandboxKind = kind
        self.runtime: CodeRuntime = runtime
        """The Wasm runtime of a ``wasm`` sandbox (``[capsules] code_runtime``)."""
        self._tools = tools
        self._call = call
        self._helper = helper
        self._pool = pool
        self._quiet = quiet
        """Starts no guest of its own to run code: says nothing of the guests it boots
        (the pool's maker; the session adopting one announces it)."""
        self._canonical = canonical
        self._limits = limits
        self._events = events
        self._session = session
        self._tg = task_group
        self._guest: Guest | None = None
        self._lock = anyio.Lock()
        self._runs = 0
        self._lost = False
        self._closed = False
        self.starts = 0
        self._spare: _Spare | None = None
        self._lease: _forkserver.Lease | None = None
        self._guarded: tuple[Guest, anyio.CancelScope] | None = None
        """The current guest and the scope of its guard (:meth:`_guard`; one per guest)."""
        self._current: _Run | None = None
        """The run in progress, for the guard of the guest running it."""
        self._wake: anyio.Event | None = None
        """Set by a run's start to wake the guard from a quiet tick (:data:`_IDLE_TICK`)."""
        self._lost_why: str | None = None
        """Why the sandbox was replaced between runs, when the host knows."""
        self._unsubscribe = events.subscribe(self._on_event, ("policy_decision",))

    @staticmethod
    def _on_event(event: Event) -> None:
        if event.kind == "policy_decision":
            slot = _DECISIONS.get()
            if slot is not None:
                slot.append(str(event.data.get("decision")))

    def __repr__(self) -> str:
        state = "running" if self._guest is not None and self._guest.alive else "stopped"
        return f"<CodeSandbox {self.kind} session={self._session} {state} starts={self.starts}>"

    # -- the guest process -------------------------------------------------------------

    async def _spawn(self, memory: int) -> tuple[anyio.abc.Process, int, int]:
        if self.kind == "wasm":
            prepared = await _wasm_cache.prepare(_wasm.runtime_named(self.runtime))
            for reason in prepared.rejected:  # what was found wrong and built again
                self._events.emit("cache_rejected", self._session, cache="wasm", reason=reason)
            spec = prepared.code_spec(_GUEST_MAIN, {"MSGPACK_PUREPYTHON": "1"}, memory)
            if self._closed:
                raise OSError("the session is closing")
            if _forkserver.wanted():
                try:
                    if self._lease is None:
                        self._lease = _forkserver.Lease(prepared.cwasm)
                    return await _forkserver.spawn(self._lease, spec)
                except (_forkserver.ForkUnavailable, OSError) as exc:  # OSError: no server
                    if self._closed:
                        raise OSError("the session is closing") from None
                    logger.warning("starting the sandbox without the fork server: %s", exc)
            return await _wasm.spawn_guest(spec)
        return await self._spawn_subprocess(memory)

    async def _spawn_subprocess(self, cap: int) -> tuple[anyio.abc.Process, int, int]:
        """The weaker fallback: a CPython child with rlimits and an empty environment."""
        memory = cap + 128 * 1024 * 1024  # the interpreter's own share
        # CPU: a backstop for when the host is gone (it counts the guest's time itself);
        # the soft limit moves up before each run (rearm_cpu_limit), the hard one stays.
        cpu = self._cpu_backstop()
        bootstrap = (
            # The keeper's pidfds of the host and of itself are not for agent code (it
            # could signal through them): the keeper ends this child when the host ends.
            "import os\n"
            "for w in os.environ.pop('TOOLHOST_LIFELINES', '').split():\n"
            "    try: os.close(int(w))\n"
            "    except (ValueError, OSError): pass\n"
            "import resource as r, sys\n"
            f"for k, v in ((r.RLIMIT_AS, {memory}), "
            "(r.RLIMIT_NPROC, 0), (r.RLIMIT_NOFILE, 64), (r.RLIMIT_FSIZE, 0), "
            "(r.RLIMIT_CORE, 0)):\n"
            "    try: r.setrlimit(k, (v, v))\n"
            "    except (ValueError, OSError): pass\n"
            "h = r.getrlimit(r.RLIMIT_CPU)[1]\n"
            f"c = {cpu} if h == r.RLIM_INFINITY else min({cpu}, h)\n"
            "try: r.setrlimit(r.RLIMIT_CPU, (c, h))\n"
            "except (ValueError, OSError): pass\n"
            "import signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            f"sys.path.insert(0, {_CAPSULE_PARENT!r})\n"
            "from capsule._harden import drop_privileges; drop_privileges('sandbox')\n"
            f"{_GUEST_MAIN}\n"
        )
        command = [sys.executable, "-I", "-B", "-c", bootstrap]
        env = {"LANG": "C.UTF-8"}
        if _keeper.available():  # a subreaper: what the code forks and abandons comes back
            try:
                return await _keeper.spawn(command, cwd="/", env=env)
            except _keeper.KeeperUnavailable as exc:
                logger.warning("starting the fallback sandbox without the keeper: %s", exc)
        return await spawn_piped(command, cwd="/", env=env)

    def _cpu_backstop(self) -> int:
        """Seconds of CPU the fallback's RLIMIT_CPU allows beyond what it has used: a run,
        the idle time after it, and a margin."""
        return math.ceil(self._limits.code_timeout + _WARM_UP) + 5

    async def _start(self, memory: int | None = None) -> Guest:
        memory = self._limits.code_memory if memory is None else memory
        try:
            process, wfd, rfd = await self._spawn(memory)
        except (_wasm.WasmUnavailable, OSError) as exc:
            raise ToolUnavailable(
                "run_code", reason=f"the code sandbox cannot start: {exc}"
            ) from exc
        guest = Guest(process, wfd, rfd, memory)
        self._tg.start_soon(self._watch, guest)
        tools = [
            [spec.name, spec.file, spec.export, spec.member, spec.installed]
            for spec in self._tools.values()
        ]
        try:
            with anyio.fail_after(self._limits.load_timeout):
                await guest.send(
                    {
                        "k": p.K_SETUP,
                        "tools": tools,
                        "max_output": self._limits.code_max_output,
                        "max_argument": self._limits.max_argument_size,
                    }
                )
                msg = await guest.next()
            if msg is None or msg.get("k") != p.K_READY:
                raise Dead
        except (Dead, TimeoutError, p.BadFrame) as exc:
            guest.kill("it failed to start")
            with anyio.move_on_after(5):
                await guest.exited.wait()
            guest.close()  # its pipes, and the loop's reader on one of them
            reason = guest.stderr_tail.decode("utf-8", "replace")[-2000:]
            raise ToolUnavailable(
                "run_code",
                reason=f"the code sandbox did not start ({type(exc).__name__}): {reason}",
            ) from None
        if not self._quiet:
            self._announce(guest)
        return guest

    def _announce(self, guest: Guest) -> None:
        self.starts += 1
        self._events.emit(
            "sandbox_started",
            self._session,
            sandbox=self.kind,
            pid=guest.process.pid,
            restart=self._lost,
        )

    async def _watch(self, guest: Guest) -> None:
        """Drain the guest's stderr (console events, bounded) until it exits."""
        stream = guest.process.stderr
        assert stream is not None
        budget = 1024 * 1024

        def owner() -> CodeSandbox:  # a guest from the pool serves the session adopting it
            adopted: CodeSandbox | None = guest.owner
            return self if adopted is None else adopted

        # A secret may come in two pieces; the session's tools may set secrets meanwhile.
        redactor = self._events.redactor_for(owner()._session).stream()
        try:
            with contextlib.suppress(
                anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError
            ):
                while True:
                    data = await stream.receive(1 << 16)
                    guest.stderr_tail += data
                    del guest.stderr_tail[: max(0, len(guest.stderr_tail) - 16384)]
                    if budget > 0:
                        budget -= len(data)
                        sandbox = owner()
                        redactor.use(self._events.redactor_for(sandbox._session))
                        sandbox._console(redactor.feed(data.decode("utf-8", "replace")))
        finally:
            owner()._console(redactor.flush())
            # Also when the host's task group is cancelled: never leave the child running
            # or its pipes to the garbage collector.
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                if guest.process.returncode is None:
                    kill_tree(guest.process.pid)
                with contextlib.suppress(
                    OSError, anyio.BrokenResourceError, anyio.ClosedResourceError
                ):
                    await guest.process.aclose()
            guest.exited.set()

    def _console(self, text: str) -> None:
        if text:
            self._events.emit(
                "console", self._session, stream="stderr", data=text, capsule="sandbox"
            )

    async def _discard(self, reason: str) -> None:
        self._stop_guard()
        guest, self._guest = self._guest, None
        if guest is None:
            return
        guest.kill(reason)
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await guest.exited.wait()
        guest.close()

    def warm(self) -> None:
        """Boot a sandbox in the background if none is running, so that a run that
        must wait for something else first (its check) finds one ready."""
        if self._guest is None or not self._guest.alive:
            self._prefetch()

    def _prefetch(self) -> None:
        """Boot the next sandbox now, while the agent thinks, rather than on its next run."""
        if self._closed or self._spare is not None:
            return
        spare = _Spare()
        self._spare = spare
        self._tg.start_soon(self._boot_spare, spare)

    async def _boot_spare(self, spare: _Spare) -> None:
        try:
            spare.guest = await self._start()
        except ToolUnavailable:
            pass  # the next run starts one itself, and reports why it cannot
        finally:
            spare.done.set()
        if self._closed and spare.guest is not None:
            spare.guest.kill("the session is closing")
            spare.guest.close()

    async def _take_spare(self, memory: int) -> Guest | None:
        """The guest booted ahead (the prefetched one, or the pool's), waiting for its
        boot if it is under way, if it is alive with the ``memory`` cap; one that is not
        is killed."""
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        await spare.done.wait()
        guest = spare.guest
        if guest is None:
            return None
        if guest.alive and guest.memory == memory:
            return guest
        guest.kill("it died before its first run")
        guest.close()
        return None

    async def _fresh(self, memory: int) -> Guest:
        """The prefetched sandbox if there is a good one (with the ``memory`` cap), else
        the pool's, else a new one."""
        guest = await self._take_spare(memory)
        if guest is not None:
            return guest
        if self._pool is not None:
            guest = await self._pool.take(memory)
            if guest is not None:
                guest.owner = self
                self._announce(guest)
                return guest
        guest = await self._start(memory)
        if self._pool is not None:
            self._pool.use()  # code mode is in use in this host: keep one booted ahead
        return guest

    # -- runs --------------------------------------------------------------------------

    async def run(self, source: str, options: RunOptions | None = None) -> CodeResult:
        """Run agent code (with ``options`` checked by ``read_options``); every failure of
        the code is in the result, not raised.

        A run whose ``memory_limit`` differs from the cap of the sandbox in place gets a
        sandbox started with its own cap (the variables of earlier runs are lost, and the
        result says so); the next run without one gets ``code_memory`` back the same way.

        Raises:
            ToolUnavailable: the sandbox cannot start at all.
        """
        if not isinstance(source, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError("run_code takes the source code as a str")
        options = options or RunOptions()
        memory = self._limits.code_memory if options.memory is None else options.memory
        async with self._lock:
            if self._closed:
                raise ToolUnavailable("run_code", reason="the session is closed")
            refused = self._check_source(source, options.size())
            if refused is not None:  # nothing was sent: the sandbox and its variables stay
                return CodeResult(ok=False, error=refused, sandbox=self.kind)
            warnings: list[str] = list(options.warnings)
            guest = self._guest
            if guest is not None and guest.alive and guest.memory != memory:
                await self._discard("the run asked for another memory cap")
                self._lost = True
                self._lost_why = (
                    f"the run's memory cap is {_mib(memory)} and the sandbox's was "
                    f"{_mib(guest.memory)} (memory_limit)"
                )
            if guest is not None and guest.alive and guest.has_output():
                # Frames between runs: the code of an earlier run is still at work (after
                # a done frame it forged). Its sandbox cannot be trusted to be idle.
                await self._discard("it sent frames between runs")
                self._lost = True
                self._lost_why = "it sent frames after its run had ended"
            if self._guest is None or not self._guest.alive:
                if self._guest is not None:
                    await self._discard("it died between runs")
                    self._lost = True
                self._guest = await self._fresh(memory)
                if self._lost:
                    warnings.append(LOST)
                    if self._lost_why is not None:
                        warnings.append(f"the sandbox was replaced because {self._lost_why}")
                    self._lost = False
                self._lost_why = None
            guest = self._guest
            if self.kind == "subprocess":
                rearm_cpu_limit(guest.process.pid, self._cpu_backstop())
            self._runs += 1
            run = _Run(self._runs)
            run.started = anyio.current_time()
            self._guard_guest(guest)
            self._current = run
            wake = self._wake
            if wake is not None:  # the guard is in a quiet tick: it must count from now
                wake.set()
            try:
                await guest.send({"k": p.K_RUN, "id": run.id, "source": source, **options.frame()})
                await self._drive(guest, run)
            except Dead:
                pass
            except p.BadFrame as exc:
                run.failure = CodeError(
                    kind="protocol_error",
                    type="ProtocolError",
                    message=f"the sandbox broke the wire protocol ({exc}); {LOST}",
                )
                self._events.emit("protocol_error", self._session, error=str(exc)[:MAX_TEXT])
            except Exception as exc:  # a host bug: the run fails cleanly, the log has it
                logger.exception("serving a run of the code sandbox failed")
                run.failure = CodeError(
                    kind="host_error",
                    type="HostError",
                    message=f"the host failed while serving the run ({type(exc).__name__}); {LOST}",
                )
            finally:
                self._current = None
            return await self._finish(guest, run, warnings)

    def refusal(self, source: str, options: RunOptions) -> CodeError | None:
        """Why :meth:`run` would refuse ``source`` at once (not Unicode, too big), if it
        would: checked before the source goes to anyone else (the checker)."""
        return self._check_source(source, options.size())

    def _check_source(self, source: str, extra: int = 0) -> CodeError | None:
        """Why ``source`` cannot be sent to the guest, if it cannot."""
        try:
            size = len(source.encode("utf-8"))
        except UnicodeEncodeError as exc:
            return CodeError(
                kind="invalid_arguments",
                type="InvalidArguments",
                message=(
                    f"the source code is not valid Unicode text: {exc.reason} at character "
                    f"{exc.start} ({source[exc.start : exc.start + 1]!r}); pass it as UTF-8 "
                    "text (lone surrogates come from bytes decoded with 'surrogateescape')"
                ),
            )
        cap = min(self._limits.max_argument_size, _MAX_SOURCE)
        size += extra
        if size > cap:
            return CodeError(
                kind="limit_exceeded",
                type="LimitExceeded",
                message=(
                    f"limit max_argument_size exceeded: the source code"
                    f"{' with its options' if extra else ''} takes {size} bytes, "
                    f"over the limit of {cap}; it did not run, and the sandbox keeps its "
                    "variables: send the code in smaller runs, or the data through a tool"
                ),
                limit="max_argument_size",
            )
        return None

    async def _finish(self, guest: Guest, run: _Run, warnings: list[str]) -> CodeResult:
        done = run.done
        if run.failure is None and done is None:
            await self._discard("it died")
            reason = guest.exit_reason()
            run.failure = CodeError(
                kind="capsule_crashed",
                type="CapsuleCrashed",
                message=f"the code sandbox crashed ({reason}); {LOST}",
            )
        if run.failure is not None:
            await self._discard(run.failure.message)
            self._lost = False  # this result already says so
            self._lost_why = None
            self._prefetch()
            self._events.emit(
                "sandbox_reset", self._session, reason=run.failure.message, limit=run.failure.limit
            )
            return CodeResult(
                ok=False,
                error=run.failure,
                calls=run.records(),
                warnings=warnings,
                sandbox=self.kind,
                attachments=run.files,
            )
        assert done is not None
        error = done.error
        if (
            error is not None
            and error.kind == "limit_exceeded"
            and error.limit in ("code_memory", "code_max_output")
        ):
            # Memory ran out (or output overflowed) inside the guest: its state may be
            # half-made, so it is replaced, and the result says so.
            await self._discard(error.message)
            self._prefetch()
            self._events.emit(
                "sandbox_reset", self._session, reason=error.message, limit=error.limit
            )
            detail = _guest_limit(error.limit, error.message, self._limits, guest.memory)
            error = error.model_copy(
                update={"message": f"limit {error.limit} exceeded: {detail}; {LOST}"}
            )
        warnings.extend(done.warnings)
        return CodeResult(
            ok=done.ok,
            value=done.value,
            stdout=done.stdout,
            error=error,
            calls=run.records(),
            warnings=warnings,
            sandbox=self.kind,
            attachments=run.files,
        )

    async def _drive(self, guest: Guest, run: _Run) -> None:
        """Serve the run's tool calls until it is done, fails, or hits a limit; then
        cancel whatever of it is still in flight (each call records that it was).

        The guest's guard (:meth:`_guard`) counts the run's time and cancels ``run.stop``
        at ``code_timeout``. A task group is entered only once the code makes a call
        the loop cannot make itself (one that runs beside others, or that the guest does
        not wait for): most runs make their calls one at a time and need none."""
        broken: Exception | None = None
        with anyio.CancelScope() as stop:
            run.stop = stop
            try:
                first = await self._serve(guest, run, None)
            except Exception as exc:
                broken = exc
                first = None
            if first is not None:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._tool_call, guest, run, *first)
                    try:
                        await self._serve(guest, run, tg)
                    except Exception as exc:  # raised outside the group, not wrapped in one
                        broken = exc
                    tg.cancel_scope.cancel()
        if broken is not None:
            raise broken

    async def _serve(
        self, guest: Guest, run: _Run, tg: anyio.abc.TaskGroup | None
    ) -> _Pending | None:
        """Read the guest's frames until the run ends (None), or, without a task group
        (``tg``), until a call needs a task of its own: that call's arguments to
        :meth:`_tool_call`, its scope already registered."""
        while True:
            msg = await guest.next()
            if msg is None or run.failure is not None:
                return None
            kind = msg.get("k")
            if kind == p.K_USE:
                call_id, tool, args, kwargs = self._check_use(msg, run)
                run.made += 1
                if run.made > self._limits.code_max_calls:
                    run.failure = limit_error(
                        "code_max_calls",
                        f"the code made more than {self._limits.code_max_calls} tool calls",
                    )
                    guest.kill("too many tool calls")
                    return None
                if tool in HELPERS:  # not a tool: answered from the declarations
                    await self._answer_helper(guest, call_id, tool, args, kwargs)
                    continue
                slot = len(run.calls)
                run.calls.append((tool, None, False, "cancelled"))
                run.inflight += 1
                if msg.get("wait") is True and run.inflight == 1:
                    # The guest waits for this answer and sends nothing until then (it
                    # says so; if it does not, only its own later frames wait): made
                    # here, with no task to start, and no scope of its own (no ``drop``
                    # can be read while this loop itself awaits the call).
                    await self._tool_call(guest, run, None, slot, call_id, tool, args, kwargs)
                else:
                    scope = anyio.CancelScope()
                    run.scopes[call_id] = scope
                    pending = (scope, slot, call_id, tool, args, kwargs)
                    if tg is None:
                        return pending
                    tg.start_soon(self._tool_call, guest, run, *pending)
            elif kind == p.K_DROP:
                call_id = msg.get("id")
                if type(call_id) is not int:
                    raise p.BadFrame("drop frames carry the int id of a call")
                scope = run.scopes.get(call_id)
                if scope is not None:
                    scope.cancel()
            elif kind == p.K_DONE:
                run.done = check_done(msg, run.id, self._limits.code_max_output)
                return None
            else:
                raise p.BadFrame(f"unexpected frame {kind!r} from the sandbox")

    @staticmethod
    def _check_use(msg: Mapping[str, Any], run: _Run) -> tuple[int, str, list[Any], dict[str, Any]]:
        call_id, tool = msg.get("id"), msg.get("tool")
        args, kwargs = msg.get("args"), msg.get("kwargs")
        if type(call_id) is not int or type(tool) is not str or len(tool) > 512:
            raise p.BadFrame("use frames carry an int id and a tool name")
        if type(msg.get("run")) is not int:
            raise p.BadFrame("use frames carry the int id of their run")
        if msg.get("run") != run.id:
            raise p.BadFrame("a use frame for a run that is not in progress")
        if call_id in run.scopes:
            raise p.BadFrame("a use frame reusing the id of a call in flight")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise p.BadFrame("use frames carry args as a list and kwargs as a map")
        # Flat arguments (the usual case) are plain as they are; anything else is walked.
        for item in args:  # pyright: ignore[reportUnknownVariableType]
            if type(item) not in _FLAT:  # pyright: ignore[reportUnknownArgumentType]
                p.check_plain(args)
                break
        for key, item in kwargs.items():  # pyright: ignore[reportUnknownVariableType]
            if type(key) is not str or type(item) not in _FLAT:  # pyright: ignore[reportUnknownArgumentType]
                p.check_plain(kwargs)
                break
        return call_id, tool, args, kwargs  # pyright: ignore[reportUnknownVariableType]

    async def _tool_call(
        self,
        guest: Guest,
        run: _Run,
        scope: anyio.CancelScope | None,
        slot: int,
        call_id: int,
        tool: str,
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> None:
        """Make one call, record it in its ``slot`` and answer it; ``scope`` (a call made
        on a task) lets a ``drop`` cancel it. A cancelled call gets no answer, and is
        recorded as cancelled, with the decision made for it if one was."""
        try:
            name = self._canonical(tool)
        except HostError:
            name = tool
        decided: list[str] = []
        outcome: tuple[Any, HostError | None] | None = None
        token = _DECISIONS.set(decided)
        try:
            if scope is None:
                outcome = await self._outcome(tool, args, kwargs)
            else:
                with scope:
                    outcome = await self._outcome(tool, args, kwargs)
        finally:
            _DECISIONS.reset(token)
            run.inflight -= 1
            if scope is not None:
                run.scopes.pop(call_id, None)
            if outcome is None:  # dropped by the code, or cut short as the run stopped
                run.calls[slot] = (
                    name,
                    decision_of(None, decided, cancelled=True),
                    False,
                    "cancelled",
                )
        if outcome is None:
            return
        value, failure = outcome
        if failure is None:
            run.calls[slot] = (name, decision_of(None, decided), True, None)
            if isinstance(value, Result):  # the code gets the value; the files go to the result
                result: Result[Any] = value  # pyright: ignore[reportUnknownVariableType]
                run.files.extend(result.attachments)
                value = result.value
            elif type(value) is Attachment:  # a file alone: the code gets its metadata
                run.files.append(value)
                value = value.info()
            reply = {"k": p.K_OK, "id": call_id, "value": value}
        else:
            run.calls[slot] = (name, decision_of(failure, decided), False, failure.kind)
            reply = {"k": p.K_ERR, "id": call_id, "error": _error_for_guest(failure)}
        with contextlib.suppress(Dead):
            await guest.send(reply)

    async def _answer_helper(
        self, guest: Guest, call_id: int, tool: str, args: list[Any], kwargs: dict[str, Any]
    ) -> None:
        """Answer ``toolhost.search`` or ``toolhost.declaration``: no policy (they read
        only the declarations the model may be shown), not recorded as tool calls."""
        try:
            if self._helper is None:
                raise UnknownTool(tool)
            reply = {"k": p.K_OK, "id": call_id, "value": self._helper(tool, args, kwargs)}
        except HostError as exc:
            reply = {"k": p.K_ERR, "id": call_id, "error": _error_for_guest(exc)}
        with contextlib.suppress(Dead):
            await guest.send(reply)

    async def _outcome(
        self, tool: str, args: list[Any], kwargs: dict[str, Any]
    ) -> tuple[Any, HostError | None]:
        """The call through the mediator: (its value, None) or (None, why it failed)."""
        try:
            return await self._call(tool, tuple(args), kwargs), None
        except HostError as exc:
            return None, exc
        except Exception as exc:  # a host bug: the code gets an error, the log the detail
            logger.exception("tool call %s from agent code failed inside the host", tool)
            return None, HostError(f"the host failed to run {tool}: {type(exc).__name__}")

    # -- between runs ------------------------------------------------------------------

    def _guard_guest(self, guest: Guest) -> None:
        """Watch ``guest`` (its runs' time, and between them) from now on (once per guest)."""
        if self._guarded is not None and self._guarded[0] is guest:
            return
        self._stop_guard()
        scope = anyio.CancelScope()
        self._guarded = (guest, scope)
        self._tg.start_soon(self._guard, guest, scope)

    def _stop_guard(self) -> None:
        guarded, self._guarded = self._guarded, None
        if guarded is not None:
            guarded[1].cancel()

    async def _guard(self, guest: Guest, scope: anyio.CancelScope) -> None:
        """Count the time of ``guest``'s runs, and watch it between them (one task per
        guest, not one per run).

        A run is stopped at ``code_timeout``: wall time counts while no call is in
        flight, the guest's own CPU time while one is (computing meanwhile counts;
        waiting does not); where the CPU time cannot be read, wall time counts. It is
        first seen at most a tick after it began (:data:`_TICK` for :data:`_LINGER` after
        a run, else a run's start wakes the guard), and counted from its start.

        Between runs the guest has nothing to compute but its idle imports: one that
        keeps computing (code still at work after a ``done`` frame it forged) is killed
        once it has used ``code_timeout`` plus :data:`_WARM_UP` seconds of CPU in one
        idle period (counted from the first look after a run, at most a tick late)."""
        timeout = self._limits.code_timeout
        idle_budget = timeout + _WARM_UP
        meter = CpuMeter(guest.process.pid, tree=self.kind == "subprocess")
        proc = True  # whether the guest's CPU time can be read (the idle check only if so)
        seen: _Run | None = None  # the run being counted
        used = last = 0.0
        last_cpu: float | None = None
        period = -1  # the idle period being counted (the number of runs before it)
        start = 0.0
        quiet_from = anyio.current_time() + _LINGER  # when the ticks slow down
        with scope:
            while guest.alive:
                run = self._current
                if run is None and anyio.current_time() >= quiet_from:
                    wake = self._wake = anyio.Event()
                    try:
                        with anyio.move_on_after(_IDLE_TICK):
                            await wake.wait()
                    finally:
                        if self._wake is wake:
                            self._wake = None
                else:
                    await anyio.sleep(_TICK)
                if not guest.alive:
                    return
                run = self._current
                now = anyio.current_time()
                if run is not None:  # a run of this guest (the lock allows one at a time)
                    period = -1
                    quiet_from = now + _LINGER
                    cpu = meter.read()
                    if run is not seen:  # its first look: wall time from its start
                        seen, used = run, now - run.started
                    elif cpu is None or last_cpu is None:
                        used += now - last
                    else:
                        spent = max(0.0, cpu - last_cpu)
                        if run.inflight == 0:
                            spent = max(spent, now - last)
                        used += spent
                    last, last_cpu = now, cpu
                    if used > timeout:
                        self._time_out(guest, run, timeout)
                    continue
                if not proc or self._lock.locked():  # a replacement, or a run's very end
                    period = -1
                    continue
                cpu = meter.read()
                if cpu is None:
                    proc = False  # no /proc here: only the runs' clock counts
                    continue
                if period != self._runs:  # a new idle period: it counts from here
                    period, start = self._runs, cpu
                    continue
                if cpu - start > idle_budget and guest.alive:
                    self._lost_why = (
                        f"it kept computing after its run had ended ({idle_budget:g} s of CPU time)"
                    )
                    self._events.emit("sandbox_reset", self._session, reason=self._lost_why)
                    guest.kill(self._lost_why)
                    return

    @staticmethod
    def _time_out(guest: Guest, run: _Run, timeout: float) -> None:
        """Stop ``run`` at ``code_timeout``: kill its guest, cut its calls short."""
        if run.failure is None:
            run.failure = limit_error(
                "code_timeout",
                f"the code ran for more than {timeout:g} s of sandbox time "
                "(the guest's own time; waiting on tools does not count)",
            )
        guest.kill("code_timeout")
        if run.stop is not None:
            run.stop.cancel()  # the calls still in flight: cut short, recorded

    async def retool(self, tools: Mapping[str, ToolSpec]) -> None:
        """Serve new tool files: the sandbox (and its spare) is replaced; the next run
        is told that the variables of earlier runs were lost."""
        async with self._lock:
            self._tools = tools
            spare, self._spare = self._spare, None
            if spare is not None:
                await _drop_spare(spare, "the tool files changed")
            if self._guest is not None:
                await self._discard("the tool files changed")
                self._lost = True
                self._lost_why = None

    @property
    def running(self) -> bool:
        """Whether a guest (or a spare started ahead) is running for this session now."""
        return self._guest is not None or self._spare is not None

    def release(self, reason: str) -> bool:
        """Stop the guest of an idle session (and its spare) to free their memory; the
        next run starts a new one and is told that the variables of earlier runs were
        lost, and why (``reason``). Returns whether a guest ran; refuses (``False``)
        while a run, a reset or a retool holds the sandbox.

        The guests are detached at once, so a run that comes after this never reaches
        them, and killed in the background.
        """
        if self._closed or self._lock.locked():
            return False
        guest, self._guest = self._guest, None
        spare, self._spare = self._spare, None
        if guest is None and spare is None:
            return False
        self._stop_guard()
        if guest is not None:
            self._lost = True
            self._lost_why = reason
        self._tg.start_soon(self._kill_released, guest, spare, reason)
        return guest is not None

    @staticmethod
    async def _kill_released(guest: Guest | None, spare: _Spare | None, reason: str) -> None:
        with anyio.CancelScope(shield=True):
            if guest is not None:
                guest.kill(reason)
                with anyio.move_on_after(5):
                    await guest.exited.wait()
                guest.close()
            if spare is not None:
                with anyio.move_on_after(60):  # it may be booting: a start is bounded
                    await _drop_spare(spare, reason)

    async def reset(self) -> None:
        """Start afresh: the next run gets a new sandbox with no variables."""
        async with self._lock:
            await self._discard("reset_code")
            self._lost = False
            self._lost_why = None
            self._prefetch()

    async def aclose(self) -> None:
        self._closed = True
        self._unsubscribe()
        spare, self._spare = self._spare, None
        if spare is not None and spare.guest is not None:
            spare.guest.kill("the session is closing")
            spare.guest.close()
        with anyio.CancelScope(shield=True):
            await self._discard("the session is closing")
            lease, self._lease = self._lease, None
            if lease is not None:
                await lease.release()


async def _drop_spare(spare: _Spare, reason: str) -> None:
    """End a guest booted ahead that no one will take, once its boot is over."""
    await spare.done.wait()
    if spare.guest is not None:
        spare.guest.kill(reason)
        spare.guest.close()


class SandboxPool:
    """One sandbox booted ahead for the next session that runs code, so that a new
    session's first ``run_code`` does not wait for a boot (monty keeps a warm worker the
    same way). It fills only once code mode is in use in the host (a sandbox was started
    for some session) and the host has a session open besides its default one (a host
    that only ever has its default session, as the command line and ``toolhost serve``
    over stdio, would keep a guest booted for no one; one whose other sessions all ended
    keeps none), and again after each guest it hands out, once the host settles
    (``_refill.py``: not beside the first run of the session that took it). A guest
    from the pool has never run code; it serves exactly one session, and its console is
    that session's.

    ``maker`` boots the guests as its spare (:meth:`CodeSandbox.warm`'s way): a quiet
    :class:`CodeSandbox` of no session that never runs code. ``TOOLHOST_SANDBOX_POOL=0``
    turns the pool off (see ``Host.sandbox_pool``)."""

    def __init__(self, maker: CodeSandbox) -> None:
        self._maker = maker
        self.handed = 0
        """Guests handed to sessions."""
        self._in_use = False
        """Whether code mode is in use in the host (some session started a sandbox)."""
        self._sessions = False
        """Whether the host has a session open besides its default one."""
        self.refill = Refill(self.fill)
        """Boots the next guest once the host settles (``_refill.py``)."""

    def more_sessions(self) -> None:
        """The host opened a session besides its default one: the pool is worth its
        guest from now on (booted once the host settles, if code mode is in use)."""
        self._sessions = True
        if self._in_use:
            self.use()

    def no_more_sessions(self) -> None:
        """The host's last session besides its default one ended: the guest booted ahead
        goes (the next such session boots one again, once it runs code)."""
        self._sessions = False
        maker = self._maker
        spare, maker._spare = maker._spare, None  # pyright: ignore[reportPrivateUsage]
        if spare is not None:
            maker._tg.start_soon(  # pyright: ignore[reportPrivateUsage]
                _drop_spare, spare, "no session is left to take it"
            )

    @property
    def spare_pid(self) -> int | None:
        """The pid of the guest booted ahead, once it is booted."""
        spare = self._maker._spare  # pyright: ignore[reportPrivateUsage]
        guest = None if spare is None else spare.guest
        return None if guest is None else guest.process.pid

    @property
    def ready(self) -> bool:
        """Whether a guest is booted and waiting for a session."""
        spare = self._maker._spare  # pyright: ignore[reportPrivateUsage]
        return spare is not None and spare.done.is_set() and spare.guest is not None

    def fill(self) -> None:
        """Code mode is in use: boot a guest in the background now unless one is booted
        or booting (or the host has no session but its default one)."""
        self._in_use = True
        if self._sessions:
            self._maker._prefetch()  # pyright: ignore[reportPrivateUsage]

    def use(self) -> None:
        """Code mode is in use: boot a guest once the host settles (:meth:`fill`)."""
        self._in_use = True
        if self._sessions:
            self.refill.soon(self._maker._tg)  # pyright: ignore[reportPrivateUsage]

    async def take(self, memory: int) -> Guest | None:
        """The guest booted ahead (waiting for its boot if it is under way: that is
        still sooner than a boot of its own), if it is alive and has ``memory`` as its
        cap; then the next one boots."""
        maker = self._maker
        if maker._spare is None:  # pyright: ignore[reportPrivateUsage]
            return None  # not filled yet: the session boots its own (and then fills)
        guest = await maker._take_spare(memory)  # pyright: ignore[reportPrivateUsage]
        self.use()
        if guest is None:
            return None
        if guest.has_output():  # it has never run code: it has nothing to say
            guest.kill("it sent frames before its first run")
            guest.close()
            return None
        self.handed += 1
        return guest

    async def retool(self, tools: Mapping[str, ToolSpec]) -> None:
        """New tool files: the guest booted ahead knew the old tools."""
        booted = self._maker._spare is not None  # pyright: ignore[reportPrivateUsage]
        await self._maker.retool(tools)
        if booted:
            self.fill()

    async def aclose(self) -> None:
        await self._maker.aclose()
