"""Path conditions: ``when.PARAM = { path = "/etc/**", base = "/srv/data" }``.

A plain glob compares text, so ``"../../etc/passwd"`` does not match ``"/etc/**"`` though
a tool joining it to its folder opens ``/etc/passwd``. A path condition reads the
argument as a path first: joined to ``base`` (as ``os.path.join`` does, so an absolute
argument replaces the base), normalised lexically (``.``, ``..``, repeated slashes; no
file system access, so symbolic links are not followed), and only then matched against
the glob (itself joined to the base and normalised, so it may be written relative to
it). A glob ending in ``/**`` also matches the folder itself.

What cannot be read as a path counts against the caller, as every unclear case does
(docs/policy.md, "Policy file"): a NUL byte, bytes or a container, a relative path with no base
that climbs out (``../x``) or is compared with an absolute glob (where it points depends
on the tool's working folder).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["PATH_KEYS", "check_path_condition", "path_truth", "normal_path"]

PATH_KEYS = ("path", "base")


def check_path_condition(table: Mapping[str, Any]) -> None:
    """Check a ``{path = .., base = ..}`` table as written. Raises ``ValueError``."""
    others = sorted(set(table) - set(PATH_KEYS))
    if others:
        raise ValueError(f"a path condition takes path and base only, not {', '.join(others)}")
    glob = table.get("path")
    if not isinstance(glob, str) or not glob:
        raise ValueError('path takes a glob of paths, e.g. path = "/etc/**"')
    if "\0" in glob:
        raise ValueError("path must not contain a NUL character")
    if "base" in table:
        base = table["base"]
        if not isinstance(base, str) or not base.startswith("/") or "\0" in base:
            raise ValueError(
                f"base takes an absolute folder such as '/srv/data' (got {base!r:.60}): "
                "the folder the tool joins relative arguments to"
            )


def normal_path(path: str, base: str | None = None) -> str | None:
    """``path`` joined to ``base`` and normalised lexically; ``None`` if it cannot be."""
    if "\0" in path:
        return None
    if base is not None:
        path = posixpath.join(base, path)
    norm = posixpath.normpath(path)
    if norm.startswith("//"):  # POSIX keeps two leading slashes; the kernel does not
        norm = "/" + norm.lstrip("/")
    if norm == ".." or norm.startswith("../"):
        return None  # climbs out of a folder nobody named
    return norm


def path_truth(
    value: Any, table: Mapping[str, Any], match: Callable[[str, str], bool]
) -> bool | None:
    """Whether ``value`` is a path the condition's glob matches; ``None`` when unclear.

    ``match(glob, text)`` is the argument glob (``*`` and ``?`` stop at ``/``).
    """
    if type(value) is not str:
        if value is None or type(value) in (bool, int, float):
            return False
        return None  # bytes or a container: a path may sit inside
    base: str | None = table.get("base")
    target = normal_path(value, base)
    glob = normal_path(str(table["path"]), base)
    if target is None or glob is None:
        return None
    if glob.startswith("/") != target.startswith("/"):
        return None  # a relative path against an absolute glob: it depends on the folder
    if match(glob, target):
        return True
    if glob.endswith("/**"):  # the folder itself, as well as what is in it
        return target == (glob[:-3] or "/")
    return False
