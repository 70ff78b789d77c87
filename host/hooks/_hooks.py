"""Hooks around every tool call, in the Standard Agents order (docs/context-and-hooks.md, "Hooks").

Order of one call that runs: the ``tool_call_started`` event, then the
``tool_call_started`` hooks (observe; the call waits for them at most
``started_timeout`` seconds, then goes on without cancelling them) -> the tool runs ->
``tool_call_done`` (observe the raw result; the call, and so the session's next call,
waits for them) -> ``after_tool_call_success`` or ``after_tool_call_failure`` (a chain)
-> ``before_store_tool_result`` (a chain: what it ends with is audited and returned).

A chain hook returns ``None`` to keep the result, a :class:`ToolResult` to replace it, a
``HostError`` to make the call fail with that error, or any other value to make the call
succeed with that value. A hook that raises (or returns an exception that is not a
``HostError``) is logged with its id and a ``hook_failed`` event; the chain goes on with
the last good result. A call refused before it runs gets no hooks but the policy kinds
(``policy_decision``, ``policy_denied``, ``policy_escalation``), whose hooks are called
with ``(ctx, event)`` as observers.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

import anyio
import anyio.abc

from host._display import Redactor
from host._events import Event, EventBus
from host.errors import HostError

__all__ = [
    "HOOK_KINDS",
    "POLICY_HOOK_KINDS",
    "Hook",
    "HookContext",
    "HookFn",
    "HookKind",
    "HookRunner",
    "ToolCallInfo",
    "ToolResult",
    "hook",
    "load_hook_files",
]

logger = logging.getLogger("toolhost")

HookKind = Literal[
    "tool_call_started",
    "tool_call_done",
    "after_tool_call_success",
    "after_tool_call_failure",
    "before_store_tool_result",
    "policy_decision",
    "policy_denied",
    "policy_escalation",
]
HOOK_KINDS: tuple[HookKind, ...] = get_args(HookKind)
POLICY_HOOK_KINDS: tuple[HookKind, ...] = ("policy_decision", "policy_denied", "policy_escalation")

HookFn = Callable[..., Any]
"""``(ctx, call, progress|result)`` or, for the policy kinds, ``(ctx, event)``; sync or async."""

_MARK = "__toolhost_hook__"


@dataclass(frozen=True, slots=True)
class HookContext:
    """Where a call comes from: the same for every hook of one call."""

    session: str | None
    """The session id."""
    caller: str | None
    """``app``, ``agent``, ``script`` or ``tool`` (a nested call from ``ctx.call``)."""
    chain: tuple[str, ...] = ()
    """The tools above this call, outermost first (empty for a call from outside)."""
    metadata: Mapping[str, Any] = field(default_factory=dict[str, Any])
    """Read-only values the app gave the session."""
    host_id: str = ""


@dataclass(frozen=True, slots=True)
class ToolCallInfo:
    """The call a hook sees."""

    call_id: str
    tool: str
    """The canonical tool name."""
    arguments: Mapping[str, Any]
    """The bound arguments by parameter name, with the values of ``[env] secret`` variables
    replaced by ``⟨secret NAME⟩`` (a copy: changing it changes nothing)."""
    caller: str


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A call's result: a value (``ok``) or a typed error."""

    ok: bool
    value: Any = None
    error: HostError | None = None

    @classmethod
    def success(cls, value: Any) -> ToolResult:
        return cls(True, value, None)

    @classmethod
    def failure(cls, error: HostError) -> ToolResult:
        return cls(False, None, error)


@dataclass(frozen=True, slots=True)
class Hook:
    """One registered hook."""

    id: str
    kind: HookKind
    fn: HookFn
    source: str
    """``hooks/FILE.py:LINE`` for a project hook, ``app`` for one from ``host.hook``."""

    def to_data(self) -> dict[str, str]:
        return {"id": self.id, "kind": self.kind, "source": self.source}


_collecting: list[HookFn] | None = None
"""While a hooks file is imported: the functions its ``@hook`` decorated, in order."""


def _check_kind(kind: str) -> HookKind:
    if kind not in HOOK_KINDS:
        raise HostError(f"unknown hook kind {kind!r}: use one of {', '.join(HOOK_KINDS)}")
    return kind


def hook(kind: HookKind, *, id: str | None = None) -> Callable[[HookFn], HookFn]:
    """Mark a function as a hook of ``kind`` (the function is returned unchanged).

    In ``hooks/*.py`` the marked functions are registered in definition order, with the id
    ``FILE.FUNCTION`` unless ``id`` is given; in an app, pass the function to
    ``host.hook(fn)``.
    """
    checked = _check_kind(kind)

    def mark(fn: HookFn) -> HookFn:
        setattr(fn, _MARK, (checked, id))
        if _collecting is not None:
            _collecting.append(fn)
        return fn

    return mark


def _source(fn: HookFn, fallback: str) -> str:
    code = getattr(fn, "__code__", None)
    if code is None:
        return fallback
    return f"{fallback}:{code.co_firstlineno}"


def app_hook(fn: HookFn, kind: str | None = None, id: str | None = None) -> Hook:
    """A hook from the app: marked with ``@hook`` or given its kind here."""
    marked = cast("tuple[HookKind, str | None] | None", getattr(fn, _MARK, None))
    if kind is None:
        if marked is None:
            raise HostError("host.hook(fn) needs a kind: host.hook(fn, 'tool_call_done')")
        kind = marked[0]
    name = id or (marked[1] if marked else None) or getattr(fn, "__qualname__", repr(fn))
    return Hook(name, _check_kind(kind), fn, "app")


def load_hook_files(folder: Path) -> list[Hook]:
    """The hooks of ``folder/*.py`` (the project's ``hooks/``, beside its ``tools/``): file
    name order, then definition order; files starting with ``_`` are helpers, not loaded.

    The files are imported into this process (trusted project code). Raises
    ``HostError`` naming the file when one fails to import or two hooks share an id.
    """
    global _collecting
    hooks: list[Hook] = []
    if not folder.is_dir():
        return hooks
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        where = f"hooks/{path.name}"
        module_name = f"toolhost_project_hooks.{path.stem}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise HostError(f"{where}: cannot be imported")
        module = importlib.util.module_from_spec(spec)
        collected: list[HookFn] = []
        _collecting = collected
        try:
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise HostError(
                f"{where} failed to load: {type(exc).__name__}: {exc}; fix the file or move it "
                "out of hooks/"
            ) from exc
        finally:
            _collecting = None
        for fn in collected:
            kind, given = cast("tuple[HookKind, str | None]", getattr(fn, _MARK))
            name = given or f"{path.stem}.{getattr(fn, '__name__', 'hook')}"
            hooks.append(Hook(name, kind, fn, _source(fn, where)))
    seen: set[str] = set()
    for item in hooks:
        if item.id in seen:
            raise HostError(f"two hooks have the id {item.id!r} ({item.source}): rename one")
        seen.add(item.id)
    return hooks


def redact_value(redactor: Redactor, value: Any) -> Any:
    """A copy of plain data with secret values replaced in every string."""
    if not redactor:
        return value
    if isinstance(value, str):
        return redactor.text(value)
    if isinstance(value, Mapping):
        items = cast("Mapping[Any, Any]", value)
        return {redact_value(redactor, k): redact_value(redactor, v) for k, v in items.items()}
    if isinstance(value, list | tuple):
        return [redact_value(redactor, v) for v in cast("Sequence[Any]", value)]
    return value


_FAILED = object()


class HookRunner:
    """The hooks of one host, run by the mediator in the fixed order."""

    def __init__(self, events: EventBus, *, started_timeout: float = 30.0) -> None:
        self._events = events
        self.started_timeout = started_timeout
        """Seconds a call waits for its ``tool_call_started`` hooks."""
        self._files: list[Hook] = []
        self._app: list[Hook] = []
        self._by_kind: dict[str, tuple[Hook, ...]] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self.active = False
        """Whether any tool-call hook is registered (the call path skips them if not)."""
        self._unsubscribe: Callable[[], None] | None = None

    def attach(self, task_group: anyio.abc.TaskGroup) -> None:
        """The task group slow ``tool_call_started`` hooks and policy hooks run in."""
        self._tg = task_group

    @property
    def hooks(self) -> tuple[Hook, ...]:
        """Every hook, in the order they run (project files, then the app's)."""
        return (*self._files, *self._app)

    def set_files(self, hooks: Sequence[Hook]) -> None:
        self._check((*hooks, *self._app))
        self._files = list(hooks)
        self._index()

    def add(self, item: Hook) -> Callable[[], None]:
        """Register an app hook; returns a function that removes it."""
        self._check((*self._files, *self._app, item))
        self._app.append(item)
        self._index()

        def remove() -> None:
            if item in self._app:
                self._app.remove(item)
                self._index()

        return remove

    @staticmethod
    def _check(hooks: Sequence[Hook]) -> None:
        seen: set[str] = set()
        for item in hooks:
            if item.id in seen:
                raise HostError(f"two hooks have the id {item.id!r}: give one another id")
            seen.add(item.id)

    def _index(self) -> None:
        by_kind: dict[str, list[Hook]] = {}
        for item in self.hooks:
            by_kind.setdefault(item.kind, []).append(item)
        self._by_kind = {kind: tuple(items) for kind, items in by_kind.items()}
        self.active = any(kind not in POLICY_HOOK_KINDS for kind in self._by_kind)
        observing = any(kind in POLICY_HOOK_KINDS for kind in self._by_kind)
        if observing and self._unsubscribe is None:  # the bus pays only when there are some
            self._unsubscribe = self._events.subscribe(self._on_event)
        elif not observing and self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def info(
        self,
        call_id: str,
        tool: str,
        arguments: Mapping[str, Any],
        caller: str,
        session: str | None = None,
    ) -> ToolCallInfo:
        """What hooks are told about a call: its arguments with the session's secrets
        replaced."""
        redactor = self._events.redactor_for(session)
        return ToolCallInfo(call_id, tool, redact_value(redactor, dict(arguments)), caller)

    async def _run(self, item: Hook, session: str | None, *args: Any) -> Any:
        """One hook; ``_FAILED`` (logged, with a ``hook_failed`` event) if it raises."""
        try:
            out = item.fn(*args)
            if inspect.isawaitable(out):
                out = await out
            return out
        except Exception as exc:
            self._failed(item, session, exc)
            return _FAILED

    def _failed(self, item: Hook, session: str | None, exc: BaseException) -> None:
        text = self._events.redactor_for(session).text(f"{type(exc).__name__}: {exc}")[:500]
        logger.warning("hook %s (%s) failed: %s", item.id, item.kind, text)
        self._events.emit("hook_failed", session, hook=item.id, hook_kind=item.kind, error=text)

    async def started(self, ctx: HookContext, call: ToolCallInfo, progress: Any) -> None:
        """Run the ``tool_call_started`` hooks; wait for them at most ``started_timeout``.

        A sync hook runs to its end in place (it holds the event loop: no bound could stop
        it anyway); the first async one and those after it run in a task of the host's
        task group, which the call waits for until the bound, then leaves running.
        """
        hooks = self._by_kind.get("tool_call_started", ())
        for index, item in enumerate(hooks):
            try:
                out = item.fn(ctx, call, progress)
            except Exception as exc:
                self._failed(item, ctx.session, exc)
                continue
            if inspect.isawaitable(out):
                await self._rest(ctx, call, progress, out, item, hooks[index + 1 :])
                return

    async def _rest(
        self,
        ctx: HookContext,
        call: ToolCallInfo,
        progress: Any,
        first: Awaitable[Any],
        item: Hook,
        rest: Sequence[Hook],
    ) -> None:
        finished = anyio.Event()

        async def run() -> None:
            try:
                try:
                    await first
                except Exception as exc:
                    self._failed(item, ctx.session, exc)
                for other in rest:
                    await self._run(other, ctx.session, ctx, call, progress)
            finally:
                finished.set()

        if self._tg is None:  # no host around it (a bare runner): inline, unbounded
            await run()
            return
        self._tg.start_soon(run)
        with anyio.move_on_after(self.started_timeout):
            await finished.wait()
        if not finished.is_set():
            self._events.emit(
                "hook_timed_out",
                ctx.session,
                call_id=call.call_id,
                tool=call.tool,
                hook_kind="tool_call_started",
                timeout=self.started_timeout,
            )

    async def finished(self, ctx: HookContext, call: ToolCallInfo, raw: ToolResult) -> ToolResult:
        """``tool_call_done`` on the raw result, then the chains; the final result."""
        by_kind = self._by_kind
        for item in by_kind.get("tool_call_done", ()):
            await self._run(item, ctx.session, ctx, call, raw)
        result = raw
        first = "after_tool_call_success" if raw.ok else "after_tool_call_failure"
        for kind in (first, "before_store_tool_result"):
            for item in by_kind.get(kind, ()):
                out = await self._run(item, ctx.session, ctx, call, result)
                if out is _FAILED or out is None:
                    continue
                if isinstance(out, ToolResult):
                    result = out
                elif isinstance(out, HostError):
                    result = ToolResult.failure(out)
                elif isinstance(out, BaseException):
                    self._failed(item, ctx.session, TypeError(f"returned {out!r}, not a HostError"))
                else:
                    result = ToolResult.success(out)
        return result

    def _on_event(self, event: Event) -> None:
        """Policy events reach the hooks of their kind (run in the host's task group)."""
        if event.kind not in POLICY_HOOK_KINDS:
            return
        hooks = self._by_kind.get(event.kind, ())
        if not hooks or self._tg is None:
            return
        data = event.data
        caller = data.get("caller")
        ctx = HookContext(event.session, caller if isinstance(caller, str) else None)

        async def run() -> None:
            for item in hooks:
                await self._run(item, event.session, ctx, event)

        self._tg.start_soon(run)
