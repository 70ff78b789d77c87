"""Keep built scopes, so a start with unchanged tools does not run pyright.

A scope is a pure function of the tool files' contents, the pyright version and its
settings, the Python that pyright resolves imports against, and the code that builds it;
the cache key is a SHA-256 over exactly those. Entries are content-addressed JSON files in
``scopes/`` of toolhost's one cache folder (:func:`cache_root`: ``$TOOLHOST_CACHE``, else
``$XDG_CACHE_HOME/toolhost``, else ``~/.cache/toolhost``), so projects with the same
tools share them and nothing is written into the project. Writes are atomic (a temporary
file renamed into place); a failed build raises and writes nothing.

An entry is an input, never the truth: a rewritten one loosened argument validation and
changed the docstring the model sees. So each entry starts with a keyed MAC (the host's
key, ``host.trust``, kept outside the cache) over its cache key and its bytes, and every
use checks the folders on the way (owned by this user, written by nobody else) and the
MAC before the entry is parsed. An entry that fails is a miss: moved aside, built again
(one pyright run) and reported (``on_reject``: the host emits ``cache_rejected``); a
folder that cannot be trusted is moved aside, or, above the cache, not written to.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Final

from host.trust import host_key, path_problem, private_folder, quarantine

from . import _pyright
from ._build import Runner, build_scope
from ._scope import Scope
from ._specs import Discovery

__all__ = [
    "cache_root",
    "cache_dir",
    "scope_key",
    "load",
    "store",
    "load_or_build_scope",
    "MAX_ENTRIES",
]

logger = logging.getLogger("toolhost")
_warned: set[str] = set()

MAX_ENTRIES: Final = 256
"""Entries kept; the least recently written go first."""

_FORMAT: Final = b"toolhost-scope-2"
"""In the key: changed with the layout of an entry (2: a MAC line before the JSON)."""
_CODE: Final = (
    "_build.py",
    "_pyright.py",
    "_model.py",
    "_shapes.py",
    "_typeexpr.py",
    "_typeindex.py",
    "_docstrings.py",
    "_discovery.py",
    "_specs.py",
    "_reading.py",
    "_exports.py",
)
"""The modules whose code decides what a scope holds (their text is part of the key)."""


def cache_root() -> Path:
    """toolhost's one cache folder: ``$TOOLHOST_CACHE``, else ``$XDG_CACHE_HOME/toolhost``,
    else ``~/.cache/toolhost``. Each use has a subfolder: ``scopes/`` here, ``wasm/`` for
    compiled Wasm modules and the guest library."""
    explicit = os.environ.get("TOOLHOST_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "toolhost"


def cache_dir() -> Path:
    """``scopes/`` in the cache folder. ``$TOOLHOST_CACHE_DIR``, the old name of this
    folder alone, is still read (with a deprecation note in the log) when
    ``$TOOLHOST_CACHE`` is not set."""
    old = os.environ.get("TOOLHOST_CACHE_DIR")
    if old and not os.environ.get("TOOLHOST_CACHE"):
        if old not in _warned:
            _warned.add(old)
            logger.warning(
                "TOOLHOST_CACHE_DIR is deprecated: set TOOLHOST_CACHE to the cache folder "
                "instead (built scopes go in its scopes/ subfolder)"
            )
        return Path(old)
    return cache_root() / "scopes"


def scope_key(discovery: Discovery) -> str:
    """The cache key of the scope of ``discovery``'s tools folder."""
    digest = hashlib.sha256(_FORMAT)

    def add(label: str, data: bytes) -> None:
        digest.update(f"\0{label}\0{len(data)}\0".encode())
        digest.update(data)

    add("pyright", _pyright.version().encode())
    add("settings", json.dumps(_pyright.SETTINGS, sort_keys=True).encode())
    add("python", f"{sys.version_info[:2]} {sys.prefix}".encode())
    here = Path(__file__).parent
    for name in _CODE:
        try:
            add(name, (here / name).read_bytes())
        except OSError:  # an installation without sources: the version stands in
            add(name, b"")
    for path in sorted(discovery.tools_dir.glob("*.py")):
        add(f"tool:{path.name}", path.read_bytes())
    return digest.hexdigest()


Reject = Callable[[str], None]
"""Told, in one sentence, about each entry or folder the cache would not trust."""


def _places(directory: Path | None) -> tuple[Path, Path]:
    """(the scopes folder, where its private part starts: the cache folder when it is the
    default ``scopes/`` of it, else the folder itself)."""
    folder = directory or cache_dir()
    if directory is None and folder == cache_root() / "scopes":
        return folder, cache_root()
    return folder, folder


def _mac(key: str, body: bytes) -> str:
    return host_key().mac("scope", key, body)


def load(
    key: str, directory: Path | None = None, *, on_reject: Reject | None = None
) -> Scope | None:
    """The cached scope for ``key``, or None: missing, or not to be trusted (then moved
    aside, and ``on_reject`` told why)."""
    folder, private = _places(directory)
    path = folder / f"{key}.json"
    if not os.path.lexists(path):
        return None
    try:
        problem = path_problem(path, private_from=private)
        if problem is not None:
            raise ValueError(problem)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            raw = f.read()
        mac, _, body = raw.partition(b"\n")
        if not host_key().verify(mac.decode("ascii", "replace"), "scope", key, body):
            raise ValueError(f"{path} is not signed by this host's key (rewritten?)")
        scope = Scope.from_data(json.loads(body))
        if scope.key != key:
            raise ValueError(f"{path} holds the scope of another key")
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        if on_reject is not None:
            on_reject(f"the scope cache entry {path} cannot be trusted: {exc}; built again")
        quarantine(path)
        return None
    return scope


def store(scope: Scope, directory: Path | None = None, *, on_reject: Reject | None = None) -> None:
    """Write ``scope`` under its key, atomically. Failing to write is not an error."""
    folder, private = _places(directory)
    checked = private_folder(folder, private_from=private)
    for notice in checked.notices:
        if on_reject is not None:
            on_reject(f"the scope cache: {notice}")
    if checked.problem is not None:
        if on_reject is not None:
            on_reject(f"the scope cache is not written: {checked.problem}")
        return
    body = json.dumps(scope.to_data(), separators=(",", ":")).encode()
    try:
        fd, tmp = tempfile.mkstemp(prefix=".scope-", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(_mac(scope.key, body).encode() + b"\n" + body)
            os.replace(tmp, folder / f"{scope.key}.json")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _prune(folder)
    except OSError:
        return  # a read-only home or a full disk costs a pyright run next time, nothing more


def _prune(directory: Path) -> None:
    entries = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[MAX_ENTRIES:]:
        old.unlink(missing_ok=True)


def load_or_build_scope(
    discovery: Discovery,
    *,
    runner: Runner | None = None,
    directory: Path | None = None,
    on_build: Callable[[], None] | None = None,
    on_reject: Reject | None = None,
) -> Scope:
    """The scope of ``discovery``: from the cache, else built (one pyright run) and kept.

    Blocking (file reads, maybe a pyright run): call it from a worker thread.
    Raises :class:`DeclarationError`; a failure is never cached. ``on_reject`` hears of
    every cache entry or folder that was not trusted (the host emits ``cache_rejected``).
    """
    key = scope_key(discovery)
    cached = load(key, directory, on_reject=on_reject)
    if cached is not None:
        return cached
    if on_build is not None:
        on_build()
    scope = build_scope(discovery, key=key, runner=runner)
    store(scope, directory, on_reject=on_reject)
    return scope
