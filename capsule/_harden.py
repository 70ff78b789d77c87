"""Giving up privileges before untrusted code runs (Linux; elsewhere nothing to do).

Used by the capsule's worker before it loads a tool, and by the code sandbox's weaker
fallback (a CPython child) before the agent's code runs. Standard library only.
"""

from __future__ import annotations

import os
import sys

__all__ = ["drop_privileges"]


def drop_privileges(who: str) -> None:
    """No new privileges, and no capabilities (only a process of root has any), for good.

    A process holding ``CAP_SYS_PTRACE`` (root's) could read any process's ``/proc``
    entries, the non-dumpable host's included, and one holding fewer capabilities than
    the host cannot read the host's. Where the kernel refuses, ``who`` says so on stderr
    and goes on.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)

        class _Header(ctypes.Structure):
            _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))

        class _Data(ctypes.Structure):
            _fields_ = (
                ("effective", ctypes.c_uint32),
                ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32),
            )

        failed = libc.prctl(38, 1, 0, 0, 0) != 0  # PR_SET_NO_NEW_PRIVS
        if os.geteuid() == 0:
            for cap in range(64):  # PR_CAPBSET_DROP until past the kernel's last one
                if libc.prctl(24, cap, 0, 0, 0) != 0:
                    break
            libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
            header = _Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
            failed |= libc.capset(ctypes.byref(header), (_Data * 2)()) != 0
    except (OSError, AttributeError):
        failed = True
    if failed:
        os.write(2, f"toolhost {who}: could not drop privileges; the code keeps them\n".encode())
