"""The options of one ``run_code``, checked before anything is sent to the guest.

``modules``, ``globals``, ``execute``, ``memory_limit`` and ``filename`` (``check`` is the
orchestrator's: it runs before the sandbox is involved). Each bad value ends as a
:class:`CodeError` of kind ``invalid_arguments`` that names the option and says what to
write instead; nothing is sent and the sandbox keeps its variables. What passes crosses to
the guest as plain data in the ``run`` frame (:meth:`RunOptions.frame`).
"""

from __future__ import annotations

import keyword
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capsule import protocol as p
from host.settings import Limits, parse_size

from ._code_results import CodeError

__all__ = ["MIN_MEMORY", "RESERVED_MODULES", "RunOptions", "read_options"]

MIN_MEMORY = 32 * 1024**2
"""The smallest ``memory_limit`` a run may ask for: the interpreter's own share."""
MAX_MODULES = 64
"""Modules one run may give."""
_MODULE_FILE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\.py$")
RESERVED_MODULES: frozenset[str] = frozenset(
    {"tools", "capsule", "msgpack", "host", "__main__", "builtins", "_wire", "_wasi"}
)
"""Module names a run may not give, beside the standard library's: the tools package
and what the guest itself is made of."""
_FILENAME_MAX = 200


class _Bad(Exception):
    pass


@dataclass(frozen=True, slots=True)
class RunOptions:
    """One run's checked options (``memory``: the guest's memory cap, already clamped)."""

    modules: Mapping[str, str] | None = None
    globals: Mapping[str, Any] | None = None
    execute: Mapping[str, Any] | None = None
    memory: int | None = None
    filename: str | None = None
    warnings: tuple[str, ...] = ()
    """What the checking changed (a ``memory_limit`` clamped), for the result."""

    def frame(self) -> dict[str, Any]:
        """The ``run`` frame's fields beside ``source``."""
        out: dict[str, Any] = {}
        if self.modules:
            out["modules"] = dict(self.modules)
        if self.globals:
            out["globals"] = dict(self.globals)
        if self.execute is not None:
            out["execute"] = dict(self.execute)
        if self.filename is not None:
            out["filename"] = self.filename
        return out

    def size(self) -> int:
        """Bytes the options add to the ``run`` frame."""
        frame = self.frame()
        return len(p.encode(frame)) if frame else 0


def _plain(value: Any, what: str) -> None:
    try:
        p.check_plain(value)
    except (p.BadFrame, TypeError, ValueError) as exc:
        raise _Bad(
            f"{what} must be plain data (None, bool, int, float, str, bytes, lists and "
            f"dicts with str keys): {exc}"
        ) from None


def _modules(raw: Any, tool_names: frozenset[str]) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        raise _Bad('modules must map file names to source text: {"helpers.py": "def f(): ..."}')
    items: Mapping[Any, Any] = raw  # pyright: ignore[reportUnknownVariableType]
    if len(items) > MAX_MODULES:
        raise _Bad(f"modules takes at most {MAX_MODULES} files, not {len(items)}")
    out: dict[str, str] = {}
    for file, source in items.items():
        if not isinstance(file, str):
            raise _Bad(f"modules: the name {file!r} is not a string; write 'name.py'")
        match = _MODULE_FILE.match(file)
        if match is None:
            raise _Bad(
                f"modules: {file!r} is not a plain module file name; write 'name.py' "
                "(letters, digits and _, no folders, dots or other paths)"
            )
        name = match.group(1)
        if keyword.iskeyword(name) or name.startswith("__"):
            raise _Bad(f"modules: {file!r} cannot be imported by that name; rename it")
        if (
            name in sys.stdlib_module_names
            or name in sys.builtin_module_names
            or name in RESERVED_MODULES
            or name in tool_names
        ):
            raise _Bad(
                f"modules: {file!r} would shadow "
                + (
                    "the tools package or the sandbox"
                    if name in RESERVED_MODULES
                    else "a tool global"
                    if name in tool_names
                    else "a module of the standard library"
                )
                + f" named {name!r}; rename it (say 'my_{name}.py')"
            )
        if not isinstance(source, str):
            raise _Bad(f"modules: the source of {file!r} must be text, not {type(source).__name__}")
        try:
            source.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _Bad(
                f"modules: the source of {file!r} is not valid Unicode: {exc.reason}"
            ) from None
        out[file] = source
    return out


def _globals(raw: Any, tool_names: frozenset[str]) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise _Bad('globals must map names to plain data: {"limit": 10}')
    items: Mapping[Any, Any] = raw  # pyright: ignore[reportUnknownVariableType]
    out: dict[str, Any] = {}
    for name, value in items.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise _Bad(f"globals: {name!r} is not a Python name; use letters, digits and _")
        if name.startswith("__"):
            raise _Bad(f"globals: {name!r} is reserved (dunder names); choose another name")
        if name in tool_names:
            raise _Bad(f"globals: {name!r} is a tool; choose another name for the value")
        _plain(value, f"globals: the value of {name!r}")
        out[name] = value
    return out


def _execute(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise _Bad('execute must be a map: {"fn": "main", "args": [...], "kwargs": {...}}')
    items: Mapping[Any, Any] = raw  # pyright: ignore[reportUnknownVariableType]
    extra = sorted(str(k) for k in items if k not in ("fn", "args", "kwargs"))
    if extra:
        raise _Bad(f"execute takes the keys fn, args and kwargs, not {', '.join(extra)}")
    fn = items.get("fn")
    if not isinstance(fn, str) or not fn.isidentifier() or keyword.iskeyword(fn):
        raise _Bad(
            "execute: fn must name a function the code defines at top level "
            f'(a Python name such as "main"), not {fn!r}'
        )
    args: Any = items.get("args", [])
    if args is None:
        args = []
    if not isinstance(args, Sequence) or isinstance(args, (str, bytes)):
        raise _Bad("execute: args must be a list of plain values")
    kwargs: Any = items.get("kwargs", {})
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise _Bad("execute: kwargs must map argument names to plain values")
    arg_list: list[Any] = list(args)  # pyright: ignore[reportUnknownArgumentType]
    kwarg_map: dict[Any, Any] = dict(kwargs)  # pyright: ignore[reportUnknownArgumentType]
    for key in kwarg_map:
        if not isinstance(key, str) or not key.isidentifier():
            raise _Bad(f"execute: the keyword {key!r} is not a Python name")
    _plain(arg_list, "execute: args")
    _plain(kwarg_map, "execute: kwargs")
    return {"fn": fn, "args": arg_list, "kwargs": kwarg_map}


def _memory(raw: Any, limits: Limits) -> tuple[int, tuple[str, ...]]:
    try:
        size = parse_size(raw)
    except ValueError as exc:
        raise _Bad(f"memory_limit: {exc}") from None
    if size < MIN_MEMORY:
        raise _Bad(
            f"memory_limit: {size} bytes is below the least a sandbox needs "
            f"({MIN_MEMORY // 1024**2} MiB); ask for more"
        )
    if size > limits.code_memory:
        return limits.code_memory, (
            f"memory_limit {size} bytes is above [limits] code_memory; the run gets "
            f"code_memory ({limits.code_memory} bytes): a run can lower it, never raise it",
        )
    return size, ()


def _filename(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise _Bad("filename must be a non-empty string, such as 'report.py'")
    if len(raw) > _FILENAME_MAX or not raw.isprintable():
        raise _Bad(f"filename must be printable and at most {_FILENAME_MAX} characters")
    return raw


def read_options(
    *,
    modules: Any = None,
    globals: Any = None,
    execute: Any = None,
    memory_limit: Any = None,
    filename: Any = None,
    limits: Limits,
    tool_names: frozenset[str],
) -> RunOptions | CodeError:
    """The options checked, or the error that says which is wrong and how to fix it (the
    size of the whole ``run`` frame is the sandbox's to check)."""
    try:
        checked_modules = None if modules is None else _modules(modules, tool_names)
        checked_globals = None if globals is None else _globals(globals, tool_names)
        checked_execute = None if execute is None else _execute(execute)
        memory, notes = (None, ()) if memory_limit is None else _memory(memory_limit, limits)
        checked_filename = None if filename is None else _filename(filename)
    except _Bad as exc:
        return CodeError(kind="invalid_arguments", type="InvalidArguments", message=str(exc))
    options = RunOptions(
        modules=checked_modules,
        globals=checked_globals,
        execute=checked_execute,
        memory=memory,
        filename=checked_filename,
        warnings=notes,
    )
    return options
