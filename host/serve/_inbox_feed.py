"""What the inbox shows, read from the store, as plain data for the page.

:class:`Feed` reads the pending approvals and the grants, and turns them into the
snapshot every open page receives (server-sent events carry the whole snapshot each
time, so a page that reconnects needs nothing replayed). It reads again when this
process changes a pending approval (at once) and every ``poll`` seconds while a page is
open (to see what other processes changed). A request that leaves the list is kept a
while under "closed recently", saying how it ended when this process knows: answered
here (by whom), or expired.

Every string that reaches the page passes through the redactor first. Arguments are
already rendered by the host that wrote the row (escaped, bounded, secrets replaced);
the page shows them as text, never as HTML.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Final

import anyio

from host.audit import AuditRecord, Grant, PendingAnswer, PendingApproval, Store, StoreUnavailable

__all__ = ["Feed", "answer_text", "audit_view"]

logger = logging.getLogger("toolhost.inbox")

Redact = Callable[[str], str]

_CLOSED_KEPT: Final = 20
_CLOSED_FOR: Final = 600.0
_EXPIRY_SLACK: Final = 1.0
"""A request that vanishes this close to its expiry (or later) is said to have expired."""


def answer_text(answer: PendingAnswer, redact: Redact) -> str:
    """``approved once by alice (inbox)``, ``denied by someone (inbox)``."""
    how = {"once": "once", "session": "for the session", "always": "always"}[answer.remember]
    verb = f"approved {how}" if answer.allow else "denied"
    who = redact(answer.approver) if answer.approver else "someone"
    return f"{verb} by {who} ({answer.channel})"


@dataclass(slots=True)
class _Closed:
    id: str
    tool: str
    caller: str
    session: str
    closed: float
    how: str

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tool": self.tool,
            "caller": self.caller,
            "session": self.session,
            "closed": self.closed,
            "how": self.how,
        }


class Feed:
    """The inbox's view of the store, kept fresh while pages watch it."""

    def __init__(self, store: Store, redact: Redact, *, poll: float = 0.5) -> None:
        self.store = store
        self.redact = redact
        self.poll = poll
        self.version = 0
        self.closed = False
        self.listeners = 0
        self._data: str = ""
        self._rows: dict[str, PendingApproval] = {}
        self._gone: list[_Closed] = []
        self._answers: dict[str, PendingAnswer] = {}
        self._changed = anyio.Event()
        self._listening = anyio.Event()
        self._lock = anyio.Lock()
        self.error: str | None = None

    def __repr__(self) -> str:
        return f"<inbox feed pending={len(self._rows)} listeners={self.listeners}>"

    def row(self, pending_id: str) -> PendingApproval | None:
        """A pending approval as last read (None if unknown or gone)."""
        return self._rows.get(pending_id)

    def closed_how(self, pending_id: str) -> str | None:
        """How a request that left the list ended, if this inbox saw it go."""
        return next((c.how for c in self._gone if c.id == pending_id), None)

    def answered_here(self, pending_id: str, answer: PendingAnswer) -> None:
        """Remember an answer given through this inbox (the row may go before a read)."""
        self._answers[pending_id] = answer
        while len(self._answers) > 200:
            self._answers.pop(next(iter(self._answers)))

    # -- reading --------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Read the store again; wake every page when what they show changed."""
        async with self._lock:
            try:
                rows = await self.store.pending()
                grants = await self.store.grants()
                error = None
            except StoreUnavailable as exc:
                logger.warning("the inbox cannot read the store: %s", exc)
                rows, grants = list(self._rows.values()), []
                error = "the state database cannot be read: the list may be stale"
            now = time.time()
            self._close_vanished(rows, now)
            self._rows = {row.id: row for row in rows if row.answer is None}
            data = json.dumps(
                {
                    "pending": [self._pending_view(row) for row in self._rows.values()],
                    "closed": [c.view() for c in self._gone],
                    "grants": [self._grant_view(g) for g in grants],
                    "error": error,
                },
                ensure_ascii=False,
                sort_keys=True,
            )
            if data != self._data:
                self._data = data
                self._bump()

    def _close_vanished(self, rows: list[PendingApproval], now: float) -> None:
        open_now = {row.id for row in rows if row.answer is None}
        answered = {row.id: row.answer for row in rows if row.answer is not None}
        for pending_id, row in self._rows.items():
            if pending_id in open_now:
                continue
            answer = answered.get(pending_id) or self._answers.get(pending_id)
            if answer is not None:
                how = answer_text(answer, self.redact)
            elif now >= row.expires - _EXPIRY_SLACK:
                waited = max(row.expires - row.created, 0.0)
                how = f"expired: nobody answered within {waited:.0f} s, so the call was denied"
            else:
                how = (
                    "closed without an answer from this inbox (answered on another "
                    "channel, or its call or host ended)"
                )
            self._gone.insert(
                0,
                _Closed(
                    row.id,
                    self.redact(row.tool),
                    self.redact(row.caller),
                    self.redact(row.session),
                    now,
                    how,
                ),
            )
        self._gone = [c for c in self._gone if c.closed > now - _CLOSED_FOR][:_CLOSED_KEPT]

    def _pending_view(self, row: PendingApproval) -> dict[str, Any]:
        redact = self.redact

        def text(value: str | None) -> str | None:
            return None if value is None else redact(value)

        return {
            "id": row.id,
            "tool": redact(row.tool),
            "description": text(row.description),
            "arguments": redact(row.rendered),
            "warnings": [redact(w) for w in row.warnings],
            "rule": text(row.rule),
            "reason": text(row.reason),
            "caller": redact(row.caller),
            "chain": [redact(link) for link in row.chain],
            "session": redact(row.session),
            "host": redact(row.host_id),
            "created": row.created,
            "expires": row.expires,
            "offered": row.offered,
            "approvers": list(row.approvers) if row.approvers is not None else None,
        }

    def _grant_view(self, grant: Grant) -> dict[str, Any]:
        redact = self.redact
        return {
            "id": grant.id,
            "tool": redact(grant.tool),
            "caller": redact(grant.caller),
            "allow": grant.allow,
            "scope": grant.scope,
            "summary": redact(grant.summary) if grant.summary else None,
            "rule": redact(grant.rule) if grant.rule else None,
            "created": grant.created,
        }

    def _bump(self) -> None:
        self.version += 1
        event, self._changed = self._changed, anyio.Event()
        event.set()

    # -- watching -------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep reading while any page watches (in the inbox's task group)."""
        while not self.closed:
            if self.listeners == 0:
                await self._listening.wait()
                continue
            seen = self.store.pending_version()
            await self.refresh()
            await self.store.pending_changed(seen, self.poll)

    async def snapshots(self, ping: float) -> AsyncIterator[tuple[int, str] | None]:
        """The snapshot now and after every change; None after ``ping`` quiet seconds.
        Ends when the inbox closes."""
        self.listeners += 1
        self._listening.set()
        try:
            await self.refresh()
            shown = -1
            while not self.closed:
                if self.version != shown:
                    shown = self.version
                    yield shown, self._data
                    continue
                changed = self._changed
                with anyio.move_on_after(ping) as quiet:
                    await changed.wait()
                if quiet.cancelled_caught:
                    yield None
        finally:
            self.listeners -= 1
            if self.listeners == 0:
                self._listening = anyio.Event()

    def close(self) -> None:
        """End every stream (call before the server stops, or it waits for them)."""
        self.closed = True
        self._listening.set()
        self._bump()


def audit_view(record: AuditRecord, redact: Redact) -> dict[str, Any]:
    """One audit record as the page shows it (redacted strings, no argument values)."""
    data = record.to_data()
    return {k: redact(v) if isinstance(v, str) else v for k, v in data.items()}
