"""Starting a capsule process, and killing it with everything it started.

A capsule runs in its own process group and adopts orphaned descendants (it is a child
subreaper on Linux), so its whole tree is: its process group, plus every process whose
parent chain leads back to it. Both are killed with SIGKILL.

Before the first child starts, the host makes itself non-dumpable (Linux), so that a
tool running as the same user cannot read the host's ``/proc/<pid>/environ``, ``mem``
or ``fd``. A capsule run by root drops its capabilities for the
same reason (``capsule/__main__.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

import anyio
import anyio.abc

__all__ = [
    "KEEP_DUMPABLE",
    "descendants",
    "kill_tree",
    "minimal_env",
    "protect_host",
    "spawn_piped",
]

_PR_SET_DUMPABLE = 4
KEEP_DUMPABLE = "TOOLHOST_KEEP_DUMPABLE"
"""Set to ``1`` to leave the host and its capsules dumpable (for a debugger), giving up
that protection."""


def protect_host() -> bool:
    """Make this process non-dumpable; whether it is (``False`` off Linux).

    A non-dumpable process's ``/proc`` entries belong to root and need ``CAP_SYS_PTRACE``
    in the reader, so other processes of the same user (a capsule's tools) cannot read
    its environment or memory. It also means no core dumps, and a same-user debugger
    (``py-spy``, ``gdb -p``) needs root, unless ``TOOLHOST_KEEP_DUMPABLE=1``.
    """
    if not sys.platform.startswith("linux") or os.environ.get(KEEP_DUMPABLE) == "1":
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


async def spawn_piped(
    command: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    pass_fds: Sequence[int] = (),
) -> tuple[anyio.abc.Process, int, int]:
    """Start ``command`` in a new session with two protocol pipes as its stdin and stdout.

    Returns ``(process, host_write_fd, host_read_fd)``; the caller owns both fds and must
    drain the process's stderr (a pipe). The child gets exactly ``env``; no other fd of
    this process is inherited (the ends it needs are closed here once it has them) but
    ``pass_fds``, at the same numbers.
    The host is made non-dumpable first (:func:`protect_host`).
    """
    protect_host()
    child_in, host_out = os.pipe()
    host_in, child_out = os.pipe()
    try:
        process = await anyio.open_process(
            list(command),
            stdin=child_in,
            stdout=child_out,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
            pass_fds=pass_fds,
        )
    except BaseException:
        for fd in (host_out, host_in):
            os.close(fd)
        raise
    finally:
        os.close(child_in)
        os.close(child_out)
    return process, host_out, host_in


def _parents() -> dict[int, int]:
    table: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            # The command name may hold spaces and parentheses: split after the last ')'.
            table[int(entry)] = int(stat[stat.rfind(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return table


def descendants(*roots: int) -> list[int]:
    """Every living descendant of the ``roots`` (Linux; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def _in_group(pid: int, group: int) -> bool:
    try:
        return os.getpgid(pid) == group
    except OSError:
        return False


def kill_tree(pid: int, *members: int) -> None:
    """SIGKILL ``pid``'s descendants, its process group and ``pid`` itself.

    ``members`` are more roots whose descendants die too (a capsule's worker, which may
    outlive its reaper ``pid`` and hold orphans it adopted). Each is used only while it
    is still in ``pid``'s process group: a group id is not reused while any member
    lives, so a reused pid of some other process is never taken for it.
    """
    roots = [pid, *(m for m in members if m != pid and _in_group(m, pid))]
    tree = descendants(*roots) if sys.platform.startswith("linux") else []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for target in [*roots, *tree]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, signal.SIGKILL)


def minimal_env(passed: dict[str, str]) -> dict[str, str]:
    """The environment of a capsule: a minimal base plus exactly what the policy passes."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    for name in ("HOME", "LANG", "TZ"):
        value = os.environ.get(name)
        if value is not None:
            env[name] = value
    env.setdefault("LANG", "C.UTF-8")
    env["PYTHONIOENCODING"] = "utf-8"
    env.update(passed)
    return env
