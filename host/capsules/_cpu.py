"""The CPU time a code sandbox's guest has used, read from ``/proc`` (Linux).

The sandbox's clock counts the guest's own CPU time while a tool call is in flight (and
between runs), so a run cannot hide computing behind a call it keeps pending.
:class:`CpuMeter` reads ``/proc/PID/stat`` of the guest process: its user and system time,
plus that of the children it has reaped. For the subprocess fallback, whose child may
start processes of its own, the meter also reads the guest's live descendants (found by a
scan of ``/proc`` every :data:`RESCAN` reads, which costs a few milliseconds).

Where ``/proc`` cannot be read (another system, or the process is gone) :meth:`read`
returns ``None``, and the clock then counts wall time instead: it fails closed.

:func:`rearm_cpu_limit` moves the fallback's ``RLIMIT_CPU`` (a backstop for when the host
is gone, counting the process's whole life) up before each run.
"""

from __future__ import annotations

import math
import os
import sys

from ._process import descendants

__all__ = ["CpuMeter", "RESCAN", "rearm_cpu_limit"]

RESCAN = 10
"""Reads between two scans for the guest's descendants (``tree=True`` only)."""

_TICKS = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def _seconds(pid: int, *, reaped: bool = True) -> float | None:
    """utime + stime (+ cutime + cstime: ``reaped``) of ``pid``, in seconds; None if
    unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # The command name may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        return sum(int(x) for x in fields[11 : 15 if reaped else 13]) / _TICKS
    except (OSError, ValueError, IndexError):
        return None


def rearm_cpu_limit(pid: int, seconds: float) -> None:
    """Set ``pid``'s soft ``RLIMIT_CPU`` to the CPU time it has used plus ``seconds``
    (within its hard limit; a guest that raised its own soft limit gets it lowered again).

    The limit counts a process's whole life, the host's budget one run and the idle time
    after it: left as it was set at start, it would end a long-lived sandbox that never
    broke a limit. Best effort (Linux, and a process of this user).
    """
    if not sys.platform.startswith("linux"):
        return
    used = _seconds(pid, reaped=False)
    if used is None:
        return
    import resource

    try:
        _, hard = resource.prlimit(pid, resource.RLIMIT_CPU)
        soft = math.ceil(used + seconds)
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.prlimit(pid, resource.RLIMIT_CPU, (soft, hard))
    except (OSError, ValueError):
        pass


class CpuMeter:
    """CPU seconds used by one process (and, with ``tree``, its descendants) so far."""

    def __init__(self, pid: int, *, tree: bool = False) -> None:
        self._pid = pid
        self._tree = tree
        self._reads = 0
        self._others: list[int] = []

    def read(self) -> float | None:
        """The CPU seconds used so far; None if the process's own entry cannot be read."""
        own = _seconds(self._pid)
        if own is None or not self._tree:
            return own
        if self._reads % RESCAN == 0:
            self._others = descendants(self._pid)
        self._reads += 1
        # A descendant that ended and was reaped counts in its parent's (cutime, cstime);
        # one that left the tree (re-parented to init) and ended is not counted.
        for pid in self._others:
            used = _seconds(pid)
            if used is not None:
                own += used
        return own
