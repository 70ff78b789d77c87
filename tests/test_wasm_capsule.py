"""Tool files listed in ``[capsules] wasm`` run in a Wasm capsule: same calls, same module
state, but no network, no processes and no files outside their own (read-only) folder."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host import Host, ToolError

from .test_wasm import wasm_prepared

pytestmark = [pytest.mark.anyio, pytest.mark.wasm, pytest.mark.slow]
__all__ = ["wasm_prepared"]

TOOLS = {
    "sandboxed": """
        import os
        import sys

        _calls = []


        def where() -> dict:
            '''Where this tool runs.'''
            _calls.append(1)
            return {"platform": sys.platform, "calls": len(_calls)}


        def environ() -> dict:
            return dict(os.environ)


        def read(path: str) -> str:
            with open(path) as f:
                return f.read()


        def write(path: str) -> None:
            with open(path, "w") as f:
                f.write("x")


        def connect(port: int) -> None:
            import socket

            socket.create_connection(("127.0.0.1", port), timeout=2)


        async def shout(text: str) -> str:
            print("tool output", text)
            return text.upper()
    """,
    "native": """
        import sys


        def native_platform() -> str:
            return sys.platform
    """,
}
POLICY = """
    version = 1
    [defaults]
    agent = "allow"

    [capsules]
    wasm = ["sandboxed"]
"""


async def test_listed_files_load_into_a_wasm_capsule(
    make_project: Callable[..., Path], wasm_prepared: Any, tmp_path: Path
) -> None:
    del wasm_prepared
    secret = tmp_path / "secret.txt"
    secret.write_text("file-canary")
    project = make_project(tools=TOOLS, policy=POLICY)
    async with Host.open(project) as host:
        assert await host.call("where") == {"platform": "wasi", "calls": 1}
        assert await host.call("where") == {"platform": "wasi", "calls": 2}  # module state
        assert await host.call("native_platform") == "linux"  # the other file: a subprocess
        assert await host.call("shout", "hi") == "HI"
        assert "CANARY_SECRET" not in await host.call("environ")
        assert os.environ["CANARY_SECRET"] not in repr(await host.call("environ"))
        # Its own folder is readable, nothing else is, and nothing is writable.
        assert "def where" in await host.call("read", "/project/tools/sandboxed.py")
        for path in (str(secret), "/etc/passwd", "/project/tools/../../etc/passwd"):
            with pytest.raises(ToolError):
                await host.call("read", path)
        with pytest.raises(ToolError):
            await host.call("write", "/project/tools/new.py")
        assert not (project / "tools" / "new.py").exists()
        with pytest.raises(ToolError):
            await host.call("connect", 9)
        # Agent code calls Wasm tools like any other.
        result = await host.run_code("(await where())['platform']")
        assert result.ok and result.value == "wasi"
