"""Section B (Wasm capsule containment), B01 with a race (issue 13.3): paths are resolved
once and used by descriptor. A Wasm capsule's data folder was swapped (an atomic
exchange with a link to a folder outside the project) between the host's check and the
capsule's start, and the capsule mounted, read and wrote the outside folder; the quota
watcher could be lured through a subfolder swapped for a link between its ``stat`` and
its ``scandir``, and count (walk) the outside.

The host now opens the data folder once, from the project folder one name at a time
without following a link, and the capsule mounts and measures that descriptor. The races
are won deterministically here: the swap runs from a hook at the exact point.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from host.capsules import _wasm
from tests.test_wasm import wasm_prepared

from .contain_helpers import Lab, account, accounts, lab

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2, /proc"),
]
__all__ = ["account", "accounts", "lab", "wasm_prepared"]  # the fixtures, used here

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: Path | str, b: Path | str) -> None:
    """Swap two names atomically (``renameat2(RENAME_EXCHANGE)``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    done = libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if done != 0:
        raise OSError(ctypes.get_errno(), f"renameat2 {a} {b}")


PROBE = {
    "probe": '''
        import os


        def probe() -> dict:
            """What the capsule's /data is: listed, the outside's secret read, written."""
            found = {}
            try:
                found["listing"] = sorted(os.listdir("/data"))
            except OSError as exc:
                found["listing"] = type(exc).__name__
            try:
                with open("/data/secret.txt") as f:
                    found["secret"] = f.read()
            except OSError as exc:
                found["secret"] = type(exc).__name__
            try:
                with open("/data/written.txt", "a") as f:
                    f.write("by the capsule\\n")
                found["write"] = "done"
            except OSError as exc:
                found["write"] = type(exc).__name__
            return found
    ''',
}
POLICY = """
    version = 1
    [capsules]
    wasm = ["probe"]
    data = { path = "data", writable = true }
"""

SCRIPT = """
    import ctypes
    import host.capsules._wasm_capsule as capsules
    from host.settings import DataFolder

    point, outside = ARGS
    data, swap = os.path.join(PROJECT, "data"), os.path.join(PROJECT, "swap")
    armed = []

    def exchange():
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.renameat2(-100, data.encode(), -100, swap.encode(), 2) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")

    def after(real):
        def hooked(*args):
            found = real(*args)
            if armed:
                armed.clear()
                exchange()  # data is now the link out; the folder checked is at swap
            return found
        return hooked

    if point == "check":  # right after the check, before anything uses the folder
        DataFolder.resolve = after(DataFolder.resolve)
    else:  # after the host has opened it, before the capsule starts
        capsules._data_folder = after(capsules._data_folder)

    async def main():
        async with Host.open(PROJECT) as host:
            say(before=await host.call("probe"))
            armed.append(True)
            async with host.session() as other:  # its capsule starts: the race is won
                try:
                    say(after=await other.call("probe"))
                except ToolUnavailable as exc:
                    say(refused=str(exc))
            events = host.events.recent
            reasons = [e.data["reason"] for e in events if e.kind == "capsule_unavailable"]
            say(swapped=os.path.islink(data), reasons=reasons)

    anyio.run(main)
"""


@pytest.mark.wasm
@pytest.mark.subprocess
@pytest.mark.parametrize(("point", "forkserver"), [("check", "1"), ("open", "1"), ("open", "0")])
def test_a_data_folder_swapped_for_a_link_never_reaches_the_outside(
    lab: Lab, wasm_prepared: Any, point: str, forkserver: str
) -> None:
    del wasm_prepared  # the root account's cache; the user's builds its own
    outside = lab.folder / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside secret\n")
    project = lab.project(PROBE, POLICY, folders=["data"])
    (project / "data" / "inside.txt").write_text("inside\n")
    os.symlink(outside, project / "swap")
    for path in (outside, outside / "secret.txt", project / "data" / "inside.txt"):
        os.chown(path, lab.account.uid, lab.account.gid)
    os.lchown(project / "swap", lab.account.uid, lab.account.gid)
    env = lab.env(TOOLHOST_FORKSERVER=forkserver)
    run = lab.run(SCRIPT, project, point, str(outside), env=env)
    before = run.report()["before"]
    assert before == {"listing": ["inside.txt"], "secret": "FileNotFoundError", "write": "done"}
    after = run.report()
    end = run.report()
    assert end["swapped"] is True
    assert run.wait() == 0, run.stderr()
    if point == "check":
        # The folder became a link between the check and the open: refused (and at the
        # next try, by the check itself: it is a link out of the project now).
        assert "the policy's data folder is refused" in after["refused"], after
        assert len(end["reasons"]) == 1, end
        assert "changed while it was checked" in end["reasons"][0], end
    else:
        # Opened before the swap: the capsule got the folder the check saw, wherever
        # it is now (at ``swap``), and nothing of the outside.
        assert after["after"] == {
            "listing": ["inside.txt", "written.txt"],
            "secret": "FileNotFoundError",
            "write": "done",
        }
        assert (project / "swap" / "written.txt").read_text() == "by the capsule\n" * 2
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "outside secret\n"


# -- the quota watcher's walk -------------------------------------------------------------


def _hook_descent(monkeypatch: pytest.MonkeyPatch, when: Any) -> None:
    """Run ``when()`` once, just before the walk opens or lists the subfolder ``sub``
    (whichever it does first, by name or by path): the race with a swap, won."""
    real_open, real_scandir = os.open, os.scandir
    fired: list[bool] = []

    def fire() -> None:
        if not fired:
            fired.append(True)
            when()

    def hooked_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        if os.fspath(path) == "sub" or str(path).endswith("/sub"):
            fire()
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def hooked_scandir(path: Any = ".") -> Any:
        if isinstance(path, (str, os.PathLike)) and str(path).endswith("/sub"):
            fire()
        return real_scandir(path)

    monkeypatch.setattr(os, "open", hooked_open)
    monkeypatch.setattr(os, "scandir", hooked_scandir)


@pytest.mark.parametrize("by", ["descriptor", "path"])
def test_the_quota_walk_never_follows_a_subfolder_swapped_for_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, by: str
) -> None:
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "small").write_bytes(b"x" * 4096)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(os.urandom(8 << 20))  # what a lured walk would count
    os.symlink(outside, tmp_path / "link")
    honest = _wasm.disk_usage(str(data))
    assert honest < 1 << 20
    _hook_descent(monkeypatch, lambda: exchange(data / "sub", tmp_path / "link"))
    if by == "descriptor":
        fd = os.open(data, os.O_RDONLY | os.O_DIRECTORY)
        try:
            used = _wasm.disk_usage(fd)
        finally:
            os.close(fd)
    else:
        used = _wasm.disk_usage(str(data))
    monkeypatch.undo()
    assert (data / "sub").is_symlink(), "the swap happened during the walk"
    assert used <= honest  # the link counted as itself; nothing beneath it
    assert sorted(p.name for p in outside.iterdir()) == ["big"]


def test_a_walk_that_cannot_go_on_is_never_taken_for_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors halfway (or any error but a vanished entry): the walk raises,
    and the capsule's watcher and the host's start both take that as over the quota."""
    (tmp_path / "data" / "sub").mkdir(parents=True)
    real_open = os.open

    def refuse(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        if os.fspath(path) == "sub":
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(OSError, match="Too many open files"):
        _wasm.disk_usage(str(tmp_path / "data"))
