"""H. A hanging Wasm tool in a project that mixes subprocess and Wasm tool files (issue
12, "tests that must be able to fail").

The supervisor sees the two capsules as one and restarts them as one: a call that hangs
in the Wasm capsule times out with ``ToolTimeout``, both processes (the Wasm guest
included) are gone, and the next call to either file is served.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host import Host, ToolTimeout
from tests.fixtures.e2e.helpers import alive, wait_gone
from tests.test_wasm import wasm_prepared

pytestmark = [pytest.mark.anyio, pytest.mark.wasm, pytest.mark.subprocess]
__all__ = ["wasm_prepared"]

TOOLS = {
    "native": """
        import os

        _calls = 0


        def native_count() -> int:
            '''Calls of this capsule so far.'''
            global _calls
            _calls += 1
            return _calls
    """,
    "boxed": """
        import time

        _calls = 0


        def boxed_count() -> int:
            '''Calls of this capsule so far.'''
            global _calls
            _calls += 1
            return _calls


        def spin() -> None:
            '''Compute forever.'''
            while True:
                pass


        def nap() -> None:
            '''Sleep for an hour.'''
            time.sleep(3600)
    """,
}

POLICY = """
    version = 1
    [capsules]
    wasm = ["boxed"]
    [limits]
    call_timeout = "2s"
"""


def part_pids(host: Host) -> list[int]:
    """The pid of each capsule process of the default session: subprocess, then Wasm."""
    transport: Any = host.default_session.supervisor.transport
    assert transport is not None, "no capsule is running"
    parts = getattr(transport, "_parts", None)
    assert parts is not None and len(parts) == 2, "one capsule of each kind"
    return [int(part.pid) for part in parts]


@pytest.mark.parametrize("tool", ["spin", "nap"])
async def test_a_hanging_wasm_tool_is_killed_with_its_sibling(
    make_project: Callable[..., Path], wasm_prepared: Any, tool: str
) -> None:
    del wasm_prepared
    async with Host.open(make_project(tools=TOOLS, policy=POLICY)) as host:
        assert await host.call("native_count") == 1
        assert await host.call("boxed_count") == 1
        pids = part_pids(host)
        assert all(alive(pid) for pid in pids)
        with pytest.raises(ToolTimeout):
            await host.call(tool)
        await wait_gone(pids, timeout=10)  # the Wasm guest as well as its sibling
        # Both files are served again, by new processes with fresh module state.
        assert await host.call("boxed_count") == 1
        assert await host.call("native_count") == 1
        assert not set(part_pids(host)) & set(pids)
