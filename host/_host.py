"""The orchestrator: ``Host.open`` reads the flow top to bottom.

discovery (what tools exist) -> policy files (limits, env) -> mediator (the gate) ->
sessions, each with its own supervised tool capsule. ``Host`` and ``Session`` are the
public face; ``host.tools`` and ``session.tools`` give ``tools.FILE.EXPORT[.MEMBER]``
access where every call is awaitable, whatever the tool's body.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal

import anyio
import anyio.abc
import anyio.to_thread
from pydantic import ValidationError

from capsule.protocol import encode

from ._binding import check_value
from ._context import SessionContext
from ._display import Redactor
from ._events import EventBus, SessionLog
from ._mediator import Caller, Mediator
from ._stats import CapsuleCounts, HostStats, process_memory
from ._tracing import Tracing
from .audit import JournaledStore, Store, StoreUnavailable, store_for
from .capsules import (
    LOST,
    CapsulePool,
    CodeCheck,
    CodeError,
    CodeResult,
    CodeSandbox,
    EgressProxy,
    RunOptions,
    SandboxPool,
    Supervisor,
    TransportFactory,
    capsule_pool_wanted,
    check_interpreter,
    containment,
    minimal_env,
    proxy_env,
    read_options,
    tool_capsules,
)
from .check import CodeChecker, bound_names, merged, parse, refusal
from .declare import (
    Discovery,
    Project,
    Scope,
    ToolSpec,
    discover,
    helper_call,
    load_or_build_scope,
    resolve_project,
)
from .errors import HostError, PolicyFileError
from .hooks import Hook, HookFn, HookKind, HookRunner, app_hook, load_hook_files
from .policy import (
    Approver,
    InboxApprover,
    Policy,
    PolicyConfig,
    PolicySource,
    default_approver,
    lint_policy,
    load_policy,
    missing_policy,
)
from .settings import Limits

__all__ = ["Host", "Session", "ToolProxy", "Namespace"]

_SESSION_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)
MAX_METADATA: Final = 64 * 1024
"""Bytes a session's metadata may take encoded (it goes with every call to a tool that
takes a context)."""
POLICY_LOOK: Final = 5.0
"""Seconds between the idle watch's looks at the policy files while a session's capsules
run (calls read the files anyway): an edit of ``session_idle`` takes effect within this
even on a host nobody calls."""

logger = logging.getLogger("toolhost")


def _single(group: BaseExceptionGroup[BaseException]) -> BaseException:
    while len(group.exceptions) == 1 and isinstance(group.exceptions[0], BaseExceptionGroup):
        group = group.exceptions[0]  # pyright: ignore[reportUnknownVariableType]
    return group.exceptions[0] if len(group.exceptions) == 1 else group


CallAs = Callable[[Caller, str, tuple[Any, ...], Mapping[str, Any]], Coroutine[Any, Any, Any]]
"""``Session.call_as``, or a function that wraps it."""


async def _check_python(python: Path, config: PolicyConfig) -> None:
    """Refuse to start on a ``[capsules] python`` that cannot run tool capsules."""
    try:
        await check_interpreter(python, minimal_env({}))
    except ValueError as exc:
        where = next((name for name, f in config.files if f.capsules is not None), "policy")
        raise PolicyFileError(str(exc), file=where, field="capsules.python") from None


def _limits(values: Mapping[str, Any]) -> Limits:
    """``[limits]`` with the overrides of ``Host.open(limits=...)``; a bad one is a
    ``PolicyFileError`` naming it, as in a policy file."""
    try:
        return Limits.model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in ("limits", *error["loc"]))
        message = str(error["msg"]).removeprefix("Value error, ")
        raise PolicyFileError(message, file="Host.open(limits=...)", field=field) from None


class ToolProxy:
    """One tool as a callable: calling it returns an awaitable of the tool's value."""

    __slots__ = ("_call", "_caller", "_name")

    def __init__(self, call: CallAs, name: str, caller: Caller) -> None:
        self._call: CallAs = call
        self._name: str = name
        self._caller: Caller = caller

    def __call__(self, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
        return self._call(self._caller, self._name, args, kwargs)

    def __repr__(self) -> str:
        return f"<tool {self._name}>"


class Namespace:
    """Attribute access to tools: ``tools.FILE.EXPORT[.MEMBER]``."""

    def __init__(self, label: str, entries: Mapping[str, Any]) -> None:
        self._label = label
        self._entries = dict(entries)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._entries[name]
        except KeyError:
            raise AttributeError(f"{self._label} has no attribute {name!r}") from None

    def __dir__(self) -> list[str]:
        return sorted(self._entries)

    def __repr__(self) -> str:
        return f"<{self._label}: {', '.join(sorted(self._entries))}>"


async def _no_calls(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The calls of the pool's own sandbox, which never runs code."""
    raise HostError(f"the sandbox pool makes no calls ({name})")


def _tree(call: CallAs, tools: Mapping[str, ToolSpec], caller: Caller) -> Namespace:
    files: dict[str, dict[str, ToolProxy | dict[str, ToolProxy]]] = {}
    for spec in tools.values():
        entries = files.setdefault(spec.file, {})
        proxy = ToolProxy(call, spec.name, caller)
        if spec.member is None:
            entries[spec.export] = proxy
        else:
            members = entries.setdefault(spec.export, {})
            assert isinstance(members, dict)
            members[spec.member] = proxy
    return Namespace(
        "tools",
        {
            file: Namespace(
                f"tools.{file}",
                {
                    name: Namespace(f"tools.{file}.{name}", value)
                    if isinstance(value, dict)
                    else value
                    for name, value in entries.items()
                },
            )
            for file, entries in files.items()
        },
    )


def _redacted(result: CodeResult, redactor: Redactor, results: bool) -> CodeResult:
    """A ``run_code`` result with secrets replaced: in the error always, in the value,
    output and warnings when ``results`` (what the guest printed may echo what it got)."""
    update: dict[str, Any] = {}
    if result.error is not None:
        error = result.error
        update["error"] = error.model_copy(
            update={
                "message": redactor.text(error.message),
                "traceback": redactor.text(error.traceback),
                "type": redactor.text(error.type),
            }
        )
    if result.check is not None and result.check.diagnostics:  # they may quote the code
        check = result.check
        update["check"] = check.model_copy(
            update={
                "diagnostics": [
                    d.model_copy(update={"message": redactor.text(d.message)})
                    for d in check.diagnostics
                ]
            }
        )
    if results:
        update["value"] = redactor.value(result.value)
        update["stdout"] = redactor.text(result.stdout)
        update["warnings"] = [redactor.text(w) for w in result.warnings]
    return result.model_copy(update=update)


class Session:
    """One agent conversation: its own tool capsule and its own module state."""

    def __init__(
        self,
        host: Host,
        session_id: str,
        supervisor: Supervisor,
        context: SessionContext | None = None,
        metadata: Mapping[str, Any] | None = None,
        log: SessionLog | None = None,
    ) -> None:
        self._host = host
        self.id = session_id
        self.supervisor = supervisor
        self.context = context
        """Serves the requests of the tool contexts of this session's calls."""
        self.metadata: Mapping[str, Any] = MappingProxyType(dict(metadata or {}))
        """Read-only values the app gave the session (tools see them as ``ctx.metadata``)."""
        self.log = log
        """The session's event log (``.agent/sessions/ID.jsonl``), if the host keeps them."""
        self.tools = _tree(self.call_as, host.discovery.tools, "app")
        """``tools.FILE.EXPORT[.MEMBER](...)``, called as the app."""
        self.code = CodeSandbox(
            kind=host.config.capsules.code,
            runtime=host.config.capsules.code_runtime,
            tools=host.discovery.tools,
            call=lambda name, args, kwargs: self.call_as("agent", name, args, kwargs),
            canonical=lambda name: host.mediator.lookup(name).name,
            limits=host.config.limits,
            events=host.events,
            session=session_id,
            task_group=host._tg,  # pyright: ignore[reportPrivateUsage]
            helper=lambda name, args, kwargs: helper_call(host.scope.catalog, name, args, kwargs),
            pool=host.sandbox_pool,
        )
        """The session's code sandbox, started by the first ``run_code``."""
        self._busy = 0
        """Calls, runs and resets in flight (a pending approval is inside its call)."""
        self._since = time.monotonic()
        """When the session last became idle (``[limits] session_idle`` counts from it;
        kept only while it is on, and from when it was turned on)."""
        self.released = False
        """Whether its capsules were stopped because it sat idle, and no call came since."""
        self._known: set[str] = set()
        """Names earlier runs bound (the check does not call them unknown)."""

    def __repr__(self) -> str:
        return f"<Session {self.id} {self.supervisor!r}>"

    def _leave(self) -> None:
        self._busy -= 1
        if self._busy:
            return
        self._host._settled()  # pyright: ignore[reportPrivateUsage]
        if self._host.session_idle is not None:
            self._since = time.monotonic()
            self._host._went_idle(self)  # pyright: ignore[reportPrivateUsage]

    @property
    def running(self) -> bool:
        """Whether any of its capsules (tools, code sandbox) is running now."""
        return self.supervisor.running or self.code.running

    async def call(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Call a tool by its name (``"add"``, ``"kanban.add"``), as the app."""
        return await self.call_as("app", name, args, kwargs)

    async def call_as(
        self, caller: Caller, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        """Call a tool as ``caller`` (``agent``, ``script``, ``app`` or ``tool``)."""
        self._busy += 1
        self.released = False
        try:
            return await self._host.mediator.call(
                self.supervisor, self.id, name, args, kwargs, caller
            )
        finally:
            self._leave()

    async def run_code(
        self,
        source: str,
        *,
        modules: Mapping[str, str] | None = None,
        globals: Mapping[str, Any] | None = None,
        execute: Mapping[str, Any] | None = None,
        memory_limit: int | str | None = None,
        filename: str | None = None,
        check: Literal["warn", "refuse", "off"] | None = None,
    ) -> CodeResult:
        """Run agent code in this session's sandbox; its tool calls are made as ``agent``.

        Variables and imports persist between runs; failures are in the result. The
        result goes back to the agent: the values of ``[env] secret`` variables are
        replaced in its error always, and in its value and output as ``[env]
        redact_results`` says.

        Options (docs/code-mode.md, "Code mode"): ``modules`` (``{"helpers.py": source}``,
        importable by the code, in the sandbox only), ``globals`` (plain data bound as
        globals), ``execute`` (``{"fn", "args", "kwargs"}``: the code's function to call
        once it has loaded; its value is the run's), ``memory_limit`` (bytes or
        ``"64MiB"``, at most ``[limits] code_memory``), ``filename`` (what tracebacks
        show) and ``check`` (``warn``, ``refuse`` or ``off``: overrides ``[limits]
        code_check`` for this run). A bad option fails the run (``invalid_arguments``)
        before anything runs.
        """
        limits = self._host.config.limits
        options = read_options(
            modules=modules,
            globals=globals,
            execute=execute,
            memory_limit=memory_limit,
            filename=filename,
            limits=limits,
            tool_names=self._host.tool_globals,
        )
        mode: Any = limits.code_check if check is None else check
        if mode not in ("warn", "refuse", "off"):
            options = CodeError(
                kind="invalid_arguments",
                type="InvalidArguments",
                message=f"check must be 'warn', 'refuse' or 'off', not {mode!r}",
            )
        if isinstance(options, CodeError):
            return CodeResult(ok=False, error=options, sandbox=self.code.kind)
        tracing = self._host.mediator.tracing
        self._busy += 1
        self.released = False
        try:
            if tracing is None:
                result = await self._checked_run(source, options, mode)
            else:
                with tracing.run_code(self.id):
                    result = await self._checked_run(source, options, mode)
        finally:
            self._leave()
        mediator = self._host.mediator
        redactor = mediator.redactor_for(self.id)
        if not redactor:
            return result
        return _redacted(result, redactor, mediator.redacts_results("agent", session=self.id))

    async def _checked_run(
        self, source: str, options: RunOptions, mode: Literal["warn", "refuse", "off"]
    ) -> CodeResult:
        """The check (unless ``off``), then the run (unless refused)."""
        if not isinstance(source, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError("run_code takes the source code as a str")
        refused = self.code.refusal(source, options)
        if refused is not None:  # it cannot be sent: neither checked nor run
            return CodeResult(ok=False, error=refused, sandbox=self.code.kind)
        checked: list[CodeCheck] = []
        known = set(self._known)
        known.update(options.globals or ())
        modules = {name[:-3] for name in options.modules or ()}

        async def check(how: Literal["warn", "refuse"]) -> None:
            checked.append(
                await self._host.checker.check(
                    source, mode=how, known=known, modules=modules, session=self.id
                )
            )

        tree = parse(source)  # once: the quick checks and bound_names read it
        quick = (
            self._host.checker.quick(tree, known=known, modules=modules) if mode != "off" else []
        )
        if mode == "refuse":  # the full check, so a refusal says all that is wrong
            self.code.warm()  # a sandbox boots while the code is checked
            await check(mode)
            checked[0] = merged(checked[0], quick)
            if checked[0].status != "clean":
                return CodeResult(
                    ok=False, error=refusal(checked[0]), check=checked[0], sandbox=self.code.kind
                )
            result = await self.code.run(source, options)
        elif mode == "warn":
            # The quick checks ride along with every run; the full type check is paid
            # for only where it helps: when the run failed, to explain why.
            result = await self.code.run(source, options)
            if result.ok:
                checked.append(
                    CodeCheck(
                        mode=mode,
                        status="errors" if quick else "clean",
                        diagnostics=quick,
                        level="quick",
                    )
                )
            else:
                await check(mode)
                checked[0] = merged(checked[0], quick)
        else:
            result = await self.code.run(source, options)
        if any(w.startswith(LOST) for w in result.warnings) or (
            result.error is not None and LOST in result.error.message
        ):
            self._known.clear()  # the sandbox was replaced: its variables are gone
        self._known.update(bound_names(tree))  # a failed run may have bound some
        self._known.update(options.globals or ())
        if checked:
            result = result.model_copy(update={"check": checked[0]})
        return result

    async def reset_code(self) -> None:
        """Start the code sandbox afresh: the next run has no variables or imports."""
        self._busy += 1
        try:
            self._known.clear()
            await self.code.reset()
        finally:
            self._leave()

    def globals_for(self, caller: Caller, *, call: CallAs | None = None) -> dict[str, Any]:
        """The globals a script or agent code sees: ``tools`` and every installed export.

        ``call`` replaces :meth:`call_as` for them (to record the calls, say).
        """
        tree = _tree(call or self.call_as, self._host.discovery.tools, caller)
        scope: dict[str, Any] = {"tools": tree}
        for spec in self._host.discovery.tools.values():
            if spec.installed:
                scope[spec.export] = getattr(getattr(tree, spec.file), spec.export)
        return scope

    @property
    def failed_files(self) -> Mapping[str, str]:
        """Tool files that failed to load in this session's capsule, with the reason."""
        redact = self._host.mediator.redact
        return {file: redact(reason) for file, reason in self.supervisor.failed_files.items()}


class Host:
    """A tool host over one project. Use ``async with Host.open(project) as host``."""

    def __init__(
        self,
        project: Project,
        discovery: Discovery,
        config: PolicyConfig,
        factory: TransportFactory,
        task_group: anyio.abc.TaskGroup,
        *,
        store: Store,
        approver: Approver,
        watch_policy: bool = True,
        scope: Scope,
        session_logs: bool = False,
    ) -> None:
        self.project = project
        self.discovery = discovery
        self.scope = scope
        """The declarations: ``scope.render_model()`` is what the model is told it can call."""
        self.config = config
        self.events = EventBus(redactor=Redactor(config.env.secret_values(os.environ)))
        """Every event, with the values of ``[env] secret`` variables replaced."""
        self.host_id = uuid.uuid4().hex[:12]
        """This host's id in the audit trail (each call id starts with it)."""
        self.store = store
        """The state database: audit trail, grants, pending approvals."""
        if isinstance(store, JournaledStore):
            store.on_tamper = self._tampered
        self.policy = PolicySource(
            config,
            files=(lambda: project.policy_files) if watch_policy else None,
            root=project.root,
            on_change=self._policy_changed,
        )
        """The policy in force; editing a policy file swaps it for the next calls."""
        self.mediator = Mediator(
            discovery,
            config,
            policy=self.policy,
            store=store,
            approver=approver,
            events=self.events,
            host_id=self.host_id,
            scope=scope,
        )
        self.mediator.hooks.attach(task_group)
        self._factory = factory
        self._tg = task_group
        self._session_logs = session_logs
        self._sessions: set[Session] = set()
        self._default: Session | None = None
        self.custom_capsules = False
        """Whether the app gave the transport factory (``Host.open(capsule=...)``)."""
        self._idle_after: float | None = config.limits.session_idle
        self._idle_pinned = False
        """Whether ``Host.open(limits=...)`` set ``session_idle`` (a reload keeps it)."""
        self._idle_wake = anyio.Event()
        self._idle_due: float | None = None
        """When the idle watch wakes next (``None``: only when woken)."""
        self._watch_policy = watch_policy
        self.egress: EgressProxy | None = None
        """The egress proxy, when ``[capsules] network`` names hosts."""
        self.capsule_pool: CapsulePool | None = None
        """One tool capsule process started ahead (hardened, confined, waiting for its
        tool files) for the next session's capsule, once the host has more sessions than
        its default one; with the default capsules only (:class:`CapsulePool`).
        ``TOOLHOST_CAPSULE_POOL=0`` turns it off."""
        self.sandbox_pool: SandboxPool | None = None
        """One code sandbox booted ahead for the next session's first ``run_code``, once
        code mode is in use and the host has more sessions than its default one
        (:class:`SandboxPool`). ``TOOLHOST_SANDBOX_POOL=0`` turns it off."""
        if os.environ.get("TOOLHOST_SANDBOX_POOL") != "0":
            maker = CodeSandbox(
                kind=config.capsules.code,
                runtime=config.capsules.code_runtime,
                tools=discovery.tools,
                call=_no_calls,
                canonical=lambda name: name,
                limits=config.limits,
                events=self.events,
                session="sandbox-pool",
                task_group=task_group,
                quiet=True,
            )
            self.sandbox_pool = SandboxPool(maker)
        self.checker = CodeChecker(
            scope,
            task_group=task_group,
            timeout=config.limits.code_check_timeout,
            memory=config.limits.code_check_memory,
            tools=discovery.tools.values(),
        )
        """Checks agent code against the declarations before it runs (one pyright
        language server, started on the first check)."""

    @property
    def tool_globals(self) -> frozenset[str]:
        """The names agent code sees as tools: ``tools`` and each installed export."""
        names = {"tools"}
        names.update(spec.export for spec in self.discovery.tools.values() if spec.installed)
        return frozenset(names)

    def __repr__(self) -> str:
        tools, sessions = len(self.discovery.tools), len(self._sessions)
        return f"<Host {self.project.root} tools={tools} sessions={sessions}>"

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        project: str | os.PathLike[str] = "agent_src",
        *,
        policy: PolicyConfig | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        capsule: TransportFactory | None = None,
        approver: Approver | Literal["inbox"] | None = None,
        store: Store | str | None = None,
        session: str | None = None,
        session_logs: bool = False,
        tracer_provider: Any = None,
        trace_content: bool = False,
    ) -> AsyncGenerator[Host]:
        """Discover the tools, read the policy, start the default session's capsule.

        Args:
            project: the project folder (holding ``tools/`` or ``src/tools/``).
            policy: a parsed policy to use instead of the project's policy files.
            limits: overrides for ``[limits]`` (a ``Limits`` or a mapping of its fields).
            capsule: a transport factory (default: subprocess capsules); see
                ``host.testing.in_process`` for the in-process twin.
            approver: who answers escalations: an async callable
                ``(ApprovalRequest) -> Approval | bool`` or an object with such a
                ``decide`` method (default: the terminal approver when stdin is a
                terminal, else deny-all); ``"inbox"``: the approval inbox answers
                (an ``InboxApprover`` over this host's store).
            store: the state database, or a ``postgresql://`` URL (a database several
                hosts share); default: ``$TOOLHOST_STORE``, else the policy's ``[store]
                url``, else ``SQLiteStore`` at ``PROJECT/.agent/state.db``. The host opens
                and closes it.
            session: the default session's id (letters, digits, ``_``, ``-``; at most
                64): give the id of an earlier session to find its key-value store and
                files again. Default: a new random id.
            session_logs: write each session's events (redacted) to
                ``PROJECT/.agent/sessions/ID.jsonl`` (off by default: it costs about
                15 us of CPU per call, see benchmarks/README.md).
            tracer_provider: an OpenTelemetry ``TracerProvider`` for spans per call
                (default: the global one, if the app set one; else no tracing).
            trace_content: record arguments and results (redacted) on the spans.

        Raises:
            DeclarationError: a tool file cannot be read or its names clash.
            PolicyFileError: a policy file is malformed.
        """
        resolved = resolve_project(Path(project))
        discovery = discover(resolved.tools_dir)
        project_hooks = load_hook_files(resolved.tools_dir.parent / "hooks")
        rejected: list[str] = []
        scope = await anyio.to_thread.run_sync(
            functools.partial(load_or_build_scope, discovery, on_reject=rejected.append)
        )
        config = (
            policy if policy is not None else load_policy(resolved.policy_files, root=resolved.root)
        )
        python = config.capsules.interpreter(resolved.root)
        if python is not None and capsule is None:
            await _check_python(python, config)
        overrides: dict[str, Any] = {}
        if limits is not None:
            overrides = (
                limits.model_dump(exclude_unset=True)
                if isinstance(limits, Limits)
                else dict(limits)
            )
            merged = config.limits.model_dump() | overrides
            config = config.model_copy(update={"limits": _limits(merged)})
        if store is None or isinstance(store, str):
            try:
                url = store if store is not None else config.store.resolve(os.environ)
                store = store_for(
                    url,
                    resolved.state_dir,
                    durability=config.audit.durability,
                    stale_after=config.store.stale_after,
                )
            except (ValueError, StoreUnavailable) as exc:
                raise HostError(f"the host cannot start: {exc}") from None
        if approver == "inbox":
            approver = InboxApprover(store)
        try:
            async with anyio.create_task_group() as tg:
                egress: EgressProxy | None = None
                if capsule is None and config.capsules.network_hosts():
                    egress = EgressProxy(config.capsules.network_hosts())
                    await egress.start(tg)
                pool = CapsulePool() if capsule is None and capsule_pool_wanted() else None
                host = cls(
                    resolved,
                    discovery,
                    config,
                    capsule
                    or tool_capsules(
                        config.capsules,
                        resolved.root,
                        egress_port=egress.port if egress is not None else None,
                        pool=pool,
                    ),
                    tg,
                    store=store,
                    approver=approver if approver is not None else default_approver(),
                    watch_policy=policy is None,
                    scope=scope,
                    session_logs=session_logs,
                )
                host.mediator.hooks.set_files(project_hooks)
                host.custom_capsules = capsule is not None
                host.capsule_pool = pool
                if egress is not None:
                    egress.events = host.events
                    host.egress = egress
                host._idle_pinned = "session_idle" in overrides
                tg.start_soon(host._watch_idle)
                host.mediator.tracing = Tracing.open(
                    tracer_provider, redact=host.mediator.redact, content=trace_content
                )
                for reason in rejected:  # the scope cache: what it would not trust
                    host.events.emit("cache_rejected", None, cache="scopes", reason=reason)
                host._check_policy(config, from_files=policy is None)
                await host._open_store()
                if capsule is None:
                    host._say_containment()
                try:
                    host._default = await host._open_session(session)
                    yield host
                finally:
                    with anyio.CancelScope(shield=True):
                        await host._close()
                        await host.store.aclose()
                    tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The background tasks never raise: a group holds the caller's own exception.
            raise _single(group) from None

    async def _open_store(self) -> None:
        try:
            closed = await self.store.start(self.host_id)
        except StoreUnavailable as exc:
            raise HostError(f"the host cannot start: {exc}") from None
        if closed:  # started: unknown; waiting for an approval: denied (host_stopped)
            self.events.emit("audit_reconciled", None, closed=closed, closed_as_unknown=closed)

    def _tampered(self, what: str, detail: str) -> None:
        self.events.emit("audit_tampered", None, what=what, detail=detail)

    def _say_containment(self) -> None:
        """Once at start: what the kernel cannot hold subprocess capsules to (Landlock)."""
        if self.config.capsules.default == "wasm":
            return  # no tool runs in a subprocess capsule
        held = containment()
        warning = held.warning()
        if warning is not None:
            self.events.emit("landlock_unavailable", None, message=warning, **held.to_data())

    def _policy_changed(self, change: Policy | PolicyFileError) -> None:
        if isinstance(change, PolicyFileError):
            self.events.emit("policy_reload_failed", None, error=str(change))
        else:
            self.events.emit("policy_reloaded", None, policy_version=change.version)
            self._check_policy(change.config, from_files=True)
            if not self._idle_pinned:
                self._set_idle(change.config.limits.session_idle)

    def _check_policy(self, config: PolicyConfig, *, from_files: bool) -> None:
        """Say what a policy silently gets wrong: no file at all, or rules that match
        nothing (``policy_missing`` and ``policy_warning`` events; the CLI prints them)."""
        root = self.project.root
        if from_files and not config.files:
            defaults = config.defaults
            self.events.emit(
                "policy_missing",
                None,
                project=str(root),
                defaults={c: getattr(defaults, c) for c in ("agent", "tool", "script", "app")},
                message=missing_policy(root, defaults),
            )
        for warning in lint_policy(config, self.discovery.tools, root=root):
            self.events.emit("policy_warning", None, **warning.to_data())

    def _env(self) -> dict[str, str]:
        env_config = self.config.env
        passed = {name: os.environ[name] for name in env_config.pass_ if name in os.environ}
        passed.update(env_config.set)
        if self.egress is not None:  # the named hosts are reached through it
            passed.update(proxy_env(self.egress.port))
        return minimal_env(passed)

    def _session_id(self, session_id: str | None) -> str:
        if session_id is None:
            return uuid.uuid4().hex[:12]
        if type(session_id) is not str or not _SESSION_ID.fullmatch(session_id):  # pyright: ignore[reportUnnecessaryComparison]
            raise HostError(f"session id {session_id!r}: use 1 to 64 letters, digits, '_' or '-'")
        if any(s.id == session_id for s in self._sessions):
            raise HostError(f"session {session_id} is already open in this host")
        return session_id

    @staticmethod
    def _metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
        if metadata is None:
            return {}
        try:
            plain = check_value("session", "metadata", dict(metadata))
        except HostError as exc:
            raise HostError(f"session metadata must be plain data: {exc}") from None
        size = len(encode(plain))
        if size > MAX_METADATA:
            raise HostError(
                f"session metadata takes {size} bytes encoded, over the limit of {MAX_METADATA}"
            )
        return plain

    async def _open_session(
        self, session_id: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> Session:
        session_id = self._session_id(session_id)
        values = self._metadata(metadata)
        context = SessionContext(self.mediator, self.events, session_id)
        limits = self.config.limits
        files = [f.module for f in self.discovery.files if not f.private]
        supervisor = Supervisor(
            discovery=self.discovery,
            files=files,
            tools=self.discovery.tools,
            factory=self._factory,
            events=self.events,
            task_group=self._tg,
            session=session_id,
            cwd=str(self.project.root),
            env=self._env(),
            load_timeout=limits.load_timeout,
            max_frame=limits.max_frame,
            max_restarts=limits.max_restarts,
            restart_window=limits.restart_window,
            unavailable_for=limits.unavailable_for,
            max_attachment=limits.max_attachment_size,
            context=context,
            metadata=values,
        )
        log = (
            SessionLog(
                self.events,
                session_id,
                self.project.state_dir / "sessions" / f"{session_id}.jsonl",
                self.mediator.json_redact,
            )
            if self._session_logs
            else None
        )
        context.supervisor = supervisor
        session = Session(self, session_id, supervisor, context, values, log)
        self._sessions.add(session)
        session._busy += 1  # pyright: ignore[reportPrivateUsage]
        try:
            await supervisor.ensure()
        except Exception as exc:  # the capsule cannot start: calls will say why
            self.events.emit("capsule_unavailable", session_id, reason=str(exc))
        finally:
            session._leave()  # pyright: ignore[reportPrivateUsage]
        return session

    # -- idle sessions ([limits] session_idle) -----------------------------------------

    @property
    def session_idle(self) -> float | None:
        """``[limits] session_idle`` in force, in seconds (``None``: sessions are never
        stopped for being idle). A policy reload that changes it takes effect at once."""
        return self._idle_after

    def _set_idle(self, idle: float | None) -> None:
        if idle == self._idle_after:
            return
        if self._idle_after is None:  # turned on: idle periods count from now
            now = time.monotonic()
            for session in self._sessions:
                session._since = now  # pyright: ignore[reportPrivateUsage]
        self._idle_after = idle
        self._idle_wake.set()

    def _settled(self) -> None:
        """A session has nothing in flight any more: a pool waiting to start its next
        spare may start it now (``capsules/_refill.py``)."""
        if self.capsule_pool is not None:
            self.capsule_pool.refill.settle()
        if self.sandbox_pool is not None:
            self.sandbox_pool.refill.settle()

    def _went_idle(self, session: Session) -> None:
        """``session`` has nothing in flight any more: wake the watch if it would
        otherwise look later than this session's deadline."""
        idle = self._idle_after
        if idle is None:
            return
        due = self._idle_due
        if due is None or session._since + idle < due:  # pyright: ignore[reportPrivateUsage]
            self._idle_wake.set()

    async def _watch_idle(self) -> None:
        """The one task per host that stops the capsules of sessions idle for
        ``session_idle``: it sleeps until the earliest deadline, or until woken (a session
        became idle with no deadline ahead of it, or the setting changed)."""
        while True:
            wake = self._idle_wake = anyio.Event()
            due = self._release_idle()
            self._idle_due = due
            delay = math.inf if due is None else max(0.0, due - time.monotonic())
            if self._watch_policy and any(s.running for s in self._sessions):
                delay = min(delay, POLICY_LOOK)
            with anyio.move_on_after(delay):
                await wake.wait()
            if self._watch_policy and not wake.is_set():
                # An edit of session_idle, if any, is applied; a broken file is said by a
                # policy_reload_failed event, and calls are refused meanwhile.
                with contextlib.suppress(PolicyFileError):
                    await self.policy.latest()  # parsed in a worker thread, if it changed

    def _release_idle(self) -> float | None:
        """Stop the capsules of every session idle for ``session_idle``; the earliest
        deadline of the others still running. Synchronous, so no call can start in a
        session between the look at it and the stop."""
        idle = self._idle_after
        if idle is None:
            return None
        now = time.monotonic()
        due: float | None = None
        for session in list(self._sessions):
            if session._busy or not session.running:  # pyright: ignore[reportPrivateUsage]
                continue
            at = session._since + idle  # pyright: ignore[reportPrivateUsage]
            if at > now:
                due = at if due is None else min(due, at)
                continue
            try:
                self._release(session, idle)
            except Exception:  # a host bug: the session keeps its capsules, the host serves
                logger.exception("releasing the idle session %s failed", session.id)
        return due

    def _release(self, session: Session, idle: float) -> None:
        reason = f"the session was idle for {idle:g} s and its capsules were stopped"
        stopped = [
            what
            for what, done in (
                ("tools", session.supervisor.release(reason)),
                ("code", session.code.release(reason)),
            )
            if done
        ]
        if not stopped:
            return
        session.released = True
        lost = " and agent code variables" if "code" in stopped else ""
        self.events.emit(
            "session_released",
            session.id,
            idle=idle,
            capsules=stopped,
            state_lost=True,
            message=f"{reason} to free memory: module state{lost} released (the key-value "
            "store stays); the next call starts them again",
        )

    # -- figures -------------------------------------------------------------------------

    async def stats(self) -> HostStats:
        """What this host holds and does now: sessions, live capsules by kind, memory
        (the host and every process below it), calls, approvals pending.

        Memory is read from ``/proc`` in a worker thread: a few milliseconds per process
        (``smaps_rollup`` walks every mapping), so call it for a dashboard, not per call.
        """
        sessions = list(self._sessions)
        kinds = self._tool_kinds()
        counts: dict[str, int] = dict.fromkeys(("subprocess", "wasm", "other", "code"), 0)
        for session in sessions:
            if session.supervisor.running:
                for kind in kinds:
                    counts[kind] += 1
            if session.code.running:
                counts["code"] += 1
        escalations = self.mediator.escalations
        pending = sum(escalations.open_requests(s.id) for s in sessions)
        memory = await anyio.to_thread.run_sync(process_memory)
        rate = self.mediator.rate
        return HostStats(
            sessions=len(sessions),
            idle_sessions=sum(1 for s in sessions if s.released and not s.running),
            capsules=CapsuleCounts(**counts),
            memory=memory,
            calls_total=rate.total,
            calls_per_second=rate.per_second(),
            approvals_pending=pending,
            session_idle=self._idle_after,
        )

    def _tool_kinds(self) -> tuple[str, ...]:
        """What one session's running tool capsule is made of (a Wasm part and a
        subprocess part when ``[capsules]`` splits the files)."""
        if self.custom_capsules:
            return ("other",)
        capsules = self.config.capsules
        files = [f.module for f in self.discovery.files if not f.private]
        kinds = {
            "wasm" if capsules.default == "wasm" or file in capsules.wasm else "subprocess"
            for file in files
        }
        return tuple(sorted(kinds)) or ("subprocess",)

    async def _close(self) -> None:
        if self.capsule_pool is not None:
            await self.capsule_pool.aclose()
        if self.sandbox_pool is not None:
            await self.sandbox_pool.aclose()
        sessions, self._sessions = list(self._sessions), set()
        for session in sessions:
            await session.code.aclose()
            await session.supervisor.aclose()
            if session.log is not None:
                session.log.close()
        await self.checker.aclose()
        self.events.close()
        self.policy.close()

    async def reload_tools(self) -> bool:
        """Read the tool files again and, if their declarations changed, serve the new ones.

        Every session's tool capsule and code sandbox are replaced: module state and the
        variables of agent code are lost (a ``tools_reloaded`` event, then
        ``capsule_started`` with ``state_lost``, say so). Returns whether anything changed.

        Raises:
            DeclarationError: the new tool files cannot be declared; the old ones stay.
        """
        discovery = discover(self.project.tools_dir)
        rejected: list[str] = []
        scope = await anyio.to_thread.run_sync(
            functools.partial(load_or_build_scope, discovery, on_reject=rejected.append)
        )
        for reason in rejected:
            self.events.emit("cache_rejected", None, cache="scopes", reason=reason)
        if scope.key == self.scope.key and scope.tools == self.scope.tools:
            return False
        self.discovery = discovery
        self.scope = scope
        self.mediator.retool(discovery, scope)
        self.checker.retool(scope, discovery.tools.values())
        files = [f.module for f in discovery.files if not f.private]
        sessions = list(self._sessions)
        if self.sandbox_pool is not None:
            await self.sandbox_pool.retool(discovery.tools)
        for session in sessions:
            session.tools = _tree(session.call_as, discovery.tools, "app")
            await session.supervisor.retool(discovery, files, discovery.tools)
            await session.code.retool(discovery.tools)
            session._known.clear()  # pyright: ignore[reportPrivateUsage]  # variables lost
            self.events.emit(
                "tools_reloaded",
                session.id,
                tools=len(discovery.tools),
                state_lost=True,
                message="the tool files changed: the capsule was restarted and module "
                "state and agent code variables were lost",
            )
        for session in sessions:
            if session.released:
                continue  # stopped while idle: its next call starts the new tool files
            session._busy += 1  # pyright: ignore[reportPrivateUsage]
            try:
                await session.supervisor.ensure()
            except Exception as exc:  # the capsule cannot start: calls will say why
                self.events.emit("capsule_unavailable", session.id, reason=str(exc))
            finally:
                session._leave()  # pyright: ignore[reportPrivateUsage]
        self._check_policy(self.policy.policy.config, from_files=False)  # new tool names
        return True

    @property
    def default_session(self) -> Session:
        if self._default is None:
            raise HostError("the host is not open")
        return self._default

    @property
    def tools(self) -> Namespace:
        """The default session's ``tools.FILE.EXPORT[.MEMBER]`` tree."""
        return self.default_session.tools

    async def call(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Call a tool by name in the default session, as the app."""
        return await self.default_session.call_as("app", name, args, kwargs)

    async def run_code(
        self,
        source: str,
        *,
        modules: Mapping[str, str] | None = None,
        globals: Mapping[str, Any] | None = None,
        execute: Mapping[str, Any] | None = None,
        memory_limit: int | str | None = None,
        filename: str | None = None,
        check: Literal["warn", "refuse", "off"] | None = None,
    ) -> CodeResult:
        """Run agent code in the default session's sandbox (see ``Session.run_code``)."""
        return await self.default_session.run_code(
            source,
            modules=modules,
            globals=globals,
            execute=execute,
            memory_limit=memory_limit,
            filename=filename,
            check=check,
        )

    async def reset_code(self) -> None:
        """Start the default session's code sandbox afresh."""
        await self.default_session.reset_code()

    @asynccontextmanager
    async def session(
        self, id: str | None = None, *, metadata: Mapping[str, Any] | None = None
    ) -> AsyncGenerator[Session]:
        """A new isolated session with its own capsule, closed on exit.

        Args:
            id: the session's id (letters, digits, ``_``, ``-``; at most 64). Give the id
                of an earlier session to find its key-value store and files again (also
                after a host restart); default: a new random id.
            metadata: read-only plain data for the session's tools (``ctx.metadata``), at
                most 64 KiB encoded: who the user is, what the conversation is about.
        """
        session = await self._open_session(id, metadata)
        if self.capsule_pool is not None:
            self.capsule_pool.more_sessions()
        if self.sandbox_pool is not None:
            self.sandbox_pool.more_sessions()
        try:
            yield session
        finally:
            self._sessions.discard(session)
            if not self._sessions - {self._default}:  # the last one besides the default
                if self.capsule_pool is not None:
                    self.capsule_pool.no_more_sessions()
                if self.sandbox_pool is not None:
                    self.sandbox_pool.no_more_sessions()
            with anyio.CancelScope(shield=True):
                try:
                    await session.code.aclose()
                    await session.supervisor.aclose()
                finally:  # after its capsules' last output, which its secrets still cover
                    self.mediator.forget_session(session.id)
                    self.checker.forget(session.id)
            if session.log is not None:
                session.log.close()

    @property
    def hooks(self) -> HookRunner:
        """The hooks in force (``hooks.hooks`` lists them in the order they run)."""
        return self.mediator.hooks

    def hook(
        self,
        fn: HookFn,
        kind: HookKind | None = None,
        *,
        id: str | None = None,
    ) -> Callable[[], None]:
        """Register ``fn`` as a hook (after the project's ``hooks/*.py``); returns a function
        that removes it. ``kind`` may be left out for a function marked with ``@hook``.

        Raises:
            HostError: an unknown kind, or an id another hook has.
        """
        registered: Hook = app_hook(fn, kind, id)
        return self.mediator.hooks.add(registered)

    def on(self, kind: str, listener: Callable[[Any], None]) -> Callable[[], None]:
        """Call ``listener(event)`` for every event of ``kind`` (``"*"`` for all)."""

        def filtered(event: Any) -> None:
            if kind == "*" or event.kind == kind:
                listener(event)

        return self.events.subscribe(filtered)
