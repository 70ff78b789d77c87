"""Host liveness: one locked file per running host, which the OS drops when the host dies.

A host holds ``hosts/<host_id>.lock`` (beside the state database) locked while it runs.
Another process that finds the file unlocked knows that host is gone, so its open audit
records, pending approvals and journal can be closed or replayed; a live host's never are.
Standard library only: it knows nothing of the database it guards.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

__all__ = ["HostLock"]

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


class HostLock:
    """A file under ``hosts/`` locked while the host runs; the OS drops it when we die."""

    def __init__(self, folder: Path, host_id: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{host_id}.lock"
        # Locked before it appears under its name, so no other host ever sees it unlocked.
        hidden = folder / f".{host_id}.{os.getpid()}.tmp"
        self._fd: int | None = os.open(hidden, os.O_CREAT | os.O_RDWR, 0o600)
        _lock(self._fd)
        os.replace(hidden, self.path)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(fd)

    @staticmethod
    def is_dead(folder: Path, host_id: str) -> bool:
        """True when no running host holds ``host_id``'s lock (its file is then removed)."""
        path = folder / f"{host_id}.lock"
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return True
        try:
            if not _lock(fd):
                return False
            with contextlib.suppress(OSError):
                path.unlink()
            return True
        finally:
            os.close(fd)
