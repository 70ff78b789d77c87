"""What ``host.stats()`` reports: the figures of a running host, and how they are taken.

``CallRate`` counts calls in one-second buckets (a few operations per call, no lock: the
host's calls run on one event loop). ``process_memory`` reads the memory of a process and
of every process below it from ``/proc`` (Linux): the proportional set size
(``/proc/PID/smaps_rollup``, pages shared between processes divided among them), or the
resident set size (``/proc/PID/statm``) of a process whose ``smaps_rollup`` cannot be read
(a non-dumpable capsule read by a host that is not root). It blocks: run it in a thread.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CallRate", "CapsuleCounts", "HostStats", "Memory", "process_memory"]

RATE_WINDOW: Final = 10
"""Seconds over which ``calls_per_second`` is averaged (the last whole seconds)."""

_PAGE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CapsuleCounts(_Frozen):
    """Live capsules by kind (a session whose capsules were stopped when idle has none)."""

    subprocess: int = 0
    """Tool capsules running in a subprocess (``python -m capsule``)."""
    wasm: int = 0
    """Tool capsules running in WebAssembly (``[capsules] wasm``)."""
    other: int = 0
    """Tool capsules of a transport the app gave (``Host.open(capsule=...)``)."""
    code: int = 0
    """Code sandboxes (``run_code``) with a guest running."""


class Memory(_Frozen):
    """The memory of the host process and every process below it (capsules, their keepers,
    the fork servers, the journal's writer)."""

    bytes: int
    """The total: proportional set size where it could be read, else resident set size."""
    processes: int
    """Processes counted (the host included)."""
    rss_only: int = 0
    """Processes whose proportional set size could not be read and whose resident set size
    was counted instead (it counts shared pages in full, so the total is then higher than
    the memory really used). 0 when the host runs as root or the capsules are dumpable."""
    measured: bool = True
    """False where ``/proc`` cannot be read (not Linux): ``bytes`` is then 0."""


class HostStats(_Frozen):
    """What ``await host.stats()`` returns: a snapshot of a running host."""

    sessions: int
    """Sessions open (the default one included)."""
    idle_sessions: int
    """Open sessions whose capsules were stopped because they sat idle (``[limits]
    session_idle``); their next call starts them again."""
    capsules: CapsuleCounts
    """Live capsules by kind."""
    memory: Memory
    calls_total: int
    """Calls made since the host opened, whatever their outcome (nested calls a tool made
    through its context included)."""
    calls_per_second: float
    """Calls per second over the last ``window`` seconds."""
    window: float = Field(default=float(RATE_WINDOW))
    """Seconds ``calls_per_second`` is averaged over."""
    approvals_pending: int
    """Calls of this host waiting for an approval now."""
    session_idle: float | None
    """The ``[limits] session_idle`` in force, in seconds (``None``: off)."""


class CallRate:
    """Calls counted in one-second buckets; ``per_second()`` averages the recent ones."""

    __slots__ = ("_buckets", "_second", "_start", "total")

    def __init__(self) -> None:
        self._buckets = [0] * RATE_WINDOW
        self._start = time.monotonic()
        self._second = int(self._start)
        self.total = 0

    def _advance(self, now: int) -> None:
        gap = now - self._second
        if gap <= 0:
            return
        size = len(self._buckets)
        for step in range(1, min(gap, size) + 1):
            self._buckets[(self._second + step) % size] = 0
        self._second = now

    def tick(self) -> None:
        """Count one call, now."""
        now = int(time.monotonic())
        if now != self._second:
            self._advance(now)
        self._buckets[now % len(self._buckets)] += 1
        self.total += 1

    def per_second(self) -> float:
        """Calls per second over the last ``RATE_WINDOW`` seconds: the seconds before
        this one and what has passed of it (since the counter started, if that is less;
        at least one second)."""
        now = time.monotonic()
        self._advance(int(now))
        span = min(RATE_WINDOW - 1 + (now - int(now)), now - self._start)
        return sum(self._buckets) / max(span, 1.0)


def _children(pid: int) -> list[int]:
    """The children of ``pid`` (``/proc/PID/task/TID/children``, one file per thread)."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except OSError:
            continue
        found.extend(int(p) for p in text.split())
    return found


def _parents() -> dict[int, list[int]]:
    """Every process's children, from each one's parent in ``/proc/PID/stat`` (for kernels
    without the ``children`` files)."""
    below: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        below.setdefault(parent, []).append(int(name))
    return below


def _pss(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return None


def _rss(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
    except OSError:
        return None
    return int(fields[1]) * _PAGE


def process_memory(pid: int | None = None) -> Memory:
    """The memory of ``pid`` (default: this process) and of every process below it."""
    root = os.getpid() if pid is None else pid
    if not Path(f"/proc/{root}/statm").exists():
        return Memory(bytes=0, processes=0, measured=False)
    table = None if Path(f"/proc/{root}/task/{root}/children").exists() else _parents()
    total = processes = rss_only = 0
    seen: set[int] = set()
    todo = [root]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        size = _pss(current)
        if size is None:
            size = _rss(current)
            if size is None:
                continue  # it ended while we looked
            rss_only += 1
        total += size
        processes += 1
        todo.extend(_children(current) if table is None else table.get(current, []))
    return Memory(bytes=total, processes=processes, rss_only=rss_only)
