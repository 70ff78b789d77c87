"""The zygote: the capsule runtime imported once per host, forked for each new capsule.

The host's keeper (``host/capsules/_keeper_child.py``) imports this module and calls
:func:`preload` when it starts: the capsule's own modules, msgpack and the standard library
modules tool files commonly use, but no tool file. Each new subprocess capsule is then a
``fork`` of the keeper that calls :func:`serve_forked` and imports only the project's tool
files; what was preloaded it shares with the keeper and every other capsule,
copy-on-write, so a session's capsule costs a few MiB instead of a whole interpreter.

A forked capsule is hardened as a started one is (``capsule/__main__.py``): it is the
worker itself (the keeper, a subreaper, is its parent and kills what it leaves behind,
so it needs no reaper of its own), it gives up privileges, confines itself with Landlock
and watches the host and the keeper through the pidfds on fds 3 and 4. Its environment
never passes through the keeper: the host writes it on the capsule's stdin, before the
first frame (a 4-byte big-endian length, then ``{"env": {...}}`` as JSON), and the
capsule reads it there, so the variables the policy passes to tools (secrets among them)
never reach the zygote.

Standard library and msgpack only, like the rest of the package.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
import types
from typing import Any, cast

__all__ = ["PRELOAD", "preload", "serve_forked"]

PRELOAD = (
    # What the capsule itself runs on.
    "capsule.__main__",
    "capsule._serve",
    "capsule._registry",
    "capsule._convert",
    "capsule._harden",
    "capsule._landlock",
    "capsule._netns",
    "capsule.context",
    "capsule.protocol",
    "msgpack",
    "ctypes",
    "asyncio",
    "concurrent.futures",
    # What tool files commonly import (each is shared: one a tool never touches costs
    # its capsule nothing).
    "abc",
    "base64",
    "collections",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "enum",
    "fnmatch",
    "fractions",
    "functools",
    "glob",
    "hashlib",
    "hmac",
    "html",
    "inspect",
    "io",
    "itertools",
    "json",
    "logging",
    "math",
    "operator",
    "pathlib",
    "random",
    "re",
    "secrets",
    "shlex",
    "shutil",
    "sqlite3",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "tempfile",
    "textwrap",
    "threading",
    "time",
    "traceback",
    "typing",
    "unicodedata",
    "urllib.parse",
    "uuid",
    "warnings",
    "zoneinfo",
)
_PREAMBLE_MAX = 16 * 1024 * 1024
"""Most bytes of environment a capsule reads before its first frame."""
_EXIT_FAILED = 1


def preload() -> list[str]:
    """Import :data:`PRELOAD` and freeze what exists, so that the forked capsules' garbage
    collector never touches (and so never copies) the shared objects. Returns the modules
    that could not be imported (a tool that wants one imports it itself, as usual)."""
    missing: list[str] = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # a module this interpreter lacks is only not shared
            missing.append(name)
    if "capsule.__main__" in missing or "msgpack" in missing:
        raise ImportError("the capsule runtime cannot be imported: " + ", ".join(missing))
    gc.collect()
    gc.freeze()
    return missing


def _read_exactly(fd: int, size: int) -> bytes:
    parts: list[bytes] = []
    while size:
        data = os.read(fd, min(size, 1 << 20))
        if not data:
            raise EOFError("the host closed the pipe before the environment")
        parts.append(data)
        size -= len(data)
    return b"".join(parts)


def _environment(fd: int) -> dict[str, str]:
    """The environment the host wrote before the first frame."""
    size = int.from_bytes(_read_exactly(fd, 4), "big")
    if size > _PREAMBLE_MAX:
        raise ValueError(f"an environment of {size} bytes")
    data: Any = json.loads(_read_exactly(fd, size))
    env: Any = cast("dict[str, Any]", data).get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict):
        raise ValueError("no environment")
    pairs = cast("dict[object, object]", env)
    return {str(k): str(v) for k, v in pairs.items()}


def _exit_code(exc: SystemExit) -> int:
    """The status an interpreter would exit with for ``exc``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    with_message = str(exc.code)
    os.write(2, (with_message + "\n").encode(errors="replace"))
    return _EXIT_FAILED


def serve_forked(watched: tuple[int, int]) -> None:
    """In a child the keeper forked, with the capsule's pipes on fds 0-2 and the pidfds of
    the host and the keeper at ``watched``: become the capsule's worker. Never returns."""
    code = _EXIT_FAILED
    try:
        from capsule.__main__ import become_subreaper, host_settings, lifelines, undumpable, work

        env = _environment(0)
        os.environ.clear()
        os.environ.update(env)
        import time

        time.tzset()  # TZ may differ from the keeper's
        sys.argv = ["-c"]
        sys.modules["__main__"] = types.ModuleType("__main__")  # not the keeper's script
        settings = host_settings()
        undumpable(settings)
        become_subreaper()
        work(settings, lifelines([str(fd) for fd in watched]), keeper_is_parent=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:  # said on stderr, as the interpreter would
        import contextlib
        import traceback

        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        try:
            import atexit

            atexit._run_exitfuncs()  # pyright: ignore[reportPrivateUsage]
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
        finally:
            os._exit(code)
