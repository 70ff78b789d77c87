"""Plain asyncio inside a CPython-WASI guest, and the guest's entry points.

WASI preview 1 has no sockets, so asyncio's stock event loop cannot make its self-pipe
(``socket.socketpair()``) and ``asyncio.run`` fails. A guest is single-threaded, so
nothing ever needs to wake the loop from another thread: the self-pipe methods become
no-ops and everything else (``add_reader(0, ...)``, timers, ``wait_for``) is the stock
selector loop. On a normal CPython the stock loop is used unchanged, so the same guest
code also runs in a subprocess (the weaker fallback).

The guest's fd 0 and fd 1 are the protocol pipes; nothing else of the host is reachable.
"""

from __future__ import annotations

import asyncio
import selectors
import sys
from typing import Any

__all__ = ["new_event_loop", "tool_capsule_main"]


class _WasiLoop(asyncio.SelectorEventLoop):
    """A selector loop without a self-pipe (single-threaded guests only)."""

    def _make_self_pipe(self) -> None:
        self._ssock: Any = None
        self._csock: Any = None
        self._internal_fds = 0

    def _close_self_pipe(self) -> None:
        pass

    def _write_to_self(self) -> None:
        pass

    def _process_self_data(self, data: bytes) -> None:
        pass


def new_event_loop() -> asyncio.AbstractEventLoop:
    """An event loop that works here: the shimmed one under WASI, else the stock one."""
    if sys.platform == "wasi":
        return _WasiLoop(selectors.SelectSelector())
    return asyncio.new_event_loop()


def tool_capsule_main() -> None:
    """A Wasm tool capsule: the ordinary serve loop over fds 0 and 1.

    ``print`` in tool code goes to stderr (drained by the host as console output), so fd 1
    carries frames only.
    """
    from ._serve import Capsule

    sys.stdout = sys.stderr
    capsule = Capsule(0, 1)
    if not capsule.load():
        return
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(capsule.serve())
    finally:
        loop.close()
