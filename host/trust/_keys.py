"""The host's secret key, and the keyed MACs that tell the host's own writing from others'.

The key is 32 random bytes in a file of the host's user that nobody else may read:
``$TOOLHOST_KEY_FILE``, else ``$XDG_STATE_HOME/toolhost/host.key``, else
``~/.local/state/toolhost/host.key``. It is outside every project (a tool writes there)
and every cache (a cache entry must not carry what vouches for it), made on first use,
and kept in the host's memory after. The audit writer gets it on a pipe, never in its
command line or environment; capsules never get it.

A key that cannot be trusted (a folder on the way that others may write, a file that
others may read, of the wrong size, or a link) is replaced; one that cannot be kept at
all gives way to a key for this process only (:attr:`HostKey.problem` says why): what
it signs does not outlive the process, so caches are rebuilt and grants asked again,
which is slower but never looser.

What a MAC proves is in ``docs/security/trust.md``: another user, and a capsule that
cannot read this file, cannot forge one; a process of the host's own user that can read
the file can.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ._paths import path_problem, private_folder, quarantine

__all__ = ["KEY_ENV", "HostKey", "host_key", "key_path", "mac_parts"]

KEY_ENV: Final = "TOOLHOST_KEY_FILE"
"""The variable naming the key file (tests and unusual homes)."""

KEY_SIZE: Final = 32

Part = str | bytes | int | float | bool | None


def key_path() -> Path:
    """Where the host's key lives (see the module's docstring)."""
    explicit = os.environ.get(KEY_ENV)
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "toolhost" / "host.key"


def _encode(part: Part) -> bytes:
    if part is None:
        tag, data = b"n", b""
    elif isinstance(part, bool):
        tag, data = b"t", b"1" if part else b"0"
    elif isinstance(part, int):
        tag, data = b"i", str(part).encode()
    elif isinstance(part, float):
        tag, data = b"f", part.hex().encode()
    elif isinstance(part, str):
        tag, data = b"s", part.encode("utf-8", "surrogatepass")
    else:
        tag, data = b"b", bytes(part)
    return tag + len(data).to_bytes(8, "little") + data


def mac_parts(parts: Iterable[Part]) -> bytes:
    """The unambiguous byte string a MAC is made over (typed, length-prefixed parts)."""
    return b"".join(_encode(p) for p in parts)


@dataclass(frozen=True, slots=True)
class HostKey:
    """The key, and MACs made with it. Its ``repr`` never shows the secret."""

    secret: bytes = field(repr=False)
    path: Path
    problem: str | None = None
    """Why this key lasts only as long as the process (``None``: it is the kept one)."""
    notice: str | None = None
    """What was wrong with the key or its folder and was mended (a new key was made)."""

    @property
    def persistent(self) -> bool:
        return self.problem is None

    def mac(self, purpose: str, *parts: Part) -> str:
        """A MAC over ``parts`` for ``purpose`` (hex). Each purpose is its own domain."""
        digest = hashlib.blake2b(
            mac_parts(parts),
            key=self.secret,
            digest_size=32,
            person=purpose.encode()[:16],
        )
        return digest.hexdigest()

    def verify(self, tag: object, purpose: str, *parts: Part) -> bool:
        """Whether ``tag`` is this key's MAC over ``parts`` (constant time)."""
        if not isinstance(tag, str) or len(tag) != 64:
            return False
        return hmac.compare_digest(tag, self.mac(purpose, *parts))


_keys: dict[str, HostKey] = {}
_lock = threading.Lock()


def host_key(path: Path | None = None) -> HostKey:
    """The host's key (made on first use), once per process and path. Thread-safe."""
    path = path or key_path()
    with _lock:
        found = _keys.get(str(path))
        if found is None:
            found = _load(path)
            _keys[str(path)] = found
        return found


def _ephemeral(path: Path, problem: str) -> HostKey:
    return HostKey(os.urandom(KEY_SIZE), path, problem)


def _load(path: Path) -> HostKey:
    folder = private_folder(path.parent)
    if folder.problem is not None:
        return _ephemeral(path, f"the key's folder cannot be trusted: {folder.problem}")
    notices = list(folder.notices)
    try:
        secret: bytes | None = _read(path)
    except FileNotFoundError:
        secret = None
    except _Untrusted as exc:  # what the old key signed no longer verifies
        notices.append(f"{exc}; a new key was made")
        quarantine(path)
        secret = None
    if secret is None:
        try:
            secret = _create(path)
        except OSError as exc:
            return _ephemeral(path, f"the key file cannot be written: {exc}")
    return HostKey(secret, path, None, "; ".join(notices) or None)


class _Untrusted(Exception):
    pass


def _read(path: Path) -> bytes:
    problem = path_problem(path, private_from=path.parent)
    if problem is not None and "does not exist" in problem:
        raise FileNotFoundError(path)
    if problem is not None:
        raise _Untrusted(problem)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077 or info.st_uid != os.geteuid():
            raise _Untrusted(f"{path} may be read or written by others")
        data = os.read(fd, KEY_SIZE + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_SIZE:
        raise _Untrusted(f"{path} is not a key ({len(data)} bytes)")
    return data


def _create(path: Path) -> bytes:
    """Write a new key under a private name, then link it into place: two hosts starting
    at once agree on one key (the second finds the first's)."""
    secret = os.urandom(KEY_SIZE)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secret[:4].hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, secret)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        try:
            return _read(path)
        except (OSError, _Untrusted):
            raise OSError(f"{path} appeared and cannot be used as a key") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return secret
