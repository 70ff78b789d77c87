"""Tool files listed in ``[capsules] wasm`` run in a Wasm capsule: same calls, same module
state, but no network, no processes and no files outside their own (read-only) folder and
the policy's data folder (``[capsules] data``: read-only unless the policy says so)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host import CapsuleCrashed, Host, HostError, ToolError, ToolUnavailable
from host.capsules._wasm import disk_usage

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


        def listdir(path: str) -> list[str]:
            return sorted(os.listdir(path))


        def symlink(target: str, path: str) -> None:
            os.symlink(target, path)


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


        def native_data() -> str | None:
            import os

            return os.environ.get("TOOLHOST_DATA")
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
    (project / "data").mkdir()
    (project / "data" / "notes.txt").write_text("not named by the policy")
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
        # Without [capsules] data no other folder is there, and nothing says otherwise.
        assert "TOOLHOST_DATA" not in await host.call("environ")
        assert await host.call("native_data") is None
        for path in ("/data/notes.txt", "/data", "/"):
            with pytest.raises(ToolError):
                await host.call("listdir" if not path.endswith(".txt") else "read", path)
        with pytest.raises(ToolError):
            await host.call("connect", 9)
        # Agent code calls Wasm tools like any other.
        result = await host.run_code("(await where())['platform']")
        assert result.ok and result.value == "wasi"


def data_project(make_project: Callable[..., Path], data: str) -> tuple[Path, Path]:
    """A project whose policy names ``data``; a canary file next to it, and a link from
    the data folder to the canary made on the host."""
    project = make_project(tools=TOOLS, policy=POLICY + f"    data = {data}\n")
    folder = project / "data"
    folder.mkdir()
    (folder / "notes.txt").write_text("the notes")
    canary = project.parent / "canary.txt"
    canary.write_text("file-canary")
    (folder / "out").symlink_to(canary)
    return project, canary


async def outside_is_unreadable(host: Host, canary: Path) -> None:
    for path in (str(canary), "/data/../canary.txt", "/data/out", "/etc/passwd"):
        with pytest.raises(ToolError):
            await host.call("read", path)


async def test_a_read_only_data_folder(
    make_project: Callable[..., Path], wasm_prepared: Any
) -> None:
    del wasm_prepared
    project, canary = data_project(make_project, '"data"')
    folder = project / "data"
    async with Host.open(project) as host:
        assert (await host.call("environ"))["TOOLHOST_DATA"] == "/data"
        assert await host.call("read", "/data/notes.txt") == "the notes"
        assert await host.call("listdir", "/data") == ["notes.txt", "out"]
        for path in ("/data/new.txt", "/data/notes.txt"):
            with pytest.raises(ToolError) as caught:
                await host.call("write", path)
            assert caught.value.type_name == "PermissionError"
        assert sorted(os.listdir(folder)) == ["notes.txt", "out"]
        assert (folder / "notes.txt").read_text() == "the notes"
        await outside_is_unreadable(host, canary)
        # The subprocess capsule is told where the folder is (it is not contained).
        assert await host.call("native_data") == str(folder.resolve())
        # The folder is checked again whenever a capsule starts: a link out is refused.
        folder.rename(project / "moved")
        folder.symlink_to(canary.parent)
        with pytest.raises(HostError, match=r"data folder is refused.*outside the project"):
            async with host.session() as session:
                await session.call("where")
        assert await host.call("read", "/data/notes.txt") == "the notes"  # already open


async def test_a_writable_data_folder(
    make_project: Callable[..., Path], wasm_prepared: Any
) -> None:
    del wasm_prepared
    project, canary = data_project(make_project, '{ path = "data", writable = true }')
    folder = project / "data"
    async with Host.open(project) as host:
        await host.call("write", "/data/new.txt")
        assert (folder / "new.txt").read_text() == "x"
        assert await host.call("read", "/data/new.txt") == "x"
        await outside_is_unreadable(host, canary)
        # A link the tool makes is not followed out of the folder either.
        with contextlib.suppress(ToolError):
            await host.call("symlink", "../../canary.txt", "/data/escape")
        with pytest.raises(ToolError):
            await host.call("read", "/data/escape")
        # Only the data folder is writable.
        with pytest.raises(ToolError):
            await host.call("write", "/project/tools/new.py")
        assert not (project / "tools" / "new.py").exists()


@pytest.mark.parametrize("forkserver", ["1", "0"])
async def test_passed_secrets_never_reach_a_command_line(
    make_project: Callable[..., Path],
    wasm_prepared: Any,
    monkeypatch: pytest.MonkeyPatch,
    forkserver: str,
) -> None:
    """A variable the policy passes to Wasm tools reaches them, and no process's command
    line (world-readable in ``/proc`` and ``ps``), from the fork server or without it."""
    del wasm_prepared
    token = "token-" + os.urandom(8).hex()
    monkeypatch.setenv("CANARY_TOKEN", token)
    monkeypatch.setenv("TOOLHOST_FORKSERVER", forkserver)
    policy = POLICY + '\n[env]\npass = ["CANARY_TOKEN"]\nsecret = ["CANARY_TOKEN"]\n'
    project = make_project(tools=TOOLS, policy=policy)
    async with Host.open(project) as host:
        assert (await host.call("environ")).get("CANARY_TOKEN") == token
        assert _command_lines_holding(token.encode()) == []


def _command_lines_holding(needle: bytes) -> list[str]:
    found: list[str] = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
    return found


# -- the quota of a writable data folder (security catalogue I06) -------------------------

FILLER = {
    "filler": """
        import os


        def big(path: str, size: int) -> int:
            '''Write ``size`` bytes to one file, a MiB at a time.'''
            chunk = b"x" * (1 << 20)
            with open(path, "wb") as f:
                for _ in range(size // len(chunk)):
                    f.write(chunk)
            return size


        def fill(folder: str, size: int) -> int:
            '''Small (or empty) files, endlessly.'''
            count = 0
            while True:
                with open(f"{folder}/f{count}", "wb") as f:
                    f.write(b"x" * size)
                count += 1


        def count(folder: str) -> int:
            return len(os.listdir(folder))


        def deep(folder: str) -> int:
            # Folders nested until the path is too long (on the host too, where it is
            # longer), a file in each.
            depth = 0
            while True:
                folder += "/" + "d" * 200
                os.mkdir(folder)
                with open(folder + "/f", "wb") as f:
                    f.write(b"x" * 4096)
                depth += 1
    """,
}
QUOTA = 4 * 1024**2
QUOTA_POLICY = """
    version = 1
    [defaults]
    agent = "allow"

    [limits]
    unavailable_for = "1s"

    [capsules]
    wasm = ["filler"]
    data = { path = "data", writable = true, quota = "4MiB" }
"""


def quota_project(make_project: Callable[..., Path]) -> Path:
    project = make_project(tools=FILLER, policy=QUOTA_POLICY)
    (project / "data").mkdir()
    return project


@pytest.mark.parametrize("forkserver", ["1", "0"])
async def test_one_file_cannot_grow_past_the_quota(
    make_project: Callable[..., Path],
    wasm_prepared: Any,
    monkeypatch: pytest.MonkeyPatch,
    forkserver: str,
) -> None:
    """Each file is capped at the quota (``RLIMIT_FSIZE``): the write past it fails in the
    tool (``EFBIG``), from the fork server's children as from the host's own. A folder
    exactly at its quota is not over it."""
    del wasm_prepared
    monkeypatch.setenv("TOOLHOST_FORKSERVER", forkserver)
    project = quota_project(make_project)
    big = project / "data" / "big.bin"
    async with Host.open(project) as host:
        with pytest.raises(ToolError) as caught:
            await host.call("big", "/data/big.bin", 2 * QUOTA)
        assert caught.value.type_name == "OSError"
        assert "too large" in str(caught.value)
        assert big.stat().st_size == QUOTA  # the folder is full, not over: tools still run
        big.unlink()
        assert await host.call("big", "/data/big.bin", 1024**2) == 1024**2


@pytest.mark.parametrize("size", [4096, 0])
async def test_a_folder_filled_past_its_quota_stops_the_capsule(
    make_project: Callable[..., Path], wasm_prepared: Any, size: int
) -> None:
    """Many small files (or empty ones, each counted as ``ENTRY_MIN``): the watcher ends
    the capsule soon after the folder goes over its quota, a restart is refused while it
    stays over, and calls work again once files are deleted."""
    del wasm_prepared
    project = quota_project(make_project)
    folder = project / "data"
    async with Host.open(project) as host:
        with pytest.raises(CapsuleCrashed) as crashed:
            await host.call("fill", "/data", size)
        assert f"the data folder is over its quota of {QUOTA} bytes" in crashed.value.reason
        used = disk_usage(str(folder))
        assert QUOTA < used < QUOTA + 32 * 1024**2  # the loop alone would never stop
        with pytest.raises(ToolUnavailable) as refused:
            await host.call("count", "/data")
        assert "over its quota" in str(refused.value)
        assert "free space" in str(refused.value)
        assert disk_usage(str(folder)) == used  # nothing ran to write more
        for path in folder.iterdir():
            path.unlink()
        assert await host.call("count", "/data") == 0


async def test_a_folder_deeper_than_a_path_can_name_is_still_measured(
    make_project: Callable[..., Path], wasm_prepared: Any
) -> None:
    """The watcher walks the folder by descriptors, one folder relative to its parent, so
    a tree deeper than a host path can name is measured (never taken for empty, never a
    reason to stop the capsule while it is under its quota). A tree that cannot be
    measured at all still counts as over (``tests/adversarial/test_b_paths.py``)."""
    del wasm_prepared
    project = quota_project(make_project)
    async with Host.open(project) as host:
        with pytest.raises(ToolError):  # the guest's own path limit ends the loop
            await host.call("deep", "/data")
        assert await host.call("count", "/data") == 1  # still serving: not over
        fd = os.open(project / "data", os.O_RDONLY | os.O_DIRECTORY)
        try:
            used = disk_usage(fd)
        finally:
            os.close(fd)
        depth = 4096 // 201  # at least this many levels, a 4 KiB file in each
        assert depth * 4096 < used < QUOTA
        with pytest.raises(OSError):  # by path, as before: too long for the host
            disk_usage(str(project / "data") + ("/" + "d" * 200) * (depth + 1))
        shutil.rmtree(project / "data" / ("d" * 200))
        assert await host.call("count", "/data") == 0
