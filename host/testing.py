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
from typing import Any

import anyio
import anyio.abc

from capsule import _registry  # pyright: ignore[reportPrivateUsage]
from capsule import protocol as p
from capsule._convert import NotPlainData, to_plain  # pyright: ignore[reportPrivateUsage]
from capsule._serve import error_data, split_arguments  # pyright: ignore[reportPrivateUsage]

from ._events import EventBus
from .capsules import FileReport, LoadReport, LoadRequest, TransportFactory
from .errors import CapsuleCrashed, LimitExceeded, NotSerializable, ToolError, ToolTimeout

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
        for name, (file, path, params) in request.tools.items():
            if file in modules:
                self._targets[name] = _registry.resolve(modules[file], name, path, params)
        self._report.python = ".".join(map(str, sys.version_info[:3]))

    async def call(self, call_id: int, tool: str, encoded: bytes, timeout: float) -> Any:
        del call_id
        if self._dead is not None:
            raise CapsuleCrashed(tool, reason=self._dead, may_have_executed=False)
        target = self._targets[tool]
        args, kwargs = split_arguments(target.params, p.decode(encoded))
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
            body = p.encode(to_plain(result))
        except (ToolTimeout, cancelled):
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
        if len(body) > self._request.max_frame:
            raise LimitExceeded("max_frame", f"the result is {len(body)} bytes", tool=tool)
        value = p.decode(body)
        p.check_plain(value)
        return value

    async def kill(self, reason: str) -> None:
        self._dead = reason


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
