"""Escalation: ask a person about one call, wait in place, and remember the answer.

When policy says ``escalate`` the mediator hands the call here.
An :class:`ApprovalRequest` shows the bound arguments as the capsule will receive them
(decoded afresh from the frozen bytes, escaped and bounded for display) and goes to the
approver: an async callable, or an object with an async ``decide`` method, answering an
:class:`Approval` or a bool. The call waits until the answer, at most
``escalation_timeout``; no answer, an approver that raises, and an answer that is not an
approval all deny.

What keeps an approval honest:

* an allow becomes a one-shot :class:`Ticket` bound to the call id, session, tool and the
  hash of the frozen argument bytes; the mediator redeems it right before dispatch, so
  what runs is exactly what was approved, once;
* an answer made with :meth:`ApprovalRequest.allow` carries the request's id, and is
  refused when returned for any other request (a replayed approval does nothing);
* remembered answers (``session``: in memory; ``always``: a :class:`Grant` in the store)
  cover the exact tool, caller and arguments, or the whole tool when the approver widens
  the scope; a remembered deny beats a remembered allow;
* a remembered allow answers the rule that asked: it records the rule's name, a digest of
  what the rule said (``Decision.rule_digest``) and the reason shown, and a call
  escalated by another rule, or by the same rule changed, asks again (a remembered deny
  counts whatever the rule);
* each session has at most ``max_pending_approvals`` requests open; an identical
  request (same session, caller, tool, arguments and escalating rule) joins the open one
  instead of asking again;
* a rule may name the channels whose answer counts (``approvers = ["inbox"]``): an
  allow from any other channel (an MCP client's own user, say, which an agent driving
  that client could fake) denies, and remembered allows do not answer such a call
  (grants do not record their channel), so an allowed channel is asked every time.

The approvers that ship (deny-all and the terminal's) are in ``_approvers.py``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any, Literal, Protocol, cast

import anyio

from capsule.protocol import decode
from host._binding import BoundCall
from host._display import (
    Redactor,
    escape_text,
    quote_text,
    render_arguments,
    render_full,
    summarize_arguments,
)
from host._events import EventBus
from host.audit import Grant, PendingApproval, Store
from host.errors import LimitExceeded, NotApproved

from ._files import Caller, Channel

__all__ = [
    "Approval",
    "ApprovalRequest",
    "Approver",
    "Ticket",
    "Escalations",
    "channel_of",
]

Remember = Literal["once", "session", "always"]
Scope = Literal["call", "tool"]


@dataclass(frozen=True, slots=True)
class Approval:
    """An approver's answer. ``True``/``False`` from an approver mean allow/deny once."""

    allow: bool
    remember: Remember = "once"
    """``once``: this call only; ``session``: for the rest of the session; ``always``:
    a persisted grant (``toolhost policy grants`` lists and revokes it)."""
    scope: Scope = "call"
    """What a remembered answer covers: ``call``, the exact tool and arguments (the
    default), or ``tool``, every call of the tool by the same caller."""
    request_id: str | None = None
    """Set by :meth:`ApprovalRequest.allow`/:meth:`~ApprovalRequest.deny`: the answer then
    counts for that request only."""
    note: str | None = None
    """Why, in the approver's words (shown to the caller when the call is denied)."""
    channel: Channel | None = None
    """Where the answer came from; None: the approver's own ``channel`` (``app`` for a
    plain function). Checked against the rule's ``approvers``."""
    comment: str | None = None
    """Free text from the person who answered. A denied call's ``NotApproved`` carries it
    escaped and quoted (``comment``): the caller sees it as data, never as the host's
    words."""
    approver: str | None = None
    """Who answered, as they named themselves (the inbox's name field): recorded with
    the decision, a label rather than an authenticated identity."""

    def __post_init__(self) -> None:
        if type(self.allow) is not bool:
            raise TypeError("Approval.allow must be a bool")
        if self.remember not in ("once", "session", "always"):
            raise ValueError("Approval.remember is 'once', 'session' or 'always'")
        if self.scope not in ("call", "tool"):
            raise ValueError("Approval.scope is 'call' or 'tool'")


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """One call waiting for a person's answer."""

    id: str
    """A fresh random id for this request (answers made with :meth:`allow` carry it)."""
    call_id: str
    session_id: str
    caller: Caller
    tool: str
    arguments: Mapping[str, Any]
    """The bound arguments as the capsule will receive them: a private copy decoded from
    the frozen bytes (changing it changes nothing that runs)."""
    rendered: str
    """The same arguments escaped and bounded for display, secrets replaced."""
    warnings: tuple[str, ...]
    """What in the arguments deserves a second look (hidden characters, look-alikes...)."""
    rule: str
    reason: str | None
    """The policy's reason (policy text, never text from the arguments)."""
    args_sha256: str
    size: int
    """Bytes of the encoded arguments."""
    policy_version: str
    timeout: float
    """Seconds the call waits for an answer before it is denied."""
    approvers: tuple[Channel, ...] | None = None
    """The channels whose allow counts (the rule's ``approvers``); None: any."""
    description: str | None = None
    """The tool's description (the first paragraph of its docstring)."""
    elided: bool = False
    """``rendered`` leaves part of the arguments out (each cut is one of the ``warnings``):
    an approver should offer :meth:`full_text` before it takes an allow."""
    redactor: Redactor | None = field(default=None, repr=False, compare=False)
    """Replaces secrets in :meth:`full_text` (the host's; None: no secrets)."""

    def full_text(self) -> str:
        """The arguments in full, one item per line, escaped, secrets replaced: nothing
        is cut, so it can be long (page it). Built when asked, not before."""
        return render_full(self.arguments, redactor=self.redactor)

    chain: tuple[str, ...] = ()
    """The callers above the call, outermost first: the caller that started it all, then
    each tool whose context made the next call (``("agent", "send_email")``)."""

    def allow(self, remember: Remember = "once", scope: Scope = "call") -> Approval:
        """An allow that counts for this request only."""
        return Approval(True, remember, scope, request_id=self.id)

    def deny(self, remember: Remember = "once", scope: Scope = "call") -> Approval:
        """A deny for this request (``remember`` makes it stick)."""
        return Approval(False, remember, scope, request_id=self.id)


ApproverFunction = Callable[[ApprovalRequest], Awaitable[Approval | bool]]


class SupportsDecide(Protocol):
    """An approver object: ``await approver.decide(request)``."""

    def decide(self, request: ApprovalRequest, /) -> Awaitable[Approval | bool]: ...


Approver = ApproverFunction | SupportsDecide


def channel_of(approver: object) -> Channel:
    """The channel an approver answers on: its ``channel`` attribute, else ``app``."""
    channel = getattr(approver, "channel", None)
    return channel if channel in ("app", "terminal", "mcp", "inbox") else "app"


def _as_function(approver: Approver) -> ApproverFunction:
    decide = getattr(approver, "decide", None)
    if decide is not None and callable(decide):
        return cast("ApproverFunction", decide)
    return cast("ApproverFunction", approver)


# -- the one-shot binding ------------------------------------------------------------------


@dataclass(slots=True)
class Ticket:
    """Permission for exactly one dispatch of exactly the approved call."""

    call_id: str
    session: str
    tool: str
    args_sha256: str
    how: str
    """How it was approved, for the audit: ``once``, ``session``, ``always``, ``grant 3``."""
    used: bool = False

    def redeem(self, call_id: str, session: str, tool: str, encoded: bytes) -> None:
        """Use the ticket for this dispatch. Raises :class:`NotApproved` on any mismatch."""
        same = (
            call_id == self.call_id
            and session == self.session
            and tool == self.tool
            and sha256(encoded).hexdigest() == self.args_sha256
        )
        if self.used or not same:
            raise NotApproved(
                tool,
                reason="mismatch",
                detail="the approval was for another call or was already used",
            )
        self.used = True


# -- escalations ---------------------------------------------------------------------------


def _same_tool(grant: Grant, e: Escalation) -> bool:
    """Whether ``grant`` was given for the tool as it is declared now (a grant that
    recorded no declaration, given by an older host, answers as before)."""
    return grant.tool_digest is None or grant.tool_digest == e.tool_digest


def _same_rule(grant: Grant, e: Escalation) -> bool:
    """Whether ``grant`` was given under the rules that escalate ``e``, as they are now."""
    return (
        grant.rule == e.rule
        and grant.rule_digest is not None
        and (grant.rule_digest == e.rule_digest)
    )


@dataclass(slots=True)
class _Open:
    """One open request, which identical calls join."""

    done: anyio.Event = field(default_factory=anyio.Event)
    denial: NotApproved | None = None


@dataclass(frozen=True, slots=True)
class Escalation:
    """What the mediator knows about a call it escalates."""

    call_id: str
    session: str
    caller: Caller
    tool: str
    bound: BoundCall
    args_sha256: str
    rule: str
    reason: str | None
    policy_version: str
    timeout: float
    max_pending: int
    redactor: Redactor
    approvers: tuple[Channel, ...] | None = None
    """The channels whose allow counts (from the decision); None: any."""
    description: str | None = None
    """The tool's description, shown to the person asked."""
    chain: tuple[str, ...] = ()
    """The callers above the call, outermost first (see :attr:`ApprovalRequest.chain`)."""
    rule_digest: str | None = None
    """What the rule that escalated says (``Decision.rule_digest``): a remembered allow
    answers this call only if it was given under the same."""
    tool_digest: str | None = None
    """A digest of the tool's declaration (signature and schemas): a remembered allow
    answers this call only if it was given for the same."""
    grant_expiry: float | None = None
    """Seconds an ``always`` answer to it lasts (``[defaults] grant_expiry``); None: until
    revoked."""


class Escalations:
    """Open requests, session grants, and the approver: one per host."""

    def __init__(self, approver: Approver, store: Store, events: EventBus, host_id: str) -> None:
        self._approver = approver
        self._ask_fn = _as_function(approver)
        self._store = store
        self._events = events
        self._host_id = host_id
        self._open: dict[tuple[str, str, str, str, str, str], _Open] = {}
        self._session_grants: dict[str, list[Grant]] = {}

    def __repr__(self) -> str:
        return f"<Escalations approver={self.approver!r} open={len(self._open)}>"

    @property
    def approver(self) -> Approver:
        """Who answers escalations; setting it takes effect for the next request."""
        return self._approver

    @approver.setter
    def approver(self, approver: Approver) -> None:
        self._approver = approver
        self._ask_fn = _as_function(approver)

    def open_requests(self, session: str) -> int:
        return sum(1 for key in self._open if key[0] == session)

    def forget_session(self, session: str) -> None:
        self._session_grants.pop(session, None)

    async def _remembered(self, e: Escalation) -> Grant | None:
        grants = [
            g
            for g in self._session_grants.get(e.session, [])
            if g.covers(e.tool, e.caller, e.args_sha256)
        ]
        grants += await self._store.find_grants(e.tool, e.caller, e.args_sha256)
        # An allow answers the rule that asked: given under another rule, or under this
        # one when it said something else, it answers nothing (a deny always counts).
        # An allow answers only the tool as it was declared when it was given: a tool whose
        # signature or schemas changed asks again.
        grants = [g for g in grants if not g.allow or (_same_rule(g, e) and _same_tool(g, e))]
        if e.approvers is not None:
            # Grants do not say which channel made them: only a remembered deny counts.
            grants = [g for g in grants if not g.allow]
        if not grants:
            return None
        return next((g for g in grants if not g.allow), grants[0])

    async def resolve(self, e: Escalation) -> Ticket:
        """Wait for the answer to ``e``. Returns a ticket, or raises :class:`NotApproved`,
        :class:`LimitExceeded`, or ``StoreUnavailable`` (the caller fails closed)."""
        # An identical call escalated by another rule (or a changed one) asks on its own:
        # it must not join a request that shows the person another rule's reason.
        key = (e.session, e.caller, e.tool, e.args_sha256, e.rule, e.rule_digest or "")
        while True:
            grant = await self._remembered(e)
            if grant is not None:
                label = f"grant {grant.id}" if grant.session is None else "session"
                if not grant.allow:
                    raise NotApproved(
                        e.tool, reason="denied", rule=e.rule, detail=f"remembered ({label})"
                    )
                return Ticket(e.call_id, e.session, e.tool, e.args_sha256, label)
            joined = self._open.get(key)
            if joined is None:
                break
            await joined.done.wait()
            if joined.denial is not None:
                raise NotApproved(
                    e.tool,
                    reason=joined.denial.reason,
                    rule=e.rule,
                    detail=joined.denial.detail,
                    comment=joined.denial.comment,
                )
            # allowed once (for the other call): this one asks again, or finds a grant
        if self.open_requests(e.session) >= e.max_pending:
            raise LimitExceeded(
                "max_pending_approvals",
                f"this session already has {e.max_pending} approval requests waiting; "
                "wait for answers before asking for more",
                tool=e.tool,
            )
        entry = _Open()
        self._open[key] = entry
        try:
            return await self._ask(e)
        except NotApproved as exc:
            entry.denial = exc
            raise
        finally:
            del self._open[key]
            entry.done.set()

    async def _ask(self, e: Escalation) -> Ticket:
        arguments: Mapping[str, Any] = decode(e.bound.encoded)
        rendered = render_arguments(arguments, redactor=e.redactor)
        request = ApprovalRequest(
            id=uuid.uuid4().hex,
            call_id=e.call_id,
            session_id=e.session,
            caller=e.caller,
            tool=e.tool,
            arguments=arguments,
            rendered=rendered.text,
            warnings=rendered.warnings,
            rule=e.rule,
            reason=e.reason,
            args_sha256=e.args_sha256,
            size=len(e.bound.encoded),
            policy_version=e.policy_version,
            timeout=e.timeout,
            approvers=e.approvers,
            description=e.description,
            elided=rendered.elided,
            redactor=e.redactor,
            chain=e.chain,
        )
        now = time.time()
        await self._store.add_pending(
            PendingApproval(
                id=request.id,
                host_id=self._host_id,
                created=now,
                expires=now + e.timeout,
                call_id=e.call_id,
                session=e.session,
                caller=e.caller,
                tool=e.tool,
                rule=e.rule,
                reason=e.reason,
                args_sha256=e.args_sha256,
                rendered=rendered.text,
                description=e.description,
                warnings=rendered.warnings,
                approvers=e.approvers,
                chain=e.chain,
            )
        )
        self._events.emit(
            "policy_escalation",
            e.session,
            call_id=e.call_id,
            tool=e.tool,
            rule=e.rule,
            request_id=request.id,
            warnings=list(rendered.warnings),
            elided=rendered.elided,
        )
        try:
            approval = await self._answer(request, e)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                try:
                    await self._store.remove_pending(request.id)
                except Exception:  # the row is cleared when the host closes or restarts
                    self._events.emit("store_failed", e.session, what="remove_pending")
        return await self._apply(approval, e)

    async def _answer(self, request: ApprovalRequest, e: Escalation) -> Approval:
        answer: object = None
        with anyio.move_on_after(e.timeout) as scope:
            try:
                answer = await self._ask_fn(request)
            except Exception as exc:
                raise NotApproved(
                    e.tool,
                    reason="approver_failed",
                    rule=e.rule,
                    detail=f"the approver raised {type(exc).__name__}",
                ) from None
        if scope.cancelled_caught:
            raise NotApproved(
                e.tool,
                reason="timeout",
                rule=e.rule,
                detail=f"nobody answered within {e.timeout:g} s",
            )
        if type(answer) is bool:
            answer = Approval(answer, request_id=request.id)
        if not isinstance(answer, Approval):
            raise NotApproved(
                e.tool,
                reason="approver_failed",
                rule=e.rule,
                detail=f"the approver answered with a {type(answer).__name__}, not an Approval",
            )
        if answer.request_id is not None and answer.request_id != request.id:
            raise NotApproved(
                e.tool,
                reason="mismatch",
                rule=e.rule,
                detail="the answer was given for another request",
            )
        channel = answer.channel or channel_of(self._approver)
        if answer.allow and e.approvers is not None and channel not in e.approvers:
            allowed = ", ".join(e.approvers) or "no channel"
            raise NotApproved(
                e.tool,
                reason="channel_not_allowed",
                rule=e.rule,
                detail=f"rule {e.rule} accepts an allow only from {allowed}, "
                f"and this one came from {channel}",
            )
        return answer

    async def _apply(self, approval: Approval, e: Escalation) -> Ticket:
        how: str = approval.remember
        by = _answered_by(approval)
        if approval.remember != "once":
            grant = Grant(
                tool=e.tool,
                caller=e.caller,
                allow=approval.allow,
                args_sha256=e.args_sha256 if approval.scope == "call" else None,
                created=time.time(),
                rule=e.rule,
                summary=summarize_arguments(decode(e.bound.encoded), redactor=e.redactor)
                if approval.scope == "call"
                else None,
                rule_digest=e.rule_digest,
                reason=e.reason,
                tool_digest=e.tool_digest,
                expires=time.time() + e.grant_expiry
                if approval.remember == "always" and e.grant_expiry is not None
                else None,
                session=e.session if approval.remember == "session" else None,
            )
            if approval.remember == "session":
                self._session_grants.setdefault(e.session, []).append(grant)
            else:
                grant = await self._store.add_grant(grant)
                how = f"always (grant {grant.id})"
        if not approval.allow:
            detail = approval.note or "a person denied it"
            if by:
                detail += f" ({by})"
            if approval.remember != "once":
                detail += f" (remembered: {how})"
            comment = (
                quote_text(approval.comment, redactor=e.redactor, limit=_COMMENT_SHOWN)
                if approval.comment
                else None
            )
            raise NotApproved(e.tool, reason="denied", rule=e.rule, detail=detail, comment=comment)
        if by:
            how += f" ({by})"
        return Ticket(e.call_id, e.session, e.tool, e.args_sha256, how)


_COMMENT_SHOWN = 1000
"""Characters of an approver's comment a denied caller is shown (head and tail beyond)."""


def _answered_by(approval: Approval) -> str:
    """Where and by whom, when the answer says so: ``inbox: alice``, ``mcp`` (for the
    audit's ``approval`` column and a denial's detail); the name is escaped."""
    parts: list[str] = []
    if approval.channel is not None:
        parts.append(approval.channel)
    if approval.approver:
        parts.append(escape_text(approval.approver[:80]))
    return ": ".join(parts)
