"""Keep built scopes, so a start with unchanged tools does not run pyright.

A scope is a pure function of the tool files' contents, the pyright version and its
settings, the Python that pyright resolves imports against, and the code that builds it;
the cache key is a SHA-256 over exactly those. Entries are content-addressed JSON files in
``scopes/`` of toolhost's one cache folder (:func:`cache_root`: ``$TOOLHOST_CACHE``, else
``$XDG_CACHE_HOME/toolhost``, else ``~/.cache/toolhost``), so projects with the same
tools share them and nothing is written into the project. Writes are atomic (a temporary
file renamed into place); an unreadable or malformed entry is a miss; a failed build
raises and writes nothing.
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

_FORMAT: Final = b"toolhost-scope-1"
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


def load(key: str, directory: Path | None = None) -> Scope | None:
    """The cached scope for ``key``, or None (missing, unreadable or malformed)."""
    path = (directory or cache_dir()) / f"{key}.json"
    try:
        data = json.loads(path.read_bytes())
        scope = Scope.from_data(data)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return scope if scope.key == key else None


def store(scope: Scope, directory: Path | None = None) -> None:
    """Write ``scope`` under its key, atomically. Failing to write is not an error."""
    directory = directory or cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".scope-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(json.dumps(scope.to_data(), separators=(",", ":")).encode())
            os.replace(tmp, directory / f"{scope.key}.json")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _prune(directory)
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
) -> Scope:
    """The scope of ``discovery``: from the cache, else built (one pyright run) and kept.

    Blocking (file reads, maybe a pyright run): call it from a worker thread.
    Raises :class:`DeclarationError`; a failure is never cached.
    """
    key = scope_key(discovery)
    cached = load(key, directory)
    if cached is not None:
        return cached
    if on_build is not None:
        on_build()
    scope = build_scope(discovery, key=key, runner=runner)
    store(scope, directory)
    return scope
