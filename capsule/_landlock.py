"""Landlock from the standard library: the worker of a subprocess capsule gives up, before
it loads a tool, writing anywhere but where it may, reading the host's state, and
signalling or tracing any process outside its own tree (Linux 5.13 and later).

Three syscalls, called through ctypes. A *ruleset* names the rights it handles; a rule
grants some of them beneath one file or folder (the whole subtree); after
``landlock_restrict_self`` every handled right that no rule grants is denied to this
thread and every process or thread it starts later (the domain is inherited and cannot
be left). So it must run before the capsule starts a thread: a thread started earlier
stays outside the domain.

What the capsule is asked for (:func:`restrict`, from the host's ``Guard``):

* **writes** (create, remove, rename, write, truncate) only beneath the ``write`` roots,
  minus the ``deny_write`` paths;
* **reads** of file contents everywhere but beneath ``deny_read`` (folder listings stay
  allowed: names of the denied folders' entries show, their contents do not);
* **network** (ABI 4): no TCP ``bind`` or ``connect`` but to the ports the policy
  allows (``[capsules] network``), whatever the address (Landlock filters ports, not hosts);
* **scopes** (ABI 6): no signal to a process outside the domain (the reaper, the host,
  another session's capsule) and no connection to an abstract Unix socket made outside it.
  Landlock also denies tracing (``ptrace``, ``/proc/PID/mem``) of processes outside it.

Landlock only grants. "All of this root but that path" is built from the complement:
every entry of each folder on the way from the root down to a denied path gets its own
rule, except the folder holding the denied path, which gets none. The price: nothing can
be created, removed or renamed directly in such a folder (the project folder, and the
folders above it up to the write root), and a file created there later has no rule (its
contents cannot be read either). Symbolic links get no rule: a path through one is
checked where it leads.
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["abi", "restrict", "NET_ABI", "SCOPED_ABI"]

_CREATE_RULESET = 444  # the same numbers on every architecture using the generic table
_ADD_RULE = 445
_RESTRICT_SELF = 446
_VERSION = 1 << 0  # landlock_create_ruleset(NULL, 0, VERSION) returns the ABI
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

_EXECUTE = 1 << 0
_WRITE_FILE = 1 << 1
_READ_FILE = 1 << 2
_REMOVE_DIR = 1 << 4
_REMOVE_FILE = 1 << 5
_MAKE_CHAR = 1 << 6
_MAKE_DIR = 1 << 7
_MAKE_REG = 1 << 8
_MAKE_SOCK = 1 << 9
_MAKE_FIFO = 1 << 10
_MAKE_BLOCK = 1 << 11
_MAKE_SYM = 1 << 12
_REFER = 1 << 13  # ABI 2
_TRUNCATE = 1 << 14  # ABI 3
_IOCTL_DEV = 1 << 15  # ABI 5

_NET_BIND_TCP = 1 << 0  # ABI 4
_NET_CONNECT_TCP = 1 << 1  # ABI 4
_RULE_NET_PORT = 2
NET_ABI = 4
"""The first ABI that handles TCP bind and connect: Linux 6.7."""

_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
_SCOPE_SIGNAL = 1 << 1  # ABI 6
SCOPED_ABI = 6
"""The first ABI with scopes (signals, abstract Unix sockets): Linux 6.12."""

_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
_FS_LATEST = (1 << 16) - 1  # ABI 5 and later (checked up to 7)

_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
"""The only rights a rule on something other than a folder may carry (else EINVAL)."""

_WRITE_RIGHTS = (
    _WRITE_FILE
    | _TRUNCATE
    | _REMOVE_DIR
    | _REMOVE_FILE
    | _MAKE_CHAR
    | _MAKE_DIR
    | _MAKE_REG
    | _MAKE_SOCK
    | _MAKE_FIFO
    | _MAKE_BLOCK
    | _MAKE_SYM
)


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),  # ABI 4
        ("scoped", ctypes.c_uint64),  # ABI 6
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)): 12 bytes
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class _NetPortAttr(ctypes.Structure):
    _fields_ = (("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64))


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    """Judge by the return value; only then is errno meaningful."""
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def abi() -> int:
    """The kernel's Landlock ABI: 0 if it has none (not built, or disabled at boot)."""
    try:
        syscall = _libc().syscall
    except (OSError, AttributeError):
        return 0
    syscall.restype = ctypes.c_long
    result = int(syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION)))
    return max(result, 0)


class _Ruleset:
    """A ruleset being built, clamped to what the running kernel knows."""

    def __init__(self, version: int, fs: int, scoped: int, net: int = 0) -> None:
        self._libc = _libc()
        self._syscall = self._libc.syscall
        self._syscall.restype = ctypes.c_long
        self.fs = fs & _FS_BY_ABI.get(version, _FS_LATEST)
        self.scoped = scoped if version >= SCOPED_ABI else 0
        self.net = net if version >= NET_ABI else 0
        attr = _RulesetAttr(self.fs, self.net, self.scoped)
        # The smallest size that holds the fields used: an older kernel refuses a larger
        # struct whose tail it does not know (E2BIG) unless that tail is zero.
        size = 24 if self.scoped else 16 if self.net else 8
        self.fd = _check(
            self._syscall(
                _CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)
            ),
            "landlock_create_ruleset",
        )
        self._beneath = _PathBeneathAttr(0, -1)
        self._add_beneath = (
            _ADD_RULE,
            ctypes.c_int(self.fd),
            ctypes.c_int(_RULE_PATH_BENEATH),
            ctypes.byref(self._beneath),
            ctypes.c_uint32(0),
        )

    def grant(self, path: str, access: int) -> None:
        """Grant ``access`` beneath ``path``; a path that cannot be opened stays denied."""
        access &= self.fs
        if not access:
            return
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return  # gone, or out of reach for this user anyway: nothing granted
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                return  # a link: what it leads to is checked where it lives
            if not stat.S_ISDIR(mode):
                access &= _FILE_RIGHTS
                if not access:
                    return
            # One rule per entry of a crowded folder (thousands in a busy /tmp): the
            # call's arguments are made once per ruleset, only the rule's fields change.
            attr = self._beneath
            attr.allowed_access = access
            attr.parent_fd = fd
            if self._syscall(*self._add_beneath) < 0:
                _check(-1, f"landlock_add_rule({path!r})")
        finally:
            os.close(fd)

    def grant_port(self, port: int, access: int) -> None:
        """Grant ``access`` (TCP bind, connect) on ``port``, whatever the address."""
        access &= self.net
        if not access:
            return
        self._add(_RULE_NET_PORT, _NetPortAttr(access, port), f"port {port}")

    def _add(self, kind: int, attr: ctypes.Structure, what: str) -> None:
        """``landlock_add_rule`` of one rule of ``kind``; raises OSError naming ``what``."""
        _check(
            self._syscall(
                _ADD_RULE,
                ctypes.c_int(self.fd),
                ctypes.c_int(kind),
                ctypes.byref(attr),
                ctypes.c_uint32(0),
            ),
            f"landlock_add_rule({what})",
        )

    def enforce(self) -> None:
        """No new privileges, then the domain: this thread and everything it starts."""
        try:
            _check(self._libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
            _check(
                self._syscall(_RESTRICT_SELF, ctypes.c_int(self.fd), ctypes.c_uint32(0)),
                "landlock_restrict_self",
            )
        finally:
            os.close(self.fd)


def _real(paths: Iterable[str]) -> list[str]:
    """Each path with its links resolved (rules bind what a name leads to), in order."""
    return sorted({os.path.realpath(p) for p in paths})


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _grant_except(grants: dict[str, int], root: str, denied: Sequence[str], access: int) -> None:
    """Add ``access`` beneath ``root`` except beneath each ``denied`` path to ``grants``
    (path -> access; :func:`restrict` makes one rule per path, whatever was added).

    Every folder from ``root`` down to the parent of a denied path gets no rule of its
    own; every other entry of such a folder gets one (its whole subtree). One rule per
    path, with every access granted to it: two rules on one file are the same as one
    with both rights, and a crowded folder (``/tmp``) above both a denied path and a
    writable root is read once and ruled once per entry, not twice.
    """
    inside = _inside(root, denied)
    if root in inside:
        return
    if not inside:
        grants[root] = grants.get(root, 0) | access
        return
    ancestors = _ancestors(root, inside)
    for folder in sorted(ancestors):
        try:
            names = os.listdir(folder)
        except OSError:
            continue  # nothing beneath it is granted
        for name in names:
            entry = os.path.join(folder, name)
            if entry in ancestors or entry in inside:
                continue
            grants[entry] = grants.get(entry, 0) | access


def _ancestors(root: str, inside: set[str]) -> set[str]:
    """The folders from ``root`` down to the parent of each path in ``inside`` (paths
    beneath ``root``): the folders :func:`_grant_except` lists, one rule per entry."""
    ancestors: set[str] = set()
    for path in inside:
        folder = os.path.dirname(path)
        while _under(folder, root):
            ancestors.add(folder)
            if folder == root:
                break
            folder = os.path.dirname(folder)
    return ancestors


def _inside(root: str, denied: Sequence[str]) -> set[str]:
    return {d for d in denied if _under(d, root)}


def _plan(spec: Mapping[str, Any]) -> list[tuple[str, list[str], int]]:
    """The grants :func:`restrict` makes for ``spec``, each (root, denied paths, access):
    ``access`` beneath ``root`` except beneath the denied paths (:func:`_grant_except`).
    Reading everywhere but where reading is denied; writing beneath each writable root
    that is not itself denied, but where writing (or reading) is denied."""
    deny_write = _real([*spec.get("deny_write", ()), *spec.get("deny_read", ())])
    plan = [("/", _real(spec.get("deny_read", ())), _READ_FILE)]
    for root in _real(spec.get("write", ())):
        if not any(_under(root, d) for d in deny_write):
            plan.append((root, deny_write, _WRITE_RIGHTS))
    return plan


def listed(spec: Mapping[str, Any]) -> list[str]:
    """The folders :func:`restrict` lists to make its rules for ``spec``, each a rule
    per entry: an entry made (or replaced) in one of them afterwards is covered by no
    rule. So rules made earlier are out of date once one of them changes."""
    folders: set[str] = set()
    for root, denied, _ in _plan(spec):
        inside = _inside(root, denied)
        if root not in inside:
            folders |= _ancestors(root, inside)
    return sorted(folders)


def restrict(spec: Mapping[str, Any]) -> int:
    """Confine this process (and everything it starts) as ``spec`` says; returns the ABI.

    ``spec``: ``write`` (roots beneath which writing is allowed), ``deny_write`` and
    ``deny_read`` (paths beneath which it is not; a path need not exist), ``network``
    (``"none"``: no TCP bind or connect but to the ``connect_ports``; ``"all"``, or
    absent: TCP is not restricted) and ``netns`` (the process is in a network namespace
    of its own: with it, a kernel without Landlock's TCP rules still has no network).
    Call it before any thread starts.

    Raises:
        OSError: Landlock is missing or refused the ruleset; nothing was restricted
            (unless the very last step failed, which leaves the process as restricted
            as the kernel got it).
    """
    version = abi()
    if version < 1:
        raise OSError(38, "this kernel has no Landlock")
    closed = spec.get("network", "all") == "none"
    if closed and version < NET_ABI and not spec.get("netns"):
        raise OSError(
            95,
            f"this kernel's Landlock (ABI {version}) cannot take TCP away and no network "
            f"namespace could be made ({spec.get('netns_failure') or 'not tried'}): "
            'set [capsules] network = "all" to run the tools with the network',
        )
    rules = _Ruleset(
        version,
        fs=_WRITE_RIGHTS | _READ_FILE | _REFER,
        scoped=_SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET,
        net=_NET_BIND_TCP | _NET_CONNECT_TCP if closed else 0,
    )
    for port in spec.get("connect_ports", ()) if closed else ():
        if type(port) is not int or not 0 < port < 65536:
            raise ValueError(f"connect_ports holds {port!r}, not a port")
        rules.grant_port(port, _NET_CONNECT_TCP)
    # A cross-folder rename or link needs REFER, which every ruleset denies unless it is
    # granted: grant it everywhere. A move that would give a file more rights where it
    # lands (out of a denied folder) is still refused (EXDEV), and creating or removing
    # entries still needs the other rights.
    grants: dict[str, int] = {"/": _REFER}
    for root, denied, access in _plan(spec):
        _grant_except(grants, root, denied, access)
    for path, access in grants.items():
        rules.grant(path, access)
    rules.enforce()
    return version
