"""Folders and files the host may trust: owned by its user, written by nobody else.

A cache entry is only as good as the folders above it: whoever may rename or replace a
component of its path may swap the entry, whatever the entry's own mode says. So a
location is checked component by component, every time it is used (a folder can be
swapped under a running host):

* from the cache's own root down (the *private* part), each component is a real folder or
  file (never a link), owned by the host's user, and nobody else may write it;
* above that (``/``, ``/home``, ``~``, ``/tmp``), each component is owned by the host's
  user or by root, and nobody else may write it unless it is a sticky folder (``/tmp``:
  others may add entries but never rename or remove ours); links there are followed, and
  their targets checked the same way.

What fails is never used: :func:`private_folder` moves a bad private folder aside
(:func:`quarantine`) and makes a fresh one, and says so; a bad component above the
private part cannot be mended by the host, and the caller does without the location.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PrivateFolder", "path_problem", "private_folder", "quarantine"]

_MAX_LINKS = 16


def _owner_ok(info: os.stat_result, strict: bool) -> bool:
    return info.st_uid == os.geteuid() or (not strict and info.st_uid == 0)


def _describe(info: os.stat_result) -> str:
    return f"owner uid {info.st_uid}, mode {stat.filemode(info.st_mode)}"


def _component(path: Path, strict: bool, hops: int) -> str | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as exc:
        return f"{path} cannot be examined: {exc.strerror or exc}"
    if stat.S_ISLNK(info.st_mode):
        if strict:
            return f"{path} is a link, where a real file or folder must be"
        if not _owner_ok(info, strict):
            return f"{path} is a link owned by another user ({_describe(info)})"
        if hops >= _MAX_LINKS:
            return f"{path}: too many links on the way"
        target = Path(os.path.join(path.parent, os.readlink(path)))
        return _walk(Path(os.path.normpath(target)), None, hops + 1)
    if not _owner_ok(info, strict):
        return f"{path} belongs to another user ({_describe(info)})"
    if info.st_mode & 0o022:
        sticky = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
        if strict or not sticky:
            return f"{path} may be written by others ({_describe(info)})"
    return None


def _walk(path: Path, private_from: Path | None, hops: int) -> str | None:
    current = Path(path.anchor or "/")
    problem = _component(current, current == private_from, hops)
    if problem is not None:
        return problem
    for part in path.parts[1:]:
        current = current / part
        strict = private_from is not None and (
            current == private_from or private_from in current.parents
        )
        problem = _component(current, strict, hops)
        if problem is not None:
            return problem
    return None


def path_problem(path: Path, *, private_from: Path | None = None) -> str | None:
    """Why ``path`` cannot be trusted (see the module's docstring), or ``None``.

    Args:
        path: the file or folder to use.
        private_from: where the private part starts (``path`` itself, or a folder above
            it); by default only ``path`` is private.
    """
    path = Path(os.path.abspath(path))
    start = Path(os.path.abspath(private_from)) if private_from is not None else path
    if start != path and start not in path.parents:
        raise ValueError(f"{start} is not {path} or a folder above it")
    return _walk(path, start, 0)


def quarantine(path: Path) -> bool:
    """Move ``path`` (a file, folder or link) out of the way and remove it; whether it is
    gone from its name. Never follows a link."""
    aside = path.with_name(f".{path.name}.rejected-{os.urandom(4).hex()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return True
    except OSError:
        aside = path
    try:
        info = os.lstat(aside)
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.unlink(aside)
    except OSError:
        pass
    return not os.path.lexists(path)


@dataclass(frozen=True, slots=True)
class PrivateFolder:
    """A folder checked (and made, or mended) for private use."""

    path: Path
    problem: str | None = None
    """Why the folder cannot be used at all (``None``: it can)."""
    notices: tuple[str, ...] = ()
    """What was wrong and was mended (a folder moved aside and made again)."""


def _make(path: Path, private_from: Path) -> None:
    """Make ``path`` and the missing folders from ``private_from`` down, each ``0700``;
    folders above ``private_from`` with the default mode (``mkdir -p``)."""
    missing: list[Path] = []
    current = path
    while not os.path.lexists(current):
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for folder in reversed(missing):
        private = folder == private_from or private_from in folder.parents
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700 if private else 0o777)
        if private:
            os.chmod(folder, 0o700)  # whatever the umask says


def private_folder(path: Path, *, private_from: Path | None = None) -> PrivateFolder:
    """``path`` as a folder only the host's user may use, made if missing.

    From ``private_from`` (default: ``path``) down, a component that fails the checks is
    moved aside and made again (a notice says so); a component above that fails makes
    the folder unusable (:attr:`PrivateFolder.problem`). Checked on every call: call it
    at every use.
    """
    path = Path(os.path.abspath(path))
    start = Path(os.path.abspath(private_from)) if private_from is not None else path
    notices: list[str] = []
    for _ in range(3):  # a folder swapped back at once each time is not worth chasing
        try:
            _make(path, start)
        except OSError as exc:
            return PrivateFolder(path, f"{path} cannot be made: {exc.strerror or exc}")
        above = _walk(start.parent, None, 0) if start.parent != start else None
        if above is not None:
            return PrivateFolder(path, above, tuple(notices))
        problem = path_problem(path, private_from=start)
        if problem is None:
            return PrivateFolder(path, None, tuple(notices))
        bad = _first_bad(path, start)
        notices.append(f"{problem}; moved it aside")
        if not quarantine(bad):
            return PrivateFolder(path, f"{problem}, and it cannot be moved aside", tuple(notices))
    return PrivateFolder(path, f"{path} keeps changing under the host", tuple(notices))


def _first_bad(path: Path, start: Path) -> Path:
    """The highest component from ``start`` down to ``path`` that fails the checks."""
    current = start
    chain = [start, *(p for p in reversed(path.parents) if start in p.parents), path]
    for current in dict.fromkeys(chain):
        if _component(current, True, 0) is not None:
            return current
    return current
