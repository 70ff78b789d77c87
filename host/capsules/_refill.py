"""When a pool (``_capsule_pool.py``, ``SandboxPool``) starts its next spare.

Not while the session that took the last spare is at its first use: a new session's
first call or run is what the pool is for, and a spare's start beside it (a capsule's
fork and hardening, a guest's boot and idle warm-up) takes its time from it wherever
the processes share a CPU. So a refill waits until a session has nothing in flight any
more (:meth:`Refill.settle`, from ``Session``'s count of its calls and runs) or for
:data:`GRACE` seconds, whichever comes first: an agent's model thinks for longer than
that between opening a session and its first call, so the spare is still there in time
for the next session. With more CPUs than processes to run, waiting costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.abc

__all__ = ["GRACE", "Refill"]

GRACE = 0.5
"""The longest a refill waits for the host to settle, in seconds."""


class Refill:
    """A pool's next start, put off until the host settles (see the module's text)."""

    def __init__(self, fill: Callable[[], None]) -> None:
        self._fill = fill
        """Starts the spare now (and does nothing if none is wanted any more)."""
        self._due: anyio.Event | None = None

    @property
    def pending(self) -> bool:
        """Whether a refill is waiting for the host to settle."""
        return self._due is not None

    def soon(self, task_group: anyio.abc.TaskGroup) -> None:
        """Fill once the host settles, or in :data:`GRACE` seconds (one wait at a time)."""
        if self._due is None:
            self._due = anyio.Event()
            task_group.start_soon(self._wait, self._due)

    def settle(self) -> None:
        """A session has nothing in flight any more: a waiting refill starts now."""
        if self._due is not None:
            self._due.set()

    async def _wait(self, due: anyio.Event) -> None:
        with anyio.move_on_after(GRACE):
            await due.wait()
        if self._due is due:
            self._due = None
        self._fill()
