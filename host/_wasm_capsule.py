"""Tool files in a Wasm capsule (``[capsules] wasm = ["math"]``): same protocol, same
module persistence, but the tools run in a CPython-WASI guest with no network, no
processes and no files except their own folder, read-only.

:func:`start_wasm_capsule` is a transport factory like ``start_subprocess``: the guest runs
the ordinary serve loop (``capsule._wasi.tool_capsule_main``) over its stdin/stdout pipes,
and the host talks to it through the shared :class:`Connection`. :func:`mixed_factory`
starts the subprocess capsule for the other files next to it and routes each call by
tool, so the supervisor sees one capsule (restarted as one).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

import anyio
import anyio.abc

from capsule.protocol import BadFrame

from . import _wasm
from ._events import EventBus
from ._process import kill_tree
from ._transport import (
    CapsuleDied,
    Connection,
    LoadFailed,
    LoadReport,
    LoadRequest,
    Transport,
    TransportFactory,
)

__all__ = ["WasmCapsule", "start_wasm_capsule", "mixed_factory"]

TOOLS_GUEST = "/project/tools"
"""Where a Wasm capsule sees the tools folder (read-only)."""

MEMORY = 1024 * 1024 * 1024
"""The memory cap of one Wasm tool capsule."""


def _exit_reason(code: int | None, tail: bytes) -> str:
    text = tail.decode("utf-8", "replace").strip().splitlines()
    trap = [line for line in text if line.startswith(_wasm.TRAP_PREFIX)]
    if trap:
        return "the guest trapped: " + trap[-1][len(_wasm.TRAP_PREFIX) :]
    if code is None:
        return "it stopped answering"
    return f"it exited with status {code}" if code >= 0 else f"it was killed by signal {-code}"


class WasmCapsule:
    """A Wasm guest serving tool calls, in a child process of its own."""

    def __init__(
        self, process: anyio.abc.Process, connection: Connection, events: EventBus, session: str
    ) -> None:
        self._process = process
        self._connection = connection
        self._events = events
        self._session = session
        self._report = LoadReport()
        self._scope = anyio.CancelScope()
        self._killed: str | None = None
        self.exited = anyio.Event()
        self.serving = anyio.Event()
        self.stderr_tail = bytearray()

    @property
    def report(self) -> LoadReport:
        return self._report

    @property
    def alive(self) -> bool:
        return self._connection.dead is None and self._killed is None

    async def call(self, call_id: int, tool: str, encoded: bytes, timeout: float) -> Any:
        return await self._connection.call(call_id, tool, encoded, timeout)

    def kill_now(self, reason: str) -> None:
        if self._killed is None:
            self._killed = reason
        kill_tree(self._process.pid)

    async def kill(self, reason: str) -> None:
        self.kill_now(reason)
        self._connection.fail_all(reason)
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await self.exited.wait()
        self._scope.cancel()

    def exit_reason(self) -> str:
        return _exit_reason(self._process.returncode, bytes(self.stderr_tail))

    async def _drain_stderr(self) -> None:
        stream = self._process.stderr
        assert stream is not None
        budget = 1024 * 1024  # console output of one capsule, then only the tail is kept
        with contextlib.suppress(
            anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError
        ):
            while True:
                data = await stream.receive(1 << 16)
                self.stderr_tail += data
                del self.stderr_tail[: max(0, len(self.stderr_tail) - 16384)]
                if budget > 0:
                    budget -= len(data)
                    text = data.decode("utf-8", "replace")
                    self._events.emit("console", self._session, stream="stderr", data=text)

    async def _watch(self) -> None:
        await self._process.wait()
        self._connection.fail_all(self._killed or self.exit_reason())
        kill_tree(self._process.pid)
        self.exited.set()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Own the capsule's background tasks until it ends."""
        try:
            with self._scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._drain_stderr)
                    tg.start_soon(self._watch)
                    task_status.started()
                    await self.serving.wait()
                    await self._connection.run()
                    with anyio.move_on_after(5):
                        await self.exited.wait()
                    tg.cancel_scope.cancel()
        finally:
            self._connection.close()
            if self._process.returncode is None:
                kill_tree(self._process.pid)
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(5),
                contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError),
            ):
                await self._process.aclose()


async def start_wasm_capsule(
    request: LoadRequest, events: EventBus, task_group: anyio.abc.TaskGroup
) -> WasmCapsule:
    """Start a Wasm tool capsule, load ``request.files`` into it, return it serving."""
    try:
        prepared = await _wasm.prepare()
    except _wasm.WasmUnavailable as exc:
        raise LoadFailed(f"the Wasm runtime is unavailable: {exc}", LoadReport()) from exc
    spec = _wasm.GuestSpec(
        cwasm=prepared.cwasm,
        argv=_wasm.guest_argv("from capsule._wasi import tool_capsule_main; tool_capsule_main()"),
        env={**request.env, "MSGPACK_PUREPYTHON": "1"},
        preopens=[
            _wasm.Preopen(prepared.lib, _wasm.LIB_GUEST, writable=False),
            _wasm.Preopen(request.tools_dir, TOOLS_GUEST, writable=False),
        ],
        memory=MEMORY,
    )
    process, host_out, host_in = await _wasm.spawn_guest(spec)
    capsule: WasmCapsule | None = None

    def violation(reason: str) -> None:
        if capsule is not None:
            capsule.kill_now(reason)

    connection = Connection(
        host_out,
        host_in,
        events=events,
        session=request.session,
        on_violation=violation,
        max_frame=request.max_frame,
    )
    capsule = WasmCapsule(process, connection, events, request.session or "")
    guest_request = dataclasses.replace(request, tools_dir=TOOLS_GUEST)
    try:
        await task_group.start(capsule.run)
        try:
            await connection.load(guest_request, capsule.report)
        except CapsuleDied:
            with anyio.move_on_after(2):
                await capsule.exited.wait()
            reason = capsule.exit_reason()
            await capsule.kill(reason)
            raise LoadFailed(reason, capsule.report) from None
        except TimeoutError:
            reason = f"importing it did not finish within {request.load_timeout:g} s"
            await capsule.kill(reason)
            raise LoadFailed(reason, capsule.report) from None
        except BadFrame as exc:
            reason = f"it broke the wire protocol while loading ({exc})"
            await capsule.kill(reason)
            raise LoadFailed(reason, capsule.report) from None
    except BaseException:
        with anyio.CancelScope(shield=True):
            await capsule.kill("it failed to load")
        raise
    capsule.serving.set()
    return capsule


class _Mixed:
    """Two capsules presented as one: calls are routed by tool name."""

    def __init__(self, parts: list[Transport], routes: Mapping[str, Transport]) -> None:
        self._parts: list[Transport] = parts
        self._routes = routes
        report = LoadReport()
        for part in parts:
            report.files.update(part.report.files)
        report.pid = parts[0].report.pid
        report.python = parts[0].report.python
        self._report = report

    @property
    def report(self) -> LoadReport:
        return self._report

    @property
    def alive(self) -> bool:
        return all(part.alive for part in self._parts)

    async def call(self, call_id: int, tool: str, encoded: bytes, timeout: float) -> Any:
        return await self._routes[tool].call(call_id, tool, encoded, timeout)

    async def kill(self, reason: str) -> None:
        for part in self._parts:
            await part.kill(reason)

    async def linked(self) -> None:
        """When one part ends, end the other: the supervisor restarts them as one."""
        # Polled: the Transport interface has no "ended" event to wait on.
        while all(part.alive for part in self._parts):  # noqa: ASYNC110
            await anyio.sleep(0.25)
        await self.kill("a sibling capsule ended")


def _subset(request: LoadRequest, files: list[str]) -> LoadRequest:
    tools = {name: target for name, target in request.tools.items() if target[0] in files}
    return dataclasses.replace(request, files=files, tools=tools)


def mixed_factory(
    wasm_files: Collection[str], *, default: str, fallback: TransportFactory
) -> TransportFactory:
    """Tool files in ``wasm_files`` (all of them when ``default`` is ``"wasm"``) load into a
    Wasm capsule; the rest into ``fallback``'s capsule."""
    chosen = set(wasm_files)

    async def start(request: LoadRequest, events: EventBus, task_group: anyio.abc.TaskGroup) -> Any:
        in_wasm = [f for f in request.files if default == "wasm" or f in chosen]
        others = [f for f in request.files if f not in in_wasm]
        parts: list[Transport] = []
        routes: dict[str, Transport] = {}
        try:
            for files, factory in ((others, fallback), (in_wasm, start_wasm_capsule)):
                if not files:
                    continue
                sub = _subset(request, files)
                part: Transport = await factory(sub, events, task_group)
                parts.append(part)
                routes.update(dict.fromkeys(sub.tools, part))
        except BaseException:
            with anyio.CancelScope(shield=True):
                for part in parts:
                    await part.kill("a sibling capsule failed to load")
            raise
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return await fallback(request, events, task_group)
        mixed = _Mixed(parts, routes)
        task_group.start_soon(mixed.linked)
        return mixed

    return start
