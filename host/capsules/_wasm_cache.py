"""The Wasm runtime's private cache: the runtime compiled for this wasmtime and engine
settings, and the guest library (``capsule`` and pure-Python ``msgpack``, compiled to
``.pyc`` by a guest, with the standard library modules a guest imports while starting).

A cache is an input, never the truth: whoever can write it could run their own machine
code in a sandbox's process (``Module.deserialize`` runs what it is given) or change what
the guest's library does. So every entry is vouched for by a record beside it, a keyed
MAC (``host.trust``: the key lives outside the cache) over the entry's SHA-256 digests;
a compiled module is named by its digest, and the child that loads it checks the bytes
it reads against the name (``_wasm.load``). Every use (each guest started) checks the
folders on the way (owned by this user, written by nobody else), the records, and the
entries against them (hashed again whenever a file's status changed). Whatever fails is
moved aside and built again, and said (:attr:`Prepared.rejected`: the caller emits a
``cache_rejected`` event); a cache folder that cannot be trusted at all gives way to a
private folder for this process. ``docs/security/trust.md`` says what this assumes.

Layout under :func:`cache_root`, in ``wasm/``: ``NAME-SETTINGS-SHA256.cwasm`` with its
record ``NAME-SETTINGS.json``; ``lib-KEY/`` with its record ``lib-KEY.json``. Content
keys: another runtime, wasmtime, engine setting or library file makes a new entry. A
runtime whose standard library is a zip (the data runtime) gets a copy of it in its
library, ``lib-KEY/runtime/NAME.zip``, checked against the pinned digest while it is
copied and recorded with the rest (the guest sees that folder at the zip's place).

:func:`prepare` checks, builds what is missing in a child process (``_wasm_child.py
prepare`` runs :func:`build`), records it, and returns the :class:`Prepared` paths the
rest of the host uses; :func:`prepare_blocking` does the same in this process. The child
loads this file by path, next to ``_wasm.py``: its top level imports the standard
library and ``_wasm`` only (what the host alone runs imports ``host.trust`` inside).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from ._wasm import (
    BOOT_ENV,
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
    cwasm_digest,
    default_runtime,
    new_engine,
)

if TYPE_CHECKING:
    from host.trust import HostKey

__all__ = ["Prepared", "build", "cache_root", "prepare", "prepare_blocking"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A runtime compiled for this wasmtime, and the guest library, in the private cache."""

    runtime: str
    python: str
    cwasm: str
    lib: str
    rejected: tuple[str, ...] = field(default=(), compare=False)
    """What was wrong in the cache and was built again for this use (one sentence each)."""
    source: Runtime | None = field(default=None, compare=False)
    """The runtime these paths are of (its entry and argv)."""

    def preopens(self) -> list[Preopen]:
        """What every guest of this runtime sees: its library, and its standard library
        zip where it has one (both read-only)."""
        found = [Preopen(self.lib, LIB_GUEST, writable=False)]
        if self.source is not None and self.source.stdlib is not None:
            zipped = Path(self.source.stdlib_guest)
            found.append(Preopen(f"{self.lib}/{_ZIP_FOLDER}", str(zipped.parent)))
        return found

    def code_spec(self, code: str, env: Mapping[str, str], memory: int | None) -> GuestSpec:
        """A code sandbox's guest: ``code`` run with the library's copy of the standard
        library modules a guest imports at start (a command runtime; a reactor's snapshot
        has them imported already)."""
        source = self.source or default_runtime()
        if source.entry == "_start":
            from ._wasm import boot_argv

            argv, env = boot_argv(code), {**env, **BOOT_ENV}
        else:
            argv, env = source.argv(code), dict(env)
        return GuestSpec(
            cwasm=self.cwasm,
            argv=argv,
            env=env,
            preopens=self.preopens(),
            memory=memory,
            entry=source.entry,
        )


def cache_root() -> Path:
    """toolhost's one cache folder, whose ``wasm/`` is this cache: ``$TOOLHOST_CACHE``,
    else ``$XDG_CACHE_HOME/toolhost``, else ``~/.cache/toolhost`` (``host.declare`` owns
    the definition; imported here, as the child never calls this)."""
    from host.declare import cache_root as root

    return root()


def _wasmtime_version() -> str:
    from importlib.metadata import version

    return version("wasmtime")


def _settings_key(runtime: Runtime) -> str:
    parts: list[Any] = [runtime.sha256, _wasmtime_version(), dict(ENGINE_SETTINGS), sys.platform]
    if runtime.stdlib is not None:
        parts.append(runtime.stdlib_sha256)
    text = json.dumps(parts, sort_keys=True)
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


_ZIP_FOLDER: Final = "runtime"
"""The library's folder holding a copy of the runtime's standard library zip."""

_LIB_LAYOUT = b"lib 3: stdlib copy, verified"
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
    digest = hashlib.sha256(key.encode() + _LIB_LAYOUT)
    for name, path in files:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


def _guest_env() -> dict[str, str]:
    return {"MSGPACK_PUREPYTHON": "1", "PYTHONHASHSEED": "random"}


# -- building (in the child, or in this process) -------------------------------------------


def _compile(runtime: Runtime, base: Path, stem: str) -> tuple[str, str, int]:
    """Compile the runtime into ``base``; (file, SHA-256, size) of what was written."""
    import tempfile

    import wasmtime

    data = runtime.wasm.read_bytes()
    if hashlib.sha256(data).hexdigest() != runtime.sha256:
        raise WasmUnavailable(f"{runtime.wasm} does not have its pinned SHA-256; not compiling it")
    compiled = wasmtime.Module(new_engine(), data).serialize()
    digest = hashlib.sha256(compiled).hexdigest()
    target = base / f"{stem}-{digest}.cwasm"
    fd, tmp = tempfile.mkstemp(prefix=".cwasm-", dir=base)  # created 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(compiled)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target.name, digest, len(compiled)


def _walk(folder: Path, relative: str = "") -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Every entry under ``folder`` (relative name, entry), links never followed."""
    with os.scandir(folder) as entries:
        listed = sorted(entries, key=lambda e: e.name)
    for entry in listed:
        name = f"{relative}{entry.name}"
        yield name, entry
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(Path(entry.path), name + "/")


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _manifest(folder: Path) -> dict[str, str]:
    """The digest of every file under ``folder``, by relative name."""
    return {
        name: _hash_file(Path(entry.path))
        for name, entry in _walk(folder)
        if entry.is_file(follow_symlinks=False)
    }


def _copy_checked(source: Path, dest: Path, digest: str) -> None:
    """Copy ``source`` to ``dest`` if the bytes read have ``digest``; else refuse."""
    hashed = hashlib.sha256()
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f, open(dest, "xb") as out:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            hashed.update(chunk)
            out.write(chunk)
    if hashed.hexdigest() != digest:
        raise WasmUnavailable(f"{source} does not have its pinned SHA-256; not using it")


def _build_lib(
    cwasm: Path, target: Path, files: Sequence[tuple[str, Path]], runtime: Runtime
) -> dict[str, str]:
    """Copy the guest library and let the guest itself compile it to ``.pyc``; returns the
    digests of what is in ``target`` then (hashed before it gets its name)."""
    import shutil
    import subprocess
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix=".lib-", dir=target.parent))
    try:
        for name, source in files:
            dest = tmp / name
            dest.parent.mkdir(exist_ok=True)
            shutil.copyfile(source, dest)
        preopens = [Preopen(str(tmp), LIB_GUEST, writable=True)]
        if runtime.stdlib is not None:
            zipped = Path(runtime.stdlib_guest)
            (tmp / _ZIP_FOLDER).mkdir()
            _copy_checked(runtime.stdlib, tmp / _ZIP_FOLDER / zipped.name, runtime.stdlib_sha256)
            preopens.append(Preopen(str(tmp / _ZIP_FOLDER), str(zipped.parent)))
        spec = GuestSpec(
            cwasm=str(cwasm),
            argv=runtime.argv(_BUILD_LIB),
            env=_guest_env(),
            preopens=preopens,
            entry=runtime.entry,
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
        manifest = _manifest(tmp)
        os.rename(tmp, target)  # the folder was moved aside first: nothing is in the way
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


STEP_PREFIX: Final = "toolhost-wasm: step "
"""How the ``prepare`` child says on stderr which step it starts (``compile``, ``library``)."""


def _step(name: str, steps: bool) -> None:
    if steps:
        os.write(2, f"{STEP_PREFIX}{name}\n".encode())


def build(
    base: Path,
    *,
    cwasm: str | None,
    lib: str | None,
    runtime: Runtime | None = None,
    steps: bool = False,
) -> dict[str, Any]:
    """Build what is missing in ``base`` (a checked private folder): the compiled runtime
    (``cwasm`` is None), the library ``lib`` (a folder name) with the module ``cwasm``.
    ``steps``: say each step on stderr (:data:`STEP_PREFIX`).

    Returns what was built and the digests of the bytes written (never read back from
    the disk): ``{"cwasm": NAME, "sha256": .., "size": .., "lib": NAME, "files": {..}}``.
    """
    runtime = runtime or default_runtime()
    out: dict[str, Any] = {}
    if cwasm is None:
        _step("compile", steps)
        name, digest, size = _compile(runtime, base, f"{runtime.name}-{_settings_key(runtime)}")
        out.update(cwasm=name, sha256=digest, size=size)
        cwasm = name
    if lib is not None:
        _step("library", steps)
        files = _build_lib(base / cwasm, base / lib, _lib_sources(), runtime)
        out.update(lib=lib, files=files)
    return out


# -- checking and recording (the host) -----------------------------------------------------

_RACY: Final = 2.0
"""Seconds within which a file's status cannot show a later change: hash it again."""

_seen: dict[str, tuple[tuple[int, ...], str]] = {}
"""path -> (status when hashed, digest): a file whose status is unchanged since is not
hashed again (a change to its contents changes its ctime, which nobody can set)."""


def _status(info: os.stat_result) -> tuple[int, ...]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _digest_of(path: Path, info: os.stat_result) -> str:
    status = _status(info)
    seen = _seen.get(str(path))
    if seen is not None and seen[0] == status and time.time() - info.st_ctime > _RACY:
        return seen[1]
    digest = _hash_file(path)
    _seen[str(path)] = (status, digest)
    return digest


def _entry_problem(path: Path, root: Path, *, folder: bool = False) -> str | None:
    from host.trust import path_problem

    problem = path_problem(path, private_from=root)
    if problem is None:
        info = os.lstat(path)
        if folder != stat.S_ISDIR(info.st_mode):
            return f"{path} is not a {'folder' if folder else 'file'}"
    return problem


def _read_record(path: Path, root: Path) -> dict[str, Any] | None:
    if not os.path.lexists(path):
        return None
    problem = _entry_problem(path, root)
    if problem is not None:
        raise _Bad(problem)
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise _Bad(f"{path} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise _Bad(f"{path} is not a cache record")
    return data  # pyright: ignore[reportUnknownVariableType]


def _write_record(path: Path, data: Mapping[str, Any]) -> None:
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=".record-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(dict(data), f, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class _Bad(Exception):
    """An entry that cannot be trusted; the message says why."""


def _cwasm_mac(key: HostKey, stem: str, name: str, digest: str, size: int) -> str:
    return key.mac("wasm-cwasm", stem, name, digest, size)


def _lib_mac(key: HostKey, name: str, files: Mapping[str, str]) -> str:
    return key.mac("wasm-lib", name, json.dumps(dict(files), sort_keys=True))


def _check_cwasm(base: Path, root: Path, stem: str, key: HostKey) -> str:
    """The verified compiled module's name. Raises :class:`_Bad`, or FileNotFoundError
    when there is none."""
    record = _read_record(base / f"{stem}.json", root)
    if record is None:
        unrecorded = sorted(p.name for p in base.glob(f"{stem}-*.cwasm"))
        if unrecorded:  # a module nothing vouches for: never loaded, compiled again
            raise _Bad(f"{base / unrecorded[0]} has no record")
        raise FileNotFoundError(stem)
    name, digest, size = record.get("file"), record.get("sha256"), record.get("size")
    if not (isinstance(name, str) and isinstance(digest, str) and isinstance(size, int)):
        raise _Bad(f"the record of {stem} is malformed")
    if not key.verify(record.get("mac"), "wasm-cwasm", stem, name, digest, size):
        raise _Bad(f"the record of {stem} is not signed by this host's key")
    path = base / name
    if cwasm_digest(path) != digest or "/" in name:
        raise _Bad(f"the record of {stem} names {name!r}, not its own module")
    problem = _entry_problem(path, root)
    if problem is not None:
        raise _Bad(problem)
    info = os.lstat(path)
    if info.st_size != size or _digest_of(path, info) != digest:
        raise _Bad(f"{path} is not the module that was compiled (rewritten or truncated)")
    return name


def _check_lib(base: Path, root: Path, name: str, key: HostKey) -> None:
    """Check the guest library ``name``: every file, and nothing more, as recorded."""
    record = _read_record(base / f"{name}.json", root)
    folder = base / name
    if record is None:
        if os.path.lexists(folder):
            raise _Bad(f"{folder} has no record")
        raise FileNotFoundError(name)
    listed = record.get("files")
    if not isinstance(listed, dict) or not key.verify(
        record.get("mac"), "wasm-lib", name, json.dumps(listed, sort_keys=True)
    ):
        raise _Bad(f"the record of {name} is not signed by this host's key")
    files = cast("dict[str, object]", listed)
    problem = _entry_problem(folder, root, folder=True)
    if problem is not None:
        raise _Bad(problem)
    seen: set[str] = set()
    uid = os.geteuid()
    for relative, entry in _walk(folder):
        info = entry.stat(follow_symlinks=False)
        where = f"{folder}/{relative}"
        if stat.S_ISLNK(info.st_mode) or not (
            stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)
        ):
            raise _Bad(f"{where} is not a plain file or folder")
        if info.st_uid != uid or info.st_mode & 0o022:
            raise _Bad(f"{where} may be written by others, or belongs to another user")
        if stat.S_ISREG(info.st_mode):
            if files.get(relative) != _digest_of(Path(entry.path), info):
                raise _Bad(f"{where} is not what was built (changed or added)")
            seen.add(relative)
    missing = set(files) - seen
    if missing:
        raise _Bad(f"{folder} lacks {len(missing)} of its files ({sorted(missing)[0]}, ...)")


@dataclass(slots=True)
class _Plan:
    """What one use found: the folder, what is good, what must be built, what was wrong."""

    runtime: Runtime
    root: Path
    base: Path
    stem: str
    lib: str
    cwasm: str | None = None
    lib_ok: bool = False
    rejected: list[str] = field(default_factory=list[str])
    lock: int = -1


def _fallback_base(reason: str, rejected: list[str]) -> tuple[Path, Path]:
    """A private folder for this process alone, when the cache folder cannot be trusted."""
    import atexit
    import shutil
    import tempfile

    from host.trust import path_problem

    for made in _fallback:
        if path_problem(made, private_from=made) is None:
            return made, made
    made = Path(tempfile.mkdtemp(prefix="toolhost-wasm-"))
    problem = path_problem(made, private_from=made)
    if problem is not None:
        raise WasmUnavailable(f"no private folder for the Wasm runtime: {reason}; {problem}")
    _fallback.append(made)
    atexit.register(shutil.rmtree, made, True)
    rejected.append(f"{reason}: the runtime is compiled for this process alone, in {made}")
    return made, made


_fallback: list[Path] = []


def _plan(runtime: Runtime, root: Path) -> _Plan:
    """Check the cache for one use (blocking); hold its lock until :func:`_finish`."""
    import fcntl

    from host.trust import host_key, private_folder

    key = host_key()
    rejected: list[str] = []
    if key.problem is not None:
        rejected.append(f"the host's key is for this process only ({key.problem})")
    folder = private_folder(root / "wasm", private_from=root)
    rejected.extend(folder.notices)
    base = folder.path
    if folder.problem is not None:
        root, base = _fallback_base(
            f"the cache folder cannot be trusted ({folder.problem})", rejected
        )
    settings = _settings_key(runtime)
    lib = f"lib-{_lib_key(settings, _lib_sources())}"
    plan = _Plan(runtime, root, base, f"{runtime.name}-{settings}", lib)
    plan.rejected = rejected
    plan.lock = os.open(
        base / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    fcntl.flock(plan.lock, fcntl.LOCK_EX)  # one builder at a time, across processes
    try:
        plan.cwasm = _check_cwasm(base, root, plan.stem, key)
    except FileNotFoundError:
        pass
    except _Bad as exc:
        rejected.append(f"{exc}: compiled again")
        _drop(base / f"{plan.stem}.json")
    try:
        _check_lib(base, root, plan.lib, key)
        plan.lib_ok = True
    except FileNotFoundError:
        pass
    except _Bad as exc:
        rejected.append(f"{exc}: built again")
        _drop(base / f"{plan.lib}.json", base / plan.lib)
    return plan


def _drop(*paths: Path) -> None:
    from host.trust import quarantine

    for path in paths:
        quarantine(path)
        _seen.pop(str(path), None)


def _finish(plan: _Plan, built: Mapping[str, Any]) -> Prepared:
    """Record what was built, release the lock, and say where everything is."""
    from host.trust import host_key

    key = host_key()
    try:
        if "cwasm" in built:
            name, digest, size = str(built["cwasm"]), str(built["sha256"]), int(built["size"])
            record = {
                "file": name,
                "sha256": digest,
                "size": size,
                "mac": _cwasm_mac(key, plan.stem, name, digest, size),
            }
            _write_record(plan.base / f"{plan.stem}.json", record)
            plan.cwasm = name
            for old in plan.base.glob(f"{plan.stem}-*.cwasm"):  # modules no record names
                if old.name != name:
                    _drop(old)
        if "files" in built:
            files = {str(k): str(v) for k, v in dict(built["files"]).items()}
            _write_record(
                plan.base / f"{plan.lib}.json",
                {"files": files, "mac": _lib_mac(key, plan.lib, files)},
            )
    finally:
        os.close(plan.lock)
    assert plan.cwasm is not None
    runtime = plan.runtime
    return Prepared(
        runtime.name,
        runtime.python,
        str(plan.base / plan.cwasm),
        str(plan.base / plan.lib),
        tuple(plan.rejected),
        runtime,
    )


def _wanted(plan: _Plan) -> tuple[str | None, str | None]:
    return plan.cwasm, None if plan.lib_ok else plan.lib


def prepare_blocking(runtime: Runtime | None = None, root: Path | None = None) -> Prepared:
    """Check the cache, build what is missing or bad (in this process), and record it.

    Blocking and slow the first time (seconds): call it from a child process or a thread.
    """
    runtime = runtime or default_runtime()
    plan = _plan(runtime, root or cache_root())
    built: dict[str, Any] = {}
    try:
        cwasm, lib = _wanted(plan)
        if cwasm is None or lib is not None:
            built = build(plan.base, cwasm=cwasm, lib=lib, runtime=runtime)
    except BaseException:
        os.close(plan.lock)
        raise
    return _finish(plan, built)


# -- from the host: at every use -----------------------------------------------------------


async def prepare(
    runtime: Runtime | None = None, on_step: Callable[[str], None] | None = None
) -> Prepared:
    """The cache checked for this use, and what is missing or bad built in a child process.

    Every call checks (a few milliseconds, off the event loop): each guest started uses
    the cache as it is now, never as it was when the host started. ``on_step`` is told
    each step the child starts (``compile``, ``library``), for a progress display.
    """
    import anyio

    runtime = runtime or default_runtime()
    plan = await anyio.to_thread.run_sync(_plan, runtime, cache_root())
    built: dict[str, Any] = {}
    try:
        cwasm, lib = _wanted(plan)
        if cwasm is None or lib is not None:
            command = [sys.executable, "-I", str(CHILD), "prepare", str(plan.base)]
            command += [cwasm or "-", lib or "-", runtime.name]
            built = await _run_prepare(command, on_step)
    except BaseException:
        os.close(plan.lock)
        raise
    return await anyio.to_thread.run_sync(_finish, plan, built)


async def _run_prepare(command: list[str], on_step: Callable[[str], None] | None) -> Any:
    """Run the ``prepare`` child; its JSON answer. Its stderr is read as it comes (the
    steps it says), its stdout at the end; the last 2,000 characters of stderr make the
    error when it fails."""
    import subprocess

    import anyio
    from anyio.abc import ByteReceiveStream

    err: list[str] = []
    out = bytearray()

    async def read_err(stream: ByteReceiveStream) -> None:
        pending = b""
        async for chunk in stream:
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                if line.startswith(STEP_PREFIX):
                    if on_step is not None:
                        on_step(line.removeprefix(STEP_PREFIX))
                else:
                    err.append(line + "\n")
        err.append(pending.decode("utf-8", "replace"))

    async def read_out(stream: ByteReceiveStream) -> None:
        async for chunk in stream:
            out.extend(chunk)

    async with await anyio.open_process(
        command,
        stdin=subprocess.DEVNULL,
        cwd=str(HOST_ROOT),
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home())},
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_err, process.stderr)
            tg.start_soon(read_out, process.stdout)
        code = await process.wait()
    if code != 0:
        raise WasmUnavailable("preparing the Wasm runtime failed: " + "".join(err)[-2000:])
    return json.loads(bytes(out))
