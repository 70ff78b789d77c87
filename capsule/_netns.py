"""No network for a tool capsule: a network namespace of its own (Linux).

Landlock (``_landlock``) takes TCP ``connect`` and ``bind`` away on kernels that have its
network rules (ABI 4, Linux 6.7), and only TCP. A network namespace takes everything:
the capsule's only interface is its own loopback, down, so UDP, raw and TCP sockets
reach nothing, not the host's loopback services, not the outside. It needs no privilege
where the kernel lets users make user namespaces: the process moves into a new user
namespace (where it keeps its own user and group id, mapped one to one, so files it
makes are its user's as before) and a new network namespace owned by it. The
capabilities that come with the new user namespace reach only what that namespace owns;
the capsule gives them up right after (``drop_privileges``).

Standard library only (ctypes); called before any thread starts (``unshare`` of a user
namespace refuses a threaded process).
"""

from __future__ import annotations

import os
import sys

__all__ = ["isolate"]

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4


def isolate() -> str | None:
    """Move this process into a new user and network namespace. None when done, else
    why not (the kernel refuses user namespaces, or this is not Linux): nothing changed.

    Raises:
        OSError: the namespaces were made but their id maps could not be written (the
            process is in them, as an unmapped user: it must not go on).
    """
    if not sys.platform.startswith("linux"):
        return "not Linux"
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except (OSError, AttributeError) as exc:
        return f"no C library: {exc}"
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        return f"unshare: {os.strerror(ctypes.get_errno())}"
    # A process that is not dumpable (the capsule makes itself so at once) finds its
    # /proc/self files owned by root, and cannot write its own id maps: dumpable for the
    # three writes only. Another process of the user could attach in that moment only if
    # it is not itself confined (Landlock keeps a confined tool from tracing it).
    dumpable = libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)
    if dumpable != 1:
        libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
    try:
        _write("/proc/self/setgroups", "deny")  # required before an unprivileged gid_map
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    finally:
        if dumpable != 1:
            libc.prctl(_PR_SET_DUMPABLE, max(dumpable, 0), 0, 0, 0)
    return None


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
