"""What a subprocess tool capsule may touch on the host, and whether this kernel can
hold it to that (Landlock).

A subprocess capsule runs as the host's user, so without more its tools could rewrite the
host's state (``.agent/``: the state database and the audit journal), the tool files and
the policy. The worker confines itself before it loads a tool (``capsule/_landlock.py``)
to what a :class:`Guard` allows:

* **writes** only beneath the project folder, ``/tmp``, ``/var/tmp``, ``/dev`` (``null``,
  ``tty``, ``shm``) and its own ``/proc/self``, and never beneath the project's own
  folders and files (:data:`PROTECTED`), the tools folder, or the host's caches and
  code when they lie beneath one of those;
* **reads** of file contents everywhere but beneath ``.agent/``;
* no signal to, and no trace of, any process outside its own tree (ABI 6 and later).

Where the kernel has no Landlock, or ``TOOLHOST_LANDLOCK=0`` switches it off,
:func:`containment` says why, the host says so once at start (a ``landlock_unavailable``
event, printed by the command line) and ``toolhost policy check`` says so too.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

__all__ = ["Guard", "Containment", "PROTECTED", "WRITABLE", "containment", "project_guard"]

SWITCH: Final = "TOOLHOST_LANDLOCK"
"""``0`` in the host's environment: run subprocess capsules without Landlock."""

PROTECTED: Final = (".agent", "policy.toml", "policies", "tools", "src/tools", "hooks", "src/hooks")
"""The project's own files and folders, which tools may not write (relative to it)."""

WRITABLE: Final = ("/tmp", "/var/tmp", "/dev", "/proc/self")
"""Where else tools may write (``/proc/self`` is resolved by the worker: its own)."""

SCOPED_ABI: Final = 6
"""The first Landlock ABI with signal scoping (Linux 6.12)."""

_HOST_CODE = (Path(__file__).resolve().parents[1], Path(__file__).resolve().parents[2] / "capsule")


@dataclass(frozen=True, slots=True)
class Guard:
    """The paths a subprocess capsule's worker confines itself to (all absolute)."""

    write: tuple[str, ...]
    """Roots beneath which writing is allowed."""
    deny_write: tuple[str, ...]
    """Paths beneath which it is not, even inside a root (they need not exist)."""
    deny_read: tuple[str, ...]
    """Paths whose file contents cannot be read (nor written)."""
    network: Literal["none", "all"] = "none"
    """``none``: no TCP bind or connect but to ``connect_ports``; ``all``: TCP as it is."""
    connect_ports: tuple[int, ...] = ()

    def to_data(self) -> dict[str, Any]:
        return {
            "write": list(self.write),
            "deny_write": list(self.deny_write),
            "deny_read": list(self.deny_read),
            "network": self.network,
            "connect_ports": list(self.connect_ports),
        }


def project_guard(
    root: Path,
    tools_dir: str | Path,
    caches: Iterable[Path] = (),
    private: Iterable[Path] = (),
    network: Literal["none", "all"] | Sequence[int] = "none",
) -> Guard:
    """The guard of a project folder: what is written above, for tools loaded from
    ``tools_dir``; ``caches`` are the host's cache folders (never writable either);
    ``private`` are folders tools may neither read nor write (the host's key);
    ``network`` is ``[capsules] network``."""
    root = Path(root)
    protected = [root / name for name in PROTECTED]
    code = [*_HOST_CODE, Path(sys.prefix)]
    return Guard(
        write=(str(root), *WRITABLE),
        deny_write=tuple(str(p) for p in (*protected, Path(tools_dir), *caches, *code)),
        deny_read=(str(root / ".agent"), *(str(p) for p in private)),
        network="all" if network == "all" else "none",
        connect_ports=() if isinstance(network, str) else tuple(network),
    )


@dataclass(frozen=True, slots=True)
class Containment:
    """What this kernel lets a subprocess capsule be held to."""

    abi: int
    """The Landlock ABI in use; 0 when none."""
    reason: str | None = None
    """Why Landlock is not used, when it is not."""

    @property
    def landlock(self) -> bool:
        return self.abi > 0

    @property
    def scoped(self) -> bool:
        """Whether tools are kept from signalling and tracing other processes."""
        return self.abi >= SCOPED_ABI

    def warning(self) -> str | None:
        """What is not enforced here, in one sentence; ``None`` when all of it is."""
        if not self.landlock:
            return (
                f"Landlock is unavailable ({self.reason}): subprocess tool capsules can "
                "write the project's .agent/ (state and audit journal), tool files and "
                "policy files, and signal other processes of this user; give tools that "
                "must not a Wasm capsule"
            )
        if not self.scoped:
            return (
                f"Landlock ABI {self.abi} has no signal scoping (it needs ABI {SCOPED_ABI}, "
                "Linux 6.12): subprocess tool capsules can signal other processes of this user"
            )
        return None

    def to_data(self) -> dict[str, Any]:
        return {"landlock": self.abi or None, "scoped": self.scoped, "reason": self.reason}


def _abi() -> int:
    """The kernel's Landlock ABI (0: none), as ``capsule/_landlock.py`` asks it."""
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return 0
    syscall.restype = ctypes.c_long
    # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))), 0)


def containment() -> Containment:
    """Whether subprocess capsules run under Landlock here, and at which ABI."""
    if not sys.platform.startswith("linux"):
        return Containment(0, "it exists on Linux only")
    if os.environ.get(SWITCH) == "0":
        return Containment(0, f"switched off by {SWITCH}=0")
    abi = _abi()
    if abi < 1:
        return Containment(0, "this kernel has none, or it is disabled at boot")
    return Containment(abi)
