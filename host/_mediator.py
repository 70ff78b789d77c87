"""The gate every call passes (ARCHITECTURE.md, "The path of one call").

bind -> validate -> decide -> escalate -> audit -> dispatch -> audit the outcome.

A call a tool makes through its context is just another call here, with caller ``tool``
and the :class:`CallFrame` of the call that made it (``parent``): it is refused if that
tool's ``uses`` does not list it, if the chain is already :data:`MAX_CHAIN` tools deep or
already holds the tool, and decided for caller ``tool`` and for the caller at the top of
the chain (the stricter decision wins); its audit record carries the chain.

The mediator resolves the tool name exactly (never fuzzily), binds and checks the
arguments against the signature, freezes them as canonical bytes, asks the policy in
force for a decision (one version per call), takes the call's place in its quotas,
escalates to the approver if policy says so, writes the decision to the audit trail
durably, and only then dispatches those same bytes to the session's capsule; the outcome
is audited after. A call refused anywhere before dispatch never reaches a capsule and
gets one terminal audit record. If the audit cannot be written, the call is refused
(fail closed).

What leaves the gate is redacted: every error it raises has the values of ``[env] secret``
variables replaced by ``⟨secret NAME⟩`` (for every caller), and so does every result for
the callers ``[env] redact_results`` names (``agent`` by default: agent code and MCP
clients), read from the policy version the call was decided against.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from hashlib import sha256
from typing import TYPE_CHECKING, Any, Final

import anyio

from capsule.context import Attachment, Result

from ._binding import BoundCall, bind
from ._display import Redactor, escape_text, summarize_arguments
from ._events import EventBus
from ._stats import CallRate
from ._tracing import Tracing
from .audit import DONE, AuditRecord, Outcome, Store, StoreFull, StoreUnavailable
from .declare import ArgumentValidator, Discovery, Scope, ToolSpec
from .errors import (
    CallError,
    HostError,
    InvalidArguments,
    LimitExceeded,
    NotApproved,
    PolicyDenied,
    PolicyFileError,
    UnknownTool,
)
from .hooks import HookContext, HookRunner, ToolResult, progress_arguments
from .policy import (
    Approver,
    Decision,
    Escalation,
    Escalations,
    Policy,
    PolicyConfig,
    PolicySource,
    Quotas,
    Reservation,
    Ticket,
    policy_arguments,
)
from .settings import Caller

if TYPE_CHECKING:
    from .capsules import Supervisor

__all__ = ["Caller", "CallFrame", "Decision", "Mediator", "MAX_CHAIN"]

_ERROR_TEXT = 500
"""Characters of an error message kept in the audit (after redaction)."""

MAX_CHAIN: Final = 8
"""Most tools a chain of nested calls may hold above a call (``ctx.call`` depth)."""

_FILES: Final[tuple[type, ...]] = (Result, Attachment)
_STRICTNESS: Final = {"allow": 0, "escalate": 1, "deny": 2}


@dataclass(frozen=True, slots=True)
class CallFrame:
    """A call in flight to a tool that takes a context: the host's own record of it.

    Context requests of that call are answered from this, never from what the capsule
    says; a nested call is made with this as its parent.
    """

    number: int
    """The call's id on the wire."""
    call_id: str
    """Its id in the audit trail."""
    session: str
    tool: str
    caller: Caller
    chain: tuple[str, ...]
    """The callers above the call, outermost first: the caller that started it all, then
    each tool that made the next call."""
    uses: tuple[str, ...] | None
    """The tools this one may call (its ``__uses__``); None: any, as policy decides."""
    root: Caller
    """The caller that started the chain (``chain[0]``)."""

    def info(self) -> dict[str, Any]:
        """What the capsule builds the call's ``ToolContext`` from."""
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "session": self.session,
            "caller": self.caller,
            "chain": list(self.chain),
        }


def _stricter(mine: Decision, root: Decision, caller: str) -> Decision:
    """The stricter of a nested call's decision for caller ``tool`` and for the caller at
    the top of its chain (deny > escalate > allow; on a tie, the one for ``tool``)."""
    if _STRICTNESS[root.decision] <= _STRICTNESS[mine.decision]:
        return mine
    reason = f"decided for the original caller {caller}" + (
        f": {root.reason}" if root.reason else ""
    )
    return Decision(
        decision=root.decision,
        rule=root.rule,
        reason=reason,
        policy_version=root.policy_version,
        matched=root.matched,
        approvers=root.approvers,
    )


def _shown_name(name: object) -> str:
    """A requested tool name as the audit may store it: escaped and bounded."""
    if type(name) is not str:
        return f"<{type(name).__name__}>"
    return escape_text(name[:200]) + ("…" if len(name) > 200 else "")


class Mediator:
    """Resolves, binds, decides and dispatches calls for every session of a host."""

    def __init__(
        self,
        discovery: Discovery,
        config: PolicyConfig,
        *,
        policy: PolicySource,
        store: Store,
        approver: Approver,
        events: EventBus,
        host_id: str,
        scope: Scope | None = None,
    ) -> None:
        self._discovery = discovery
        self._config = config
        self._ids = itertools.count(1)
        names: dict[str, ToolSpec] = {}
        for spec in discovery.tools.values():
            names[spec.name] = spec
            names[spec.qualified] = spec
        self._names = names
        self.policy = policy
        """The policy in force (re-read when its files change)."""
        self.store = store
        self.events = events
        self.host_id = host_id
        self._validator = ArgumentValidator(scope) if scope is not None else None
        """Checks bound arguments against each tool's input schema (compiled once per tool)."""
        self._scope = scope
        self._tool_digests: dict[str, str] = {}
        self.quotas = Quotas()
        self.escalations = Escalations(approver, store, events, host_id)
        self._frames: dict[int, CallFrame] = {}
        """Calls in flight to tools that take a context, by wire id."""
        secrets = config.env.secret_values(os.environ)
        if secrets and not events.redactor:  # one redactor for the gate and the events
            events.redactor = Redactor(secrets)
        self._redactor = events.redactor
        """The host's secrets (``[env] secret``); a session whose tools set secrets has
        its own copy with them too (``redactor_for``), dropped when it closes."""
        self._json_redactor = Redactor(
            {name: json.dumps(value, ensure_ascii=False)[1:-1] for name, value in secrets.items()}
        )
        """Secrets as they appear inside a JSON string (the session logs)."""
        self.tracing: Tracing | None = None
        """Spans per call, when OpenTelemetry is configured (set by the host)."""
        self.hooks = HookRunner(events)
        """The hooks of this host, run around every call that runs."""
        self._progress = progress_arguments(discovery)
        self.rate = CallRate()
        """Every call counted as it comes (``host.stats()``)."""

    @property
    def config(self) -> PolicyConfig:
        """The policy the host started with (``[limits]``, ``[env]``, ``[capsules]``)."""
        return self._config

    def retool(self, discovery: Discovery, scope: Scope | None) -> None:
        """Serve the tools of a new discovery (the tool files changed): names, schemas."""
        names: dict[str, ToolSpec] = {}
        for spec in discovery.tools.values():
            names[spec.name] = spec
            names[spec.qualified] = spec
        self._discovery = discovery
        self._names = names
        self._validator = ArgumentValidator(scope) if scope is not None else None
        self._scope = scope
        self._tool_digests = {}
        self._progress = progress_arguments(discovery)

    def redact(self, text: str, session: str | None = None) -> str:
        """``text`` with the values of ``[env] secret`` variables replaced (and, given a
        session, of the secrets its tools set)."""
        return self.events.redactor_for(session).text(text)

    @property
    def redactor(self) -> Redactor:
        """Replaces the values of ``[env] secret`` variables (by ``⟨secret NAME⟩``)."""
        return self._redactor

    def redactor_for(self, session: str | None) -> Redactor:
        """Replaces the host's secrets and those the tools of ``session`` set (by
        ``⟨secret NAME⟩``); never another session's."""
        return self.events.redactor_for(session)

    def redacts_results(
        self, caller: Caller, policy: Policy | None = None, session: str | None = None
    ) -> bool:
        """Whether results for ``caller`` (in ``session``) are redacted (``[env]
        redact_results`` of ``policy``, by default the one in force)."""
        if not self.events.redactor_for(session):
            return False
        if policy is None:
            try:
                policy = self.policy.settled()
            except PolicyFileError:
                return True  # no policy in force: redact, the safe side
        mode = policy.config.env.redact_results
        return mode == "all" or (mode == "agent" and caller == "agent")

    def _redact_error(self, exc: HostError, redactor: Redactor) -> None:
        """Replace secrets in the error's message and fields, in place (and in the host
        errors it was raised from), before it leaves the gate toward any caller."""
        redact = redactor.text
        current: BaseException | None = exc
        for _ in range(8):  # a chain is short; a loop in it ends here
            if current is None:
                break
            if isinstance(current, HostError):
                fields = vars(current)
                for name, value in list(fields.items()):
                    if type(value) is str:
                        fields[name] = redact(value)
                current.args = tuple(redact(a) if type(a) is str else a for a in current.args)
            current = current.__cause__ or current.__context__

    def add_secret(self, session: str, name: str, value: str, *, limit: int) -> bool:
        """Redact ``value`` in all that concerns ``session`` (a secret one of its tools set
        through its context) until it closes: its audit records, errors, results, events
        and approval requests. Other sessions' views are not touched. False, and nothing
        added, once the session's tools set ``limit`` secret values."""
        return self.events.add_secret(session, name, value, limit=limit)

    def frame(self, number: int) -> CallFrame | None:
        """The call in flight with this wire id, if it is one to a tool with a context."""
        return self._frames.get(number)

    @property
    def json_redact(self) -> Callable[[str], str] | None:
        """Replaces secrets in JSON text (as JSON escapes them); ``None`` without secrets."""
        return self._json_redactor.text if self._json_redactor else None

    def forget_session(self, session: str) -> None:
        """Drop a closed session's quotas, remembered answers and tool-set secrets."""
        self.quotas.forget_session(session)
        self.escalations.forget_session(session)
        self.events.forget_session(session)

    def _tool_digest(self, tool: str) -> str | None:
        """A digest of the tool's declaration: its parameters, return type and schemas
        (what a grant is given for; computed at the first escalation of each scope)."""
        scope = self._scope
        if not self._tool_digests and scope is not None:
            schemas = scope.schemas()
            for decl in scope.tools:
                text = json.dumps(
                    {
                        "params": [[p.name, p.kind, p.type, p.default] for p in decl.params],
                        "returns": decl.returns,
                        "schemas": schemas.get(decl.name),
                    },
                    sort_keys=True,
                    default=str,
                )
                self._tool_digests[decl.name] = hashlib.sha256(text.encode()).hexdigest()[:32]
        return self._tool_digests.get(tool)

    def _description(self, tool: str) -> str | None:
        """The first paragraph of a tool's docstring, for the person asked about a call."""
        spec = self._names.get(tool)
        text = (spec.docstring or "").strip() if spec is not None else ""
        first = text.split("\n\n", 1)[0].strip()
        return first[:500] or None

    def lookup(self, name: str) -> ToolSpec:
        """The tool with exactly this name (or ``tools.FILE.EXPORT`` path)."""
        spec = self._names.get(name) if type(name) is str else None
        if spec is None:
            raise UnknownTool(name if isinstance(name, str) else repr(name))  # pyright: ignore[reportUnnecessaryIsInstance]
        return spec

    def bind(self, spec: ToolSpec, args: Sequence[Any], kwargs: Mapping[str, Any]) -> BoundCall:
        bound = bind(spec, args, kwargs)
        limit = self._config.limits.max_argument_size
        if len(bound.encoded) > limit:
            raise InvalidArguments(
                spec.name,
                f"the arguments take {len(bound.encoded)} bytes encoded, over the limit of "
                f"{limit} ([limits] max_argument_size); pass a reference instead of the data",
            )
        if self._validator is not None:  # the declared types, before policy sees the call
            self._validator.check(spec.name, bound.arguments)
        return bound

    def decide(self, spec: ToolSpec, bound: BoundCall, caller: Caller, policy: Policy) -> Decision:
        """The policy decision for one bound call (pure: see ``host.decide``)."""
        arguments, unknown = policy_arguments(spec, bound)
        return policy.decide(spec.name, arguments, caller, unknown=unknown)

    async def call(
        self,
        supervisor: Supervisor,
        session: str,
        name: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        caller: Caller,
        parent: CallFrame | None = None,
    ) -> Any:
        """One mediated call, from name to value.

        ``parent``: for a call a tool made through its context (caller ``tool``), the
        frame of the call that made it.
        """
        self.rate.tick()
        try:
            return await self._call(supervisor, session, name, args, kwargs, caller, parent)
        except HostError as exc:
            redactor = self.events.redactor_for(session)
            if redactor:
                self._redact_error(exc, redactor)
            raise

    async def _call(
        self,
        supervisor: Supervisor,
        session: str,
        name: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        caller: Caller,
        parent: CallFrame | None = None,
    ) -> Any:
        number = next(self._ids)
        call_id = f"{self.host_id}.{number}"
        started = time.time()
        policy_version: str | None = None
        tool: str | None = None
        chain: tuple[str, ...] = (caller,)
        chain_text: str | None = None
        root = caller
        if parent is not None:
            caller, root = "tool", parent.root
            chain = (*parent.chain, parent.tool)
            chain_text = f"{' > '.join(chain)} ({parent.call_id})"
        try:
            policy = await self.policy.latest()  # one version for the whole call
            policy_version = policy.version
            spec = self.lookup(name)
            tool = spec.name
            if parent is not None:
                _check_nested(parent, chain, spec)
            bound = self.bind(spec, args, kwargs)
        except HostError as exc:  # unknown tool, invalid or huge arguments, broken policy
            shown = tool if tool is not None else _shown_name(name)
            record = AuditRecord(
                call_id,
                self.host_id,
                started,
                session,
                caller,
                shown,
                "started",
                policy_version,
                chain=chain_text,
            )
            await self._refused(record, exc)
            raise
        decision = self.decide(spec, bound, caller, policy)
        redactor = self.events.redactor_for(session)
        if parent is not None:
            decision = _stricter(decision, self.decide(spec, bound, root, policy), root)
        record = AuditRecord(
            call_id=call_id,
            host_id=self.host_id,
            started=started,
            session=session,
            caller=caller,
            tool=tool,
            outcome="started",
            policy_version=policy_version,
            decision=decision.decision,
            rule=decision.rule,
            args_sha256=sha256(bound.encoded).hexdigest(),
            args_size=len(bound.encoded),
            args_summary=summarize_arguments(bound.arguments, redactor=redactor),
            chain=chain_text,
        )
        nested = {} if parent is None else {"chain": chain}  # only a nested call has one
        self.events.emit(
            "policy_decision",
            session,
            call_id=call_id,
            tool=tool,
            caller=caller,
            decision=decision.decision,
            rule=decision.rule,
            policy_version=policy_version,
            **nested,
        )
        if self.tracing is not None:
            self.tracing.event(
                "policy_decision",
                {"gen_ai.tool.name": tool, "decision": decision.decision, "rule": decision.rule},
            )
        above = chain if parent is not None else ()  # what hooks and events call the chain
        ticket = await self._admit(record, decision, policy, bound, above)
        if ticket is not None:  # the approval is spent here, on exactly these bytes
            try:
                ticket.redeem(call_id, session, tool, bound.encoded)
            except BaseException as exc:
                await self._finish(record, exc)
                raise
        frame: CallFrame | None = None
        if spec.context is not None:
            frame = CallFrame(number, call_id, session, tool, caller, chain, spec.uses, root)
            self._frames[number] = frame
        try:
            if self.tracing is None:
                value = await self._execute(supervisor, number, spec, bound, record, above, frame)
            else:
                with self.tracing.tool_span(
                    tool, call_id, caller, session, bound.arguments
                ) as span:
                    value = await self._execute(
                        supervisor, number, spec, bound, record, above, frame
                    )
                    self.tracing.result(span, value)
        finally:
            if frame is not None:
                del self._frames[number]
        if self.redacts_results(caller, policy, session):
            redactor = self.events.redactor_for(session)  # a tool may have set one since
            if isinstance(value, Result):  # the value is what is shown; files stay bytes
                files: Result[Any] = value  # pyright: ignore[reportUnknownVariableType]
                return Result(redactor.value(files.value), files.attachments)
            value = redactor.value(value)
        return value

    async def _keep_files(self, record: AuditRecord, value: Result[Any] | Attachment) -> None:
        """Keep the files of a result in the session's file area; set each one's path."""
        files = (value,) if isinstance(value, Attachment) else value.attachments
        try:
            kept = await self.store.save_files(
                record.session,
                record.call_id,
                [(f.name, f.mime_type, f.data, f.width, f.height) for f in files],
            )
        except (StoreUnavailable, StoreFull, OSError, ValueError) as exc:
            raise HostError(
                f"{record.tool} ran, but the files it returned could not be kept: "
                f"{self.redact(str(exc), record.session)}"
            ) from None
        for attachment, stored in zip(files, kept, strict=True):
            attachment.path = stored.path

    async def refuse_context(self, session: str, op: str, reason: str) -> None:
        """Audit a context request the host refused (its call was not in flight on the
        capsule that sent it, or took no context)."""
        number = next(self._ids)
        now = time.time()
        record = AuditRecord(
            call_id=f"{self.host_id}.{number}",
            host_id=self.host_id,
            started=now,
            session=session,
            caller="tool",
            tool=f"ctx.{_shown_name(op)}",
            outcome="denied",
            ended=now,
            error_kind="context_refused",
            error=self.redact(reason, session)[:_ERROR_TEXT],
        )
        self.events.emit(
            "context_refused", session, call_id=record.call_id, op=op, reason=record.error
        )
        await self._write(record, None)

    async def _execute(
        self,
        supervisor: Supervisor,
        number: int,
        spec: ToolSpec,
        bound: BoundCall,
        record: AuditRecord,
        chain: Sequence[str],
        frame: CallFrame | None,
    ) -> Any:
        """Hooks around the dispatch of an admitted call; its outcome audited.

        Without hooks this is the plain path, with no awaits of its own. The two events of
        every call (``tool_call_started``, ``tool_call_done``) are made only while something
        listens: building them cost about 13 us of CPU per call, a tenth of the whole call,
        for events nobody would read (benchmarks/README.md)."""
        if self.hooks.active:
            progress = self._started(record, bound, chain)
            return await self._hooked(
                supervisor, number, spec, bound, record, chain, frame, progress
            )
        events = self.events
        if events.wants("tool_call_started"):
            self._started(record, bound, chain)
        try:
            value = await self._dispatch(supervisor, number, spec, bound, record, frame)
        except BaseException as exc:
            if isinstance(exc, HostError) and events.wants("tool_call_done"):
                self._done(record, exc)
            await self._finish(record, exc)
            raise
        if events.wants("tool_call_done"):
            self._done(record, None)
        await self._finish(record, None)
        return value

    async def _hooked(
        self,
        supervisor: Supervisor,
        number: int,
        spec: ToolSpec,
        bound: BoundCall,
        record: AuditRecord,
        chain: Sequence[str],
        frame: CallFrame | None,
        progress: Any,
    ) -> Any:
        """``_execute`` with hooks: started, the call, done, the chains."""
        hooks = self.hooks
        ctx = HookContext(
            record.session, record.caller, tuple(chain), supervisor.metadata, self.host_id
        )
        info = hooks.info(
            record.call_id, record.tool, bound.arguments, record.caller or "", record.session
        )
        try:
            await hooks.started(ctx, info, progress)
            value = await self._dispatch(supervisor, number, spec, bound, record, frame)
        except HostError as exc:
            self._done(record, exc)
            result = await hooks.finished(ctx, info, ToolResult.failure(exc))
            if result.error is exc:
                await self._finish(record, exc)
                raise
        except BaseException as exc:
            await self._finish(record, exc)
            raise
        else:
            self._done(record, None)
            result = await hooks.finished(ctx, info, ToolResult.success(value))
        await self._finish(record, result.error)
        if result.error is not None:
            raise result.error
        return result.value

    def _started(self, record: AuditRecord, bound: BoundCall, chain: Sequence[str]) -> Any:
        """The ``tool_call_started`` event; returns the progress argument's value."""
        argument = self._progress.get(record.tool) if self._progress else None
        progress = bound.arguments.get(argument) if argument is not None else None
        if isinstance(progress, str):
            progress = escape_text(self.redact(progress[:200], record.session))
        elif progress is not None and not isinstance(progress, int | float | bool):
            progress = None  # only scalars travel in the event
        self.events.emit(
            "tool_call_started",
            record.session,
            call_id=record.call_id,
            tool=record.tool,
            caller=record.caller,
            chain=tuple(chain),
            progress=progress,
        )
        return progress

    def _done(self, record: AuditRecord, error: HostError | None) -> None:
        """The ``tool_call_done`` event, on the raw result."""
        self.events.emit(
            "tool_call_done",
            record.session,
            call_id=record.call_id,
            tool=record.tool,
            ok=error is None,
            error=error.kind if error is not None else None,
        )

    async def _dispatch(
        self,
        supervisor: Supervisor,
        number: int,
        spec: ToolSpec,
        bound: BoundCall,
        record: AuditRecord,
        frame: CallFrame | None,
    ) -> Any:
        """The call in its capsule (with its context, if it takes one); files kept."""
        timeout = self._config.limits.call_timeout
        if frame is None:
            value = await supervisor.call(number, spec, bound, timeout)
        else:
            value = await supervisor.call(number, spec, bound, timeout, frame.info())
        if type(value) in _FILES:
            await self._keep_files(record, value)
        return value

    async def _admit(
        self,
        record: AuditRecord,
        decision: Decision,
        policy: Policy,
        bound: BoundCall,
        chain: tuple[str, ...] = (),
    ) -> Ticket | None:
        """Deny, or reserve quota, escalate and audit the decision before dispatch."""
        tool = record.tool
        reservation: Reservation | None = None
        ticket: Ticket | None = None
        recorded = False
        try:
            if decision.decision == "deny":
                raise PolicyDenied(tool, rule=decision.rule, reason=decision.reason)
            reservation = self.quotas.reserve(policy, tool, record.session)
            if decision.decision == "escalate":
                # Waiting is on the record too: a host that dies now leaves a record the
                # next host closes as denied, never a call without one.
                written = self.store.record(record._replace(outcome="waiting"), durable=True)
                if written is not DONE:
                    await written
                ticket = await self.escalations.resolve(
                    Escalation(
                        call_id=record.call_id,
                        session=record.session,
                        caller=record.caller,  # pyright: ignore[reportArgumentType]
                        tool=tool,
                        bound=bound,
                        args_sha256=record.args_sha256 or "",
                        rule=decision.rule,
                        reason=decision.reason,
                        rule_digest=decision.rule_digest,
                        policy_version=policy.version,
                        timeout=policy.escalation_timeout,
                        grant_expiry=policy.grant_expiry,
                        max_pending=self._config.limits.max_pending_approvals,
                        redactor=self.events.redactor_for(record.session),
                        approvers=decision.approvers,
                        description=self._description(tool),
                        chain=chain,
                        tool_digest=self._tool_digest(tool),
                    )
                )
                record = record._replace(approval=ticket.how)
            written = self.store.record(record, durable=True)
            recorded = True
            if written is not DONE:  # the store waits for its disk: the call waits with it
                await written
        except StoreUnavailable as exc:
            if reservation is not None:
                reservation.release()
            self.events.emit("audit_unavailable", record.session, reason=str(exc))
            denied = PolicyDenied(
                tool,
                rule="audit_unavailable",
                reason="the audit trail cannot be written, so nothing runs",
            )
            if recorded:  # its decision is in the journal: close it there
                await self._write(
                    record, ("denied", denied.kind, self._error_text(denied, record.session))
                )
            else:
                await self._refused(record, denied)  # kept if the journal still takes it
            raise denied from None
        except BaseException as exc:
            if reservation is not None:
                reservation.release()
            if recorded:  # cancelled while the decision went to disk: close its record
                await self._write(record, ("denied", "cancelled", None))
            else:
                await self._refused(record, exc)
            raise
        return ticket

    def _error_text(self, exc: BaseException, session: str | None) -> str:
        text = self.redact(str(exc), session)
        return text if len(text) <= _ERROR_TEXT else text[: _ERROR_TEXT - 1] + "…"

    async def _refused(self, record: AuditRecord, exc: BaseException) -> None:
        """One terminal record for a call that never reached a capsule."""
        if isinstance(exc, HostError):
            kind, text = exc.kind, self._error_text(exc, record.session)
            self.events.emit(
                "policy_denied",
                record.session,
                call_id=record.call_id,
                tool=record.tool,
                error=kind,
                rule=getattr(exc, "rule", None),
            )
            if self.tracing is not None:
                self.tracing.event(
                    "policy_denied", {"gen_ai.tool.name": record.tool, "error": kind}
                )
        else:
            kind, text = "cancelled", None
        approval = exc.reason if isinstance(exc, NotApproved) else record.approval
        rule = record.rule or getattr(exc, "rule", None)  # uses, call_cycle: refused before policy
        done = record._replace(
            outcome="denied",
            ended=time.time(),
            error_kind=kind,
            error=text,
            approval=approval,
            rule=rule if isinstance(rule, str) else None,
        )
        await self._write(done, None)

    async def _finish(self, record: AuditRecord, exc: BaseException | None) -> None:
        """Close the call's record with its outcome."""
        outcome: Outcome
        if exc is None:
            await self._write(record, ("ok", None, None))
            return
        if isinstance(exc, CallError) and exc.kind in ("not_approved", "policy_denied"):
            outcome = "denied"  # the approval did not fit the call: nothing ran
        elif isinstance(exc, CallError) and not getattr(exc, "may_have_executed", False):
            outcome = "failed"
        else:
            outcome = "unknown"  # timed out, crashed in flight, or cancelled while running
        kind = exc.kind if isinstance(exc, HostError) else "cancelled"
        text = self._error_text(exc, record.session) if isinstance(exc, HostError) else None
        await self._write(record, (outcome, kind, text))

    async def _write(
        self, record: AuditRecord, outcome: tuple[Outcome, str | None, str | None] | None
    ) -> None:
        """Best effort for records after the fact; a failure is an event (and the open
        record, if any, is closed as ``unknown`` by the next host)."""
        try:
            if outcome is None:
                written = self.store.record(record, durable=False)
            else:
                written = self.store.finish(
                    record.call_id, outcome[0], error_kind=outcome[1], error=outcome[2]
                )
            if written is not DONE:  # a store that waits: not cut short by a cancellation
                with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                    await written
        except StoreUnavailable as exc:
            self.events.emit(
                "audit_unavailable", record.session, call_id=record.call_id, reason=str(exc)
            )


def _check_nested(parent: CallFrame, chain: tuple[str, ...], spec: ToolSpec) -> None:
    """Refuse a nested call its tool may not make: outside its ``uses``, too deep, or a
    cycle (the tool is already in the chain)."""
    if parent.uses is not None and spec.name not in parent.uses:
        raise PolicyDenied(
            spec.name,
            rule="uses",
            reason=f"{parent.tool} may call only the tools its __uses__ lists "
            f"({', '.join(parent.uses) or 'none'}); add {spec.name!r} to its entry "
            "to let it call this one",
        )
    tools = chain[1:]
    if len(tools) > MAX_CHAIN:
        raise LimitExceeded(
            "call_depth",
            f"nested calls are {len(tools)} tools deep ({' > '.join(chain)}), over "
            f"the limit of {MAX_CHAIN}",
            tool=spec.name,
        )
    if spec.name in tools:
        raise PolicyDenied(
            spec.name,
            rule="call_cycle",
            reason=f"{spec.name} is already in the chain {' > '.join(chain)}: a tool "
            "cannot reach itself through nested calls",
        )
