"""The subprocess capsule: ``python -m capsule`` in its own process group.

The child is started by the host's keeper (``_keeper.py``), which kills whatever it leaves
behind, or by the host itself where there is no keeper. It gets a minimal environment
(see ``_process.minimal_env``) plus its settings (``TOOLHOST_CAPSULE``: the Landlock
``Guard`` it confines itself to, see ``_guard.py``), an empty stdin for tool code, and
speaks frames on its stdin/stdout pipes. Its stderr (logging, tracebacks
printed by tools) is drained all the time into console events. Console output of both
streams (stderr, and the ``console`` frames that carry what tools wrote to fd 1) passes one
token bucket per capsule, enforced here in the host because the capsule is not trusted to
limit itself, so a flood can neither block the child nor grow the host's memory. Each
stream is redacted as one text (a secret written in two pieces is still replaced), before
the event bus redacts every event again.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.abc

import capsule
from capsule import _landlock
from capsule.protocol import BadFrame
from host._display import StreamRedactor
from host._events import Event, EventBus
from host.errors import CapsuleCrashed
from host.trust import key_path

from . import _keeper
from ._capsule_pool import CapsulePool
from ._guard import containment, project_guard
from ._process import KEEP_DUMPABLE, kill_tree, spawn_piped
from ._transport import (
    CLOSED_OUTPUT,
    CapsuleDied,
    Connection,
    LoadFailed,
    LoadReport,
    LoadRequest,
    TransportFactory,
)

__all__ = [
    "SubprocessTransport",
    "start_process",
    "start_subprocess",
    "subprocess_capsules",
    "check_interpreter",
    "exit_reason",
]

Spawn = Callable[[], Awaitable[tuple[anyio.abc.Process, int, int]]]
"""Starts the child: ``(process, host_write_fd, host_read_fd)``, as ``spawn_piped``."""
ExitReason = Callable[[int | None, bytes], str]
"""Why a child ended, from its exit status (``None``: still running) and stderr's tail."""

_CAPSULE_DIR = str(Path(capsule.__file__).resolve().parent)
_CAPSULE_PARENT = str(Path(_CAPSULE_DIR).parent)
logger = logging.getLogger("toolhost.capsule")

_SETTINGS = "TOOLHOST_CAPSULE"
"""The capsule's settings, as JSON (read and removed by ``capsule/__main__.py``)."""
CONFINE_EXIT = 78
"""``capsule.__main__.CONFINE_EXIT``: the worker could not confine itself as asked."""
_BOOTSTRAP = "import sys; sys.path.insert(0, {path!r}); from capsule.__main__ import main; main()"
_UNDUMPABLE = "import ctypes; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); "  # PR_SET_DUMPABLE
_BOOTSTRAP_ELSEWHERE = (
    # Another interpreter (``[capsules] python``) gets the ``capsule`` package alone, not
    # the folder it lives in (the host's site-packages, perhaps), so the project's own
    # packages are the ones its tools import.
    "import importlib.util as u, os, sys; d = {package!r}; "
    "s = u.spec_from_file_location('capsule', os.path.join(d, '__init__.py'), "
    "submodule_search_locations=[d]); m = u.module_from_spec(s); "
    "sys.modules['capsule'] = m; s.loader.exec_module(m); "
    "from capsule.__main__ import main; main()"
)
_PROBE_TIMEOUT = 30.0
_CONSOLE_BURST = 1024 * 1024
_EXIT_GRACE = 2.0
"""Seconds a call (or a load) failed by the end of the capsule's output waits for its exit
status, to say why it died."""
_CONSOLE_RATE = 256 * 1024  # bytes per second once the burst is spent
_LINE_SLACK = 16 * 1024
"""Bytes beyond the budget that may finish a line already being shown."""


class _Bucket:
    """A token bucket for console bytes."""

    def __init__(self) -> None:
        self.tokens = float(_CONSOLE_BURST)
        self.stamp = time.monotonic()

    def take(self, size: int, *, need: int = 0, force: bool = False) -> bool:
        """Take ``size`` tokens if there are that many and at least ``need`` (``force``:
        take them anyway, into debt, which later output pays back)."""
        now = time.monotonic()
        self.tokens = min(_CONSOLE_BURST, self.tokens + (now - self.stamp) * _CONSOLE_RATE)
        self.stamp = now
        if self.tokens >= max(size, need) or force:
            self.tokens -= size
            return True
        return False


class _Stream:
    """Where one console stream stands in its lines."""

    __slots__ = ("open", "over", "skip")

    def __init__(self) -> None:
        self.open = False
        """What was delivered last ends inside a line (no newline yet)."""
        self.over = 0
        """Bytes of that open line delivered beyond the budget, to finish it."""
        self.skip = False
        """The start of the current line was dropped: drop the rest of it too."""


class _ConsoleGate(EventBus):
    """The event bus as one capsule's connection sees it: console output is rate-limited.

    Every other event passes straight to the host's bus. Console output over the budget is
    dropped in whole lines, so what is shown is never a fragment of a line or the newline
    of a dropped one: a line that was being shown is finished (up to ``_LINE_SLACK``
    bytes beyond the budget; a longer one is ended there), and once dropping starts the
    rest of the line is dropped too. Each run of dropped output is reported once, by a
    ``console_dropped`` event with its size, when it ends: before the next output shown,
    or when a call returns or the capsule exits (:meth:`flush`).
    """

    def __init__(self, events: EventBus) -> None:
        super().__init__(keep=1)
        self._events = events
        self._bucket = _Bucket()
        self._streams = {"stdout": _Stream(), "stderr": _Stream()}
        self._burst = 0
        self._total = 0
        self._session: str | None = None
        self._redactors: dict[str, StreamRedactor] = {}

    def emit(self, kind: str, session: str | None = None, **data: Any) -> Event:
        if kind != "console":
            return self._events.emit(kind, session, **data)
        self._session = session
        stream = str(data.get("stream"))
        text = data.get("data")
        if not isinstance(text, str) or stream not in self._streams:
            return self._events.emit(kind, session, **data)
        text = self._redact(session, stream, text)
        if not text:  # all of it held back: it may be the start of a secret
            return Event(kind, session, {"stream": stream, "data": ""})
        return self._console(session, stream, text)

    def _redact(self, session: str | None, stream: str, text: str) -> str:
        """``text`` with the session's secrets replaced, less what may begin one."""
        secrets = self._events.redactor_for(session)
        redactor = self._redactors.get(stream)
        if redactor is None:
            if not secrets:
                return text
            redactor = self._redactors[stream] = secrets.stream()
        else:
            redactor.use(secrets)  # the same one, or the session's since a tool set a secret
        return redactor.feed(text)

    def end(self, session: str | None, stream: str) -> None:
        """The stream ended: show what was held back (it was not a secret)."""
        redactor = self._redactors.pop(stream, None)
        held = redactor.flush() if redactor is not None else ""
        if held:
            self._console(session, stream, held)
            self.flush()

    def _console(self, session: str | None, name: str, text: str) -> Event:
        state = self._streams[name]
        if state.skip:
            cut = text.find("\n")
            self._drop(len(text) if cut < 0 else cut + 1)
            if cut < 0:
                return self._dropped_event(session)
            state.skip, text = False, text[cut + 1 :]
            if not text:
                return self._dropped_event(session)
        # Once output is being dropped, showing resumes only with a second's worth of
        # budget: a flood then shows blocks of whole lines between a few notes, not a
        # note every other line.
        if self._bucket.take(len(text), need=_CONSOLE_RATE if self._burst else 0):
            self.flush()  # the output dropped before this is said where it was
            return self._show(session, name, state, text)
        shown = ""
        if state.open:  # finish the line being shown rather than leave a fragment
            cut = text.find("\n")
            end = len(text) if cut < 0 else cut + 1
            if state.over + end <= _LINE_SLACK:
                shown, text = text[:end], text[end:]
                state.over += end
            else:
                shown = "\n"  # too long to finish: end it here
                state.skip = cut < 0
                text = text[end:] if cut >= 0 else ""
                self._drop(end)
            self._bucket.take(len(shown), force=True)
            state.open = not shown.endswith("\n")
        if text:
            self._drop(len(text))
            state.skip = not text.endswith("\n")
        if shown:
            return self._show(session, name, state, shown)
        return self._dropped_event(session)

    def _show(self, session: str | None, name: str, state: _Stream, text: str) -> Event:
        state.open = not text.endswith("\n")
        if not state.open:
            state.over = 0
        return self._events.emit("console", session, stream=name, data=text)

    def _drop(self, size: int) -> None:
        self._burst += size
        self._total += size

    def _dropped_event(self, session: str | None) -> Event:
        return Event("console_dropped", session, {"dropped_bytes": self._burst})

    def flush(self) -> None:
        """Report the output dropped since the last report, if any (once per run)."""
        if self._burst:
            burst, self._burst = self._burst, 0
            self._events.emit(
                "console_dropped",
                self._session,
                dropped_bytes=burst,
                total_bytes=self._total,
                budget=f"{_CONSOLE_BURST // 1024**2} MiB, then {_CONSOLE_RATE // 1024} KiB/s",
            )


def exit_reason(code: int | None, stderr_tail: bytes = b"") -> str:
    """Why a capsule child ended, from its exit status."""
    del stderr_tail  # a CPython capsule's stderr is tool output, not a reason
    if code is None:
        return "it stopped answering"
    if code == CONFINE_EXIT:
        return (
            f"it exited with status {code}: it could not confine its tools with Landlock "
            "(its console output says why)"
        )
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"it was killed by {name}"
    return f"it exited with status {code}"


class SubprocessTransport:
    """A capsule child process and the connection to it."""

    def __init__(
        self,
        process: anyio.abc.Process,
        connection: Connection,
        gate: _ConsoleGate,
        session: str | None,
        reason: ExitReason = exit_reason,
    ) -> None:
        self._process = process
        self._connection = connection
        self._gate = gate
        self._session = session
        self._reason = reason
        self._report = LoadReport()
        self._scope = anyio.CancelScope()
        self._killed: str | None = None
        self._exited = anyio.Event()
        self.serving = anyio.Event()
        self.stderr_tail = bytearray()
        self._stderr_ended = anyio.Event()

    @property
    def report(self) -> LoadReport:
        return self._report

    @property
    def alive(self) -> bool:
        return self._connection.dead is None and self._killed is None

    @property
    def pid(self) -> int:
        return self._process.pid

    async def call(
        self,
        call_id: int,
        tool: str,
        encoded: bytes,
        timeout: float,
        context: Mapping[str, Any] | None = None,
    ) -> Any:
        try:
            return await self._connection.call(call_id, tool, encoded, timeout, context)
        except CapsuleCrashed as exc:
            if exc.reason != CLOSED_OUTPUT:
                raise
            # The capsule's output ended before its exit status was known: wait for it
            # (briefly), so the call says why the capsule died (a status, a signal, a
            # trap, a quota), not only that its output ended.
            with anyio.move_on_after(_EXIT_GRACE):
                await self._exited.wait()
            if not self._exited.is_set():
                raise
            raise CapsuleCrashed(
                tool,
                reason=self._killed or self.exit_reason(),
                may_have_executed=exc.may_have_executed,
            ) from None
        finally:
            self._gate.flush()  # output the call's tool dropped is said once it returns

    def _kill_tree(self) -> None:
        """Kill the capsule (its reaper) and every descendant, the worker's included."""
        worker = self._report.pid  # reported by the capsule: kill_tree checks it is ours
        kill_tree(self._process.pid, *([] if worker is None else [worker]))

    def _kill_now(self, reason: str) -> None:
        if self._killed is None:
            self._killed = reason
        self._kill_tree()

    async def kill(self, reason: str) -> None:
        self._kill_now(reason)
        self._connection.fail_all(reason)
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await self._exited.wait()
        self._scope.cancel()

    def exit_reason(self) -> str:
        """Why the child ended (or that it stopped answering, while it runs)."""
        return self._reason(self._process.returncode, bytes(self.stderr_tail))

    async def _drain_stderr(self) -> None:
        stream = self._process.stderr
        assert stream is not None
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            try:
                data = await stream.receive(1 << 16)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return
            self.stderr_tail += data
            del self.stderr_tail[: max(0, len(self.stderr_tail) - 16384)]
            text = decoder.decode(data)
            if text:
                self._gate.emit("console", self._session, stream="stderr", data=text)

    async def _drain_stderr_then_flush(self) -> None:
        try:
            await self._drain_stderr()
        finally:
            self._stderr_ended.set()
            self._flush("stderr")

    def _flush(self, stream: str) -> None:
        self._gate.end(self._session, stream)

    async def _watch(self) -> None:
        await self._process.wait()
        # Descendants that kept the pipes open must not keep the capsule half-alive, and
        # a worker whose reaper a tool killed must not live on with the orphans it adopted.
        self._kill_tree()
        # What the capsule wrote last before it ended (a Wasm capsule's quota or trap
        # line) may still be in its stderr pipe: the reason is read once that is drained.
        with anyio.move_on_after(_EXIT_GRACE):
            await self._stderr_ended.wait()
        why = self._killed or self.exit_reason()
        if self._connection.dead == CLOSED_OUTPUT:
            self._connection.dead = why  # later calls say why, too
        self._connection.fail_all(why)
        self._gate.flush()
        self._exited.set()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Own the capsule's background tasks until it ends."""
        try:
            with self._scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._drain_stderr_then_flush)
                    tg.start_soon(self._watch)
                    task_status.started()
                    await self.serving.wait()  # the load phase reads the pipe until then
                    await self._connection.run()
                    with anyio.move_on_after(5):
                        await self._exited.wait()
                    tg.cancel_scope.cancel()
        finally:
            self._flush("stdout")  # no console frame comes after the connection's end
            # Also when the host's task group is cancelled while closing: a pipe left open
            # here is closed by the garbage collector after the event loop has ended,
            # which raises inside asyncio. aclose() closes the pipe transports too.
            self._connection.close()
            if self._process.returncode is None:
                self._kill_tree()  # not reaped yet, so the pid is still ours
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(5),
                contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError),
            ):
                await self._process.aclose()


async def start_process(
    request: LoadRequest,
    events: EventBus,
    task_group: anyio.abc.TaskGroup,
    *,
    spawn: Spawn,
    reason: ExitReason = exit_reason,
) -> SubprocessTransport:
    """Start a capsule child with ``spawn``, load ``request`` into it, return it serving.

    If the child dies, hangs or misbehaves while loading, it is killed and
    :class:`LoadFailed` says why, with ``report.culprit`` naming the file being imported;
    the caller retries without that file.
    """
    process, host_out, host_in = await spawn()
    transport: SubprocessTransport | None = None

    def violation(reason: str) -> None:
        if transport is not None:
            transport._kill_now(reason)  # pyright: ignore[reportPrivateUsage]

    gate = _ConsoleGate(events)
    connection = Connection(
        host_out,
        host_in,
        events=gate,
        session=request.session,
        on_violation=violation,
        max_frame=request.max_frame,
    )
    transport = SubprocessTransport(process, connection, gate, request.session, reason)
    try:
        await task_group.start(transport.run)
        try:
            await connection.load(request, transport.report)
        except CapsuleDied:
            with anyio.move_on_after(_EXIT_GRACE):
                await transport._exited.wait()  # pyright: ignore[reportPrivateUsage]
            why = transport.exit_reason()
            await transport.kill(why)
            raise LoadFailed(why, transport.report) from None
        except TimeoutError:
            why = f"importing it did not finish within {request.load_timeout:g} s"
            await transport.kill(why)
            raise LoadFailed(why, transport.report) from None
        except BadFrame as exc:
            why = f"it broke the wire protocol while loading ({exc})"
            await transport.kill(why)
            raise LoadFailed(why, transport.report) from None
    except BaseException:
        with anyio.CancelScope(shield=True):
            await transport.kill("it failed to load")
        raise
    transport.serving.set()
    return transport


async def start_subprocess(
    request: LoadRequest,
    events: EventBus,
    task_group: anyio.abc.TaskGroup,
    *,
    python: Path | None = None,
    project: Path | None = None,
    caches: tuple[Path, ...] = (),
    zygote: bool = True,
    network: Literal["none", "all"] | Sequence[int] = "none",
    pool: CapsulePool | None = None,
) -> SubprocessTransport:
    """Start a ``python -m capsule`` child and load the tool files into it.

    Under the host's own interpreter (and with ``zygote``), the child is forked from the
    keeper's zygote instead, which has imported the capsule runtime already
    (``capsule/_zygote.py``); where it cannot be (the zygote failed to import it), a
    ``zygote_unavailable`` event says why and the child is started as above.

    ``python`` runs it under another interpreter (``[capsules] python``; checked first
    with :func:`check_interpreter`) with only the ``capsule`` package added to what it
    can import, so the tools import what that environment has installed.

    With ``project`` (the project folder) and Landlock here, the worker confines itself
    to that project's :class:`~host.capsules._guard.Guard` (``caches``: the host's cache
    folders, never writable; nor is the environment of ``python``) before it loads a
    tool.

    With ``pool``, the child is the one the pool started ahead the same way, if it has
    one (``_capsule_pool.py``).
    """
    keep_dumpable = os.environ.get(KEEP_DUMPABLE) == "1"
    # exec made the child dumpable again: its first line makes it not, before the imports
    # (the capsule does it again, for a child started some other way).
    first = "" if keep_dumpable or not sys.platform.startswith("linux") else _UNDUMPABLE
    if python is None:
        command = [sys.executable, "-I", "-c", first + _BOOTSTRAP.format(path=_CAPSULE_PARENT)]
    else:
        bootstrap = _BOOTSTRAP_ELSEWHERE.format(package=_CAPSULE_DIR)
        command = [str(python), "-I", "-c", first + bootstrap]
    guard = None
    if project is not None and containment().landlock:
        # The other interpreter's environment runs in the host too (its check), so tools
        # may not plant code there either.
        extra = () if python is None else (Path(python).parent.parent,)
        # The host's key signs what the host trusts (grants, the journal, caches): a tool
        # that could read it could forge them.
        guard = project_guard(
            project,
            request.tools_dir,
            (*caches, *extra),
            private=(key_path().parent,),
            network=network,
        )
    rules = None if guard is None else guard.to_data()
    settings = {
        "landlock": rules,
        "dumpable": keep_dumpable,
    }
    env = {**request.env, _SETTINGS: json.dumps(settings)}

    async def spawn() -> tuple[anyio.abc.Process, int, int]:
        if _keeper.available():
            try:
                if zygote and python is None and _keeper.zygote_wanted():
                    try:
                        return await _keeper.spawn_forked(cwd=request.cwd, env=env)
                    except _keeper.ZygoteUnavailable as exc:
                        events.emit("zygote_unavailable", request.session, reason=str(exc))
                return await _keeper.spawn(command, cwd=request.cwd, env=env)
            except _keeper.KeeperUnavailable as exc:
                logger.warning("starting a capsule without the keeper: %s", exc)
        return await spawn_piped(command, cwd=request.cwd, env=env)

    if pool is None:
        return await start_process(request, events, task_group, spawn=spawn)
    take = pool.spawner(
        (tuple(command), request.cwd, tuple(sorted(env.items())), zygote),
        spawn,
        task_group,
        () if rules is None else tuple(_landlock.listed(rules)),
    )
    try:
        return await start_process(request, events, task_group, spawn=take)
    except LoadFailed as exc:
        if not take.spare or exc.report.culprit is not None:
            raise  # a start of its own, or a tool file that broke it: the caller says
        # The spare died while it waited (after the pool's last look): start afresh.
        logger.info("the capsule started ahead could not load the tools (%s)", exc.reason)
        return await start_process(request, events, task_group, spawn=spawn)


def subprocess_capsules(
    python: Path | None,
    project: Path | None = None,
    caches: tuple[Path, ...] = (),
    *,
    zygote: bool = True,
    network: Literal["none", "all"] | Sequence[int] = "none",
    pool: CapsulePool | None = None,
) -> TransportFactory:
    """``start_subprocess`` under ``python`` (the host's own interpreter when ``None``),
    confined to the guard of ``project`` when it is given (``caches``: see there; with
    the TCP ``network`` allows), forked from the zygote unless ``zygote`` is false
    (``[capsules] zygote``), taking the capsules ``pool`` starts ahead."""
    if python is None and project is None and zygote and pool is None:
        return start_subprocess
    return functools.partial(
        start_subprocess,
        python=python,
        project=project,
        caches=caches,
        zygote=zygote,
        network=network,
        pool=pool,
    )


_PROBE = (
    "import sys, platform\n"
    "print(platform.python_implementation(), *sys.version_info[:3])\n"
    "import msgpack\n"
    "print('msgpack', msgpack.version[0], msgpack.version[1])\n"
)


async def check_interpreter(python: Path, env: Mapping[str, str]) -> str:
    """Check that ``python`` can run tool capsules: CPython 3.11 or later with ``msgpack``
    importable. Returns what it is (``CPython 3.12.1``).

    Raises:
        ValueError: what is wrong, in one sentence that says what to install or change.
    """
    try:
        with anyio.fail_after(_PROBE_TIMEOUT):
            done = await anyio.run_process(
                [str(python), "-I", "-c", _PROBE], env=dict(env), check=False
            )
    except TimeoutError:
        raise ValueError(
            f"{python} did not answer within {_PROBE_TIMEOUT:g} s: is it a Python interpreter?"
        ) from None
    except OSError as exc:
        raise ValueError(f"{python} cannot be run: {exc.strerror or exc}") from None
    lines = done.stdout.decode("utf-8", "replace").split()
    try:
        kind, major, minor, micro = lines[0], int(lines[1]), int(lines[2]), int(lines[3])
    except (IndexError, ValueError):
        raise ValueError(
            f"{python} is not a Python interpreter toolhost can use: it needs CPython 3.11 or later"
        ) from None
    what = f"{kind} {major}.{minor}.{micro}"
    if kind != "CPython" or (major, minor) < (3, 11):
        raise ValueError(f"{python} is {what}: tool capsules need CPython 3.11 or later")
    if done.returncode != 0 or "msgpack" not in lines:
        raise ValueError(
            f"{python} ({what}) cannot import msgpack, which the capsule needs: install it "
            f"there ({python} -m pip install 'msgpack>=1.1,<1.3')"
        )
    return what
