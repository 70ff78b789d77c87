"""What agent code sees of the tools in the code sandbox's guest: data-only proxies.

Every tool is a global (bare names, and ``tools.FILE.EXPORT[.MEMBER]``, see
:func:`tool_globals`). A :class:`Tool` is a stub: calling it returns an awaitable
:class:`ToolCall` that, when awaited, can only ask the sandbox running the code (the
driver, ``capsule._guest``, which :func:`attach` names) to send a ``use`` frame and wait
for the answer. A call that is never awaited never runs: the driver reports it.

A tool call is the guest's hot path: :class:`ToolCall` reads the sandbox from this
module's globals, as it did when it lived in the driver's module, and the driver
imports :class:`ToolCall` by name. Standard library only, imported at the guest's start.
"""

from __future__ import annotations

import _collections_abc  # what ``collections.abc`` re-exports, without importing ``collections``
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Coroutine, Generator
    from typing import Any, Protocol

    _CoroutineBase = Coroutine[Any, Any, Any]

    class Driver(Protocol):
        """What a tool call needs of the sandbox running the code (``capsule._guest``)."""

        calls: list[ToolCall]
        loop_mode: bool

        def alone(self) -> bool: ...

        def call_in_place(self, call: ToolCall) -> Any: ...

        def use(
            self, tool: str, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> Coroutine[Any, Any, Any]: ...

else:
    _CoroutineBase = _collections_abc.Coroutine

__all__ = ["ToolCall", "Tool", "Namespace", "tool_globals", "attach"]

_sandbox: Driver
"""The sandbox every call talks to: there is one per guest (:func:`attach`)."""


def attach(sandbox: Driver) -> None:
    """Make ``sandbox`` the one every :class:`ToolCall` talks to."""
    global _sandbox
    _sandbox = sandbox


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
        while frame is not None and not frame.f_code.co_filename.startswith("<run "):
            frame = frame.f_back
        self.line = None if frame is None else frame.f_lineno
        calls = _sandbox.calls  # the run's calls: the never-awaited ones are reported
        if len(calls) < 100_000:
            calls.append(self)

    def __repr__(self) -> str:
        state = "awaited" if self.awaited else "not awaited: it has not run"
        return f"<call {self.tool}(...) {state}>"

    def __await__(self) -> Generator[Any, None, Any]:
        if self.awaited:
            raise RuntimeError(f"this call to {self.tool} was already awaited")
        self.awaited = True
        if _sandbox.loop_mode:  # inside asyncio's loop
            if _sandbox.alone():  # nothing else could run meanwhile: made in place
                return _sandbox.call_in_place(self)
            return (yield from _sandbox.use(self.tool, self.args, self.kwargs).__await__())
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


def tool_globals(tools: list[Any]) -> dict[str, Any]:
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
