"""Keep one session's tool capsule running: start, load check, timeouts, restarts.

There are three ways a capsule ends, and each is handled here:

* a call outruns its deadline: the capsule is killed (with every process it started) and
  the call fails with ``ToolTimeout``; the next call starts a fresh capsule;
* the capsule dies: every call in flight fails with ``CapsuleCrashed``; the next call
  starts a fresh one after a backoff that grows with each crash, and after
  ``max_restarts`` crashes within ``restart_window`` its tools are ``ToolUnavailable``
  for ``unavailable_for`` seconds, then one more start is tried;
* a tool file fails to load (raises, hangs or kills the process while importing, or
  exports other names than discovery declared): that file's tools are unavailable, with
  the reason, and the others load without it.

Module state is lost whenever a capsule is replaced, and the ``capsule_started`` event
says so.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import anyio
import anyio.abc

from host._binding import BoundCall
from host._events import EventBus
from host.declare import Discovery, ToolSpec
from host.errors import CapsuleCrashed, ToolTimeout, ToolUnavailable

from ._transport import ContextHandler, LoadFailed, LoadRequest, Transport, TransportFactory

__all__ = ["Supervisor"]

_BACKOFF_BASE = 0.05
_BACKOFF_CAP = 2.0


class _Unavailable(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Supervisor:
    """One capsule for a set of tool files, kept alive for a session."""

    def __init__(
        self,
        *,
        discovery: Discovery,
        files: list[str],
        tools: Mapping[str, ToolSpec],
        factory: TransportFactory,
        events: EventBus,
        task_group: anyio.abc.TaskGroup,
        session: str,
        cwd: str,
        env: Mapping[str, str],
        load_timeout: float,
        max_frame: int,
        max_restarts: int,
        restart_window: float,
        unavailable_for: float,
        max_attachment: int = 16 * 1024 * 1024,
        context: ContextHandler | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self._discovery = discovery
        self._files = files
        self._tools = tools
        self._factory = factory
        self._events = events
        self._tg = task_group
        self._session = session
        self._cwd = cwd
        self._env = env
        self._load_timeout = load_timeout
        self._max_frame = max_frame
        self._max_restarts = max_restarts
        self._window = restart_window
        self._unavailable_for = unavailable_for
        self._max_attachment = max_attachment
        self._context = context
        self._metadata = dict(metadata or {})
        self._transport: Transport | None = None
        self._lock = anyio.Lock()
        self._crashes: deque[float] = deque()
        self._next_start = 0.0
        self._open_until = 0.0
        self._open_reason = ""
        self._starts = 0
        self._closed = False
        self.failed_files: dict[str, str] = {}
        """Tool file -> why it is unavailable (it failed to load)."""

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The read-only values the app gave this session (what tools and hooks see)."""
        return MappingProxyType(self._metadata)

    def __repr__(self) -> str:
        state = "running" if self._transport is not None and self._transport.alive else "stopped"
        failed = sorted(self.failed_files)
        return f"<Supervisor session={self._session} {state} starts={self._starts} failed={failed}>"

    @property
    def transport(self) -> Transport | None:
        return self._transport

    # -- starting ----------------------------------------------------------------------

    async def ensure(self) -> Transport:
        """The running capsule, started (or restarted) if need be.

        Raises ``_Unavailable`` while the capsule is crash-looping or cannot start.
        """
        transport = self._transport
        if transport is not None and transport.alive:
            return transport
        async with self._lock:
            transport = self._transport
            if transport is not None and transport.alive:
                return transport
            if transport is not None:
                self._transport = None
                self._record_crash("it died between calls")
            if self._closed:
                raise _Unavailable("the host is closed")
            now = time.monotonic()
            if now < self._open_until:
                raise _Unavailable(self._open_reason)
            if self._next_start > now:
                await anyio.sleep(self._next_start - now)
            self._transport = await self._start()
            return self._transport

    def _request(self, files: list[str]) -> LoadRequest:
        tools = {
            name: (spec.file, list(spec.path[1:]), spec.capsule_params, spec.context)
            for name, spec in self._tools.items()
            if spec.file in files
        }
        return LoadRequest(
            tools_dir=str(self._discovery.tools_dir),
            files=files,
            tools=tools,
            cwd=self._cwd,
            env=self._env,
            load_timeout=self._load_timeout,
            max_frame=self._max_frame,
            session=self._session,
            max_attachment=self._max_attachment,
            context=self._context,
        )

    def _fail_file(self, file: str, reason: str) -> None:
        self.failed_files[file] = reason
        self._events.emit("tool_file_failed", self._session, file=file, reason=reason)

    async def _start(self) -> Transport:
        while True:
            files = [f for f in self._files if f not in self.failed_files]
            try:
                transport: Transport = await self._factory(
                    self._request(files), self._events, self._tg
                )
            except LoadFailed as exc:
                culprit = exc.report.culprit
                if culprit is None or culprit in self.failed_files:
                    self._record_crash(f"it could not start: {exc.reason}")
                    raise _Unavailable(f"the capsule could not start: {exc.reason}") from None
                self._fail_file(culprit, f"{exc.reason} while importing {culprit}.py")
                continue
            break
        report = transport.report
        for file in files:
            got = report.files.get(file)
            if got is None:
                self._fail_file(file, "the capsule did not report on it")
            elif got.error is not None:
                self._fail_file(file, got.error)
            elif got.exports != self._discovery.runtime_names(file):
                declared = self._discovery.runtime_names(file)
                self._fail_file(
                    file,
                    f"declared exports {declared} but at run time it exports {got.exports}; "
                    "make the file's top-level names match what it defines",
                )
        self._starts += 1
        self._events.emit(
            "capsule_started",
            self._session,
            pid=report.pid,
            restart=self._starts > 1,
            state_lost=self._starts > 1,
            message=(
                "capsule restarted: module state of the tools was lost"
                if self._starts > 1
                else "capsule started"
            ),
        )
        return transport

    def _record_crash(self, reason: str) -> None:
        now = time.monotonic()
        self._crashes.append(now)
        while self._crashes and self._crashes[0] < now - self._window:
            self._crashes.popleft()
        count = len(self._crashes)
        self._events.emit("capsule_crashed", self._session, reason=reason, recent_crashes=count)
        if count >= self._max_restarts:
            self._open_until = now + self._unavailable_for
            self._open_reason = (
                f"its capsule crashed {count} times within {self._window:g} s "
                f"(last: {reason}); it will be tried again after {self._unavailable_for:g} s"
            )
            self._events.emit("capsule_unavailable", self._session, reason=self._open_reason)
        delay = min(_BACKOFF_CAP, _BACKOFF_BASE * 2 ** (count - 1))
        self._next_start = now + delay * random.uniform(0.5, 1.0)

    # -- calling -----------------------------------------------------------------------

    async def call(
        self,
        call_id: int,
        spec: ToolSpec,
        bound: BoundCall,
        timeout: float,
        context: Mapping[str, Any] | None = None,
    ) -> Any:
        """Run one call in the capsule. Raises the typed errors of ``host.errors``.

        ``context``: the host's record of the call (``call_id``, ``tool``, ``session``,
        ``caller``, ``chain``), for a tool that takes a ``ToolContext``; the session's
        metadata is added here.
        """
        failed = self.failed_files.get(spec.file)
        if failed is not None:
            raise ToolUnavailable(spec.name, reason=f"{spec.file}.py failed to load: {failed}")
        try:
            transport = await self.ensure()
        except _Unavailable as exc:
            raise ToolUnavailable(spec.name, reason=exc.reason) from None
        try:
            if spec.context is None:
                return await transport.call(call_id, spec.name, bound.encoded, timeout)
            info = {**(context or {}), "metadata": self._metadata}
            return await transport.call(call_id, spec.name, bound.encoded, timeout, info)
        except CapsuleCrashed as exc:
            if self._transport is transport:
                self._transport = None
                self._record_crash(exc.reason)
            raise
        except ToolTimeout:
            if self._transport is transport:
                self._transport = None
            await transport.kill(f"a call to {spec.name} timed out after {timeout:g} s")
            self._events.emit("call_timed_out", self._session, tool=spec.name, timeout=timeout)
            raise

    async def retool(
        self, discovery: Discovery, files: list[str], tools: Mapping[str, ToolSpec]
    ) -> None:
        """Serve new tool files: the capsule is replaced (its module state is lost).

        Calls in flight in the old capsule fail with ``CapsuleCrashed``; the next call (or
        :meth:`ensure`) starts a capsule that loads the new files.
        """
        async with self._lock:
            self._discovery = discovery
            self._files = files
            self._tools = tools
            self.failed_files = {}
            self._crashes.clear()
            self._open_until = 0.0
            self._next_start = 0.0
            transport, self._transport = self._transport, None
        if transport is not None:
            with anyio.CancelScope(shield=True):
                await transport.kill("the tool files changed")

    @property
    def running(self) -> bool:
        """Whether a capsule is running for this session now."""
        transport = self._transport
        return transport is not None and transport.alive

    def release(self, reason: str) -> bool:
        """Stop the capsule of an idle session to free its memory; the next call (or
        :meth:`ensure`) starts a new one. Not a crash: no backoff, nothing counted.

        The capsule is detached at once (a call that comes after this never reaches it)
        and killed in the background. Only for a session with no call in flight: a call
        in flight in it would fail with ``CapsuleCrashed``. Returns whether a capsule ran.
        """
        transport, self._transport = self._transport, None
        if transport is None:
            return False
        self._tg.start_soon(self._kill, transport, reason)
        return True

    @staticmethod
    async def _kill(transport: Transport, reason: str) -> None:
        with anyio.CancelScope(shield=True):
            await transport.kill(reason)

    async def aclose(self) -> None:
        self._closed = True
        transport, self._transport = self._transport, None
        if transport is not None:
            with anyio.CancelScope(shield=True):
                await transport.kill("the host is closing")
