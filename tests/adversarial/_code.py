"""What the code-mode cases share: a project whose tools let a test hold a call in flight
for as long as it likes, and the sandbox of either kind (the Wasm guest, or the labelled
subprocess fallback) to run agent code in."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host import CodeResult, Host
from tests.fixtures.e2e.helpers import alive
from tests.test_wasm import NEEDS_DATA, runtime_policy

__all__ = ["TOOLS", "KINDS", "policy", "project", "guest_pid", "ok", "alive"]

TOOLS = {
    "lab": """
        import asyncio
        import os

        _count = 0


        def add(a: int, b: int) -> int:
            '''Add two integers.'''
            return a + b


        def count() -> int:
            '''How many times a counting tool ran.'''
            global _count
            _count += 1
            return _count


        async def slow(seconds: float) -> float:
            '''Sleep, then return the seconds slept.'''
            await asyncio.sleep(seconds)
            return seconds


        async def count_then_wait(seconds: float) -> int:
            '''Count (a side effect, at once), then sleep.'''
            global _count
            _count += 1
            await asyncio.sleep(seconds)
            return _count


        async def gate(path: str) -> str:
            '''Wait until ``path`` exists: a call held in flight for as long as a test likes.'''
            while not os.path.exists(path):
                await asyncio.sleep(0.02)
            return "open"
    """,
}

KINDS = [
    pytest.param("wasm", marks=pytest.mark.wasm),
    pytest.param("data", marks=[pytest.mark.wasm, NEEDS_DATA]),
    pytest.param("subprocess", marks=pytest.mark.subprocess),
]
"""Where agent code runs: the Wasm guest (on the default runtime, and on the data runtime,
``code_runtime = "data"``), and the weaker fallback (``code = "subprocess"``)."""


def policy(kind: str, extra: str = "") -> str:
    text = """
        version = 1
        [defaults]
        agent = "allow"
    """
    if kind == "subprocess":
        text += """
        [capsules]
        code = "subprocess"
    """
    if kind == "data":
        text += runtime_policy("data")
    return text + extra


def project(make_project: Callable[..., Path], kind: str, request: pytest.FixtureRequest) -> Path:
    """The lab project for ``kind`` (the Wasm runtime prepared first, for ``wasm`` and
    ``data``)."""
    if kind == "wasm":
        request.getfixturevalue("wasm_prepared")
    if kind == "data":
        request.getfixturevalue("wasm_data_prepared")
    return make_project(tools=TOOLS, policy=policy(kind))


def guest_pid(host: Host) -> int:
    """The pid of the default session's sandbox process (started by a first run)."""
    guest: Any = host.default_session.code._guest  # pyright: ignore[reportPrivateUsage]
    assert guest is not None and guest.alive, "no sandbox is running"
    return int(guest.process.pid)


def ok(result: CodeResult) -> Any:
    assert result.ok, result.error
    return result.value
