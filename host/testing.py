"""Helpers for testing agents and hosts: the in-process twin of the capsule transport.

``Host.open(project, capsule=in_process())`` loads the project's tool files into the
test's own process and runs calls there, through the capsule's own export rules,
argument splitting and plain-data conversion, with the result encoded and decoded as on
the wire. Everything above the transport (binding, the mediator, sessions, errors) is
the real thing, so tests of those layers run in microseconds instead of starting
processes.

What the twin does not give you: isolation. Tool code runs in your process, sees your
environment, and a sync tool that hangs cannot be killed (async tools are cancelled at
their deadline). Use real capsules to test containment. This module is the one place
in ``host`` that imports capsule internals: running the capsule's code is its purpose.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc

from capsule import _registry  # pyright: ignore[reportPrivateUsage]
from capsule import protocol as p
from capsule._convert import NotPlainData, to_plain  # pyright: ignore[reportPrivateUsage]
from capsule._serve import error_data, split_arguments  # pyright: ignore[reportPrivateUsage]
from capsule.context import (
    Attachment,
    Result,
    ToolContext,
    files_from_wire,
    files_to_wire,
)

from ._events import EventBus
from .capsules import (
    ContextFailure,
    ContextHandler,
    FileReport,
    LoadReport,
    LoadRequest,
    TransportFactory,
)
from .errors import (
    CapsuleCrashed,
    HostError,
    LimitExceeded,
    NotSerializable,
    ToolError,
    ToolTimeout,
)

__all__ = ["InProcessTransport", "in_process"]

_packages = itertools.count(1)


class InProcessTransport:
    """Tool modules imported into this process, called directly."""

    def __init__(self, request: LoadRequest, package: str) -> None:
        self._request = request
        self._package = package
        self._targets: dict[str, _registry.Target] = {}
        self._report = LoadReport()
        self._dead: str | None = None
        self.calls = 0
        """How many calls reached the tools (for assertions in tests)."""

    @property
    def report(self) -> LoadReport:
        return self._report

    @property
    def alive(self) -> bool:
        return self._dead is None

    def _load(self) -> None:
        request = self._request
        _registry.install_package(request.tools_dir, self._package)
        modules: dict[str, Any] = {}
        for file in request.files:
            try:
                module = _registry.import_file(file, self._package)
                exports = _registry.runtime_exports(module, self._package)
            except Exception as exc:  # reported like the real capsule reports it
                error = error_data(exc)
                self._report.files[file] = FileReport(
                    error=f"importing it raised:\n{error['traceback']}"
                )
                continue
            modules[file] = module
            self._report.files[file] = FileReport(exports=exports)
        for name, (file, path, params, context) in request.tools.items():
            if file in modules:
                self._targets[name] = _registry.resolve(modules[file], name, path, params, context)
        self._report.python = ".".join(map(str, sys.version_info[:3]))

    async def call(
        self,
        call_id: int,
        tool: str,
        encoded: bytes,
        timeout: float,
        context: Mapping[str, Any] | None = None,
    ) -> Any:
        if self._dead is not None:
            raise CapsuleCrashed(tool, reason=self._dead, may_have_executed=False)
        target = self._targets[tool]
        bound = p.decode(encoded)
        ctx: ToolContext | None = None
        if target.context is not None:
            info = dict(context or {})
            ctx = ToolContext(
                tool=str(info.get("tool", tool)),
                call_id=str(info.get("call_id", "")),
                session=str(info.get("session", "")),
                caller=str(info.get("caller", "")),
                chain=[str(c) for c in info.get("chain") or ()],
                metadata=info.get("metadata") or {},
                channel=_Channel(self._request.context),
                call=call_id,
            )
            bound[target.context] = ctx
        args, kwargs = split_arguments(target.params, bound)
        self.calls += 1
        cancelled = anyio.get_cancelled_exc_class()
        result: Any = None
        try:
            with anyio.move_on_after(timeout) as scope:
                if target.is_async:
                    result = await target.fn(*args, **kwargs)
                else:
                    result = await anyio.to_thread.run_sync(lambda: target.fn(*args, **kwargs))
            if scope.cancelled_caught:
                raise ToolTimeout(tool, timeout=timeout)
            if isinstance(result, (Result, Attachment)):
                return self._files(tool, result)  # pyright: ignore[reportUnknownArgumentType]
            body = p.encode(to_plain(result))
        except (ToolTimeout, LimitExceeded, cancelled):
            raise
        except NotPlainData as exc:
            raise NotSerializable(tool, type_name=exc.type_name, path=exc.path) from None
        except BaseException as exc:  # SystemExit in a tool is a ToolError, as in a capsule
            error = error_data(exc)
            raise ToolError(
                tool,
                type_name=error["type"],
                error_message=error["message"],
                traceback=error["traceback"],
            ) from None
        finally:
            if ctx is not None:
                ctx._close()  # pyright: ignore[reportPrivateUsage]
        if len(body) > self._request.max_frame:
            raise LimitExceeded("max_frame", f"the result is {len(body)} bytes", tool=tool)
        value = p.decode(body)
        p.check_plain(value)
        return value

    def _files(self, tool: str, result: Result[Any] | Attachment) -> Any:
        """A result with files, as it would cross the wire (checked, copied)."""
        value, files, shape = files_to_wire(result)
        size = sum(len(f[2]) for f in files)
        if size > self._request.max_attachment:
            raise LimitExceeded(
                "max_attachment_size",
                f"the attachments take {size} bytes, over the limit of "
                f"{self._request.max_attachment}",
                tool=tool,
            )
        value = p.decode(p.encode(to_plain(value)))
        return files_from_wire(value, files, shape)

    async def kill(self, reason: str) -> None:
        self._dead = reason


class _Channel:
    """A tool context's channel in the twin: requests go straight to the host's handler,
    their answers as they would cross the wire."""

    def __init__(self, handler: ContextHandler | None) -> None:
        self._handler = handler

    async def request(self, call: int, op: str, args: dict[str, Any]) -> tuple[bool, Any]:
        handler = self._handler
        if handler is None:
            return False, {"kind": "context_closed", "message": "no host serves contexts here"}
        try:
            value = await handler.request(call, op, p.decode(p.encode(args)))
        except ContextFailure as exc:
            return False, {"kind": exc.kind, "message": exc.message}
        except HostError as exc:
            return False, exc.to_data()
        if isinstance(value, (Result, Attachment)):
            inner, files, shape = files_to_wire(value)  # pyright: ignore[reportUnknownArgumentType]
            return True, files_from_wire(inner, files, shape)
        return True, p.decode(p.encode(value))

    def notify(self, call: int, op: str, args: dict[str, Any]) -> None:
        if self._handler is not None:
            self._handler.event(call, op, p.decode(p.encode(args)))


def in_process() -> TransportFactory:
    """A transport factory for ``Host.open(..., capsule=in_process())``."""

    async def start(
        request: LoadRequest, events: EventBus, task_group: anyio.abc.TaskGroup
    ) -> InProcessTransport:
        del events, task_group
        transport = InProcessTransport(request, f"_toolhost_twin_{next(_packages)}")
        transport._load()  # pyright: ignore[reportPrivateUsage]
        return transport

    return start
