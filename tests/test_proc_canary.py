"""SECURITY_CATALOGUE C01, second half: a subprocess capsule runs as the host's user, so a
tool can walk ``/proc`` from its reaper to the host. It must not read the host's
environment, memory or open files there: the host is non-dumpable, and a capsule run by
root has no capabilities (Linux; elsewhere this protection does not exist).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host import Host, ToolError

from .test_wasm import wasm_prepared

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.subprocess,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and prctl"),
]
__all__ = ["wasm_prepared"]  # the session fixture, reused here

TOOLS = {
    "walk": """
        import os
        import subprocess
        import time


        def parent_of(pid: int) -> int:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            return int(stat[stat.rfind(b")") + 2 :].split()[1])


        def reaper() -> int:
            return os.getppid()


        def read(path: str) -> bytes:
            with open(path, "rb") as f:
                return f.read(4096)


        def child_environ() -> bytes:
            child = subprocess.Popen(["sleep", "30"])
            try:  # mid-exec the environment reads empty for a moment: wait for the new image
                deadline = time.monotonic() + 10
                while True:
                    with open(f"/proc/{child.pid}/environ", "rb") as f:
                        data = f.read()
                    if data or time.monotonic() > deadline:
                        return data
                    time.sleep(0.01)
            finally:
                child.kill()
                child.wait()


        def fds(pid: int) -> list[str]:
            folder = f"/proc/{pid}/fd"
            found = []
            for fd in os.listdir(folder):
                try:
                    found.append(os.readlink(f"{folder}/{fd}"))
                except FileNotFoundError:  # closed meanwhile
                    continue
            return found


        def wasm_environs() -> dict[str, str]:
            # What reading each Wasm child's environment gives (guests, the server).
            found = {}
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        words = f.read().split(bytes(1))
                except OSError:
                    continue
                if not any(w.endswith(b"_wasm_child.py") for w in words):
                    continue
                if b"run" not in words and b"zygote" not in words:
                    continue  # a cache build: it holds nothing
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        found[pid] = f"read {len(f.read())} bytes"
                except OSError as exc:
                    found[pid] = type(exc).__name__
            return found


        def status() -> dict[str, str]:
            with open("/proc/self/status") as f:
                pairs = (line.split(":", 1) for line in f)
                return {key: value.strip() for key, value in pairs}
    """,
}


async def test_a_tool_cannot_read_the_hosts_proc_entries(
    make_project: Callable[..., Path],
) -> None:
    host_pid = os.getpid()
    async with Host.open(make_project(tools=TOOLS)) as host:
        # The walk itself works: the capsule's parent is the host's keeper (that forked
        # it from its zygote; or its reaper, whose parent is the keeper), whose parent is
        # this process; and reading the environment of a process of the same user is
        # possible where allowed (its own child's, the capsule's minimal one).
        chain = [await host.call("reaper")]
        while chain[-1] != host_pid and len(chain) < 3:
            chain.append(await host.call("parent_of", chain[-1]))
        assert chain[-1] == host_pid, chain
        assert await host.call("read", f"/proc/{host_pid}/stat")
        assert b"PATH=" in await host.call("child_environ")
        # What the host holds is out of reach.
        for path in (f"/proc/{host_pid}/environ", f"/proc/{host_pid}/mem"):
            with pytest.raises(ToolError) as caught:
                await host.call("read", path)
            assert caught.value.type_name == "PermissionError", path
        with pytest.raises(ToolError, match="PermissionError"):
            await host.call("fds", host_pid)
        # The tool runs with no capabilities and cannot gain any (no sudo, no setuid).
        status = await host.call("status")
        assert status["CapEff"] == status["CapPrm"] == status["CapBnd"] == "0" * 16
        assert status["NoNewPrivs"] == "1"
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(3, 0, 0, 0, 0) == 0  # PR_GET_DUMPABLE: the host is not dumpable


async def test_the_host_can_stay_dumpable_for_a_debugger(
    make_project: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    monkeypatch.setenv("TOOLHOST_KEEP_DUMPABLE", "1")
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: as a fresh process would be
    try:
        async with Host.open(make_project(tools=TOOLS)) as host:
            assert await host.call("reaper")
            assert libc.prctl(3, 0, 0, 0, 0) == 1
    finally:
        libc.prctl(4, 0, 0, 0, 0)


@pytest.mark.wasm
async def test_a_tool_cannot_read_a_wasm_childs_environment(
    make_project: Callable[..., Path], wasm_prepared: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Wasm child (a tool capsule's, the fork server, a sandbox guest) holds what the
    policy passes to Wasm tools: the other capsules' tools cannot read it from /proc.
    (Run by root, the capsule's dropped capabilities already deny it; for any other
    user it is the children being non-dumpable.)"""
    del wasm_prepared
    monkeypatch.setenv("CANARY_TOKEN", "token-" + os.urandom(8).hex())
    tools = {**TOOLS, "inwasm": "def hello() -> str:\n    return 'hi'\n"}
    policy = (
        'version = 1\n[defaults]\nagent = "allow"\n'
        '[capsules]\nwasm = ["inwasm"]\n[env]\npass = ["CANARY_TOKEN"]\n'
    )
    async with Host.open(make_project(tools=tools, policy=policy)) as host:
        assert await host.call("hello") == "hi"
        assert (await host.run_code("1")).ok  # a sandbox guest, from the fork server
        seen = await host.call("wasm_environs")
    assert len(seen) >= 3, seen  # the capsule's child, the server and its guest
    assert set(seen.values()) == {"PermissionError"}, seen
