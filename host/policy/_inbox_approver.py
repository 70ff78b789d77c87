"""The inbox as an approver: wait for an answer given through the store.

:class:`InboxApprover` answers escalations with whatever a person answers in the
approval inbox (``host.serve``'s web page, in this process or in any other one that has
the same store open: a second host, ``toolhost inbox``). The pending approval is already
in the store when the approver is asked (``Escalations`` writes it); the approver
*offers* it (the inbox shows buttons only for offered requests) and waits until the row
has an answer. The escalation timeout still bounds the wait: nobody answering denies.

An answer given in this process wakes the approver at once; one given in another
process is seen by reading the row again every ``poll`` seconds (SQLite cannot wake a
reader in another process; a PostgreSQL store could with LISTEN/NOTIFY). So that an
answer the inbox accepted is never one that came too late, the store takes answers until
two reads (at most half the timeout) before the escalation's deadline.
"""

from __future__ import annotations

from typing import get_args

from host.audit import PendingAnswer, Store

from ._approval import Approval, ApprovalRequest
from ._files import Channel

__all__ = ["InboxApprover"]

_CHANNELS: frozenset[str] = frozenset(get_args(Channel))


class InboxApprover:
    """Answers with the first answer given through the store (the approval inbox).

    Args:
        store: the host's store (``host.store``); ``Host.open(approver="inbox")`` makes
            this approver over the store it opens.
        poll: seconds between reads of a pending request, to see answers given by another
            process on the same store (an answer given in this process wakes it at once).
    """

    channel: Channel = "inbox"

    def __init__(self, store: Store, *, poll: float = 0.5) -> None:
        if poll <= 0:
            raise ValueError("poll must be a positive number of seconds")
        self.store = store
        self.poll = poll

    def __repr__(self) -> str:
        return f"<InboxApprover poll={self.poll:g}s>"

    async def decide(self, request: ApprovalRequest) -> Approval:
        store = self.store
        # Answers are taken until two reads before the deadline: one given in time is
        # read in time (an answer the inbox accepted never meets a call that timed out).
        margin = min(2 * self.poll, request.timeout / 2)
        if not await store.offer_pending(request.id, margin):
            return _withdrawn(request)
        while True:
            seen = store.pending_version()
            row = await store.get_pending(request.id)
            if row is None:
                return _withdrawn(request)
            if row.answer is not None:
                return _approval(row.answer, request)
            await store.pending_changed(seen, self.poll)


def _withdrawn(request: ApprovalRequest) -> Approval:
    return Approval(
        False,
        request_id=request.id,
        note="the request left the store before anyone answered it",
        channel="inbox",
    )


def _approval(answer: PendingAnswer, request: ApprovalRequest) -> Approval:
    channel: Channel = answer.channel if answer.channel in _CHANNELS else "inbox"  # pyright: ignore[reportAssignmentType]
    return Approval(
        answer.allow,
        answer.remember,
        answer.scope,
        request_id=request.id,
        note=None if answer.allow else "denied in the inbox",
        channel=channel,
        comment=answer.comment,
        approver=answer.approver,
    )
