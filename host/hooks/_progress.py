"""Which argument of a tool is its progress argument (``tool_call_started``'s ``progress``).

A tool file names them with a module-level dict literal, read with ``ast`` (no tool code
runs in the host)::

    __progress_argument__ = {"write_file": "path"}

Keys are the export names of the file (``EXPORT`` or ``EXPORT.MEMBER``); a name that is
not one of the tool's parameters is ignored.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

from host.declare import Discovery

__all__ = ["progress_arguments"]


def _read(path: Path) -> dict[str, str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    found: dict[str, str] = {}
    for node in tree.body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if not (isinstance(target, ast.Name) and target.id == "__progress_argument__"):
            continue
        if not isinstance(value, ast.Dict):
            continue
        for key, item in zip(value.keys, value.values, strict=True):
            if (
                isinstance(key, ast.Constant)
                and isinstance(key.value, str)
                and isinstance(item, ast.Constant)
                and isinstance(item.value, str)
            ):
                found[key.value] = item.value
    return found


def progress_arguments(discovery: Discovery) -> Mapping[str, str]:
    """Tool name -> the name of its progress argument, for the tools that declare one."""
    by_file: dict[Path, dict[str, str]] = {}
    result: dict[str, str] = {}
    for spec in discovery.tools.values():
        for path in {spec.source, *(f.path for f in discovery.files if f.module == spec.file)}:
            if path not in by_file:
                by_file[path] = _read(path)
            key = spec.export if spec.member is None else f"{spec.export}.{spec.member}"
            argument = by_file[path].get(key)
            if argument is not None and any(p.name == argument for p in spec.params):
                result[spec.name] = argument
    return result
