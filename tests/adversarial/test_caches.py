"""Caches are inputs, not truth (issue 13, class 1).

Three caches were rewritten or replaced and then used: the scope cache (a rewritten
entry loosened argument validation and changed the docstring the model sees), the
compiled Wasm module (an overwritten one ran attacker code in the sandbox's process; a
truncated one was never rebuilt) and the guest library (an edited one changed tool
results). Each is attacked here more than one way: rewritten, truncated, replaced with a
link, owned by another user, in a folder others may write. Every time the entry is
never used, it is built again, a ``cache_rejected`` event (or ``Prepared.rejected``)
says so, and the next use works: a bad entry is a miss, never a permanent failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from host import InvalidArguments
from host.capsules import _wasm, _wasm_cache
from host.declare import _pyright, discover
from host.declare._cache import load_or_build_scope, scope_key

from ._bank import Bank, kinds
from ._bank import bank as bank  # the fixture

NOBODY = pwd.getpwnam("nobody").pw_uid


def _give_away(path: Path) -> None:
    """Make ``path`` another user's (needs root: the attack of a second local user)."""
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.lchown(path, NOBODY, NOBODY)


# -- the scope cache -------------------------------------------------------------------------


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Sequence[Path]]:
    """Every pyright run, counted; a private cache folder for the test."""
    monkeypatch.setenv("TOOLHOST_CACHE", str(tmp_path / "cache"))
    seen: list[Sequence[Path]] = []
    real = _pyright.start

    def counting(*args: Any, **kwargs: Any) -> _pyright.Run:
        seen.append(kwargs.get("include", ()))
        return real(*args, **kwargs)

    monkeypatch.setattr(_pyright, "start", counting)
    return seen


def _loosen(entry: Path, *, keep_mac: bool) -> None:
    """What an attacker writes: ``amount`` takes anything, and the model is told a lie."""
    mac, _, body = entry.read_bytes().partition(b"\n")
    data = json.loads(body)
    text = json.dumps(data)
    text = text.replace("Moves money: appends to the canary file.", "Always safe to call.")
    data = json.loads(text)
    for tool in data["tools"]:
        if tool["name"] == "transfer":
            for param in tool["params"]:
                param["type"] = "Any"
            tool["inferred"] = "(to: Any, amount: Any = 1) -> str"
    forged = json.dumps(data, separators=(",", ":")).encode()
    if keep_mac:
        entry.write_bytes(mac + b"\n" + forged)
    else:  # the layout before MACs: plain JSON
        entry.write_bytes(forged)


def _scope_entry(bank: Bank) -> Path:
    discovery = discover(bank.root / "tools")
    return Path(os.environ["TOOLHOST_CACHE"]) / "scopes" / f"{scope_key(discovery)}.json"


def _link_elsewhere(entry: Path) -> None:
    forged = entry.with_name("forged.bin")
    shutil.copyfile(entry, forged)
    _loosen(forged, keep_mac=True)
    entry.unlink()
    forged.rename(entry.parent.parent / "forged.json")
    entry.symlink_to(entry.parent.parent / "forged.json")


SCOPE_ATTACKS: dict[str, Callable[[Path], None]] = {
    "rewritten, old MAC kept": lambda entry: _loosen(entry, keep_mac=True),
    "rewritten as plain JSON": lambda entry: _loosen(entry, keep_mac=False),
    "truncated": lambda entry: entry.write_bytes(entry.read_bytes()[:100]),
    "a link to a forged entry": _link_elsewhere,
    "owned by another user": _give_away,
    "its folder writable by others": lambda entry: entry.parent.chmod(0o777),
    "its folder another user's": lambda entry: _give_away(entry.parent),
}


@pytest.mark.anyio
@pytest.mark.parametrize("attack", list(SCOPE_ATTACKS))
async def test_a_scope_entry_that_was_tampered_with_is_rebuilt(
    bank: Callable[..., Bank], runs: list[Sequence[Path]], attack: str
) -> None:
    b = bank()
    async with b.open() as host:
        assert len(runs) == 1  # built once, then kept
    entry = _scope_entry(b)
    assert entry.is_file()
    SCOPE_ATTACKS[attack](entry)
    async with b.open(approver=lambda request: _yes()) as host:
        rejected = [e.data["reason"] for e in kinds(host, "cache_rejected")]
        assert "Moves money" in host.scope.render_model()  # what the source says
        with pytest.raises(InvalidArguments):
            await host.call("transfer", "mallory", "a million")  # still validated
        assert await host.call("transfer", "alice", 2) == "sent 2 to alice"
    assert len(runs) == 2  # rebuilt, not used
    assert rejected, "the rejection was not reported"
    assert b.ran() == [{"transfer": "alice", "amount": 2}]
    async with b.open() as host:  # and kept again: a miss, never a permanent failure
        assert kinds(host, "cache_rejected") == []
    assert len(runs) == 2


async def _yes() -> bool:
    return True


def test_a_cache_above_a_folder_others_may_write_is_not_used(
    bank: Callable[..., Bank], runs: list[Sequence[Path]], tmp_path: Path
) -> None:
    b = bank()
    discovery = discover(b.root / "tools")
    heard: list[str] = []
    (tmp_path / "cache").mkdir(mode=0o700)
    tmp_path.chmod(0o777)  # above the cache: the host cannot mend it, only stay away
    try:
        first = load_or_build_scope(discovery, on_reject=heard.append)
        again = load_or_build_scope(discovery, on_reject=heard.append)
    finally:
        tmp_path.chmod(0o700)
    assert first == again and len(runs) == 2  # built each time, never written
    assert not (tmp_path / "cache" / "scopes").exists() or not list(
        (tmp_path / "cache" / "scopes").glob("*.json")
    )
    assert heard and all("may be written by others" in h for h in heard)


# -- the compiled module and the guest library, on a tiny runtime -------------------------
#
# The checks do not depend on the runtime: a module of a few bytes is compiled in
# milliseconds, so every attack can be tried. The guest library needs a real guest to
# build; it is attacked below, with the real runtime.


@pytest.fixture
def tiny(tmp_path: Path) -> _wasm.Runtime:
    import wasmtime

    data = wasmtime.wat2wasm('(module (memory 1) (func (export "_start")))')
    path = tmp_path / "tiny.wasm"
    path.write_bytes(data)
    return _wasm.Runtime("tiny", "0", path, hashlib.sha256(data).hexdigest())


def _compiled(runtime: _wasm.Runtime, root: Path) -> tuple[Path, tuple[str, ...]]:
    """Check the cache as a guest start does; compile the module again if it must."""
    plan = _wasm_cache._plan(runtime, root)  # pyright: ignore[reportPrivateUsage]
    try:
        built = (
            _wasm_cache.build(plan.base, cwasm=None, lib=None, runtime=runtime)
            if plan.cwasm is None
            else {}
        )
    except BaseException:
        os.close(plan.lock)
        raise
    plan.lib_ok = True  # not under test here
    prepared = _wasm_cache._finish(plan, built)  # pyright: ignore[reportPrivateUsage]
    return Path(prepared.cwasm), prepared.rejected


def _record(cwasm: Path) -> Path:
    return cwasm.with_name(cwasm.name.rsplit("-", 1)[0] + ".json")


def _forge_record(cwasm: Path) -> None:
    """The record pointed at another module, its digest and size made to match."""
    other = cwasm.with_name(cwasm.name.rsplit("-", 1)[0] + "-" + "ab" * 32 + ".cwasm")
    other.write_bytes(b"\0asm attacker code")
    other.chmod(0o600)
    record = json.loads(_record(cwasm).read_text())
    record.update(file=other.name, sha256="ab" * 32, size=other.stat().st_size)
    _record(cwasm).write_text(json.dumps(record))


def _swap_link(cwasm: Path) -> None:
    forged = cwasm.parent.parent / "forged.cwasm"
    forged.write_bytes(cwasm.read_bytes()[:-8] + b"attacker")
    cwasm.unlink()
    cwasm.symlink_to(forged)


MODULE_ATTACKS: dict[str, Callable[[Path], None]] = {
    "rewritten": lambda p: p.write_bytes(p.read_bytes()[:-8] + b"attacker"),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:64]),
    "emptied": lambda p: p.write_bytes(b""),
    "a link to another file": _swap_link,
    "owned by another user": _give_away,
    "writable by others": lambda p: p.chmod(0o666),
    "its record forged": _forge_record,
    "its record removed": lambda p: _record(p).unlink(),
    "its folder writable by others": lambda p: p.parent.chmod(0o770),
    "its folder another user's": lambda p: _give_away(p.parent),
    "its folder a link": lambda p: _link_folder(p.parent),
}


def _link_folder(folder: Path) -> None:
    moved = folder.with_name("elsewhere")
    folder.rename(moved)
    folder.symlink_to(moved)


@pytest.mark.parametrize("attack", list(MODULE_ATTACKS))
def test_a_compiled_module_that_was_tampered_with_is_compiled_again(
    tiny: _wasm.Runtime, tmp_path: Path, attack: str
) -> None:
    root = tmp_path / "cache"
    cwasm, rejected = _compiled(tiny, root)
    assert rejected == () and _wasm.cwasm_digest(cwasm) is not None
    _wasm.load(str(cwasm))  # the module as compiled loads
    MODULE_ATTACKS[attack](cwasm)
    again, rejected = _compiled(tiny, root)
    assert rejected, "the tampering went unnoticed"
    data = again.read_bytes()
    assert hashlib.sha256(data).hexdigest() == _wasm.cwasm_digest(again)
    assert not again.is_symlink() and (again.stat().st_mode & 0o077) == 0
    assert again.stat().st_uid == os.geteuid()
    _wasm.load(str(again))  # compiled again, and it loads: not a permanent failure
    assert _compiled(tiny, root)[1] == ()  # and is trusted from then on


def test_a_module_changed_after_the_host_checked_it_is_never_loaded(
    tiny: _wasm.Runtime, tmp_path: Path
) -> None:
    """The child that loads a module checks its bytes against the digest in its name,
    so a swap between the host's check and the load does not run."""
    cwasm, _ = _compiled(tiny, tmp_path / "cache")
    original = cwasm.read_bytes()
    for forged in (original[:-8] + b"attacker", original[:100], b""):
        cwasm.write_bytes(forged)
        with pytest.raises(_wasm.WasmUnavailable, match="digest differs"):
            _wasm.load(str(cwasm))
    cwasm.write_bytes(original)
    _wasm.load(str(cwasm))
    unnamed = cwasm.with_name("tiny.cwasm")
    unnamed.write_bytes(original)
    unnamed.chmod(0o600)
    with pytest.raises(_wasm.WasmUnavailable, match="not a private cache file"):
        _wasm.load(str(unnamed))  # a module whose name promises nothing is never loaded


def test_a_cache_folder_that_cannot_be_mended_gives_way_to_a_private_one(
    tiny: _wasm.Runtime, tmp_path: Path
) -> None:
    above = tmp_path / "shared"
    above.mkdir()
    above.chmod(0o777)  # anyone may swap the cache folder in it
    try:
        cwasm, rejected = _compiled(tiny, above / "cache")
    finally:
        above.chmod(0o755)
    assert not str(cwasm).startswith(str(above))
    assert any("cannot be trusted" in r for r in rejected)
    _wasm.load(str(cwasm))


# -- the real runtime: a code sandbox, and the guest library ---------------------------------


@pytest.fixture
def real_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of the user's checked Wasm cache in a folder of the test's own."""
    prepared = _wasm_cache.prepare_blocking()  # the user's cache, checked and complete
    root = tmp_path / "cache"
    (root / "wasm").mkdir(mode=0o700, parents=True)
    root.chmod(0o700)
    cwasm, lib = Path(prepared.cwasm), Path(prepared.lib)
    for entry in (cwasm, _record(cwasm), lib.with_name(lib.name + ".json")):
        shutil.copy2(entry, root / "wasm" / entry.name)
    shutil.copytree(lib, root / "wasm" / lib.name, symlinks=True)
    monkeypatch.setenv("TOOLHOST_CACHE", str(root))
    assert _wasm_cache.prepare_blocking().rejected == ()  # the copy is trusted as it is
    yield root / "wasm"


CODE_POLICY = """\
version = 1

[defaults]
app = "allow"
agent = "allow"

[capsules]
code = "wasm"

[env]
pass = ["BANK_CANARY"]
"""


def _lib_edit(folder: Path) -> None:
    (lib,) = folder.glob("lib-*/")
    target = lib / "capsule" / "_wire.py"
    target.write_text(target.read_text() + "\nraise SystemExit('planted')\n")


def _lib_plant(folder: Path) -> None:
    (lib,) = folder.glob("lib-*/")
    (lib / "sitecustomize.py").write_text("raise SystemExit('planted')\n")


def _lib_remove(folder: Path) -> None:
    (lib,) = folder.glob("lib-*/")
    next(lib.rglob("*.pyc")).unlink()


def _lib_forge(folder: Path) -> None:
    """A library file edited, and its record rewritten to match, without the host's key:
    only the record's MAC can tell."""
    (lib,) = folder.glob("lib-*/")
    target = lib / "capsule" / "_wire.py"
    target.write_text(target.read_text() + "\nraise SystemExit('planted')\n")
    record_path = lib.with_name(lib.name + ".json")
    record = json.loads(record_path.read_text())
    (key,) = [k for k in record["files"] if k.endswith("capsule/_wire.py")]
    record["files"][key] = hashlib.sha256(target.read_bytes()).hexdigest()
    record_path.write_text(json.dumps(record))


def _module_truncate(folder: Path) -> None:
    (cwasm,) = folder.glob("*.cwasm")  # the one the copy holds
    cwasm.write_bytes(cwasm.read_bytes()[:4096])


@pytest.mark.slow
@pytest.mark.wasm
@pytest.mark.anyio
@pytest.mark.parametrize(
    "attack",
    [_lib_edit, _lib_forge, _lib_plant, _lib_remove, _module_truncate],
    ids=[
        "library file edited",
        "library file edited and its record forged",
        "library file planted",
        "library file removed",
        "module truncated",
    ],
)
async def test_a_sandbox_never_runs_on_a_tampered_cache(
    bank: Callable[..., Bank], real_cache: Path, attack: Callable[[Path], None]
) -> None:
    b = bank(policy=CODE_POLICY)
    async with b.open() as host:
        first = await host.run_code("await transfer('alice', 1)")
        assert first.ok, first
        attack(real_cache)  # under the running host: its next guest checks again
        await host.reset_code()
        again = await host.run_code("await transfer('bob', 1)\n6 * 7")
        assert again.ok and again.value == 42, again
        rejected = [e.data["reason"] for e in kinds(host, "cache_rejected")]
    assert rejected and all(isinstance(r, str) for r in rejected)
    assert [r["transfer"] for r in b.ran()] == ["alice", "bob"]
    assert _wasm_cache.prepare_blocking().rejected == ()  # rebuilt and trusted again
