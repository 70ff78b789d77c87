"""One tool capsule process started ahead for the next session (``Host.capsule_pool``).

Most of a new session's wait is its tool capsule getting ready before it imports a tool:
the fork, its network namespace (about 4 ms here), its Landlock rules (one per entry of
each folder above a denied path: 2-7 ms) and the rest of its hardening. None of that
depends on the session: the process is started with the host's settings, and learns
which tool files to load, for which session, from its first frame. So the host keeps one
such process started ahead, hardened and confined and waiting for that frame, and the
next capsule it starts takes it instead of starting one.

A spare is used only by a capsule that would have been started exactly as it was (the
same command, folder and environment, the settings included: a policy reload that
changes them makes the spare useless, and it is killed), with the same Landlock rules
(the folders its rules list an entry of, ``capsule._landlock.listed``, hold the same
names and were not changed since: a file made in the project folder after the spare
started would be readable to a capsule started now, not to the spare), and only while
it is alive and silent: a capsule says nothing before its first frame, so output means
it died. It is never used twice, and no tool code has run in it.

It is kept only while the host has a session open besides its default one: a host that
only ever has its default session (the command line, ``toolhost serve`` over stdio)
would keep a process for no one, and one whose other sessions all ended (a server whose
clients left) keeps nothing of them. ``TOOLHOST_CAPSULE_POOL=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
from collections.abc import Awaitable, Callable, Hashable, Sequence

import anyio
import anyio.abc

from ._process import kill_tree
from ._refill import Refill

__all__ = ["CapsulePool", "wanted"]

logger = logging.getLogger("toolhost.capsule")

Started = tuple[anyio.abc.Process, int, int]
"""A started child: ``(process, host_write_fd, host_read_fd)``."""
Spawn = Callable[[], Awaitable[Started]]

_ENV = "TOOLHOST_CAPSULE_POOL"


def wanted() -> bool:
    """Whether the host keeps a capsule started ahead (``TOOLHOST_CAPSULE_POOL=0``: no)."""
    return os.environ.get(_ENV) != "0"


Stamp = tuple[tuple[str, int, int, int], ...]
"""What the listed folders were: (folder, inode, modification time, hash of its names)
each."""


def stamp(folders: Sequence[str]) -> Stamp:
    """The state of ``folders`` that a capsule's Landlock rules depend on (a folder that
    cannot be read stamps as -1s: a rule cannot be made in it either)."""
    out: list[tuple[str, int, int, int]] = []
    for folder in folders:
        try:
            before = os.stat(folder)
            names = hash(frozenset(os.listdir(folder)))
            after = os.stat(folder)
        except OSError:
            out.append((folder, -1, -1, -1))
            continue
        changed = after.st_mtime_ns if before.st_mtime_ns == after.st_mtime_ns else -2
        out.append((folder, after.st_ino, changed, names))
    return tuple(out)


class _Spare:
    """A capsule process being started, or started, for whoever comes next."""

    def __init__(self, key: Hashable, folders: Sequence[str], stamped: Stamp) -> None:
        self.key = key
        self.folders = folders
        self.stamped = stamped
        """The listed folders as they were just before it started."""
        self.done = anyio.Event()
        self.started: Started | None = None


class Take:
    """One capsule's start through the pool (:meth:`CapsulePool.spawner`): a spawn
    function that remembers whether it handed out the spare."""

    def __init__(
        self,
        pool: CapsulePool,
        key: Hashable,
        spawn: Spawn,
        task_group: anyio.abc.TaskGroup,
        folders: Sequence[str],
    ) -> None:
        self._pool = pool
        self._key = key
        self._folders = folders
        self.spawn = spawn
        """The start without the pool."""
        self._tg = task_group
        self.spare = False
        """Whether the process handed out was the spare."""

    async def __call__(self) -> Started:
        started = await self._pool.take_spare(self._key, self.spawn, self._tg, self._folders)
        self.spare = started is not None
        return started if started is not None else await self.spawn()


class CapsulePool:
    """At most one capsule process started ahead; see the module's text."""

    def __init__(self) -> None:
        self._spare: _Spare | None = None
        self._recipe: tuple[Hashable, Spawn, anyio.abc.TaskGroup, Sequence[str]] | None = None
        """How the last capsule was started: how to start the next spare."""
        self._sessions = False
        self._closed = False
        self.taken = 0
        """Capsules that started from a spare."""
        self.refill = Refill(self.fill)
        """Starts the next spare once the host settles (``_refill.py``)."""

    def __repr__(self) -> str:
        state = "none" if self._spare is None else "one"
        return f"<CapsulePool spare={state} taken={self.taken}>"

    @property
    def spare_pid(self) -> int | None:
        """The pid of the spare started ahead, once it exists."""
        spare = self._spare
        if spare is None or spare.started is None:
            return None
        return spare.started[0].pid

    def spawner(
        self,
        key: Hashable,
        spawn: Spawn,
        task_group: anyio.abc.TaskGroup,
        folders: Sequence[str] = (),
    ) -> Take:
        """``spawn`` for a capsule whose start is described by ``key``, whose Landlock
        rules list the entries of ``folders``: the spare if it was started the same way,
        the folders unchanged since, and is fit; else a new start."""
        return Take(self, key, spawn, task_group, folders)

    async def take_spare(
        self,
        key: Hashable,
        spawn: Spawn,
        task_group: anyio.abc.TaskGroup,
        folders: Sequence[str] = (),
    ) -> Started | None:
        """The spare, if it was started as ``key`` says, ``folders`` unchanged since,
        and is fit (else it is killed); ``spawn`` and ``task_group`` start the next one
        (:meth:`fill`)."""
        self._recipe = (key, spawn, task_group, folders)
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        if spare.key != key or spare.folders != folders or stamp(folders) != spare.stamped:
            task_group.start_soon(_discard_spare, spare)
            return None
        await spare.done.wait()
        started = spare.started
        if started is None:
            return None
        if not _fit(started):
            await _discard(started)
            return None
        self.taken += 1
        return started

    def more_sessions(self) -> None:
        """The host opened a session besides its default one: keep a spare from now on
        (started once the host settles, if none is)."""
        self._sessions = True
        recipe = self._recipe
        if recipe is not None and self._spare is None and not self._closed:
            self.refill.soon(recipe[2])

    def no_more_sessions(self) -> None:
        """The host's last session besides its default one ended: end the spare (the
        next such session starts one again, once it is open)."""
        self._sessions = False
        spare, self._spare = self._spare, None
        recipe = self._recipe
        if spare is not None and recipe is not None:
            recipe[2].start_soon(_discard_spare, spare)

    def fill(self) -> None:
        """Start the next spare in the background, if one is wanted and none is there."""
        recipe = self._recipe
        if self._closed or not self._sessions or self._spare is not None or recipe is None:
            return
        key, spawn, task_group, folders = recipe
        spare = _Spare(key, folders, stamp(folders))
        self._spare = spare
        task_group.start_soon(self._start, spare, spawn)

    @staticmethod
    async def _start(spare: _Spare, spawn: Spawn) -> None:
        """Start ``spare``; whoever took it from the pool meanwhile (a capsule, a
        mismatch, :meth:`aclose`) waits for this and uses or discards it."""
        try:
            spare.started = await spawn()
        except Exception as exc:  # the capsule that wants it starts one itself, and says why
            logger.debug("the spare capsule did not start: %r", exc)
        finally:
            spare.done.set()

    async def aclose(self) -> None:
        """Kill the spare; start no more."""
        self._closed = True
        spare, self._spare = self._spare, None
        if spare is not None:
            await _discard_spare(spare)


def _fit(started: Started) -> bool:
    """Whether a spare can still serve: alive (not even a zombie: its server may not
    have said so yet, and the end of its output may not show while its server still
    holds the other end), and silent (a capsule says nothing before its first frame:
    anything to read on its output, end of file included, means it died or broke).
    Unreaped until it is let go of, so its pid is still its own."""
    process, _, host_in = started
    if process.returncode is not None:
        return False
    try:
        with open(f"/proc/{process.pid}/stat", "rb") as stat:
            if stat.read().rsplit(b")", 1)[-1].split()[0] in (b"Z", b"X"):
                return False
    except FileNotFoundError:
        return False
    except OSError:
        pass  # no /proc here: the other looks decide
    try:
        return not select.select([host_in], [], [], 0)[0]
    except (OSError, ValueError):
        return False


async def _discard_spare(spare: _Spare) -> None:
    with anyio.CancelScope(shield=True), anyio.move_on_after(60):
        await spare.done.wait()  # a start is bounded: the keeper answers or fails
    if spare.started is not None:
        await _discard(spare.started)


async def _discard(started: Started) -> None:
    process, host_out, host_in = started
    if process.returncode is None:  # not reaped yet, so the pid is still its own
        kill_tree(process.pid)
    for fd in (host_out, host_in):
        with contextlib.suppress(OSError):
            os.close(fd)
    with (
        anyio.CancelScope(shield=True),
        anyio.move_on_after(5),
        contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError),
    ):
        await process.aclose()
