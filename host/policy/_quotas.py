"""Call budgets: ``[[quotas]]`` per session and per minute, for each tool they match.

A call reserves its place in every budget that covers its tool after policy allowed or
escalated it and before a person is asked, so nobody is asked about a call that would be
refused anyway. The reservation is given back if the call does not run (denied by the
approver, or the audit cannot be written); a call that ran keeps it.

``per_session`` counts one session's calls to one tool. ``per_minute`` counts the host's
calls to one tool, in every session, over any 60 seconds: it protects what the tool
talks to. Counts live in memory, for the life of the host.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from host.errors import LimitExceeded

from ._decide import Policy

__all__ = ["Quotas", "Reservation"]

_WINDOW = 60.0


@dataclass(slots=True)
class Reservation:
    """Places taken in the budgets of one call; :meth:`release` gives them back once."""

    _quotas: Quotas | None
    tool: str
    session: str
    stamps: list[float] = field(default_factory=list[float])
    per_session: bool = False

    def release(self) -> None:
        quotas, self._quotas = self._quotas, None
        if quotas is not None:
            quotas._give_back(self)  # pyright: ignore[reportPrivateUsage]


_NOTHING = Reservation(None, "", "")
"""What a call covered by no budget reserves (releasing it does nothing)."""


class Quotas:
    """Counts calls against the budgets of the policy in force."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._sessions: dict[tuple[str, str], int] = {}
        self._recent: dict[str, deque[float]] = {}

    def __repr__(self) -> str:
        return f"<Quotas sessions={len(self._sessions)} tools={len(self._recent)}>"

    def reserve(self, policy: Policy, tool: str, session: str) -> Reservation:
        """Take one place in every budget covering ``tool``. Raises :class:`LimitExceeded`."""
        quotas = policy.quotas_for(tool)
        if not quotas:
            return _NOTHING
        reservation = Reservation(self, tool, session)
        now = self._clock()
        recent = self._recent.setdefault(tool, deque())
        while recent and recent[0] <= now - _WINDOW:
            recent.popleft()
        used = self._sessions.get((session, tool), 0)
        for quota in quotas:
            if quota.per_session is not None and used >= quota.per_session:
                raise LimitExceeded(
                    "per_session",
                    f"{tool} may be called {quota.per_session} times per session, "
                    "and this session has used them all",
                    tool=tool,
                )
            if quota.per_minute is not None and len(recent) >= quota.per_minute:
                wait = recent[-quota.per_minute] + _WINDOW - now
                raise LimitExceeded(
                    "per_minute",
                    f"{tool} may be called {quota.per_minute} times per minute; "
                    f"try again in {max(wait, 0.1):.1f} s",
                    tool=tool,
                )
        if any(q.per_session is not None for q in quotas):
            self._sessions[(session, tool)] = used + 1
            reservation.per_session = True
        if any(q.per_minute is not None for q in quotas):
            recent.append(now)
            reservation.stamps.append(now)
        return reservation

    def _give_back(self, reservation: Reservation) -> None:
        key = (reservation.session, reservation.tool)
        if reservation.per_session and self._sessions.get(key, 0) > 0:
            self._sessions[key] -= 1
        recent = self._recent.get(reservation.tool)
        for stamp in reservation.stamps:
            if recent is not None and stamp in recent:
                recent.remove(stamp)

    def forget_session(self, session: str) -> None:
        """Drop a closed session's counts."""
        for key in [k for k in self._sessions if k[0] == session]:
            del self._sessions[key]
