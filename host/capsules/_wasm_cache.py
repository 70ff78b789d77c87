"""The Wasm runtime's private cache: the runtime compiled for this wasmtime and engine
settings, and the guest library (``capsule`` and pure-Python ``msgpack``, compiled to
``.pyc`` by a guest, with the standard library modules a guest imports while starting).

Both live under :func:`cache_root`, in a folder only this user can use, under content
keys: another runtime, wasmtime, engine setting or library file makes a new entry.
:func:`prepare` builds what is missing in a child process (``_wasm_child.py prepare``
runs :func:`prepare_blocking`), once per host process and cache, and returns the
:class:`Prepared` paths the rest of the host uses.

The child loads this file by path, next to ``_wasm.py``: its top level imports the
standard library and ``_wasm`` only.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._wasm import (
    CHILD,
    ENGINE_SETTINGS,
    HOST_ROOT,
    LIB_GUEST,
    STDLIB_GUEST,
    GuestSpec,
    Preopen,
    Runtime,
    WasmUnavailable,
    child_command,
    child_env,
    default_runtime,
    guest_argv,
    new_engine,
    private_file,
)

__all__ = ["Prepared", "cache_root", "prepare", "prepare_blocking"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A runtime compiled for this wasmtime, and the guest library, in the private cache."""

    runtime: str
    python: str
    cwasm: str
    lib: str


def cache_root() -> Path:
    """toolhost's one cache folder, whose ``wasm/`` is this cache: ``$TOOLHOST_CACHE``,
    else ``$XDG_CACHE_HOME/toolhost``, else ``~/.cache/toolhost`` (``host.declare`` owns
    the definition; imported here, as the child never calls this)."""
    from host.declare import cache_root as root

    return root()


def _private_dir(path: Path) -> Path:
    """``path`` as a folder only this user can use; refuses one that anybody else could."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise WasmUnavailable(f"{path} is not a folder (a link?); refusing it as the cache")
    if info.st_uid != os.getuid():
        raise WasmUnavailable(f"{path} belongs to another user; refusing it as the cache")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def _wasmtime_version() -> str:
    from importlib.metadata import version

    return version("wasmtime")


def _settings_key(runtime: Runtime) -> str:
    import hashlib

    text = json.dumps(
        [runtime.sha256, _wasmtime_version(), dict(ENGINE_SETTINGS), sys.platform],
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _lib_sources() -> list[tuple[str, Path]]:
    """(guest-relative name, host file) of the guest library."""
    import msgpack  # pyright: ignore[reportMissingTypeStubs]

    files: list[tuple[str, Path]] = []
    capsule_dir = HOST_ROOT / "capsule"
    for path in sorted(capsule_dir.glob("*.py")):
        files.append((f"capsule/{path.name}", path))
    msgpack_dir = Path(msgpack.__file__).resolve().parent
    for name in ("__init__.py", "exceptions.py", "ext.py", "fallback.py"):
        files.append((f"msgpack/{name}", msgpack_dir / name))
    return files


_LIB_LAYOUT = b"lib 2: stdlib copy"
"""Changes when the library's layout does (a new key: the cache is rebuilt)."""

_BUILD_LIB = f"""
import os, sys

def started_from_zip():
    # The standard library the sandbox's guest imports while starting, as zip entries
    # (a package whole: its submodules are looked up in its own folder only).
    zips = [p for p in sys.path if p.endswith(".zip") and os.path.isfile(p)]
    if not zips:
        return None, set()
    import capsule._guest
    found = set()
    for module in list(sys.modules.values()):
        origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
        if origin.startswith(zips[0] + "/"):
            name = origin[len(zips[0]) + 1 :]
            found.add(name.rsplit("/", 1)[0] + "/" if hasattr(module, "__path__") else name)
    return zips[0], found

path, found = started_from_zip()
import compileall, zipfile
os.mkdir({STDLIB_GUEST!r})
if path is not None:
    with zipfile.ZipFile(path) as archive:
        for entry in archive.namelist():
            if entry in found or any(d.endswith("/") and entry.startswith(d) for d in found):
                target = {STDLIB_GUEST!r}
                for part in entry.split("/")[:-1]:
                    target += "/" + part
                    if not os.path.isdir(target):
                        os.mkdir(target)
                if not entry.endswith("/"):
                    with open(target + "/" + entry.rsplit("/", 1)[-1], "wb") as out:
                        out.write(archive.read(entry))
sys.exit(not compileall.compile_dir({LIB_GUEST!r}, quiet=1))
"""
"""Run by the guest over a writable copy of its library: copies the standard library
modules the sandbox's guest imports while starting out of the runtime's zip (whose
directory alone takes ~18 ms to read at every start), then compiles the library."""


def _lib_key(key: str, files: Sequence[tuple[str, Path]]) -> str:
    import hashlib

    digest = hashlib.sha256(key.encode() + _LIB_LAYOUT)
    for name, path in files:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


def _guest_env() -> dict[str, str]:
    return {"MSGPACK_PUREPYTHON": "1", "PYTHONHASHSEED": "random"}


def _compile(runtime: Runtime, target: Path) -> None:
    import hashlib
    import tempfile

    import wasmtime

    data = runtime.wasm.read_bytes()
    if hashlib.sha256(data).hexdigest() != runtime.sha256:
        raise WasmUnavailable(f"{runtime.wasm} does not have its pinned SHA-256; not compiling it")
    module = wasmtime.Module(new_engine(), data)
    fd, tmp = tempfile.mkstemp(prefix=".cwasm-", dir=target.parent)  # created 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(module.serialize())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _build_lib(cwasm: Path, target: Path, files: Sequence[tuple[str, Path]]) -> None:
    """Copy the guest library and let the guest itself compile it to ``.pyc``."""
    import shutil
    import subprocess
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix=".lib-", dir=target.parent))
    try:
        for name, source in files:
            dest = tmp / name
            dest.parent.mkdir(exist_ok=True)
            shutil.copyfile(source, dest)
        spec = GuestSpec(
            cwasm=str(cwasm),
            argv=guest_argv(_BUILD_LIB),
            env=_guest_env(),
            preopens=[Preopen(str(tmp), LIB_GUEST, writable=True)],
        )
        done = subprocess.run(
            child_command(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            cwd=str(HOST_ROOT),
            env=child_env(spec),
            check=False,
        )
        if done.returncode != 0:
            raise WasmUnavailable(
                "the guest could not compile its library: "
                + done.stderr.decode("utf-8", "replace")[-2000:]
            )
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # another process won the race: theirs is the same
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def prepare_blocking(runtime: Runtime | None = None, root: Path | None = None) -> Prepared:
    """Compile the runtime and build the guest library in the cache, unless already there.

    Blocking and slow the first time (seconds): call it from a child process or a thread.
    """
    runtime = runtime or default_runtime()
    base = _private_dir((root or cache_root()) / "wasm")
    key = _settings_key(runtime)
    cwasm = base / f"{runtime.name}-{key}.cwasm"
    if not private_file(cwasm):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(cwasm)  # a file we did not make, or a link: never load it
        _compile(runtime, cwasm)
    files = _lib_sources()
    lib = base / f"lib-{_lib_key(key, files)}"
    if not lib.is_dir() or lib.is_symlink():
        _build_lib(cwasm, lib, files)
    return Prepared(runtime.name, runtime.python, str(cwasm), str(lib))


# -- from the host: once per process and cache ---------------------------------------------

_prepared: dict[tuple[str, str], Prepared] = {}


async def prepare(runtime: Runtime | None = None) -> Prepared:
    """:func:`prepare_blocking` in a child process, once per host process and cache."""
    import anyio

    runtime = runtime or default_runtime()
    memo = (runtime.sha256, str(cache_root()))
    found = _prepared.get(memo)
    if found is not None:
        return found
    async with _prepare_lock():
        found = _prepared.get(memo)
        if found is not None:
            return found
        done = await anyio.run_process(
            [sys.executable, "-I", str(CHILD), "prepare", str(cache_root())],
            cwd=str(HOST_ROOT),
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home())},
            check=False,
        )
        if done.returncode != 0:
            raise WasmUnavailable(
                "preparing the Wasm runtime failed: "
                + done.stderr.decode("utf-8", "replace")[-2000:]
            )
        found = Prepared(**json.loads(done.stdout))
        _prepared[memo] = found
        return found


_lock: list[Any] = []


def _prepare_lock() -> Any:
    import anyio

    if not _lock:
        _lock.append(anyio.Lock())
    return _lock[0]
