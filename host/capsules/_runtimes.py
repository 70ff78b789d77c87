"""The Wasm runtimes agent code may run on, for the command line: their names, compiling
one ahead of time (``toolhost prepare --runtime NAME``), and where the cache is."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ._wasm import RUNTIMES, WasmUnavailable, runtime_named
from ._wasm_cache import Prepared, cache_root, prepare

__all__ = ["RUNTIMES", "Prepared", "WasmUnavailable", "cache_root", "prepare_runtime"]


async def prepare_runtime(name: str, on_step: Callable[[str], None] | None = None) -> Prepared:
    """The runtime ``name`` (``default``, ``data``) checked in the cache, and compiled and
    recorded there if it is not yet; ``on_step`` is told each step the build starts
    (``compile``, ``library``). Raises :class:`WasmUnavailable` (not installed, say)."""
    return await prepare(runtime_named(name), on_step)


def wasm_cache() -> Path:
    """The folder the compiled runtimes and guest libraries are kept in."""
    return cache_root() / "wasm"
