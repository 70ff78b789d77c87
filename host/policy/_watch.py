"""Knowing cheaply whether files may have changed: Linux inotify, read without blocking.

The policy in force must follow its files from the very next call after an edit, and a
call must not pay for a round of ``stat`` calls to find out. An inotify instance watching
the policy folders (and each file, so a symlinked file is followed to its target) answers
"did anything happen?" with one non-blocking ``read``: the kernel queues the event before
the writer's ``write``, ``rename`` or ``unlink`` returns, so nothing done before a call
can be missed. Where inotify is missing (not Linux, no ``libc``, the watch limit reached)
:func:`open_watch` returns ``None`` and the caller checks the files every time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

__all__ = ["Watch", "open_watch"]

_IN_NONBLOCK: Final = os.O_NONBLOCK
_IN_CLOEXEC: Final = os.O_CLOEXEC
_MASK: Final = (
    0x00000002  # IN_MODIFY
    | 0x00000004  # IN_ATTRIB
    | 0x00000008  # IN_CLOSE_WRITE
    | 0x00000040  # IN_MOVED_FROM
    | 0x00000080  # IN_MOVED_TO
    | 0x00000100  # IN_CREATE
    | 0x00000200  # IN_DELETE
    | 0x00000400  # IN_DELETE_SELF
    | 0x00000800  # IN_MOVE_SELF
)

_libc: Any = None


def _load() -> Any:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c") or "libc.so.6"
        libc = ctypes.CDLL(name, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_init1.restype = ctypes.c_int
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_add_watch.restype = ctypes.c_int
        _libc = libc
    return _libc


class Watch:
    """One inotify instance. :meth:`changed` is true once after any watched change."""

    def __init__(self, fd: int, libc: Any) -> None:
        self._fd = fd
        self._libc = libc
        self._watched: set[str] = set()
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def add(self, paths: Iterable[Path]) -> bool:
        """Watch these paths (folders: their entries too). False if one could not be
        watched, and it does not exist is no failure: its folder reports its creation."""
        ok = True
        for path in paths:
            key = os.fsencode(path)
            if path.as_posix() in self._watched:
                continue
            if self._libc.inotify_add_watch(self._fd, key, _MASK) < 0:
                if ctypes.get_errno() not in (2, 20):  # ENOENT, ENOTDIR
                    ok = False
                continue
            self._watched.add(path.as_posix())
        return ok

    def changed(self) -> bool:
        """Whether any event arrived since the last call (the queue is emptied)."""
        if not self._poll.poll(0):  # the common case: one system call, no exception
            return False
        seen = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return seen
            except OSError:
                return True  # cannot tell: assume a change
            if not data:
                return True
            seen = True
            self._watched.clear()  # re-added by the caller: a watched file may be new

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def open_watch(paths: Iterable[Path]) -> Watch | None:
    """A watch on ``paths``, or ``None`` where inotify cannot be used."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = _load()
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    except (OSError, AttributeError):
        return None
    if fd < 0:
        return None
    watch = Watch(fd, libc)
    if not watch.add(paths):
        watch.close()
        return None
    return watch
