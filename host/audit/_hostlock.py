"""Host liveness: a lock the kernel drops when the host dies, and who the host's process is.

A host holds ``hosts/<host_id>.lock`` (beside the state database) locked (``flock``) for
its whole life: the kernel releases it when the process ends, however it ends. Another
process that can take the lock knows that host is gone, so its open audit records,
pending approvals and journal can be closed or replayed; a live host's never are.

A file anyone of the host's user can remove cannot be the only evidence, though: a host
whose lock file was deleted still runs, and must not be taken for dead (its journal would
be replayed and removed under it, its calls in flight closed as lost). So each host also
records its process's identity (boot, pid namespace, pid and start time: a pid alone is
reused) where the store keeps it, and a host is dead only when its lock is free *and* no
process with that identity runs. Where the identity cannot be checked (another pid
namespace, not Linux), a missing lock file proves nothing and the host is left alone.

Standard library only: it knows nothing of the database it guards.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

__all__ = ["HostLock", "identity", "running", "same_machine"]

if sys.platform != "win32":
    import fcntl

    def _lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

else:  # pragma: no cover - no advisory locks: other hosts' records are left open

    def _lock(fd: int) -> bool:
        del fd
        return False


def _boot() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _namespace(pid: int | str = "self") -> str:
    try:
        return str(os.stat(f"/proc/{pid}/ns/pid").st_ino)
    except OSError:
        return ""


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # the command name may hold spaces
    return fields[19] if len(fields) > 19 else None


def identity() -> str | None:
    """This process's identity: ``boot:namespace:pid:start``, or None where unknown."""
    boot, namespace = _boot(), _namespace()
    start = _start_ticks(os.getpid())
    if not boot or not namespace or start is None:
        return None
    return f"{boot}:{namespace}:{os.getpid()}:{start}"


def running(ident: str | None) -> bool | None:
    """Whether the process ``ident`` names still runs; None when this process cannot tell
    (no identity, another pid namespace)."""
    if not ident:
        return None
    parts = ident.split(":")
    if len(parts) != 4 or not parts[2].isdigit():
        return None
    boot, namespace, pid, start = parts
    if boot != _boot():
        return False  # the machine restarted since
    if namespace != _namespace():
        return None
    return _start_ticks(int(pid)) == start


def same_machine(ident: str | None) -> bool:
    """Whether the process ``ident`` names ran on this machine, since its last boot, in
    this pid namespace (so its lock and :func:`running` can tell whether it is gone)."""
    parts = (ident or "").split(":")
    return len(parts) == 4 and parts[0] == _boot() and parts[1] == _namespace()


class HostLock:
    """A file under ``hosts/`` locked while the host runs; the OS drops it when we die."""

    def __init__(self, folder: Path, host_id: str) -> None:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder = folder
        self.host_id = host_id
        self.path = folder / f"{host_id}.lock"
        self._fd: int | None = self._make()

    def _make(self) -> int:
        # Locked before it appears under its name, so no other host ever sees it unlocked.
        hidden = self.folder / f".{self.host_id}.{os.getpid()}.tmp"
        fd = os.open(hidden, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        _lock(fd)
        os.replace(hidden, self.path)
        return fd

    def verify(self) -> bool:
        """Whether the lock file is still ours; made again (and locked) if it was removed
        or replaced. Returns False when it had to be made again."""
        fd = self._fd
        if fd is None:
            return True
        try:
            mine, there = os.fstat(fd), os.stat(self.path)
            if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
                return True
        except OSError:
            pass
        with contextlib.suppress(OSError):
            self._fd = self._make()
            os.close(fd)  # the old one, after the new one holds the name
        return False

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(fd)

    @staticmethod
    def is_dead(folder: Path, host_id: str, ident: str | None = None) -> bool:
        """True when ``host_id`` is gone: nobody holds its lock and no process with its
        identity ``ident`` runs (its lock file is then removed). A missing lock file and no
        way to check the identity: not dead (it may only have lost its file)."""
        path = folder / f"{host_id}.lock"
        alive = running(ident)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return alive is False
        try:
            if not _lock(fd):
                return False
            if alive:  # its lock file was replaced: the host itself still runs
                return False
            with contextlib.suppress(OSError):
                path.unlink()
            return True
        finally:
            os.close(fd)
