"""The variants of the trivial-call case; each runs in a worker process of its own.

A case answers two questions: how long one call takes when it is the only one in flight
(``latency``: nanoseconds per call), and how long a burst of calls takes with many in
flight (``burst``: seconds). The runner starts one worker per case (``python -m
benchmarks._cases NAME PROJECT``), keeps it open, and sends it commands as JSON lines on
stdin; the answers come back the same way on stdout. Only one worker runs at a time, so
short batches of every case can be interleaved, and each case has its own interpreter:
no shared heap, garbage collector or GIL between them, and a worker can import ``host``
and ``capsule`` from another tree (``--baseline``) for a before/after in one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import msgpack  # pyright: ignore[reportMissingTypeStubs]

__all__ = ["SPECS", "CaseSpec", "Worker", "write_project"]

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
_CHUNK = 1 << 16  # bytes per read; see _pipe_child._CHUNK for why not more

TOOL_SOURCE = '''\
"""The trivial tools of the benchmark."""


async def add(a: int, b: int) -> int:
    return a + b


def add_sync(a: int, b: int) -> int:
    return a + b
'''


def write_project(root: Path) -> Path:
    """A tiny project with an async ``add`` and a sync ``add_sync``."""
    tools = root / "tools"
    tools.mkdir(parents=True, exist_ok=True)
    (tools / "bench.py").write_text(TOOL_SOURCE, encoding="utf-8")
    return root


@dataclass(frozen=True, slots=True)
class CaseSpec:
    """What the runner knows about a case without starting it."""

    name: str
    title: str
    concurrent: bool
    """Whether it runs bursts (many calls in flight)."""
    ours: bool
    """Whether it runs our ``host``/``capsule`` code (so ``--baseline`` applies)."""


SPECS: dict[str, CaseSpec] = {
    spec.name: spec
    for spec in (
        CaseSpec("inproc", "in-process await of the same function", False, False),
        CaseSpec("pipe", "bare msgpack pipe, blocking client, minimal child", False, False),
        CaseSpec("pipe-asyncio", "bare msgpack pipe, asyncio client, minimal child", True, False),
        CaseSpec("capsule", "our capsule (async add), blocking client", False, True),
        CaseSpec("capsule-sync", "our capsule (sync add_sync), blocking client", False, True),
        CaseSpec("transport", "the host's capsule transport alone, asyncio", True, True),
        CaseSpec("transport-trio", "the host's capsule transport alone, trio", True, True),
        CaseSpec("host-twin", "host + in-process twin, no audit store, add, asyncio", False, True),
        CaseSpec("host", "host + subprocess capsule, add (async), asyncio", True, True),
        CaseSpec("host-sync", "host + subprocess capsule, add_sync (sync), asyncio", True, True),
        CaseSpec("host-trio", "host + subprocess capsule, add (async), trio", True, True),
        CaseSpec("host-trio-sync", "host + subprocess capsule, add_sync (sync), trio", True, True),
        CaseSpec("host-nostore", "as host, with a store that keeps nothing", True, True),
        CaseSpec("host-trio-nostore", "as host-trio, with a store that keeps nothing", True, True),
        CaseSpec("host-hooks5", "as host, with five no-op hooks that all run", True, True),
    )
}


# -- the runner's side ---------------------------------------------------------------------


class Worker:
    """The runner's handle on one case's worker process."""

    def __init__(self, spec: CaseSpec, project: Path, tree: Path | None = None) -> None:
        self.spec = spec
        self.tree = tree
        paths = [str(tree), str(_ROOT)] if tree is not None else [str(_ROOT)]
        boot = (
            f"import sys; sys.path[:0] = {paths!r}; "
            "from benchmarks._cases import main; main(sys.argv[1:])"
        )
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-c", boot, spec.name, str(project)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._ask("start")

    def _ask(self, command: str, *args: int) -> Any:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps([command, *args]) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker of case {self.spec.name} died")
        ok, value = json.loads(line)
        if not ok:
            raise RuntimeError(f"case {self.spec.name} failed: {value}")
        return value

    def latency(self, calls: int, budget: float) -> tuple[list[int], int, int]:
        """Up to ``calls`` calls one after the other, stopping once ``budget`` seconds
        have passed; nanoseconds each, and CPU nanoseconds of the worker and its children.
        """
        samples, cpu_self, cpu_children = self._ask("latency", calls, int(budget * 1e9))
        return samples, cpu_self, cpu_children

    def burst(self, calls: int, inflight: int, budget: float) -> tuple[int, float, int, int]:
        """Up to ``calls`` calls from ``inflight`` concurrent callers, which stop starting
        new calls once ``budget`` seconds have passed; (calls done, seconds in all, CPU
        nanoseconds of the worker and of its children)."""
        (done, seconds), cpu_self, cpu_children = self._ask(
            "burst", calls, inflight, int(budget * 1e9)
        )
        return done, seconds, cpu_self, cpu_children

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):
            self._ask("close")
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


# -- the worker's side ---------------------------------------------------------------------


def _cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` (Linux schedstat: exact, not tick-sampled)."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return total


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            children.setdefault(int(stat[stat.rfind(b")") + 2 :].split()[1]), []).append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


class _Cpu:
    """CPU nanoseconds of this worker and of its descendants, over one batch.

    The worker's own time comes from ``CLOCK_PROCESS_CPUTIME_ID`` (current to the
    nanosecond); its descendants, asleep when read, from their ``schedstat``. The
    descendants are found before the first reading, so reading ``/proc`` stays out of it.
    """

    def __init__(self) -> None:
        self._pids = _descendants(os.getpid())
        self._children = sum(_cpu_ns(pid) for pid in self._pids)
        self._me = time.process_time_ns()

    def stop(self, samples: Any) -> list[Any]:
        me = time.process_time_ns() - self._me
        children = sum(_cpu_ns(pid) for pid in self._pids) - self._children
        return [samples, me, children]


def _packb(value: Any) -> bytes:
    return cast(bytes, msgpack.packb(value, use_bin_type=True))  # pyright: ignore[reportUnknownMemberType]


def _unpackb(data: bytes | bytearray) -> Any:
    return msgpack.unpackb(data, raw=False)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]


def _call_frame(call_id: int, tool: str) -> bytes:
    """A ``call`` frame as the host builds it: the arguments are encoded per call too."""
    body = _packb({"k": "call", "id": call_id, "tool": tool, "args": _packb({"a": 1, "b": 2})})
    return len(body).to_bytes(4, "big") + body


class _Child:
    """A child process speaking frames on stdin/stdout, through raw blocking descriptors."""

    def __init__(self, command: list[str], cwd: str | None = None) -> None:
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, cwd=cwd
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.wfd = self.process.stdin.fileno()
        self.rfd = self.process.stdout.fileno()
        self._buf = bytearray()

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.wfd, view) :]

    def receive(self) -> Any:
        """The next frame's value (blocking)."""
        buf = self._buf
        while True:
            if len(buf) >= 4:
                size = int.from_bytes(buf[:4], "big")
                if len(buf) - 4 >= size:
                    value = _unpackb(buf[4 : 4 + size])
                    del buf[: 4 + size]
                    return value
            data = os.read(self.rfd, _CHUNK)
            if not data:
                raise EOFError("the child closed its output")
            buf += data

    def close(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        self.process.stdout.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _pipe_child() -> _Child:
    return _Child([sys.executable, "-I", str(_HERE / "_pipe_child.py")])


def _capsule_child(project: Path) -> _Child:
    """Our capsule, started and loaded the way the host does it (by hand, no host code)."""
    import capsule

    parent = str(Path(capsule.__file__).resolve().parent.parent)
    boot = f"import sys; sys.path.insert(0, {parent!r}); from capsule.__main__ import main; main()"
    child = _Child([sys.executable, "-I", "-c", boot], cwd=str(project))
    params = [["a", 1], ["b", 1]]
    load = {
        "k": "load",
        "dir": str(project / "tools"),
        "files": ["bench"],
        "tools": {"add": ["bench", ["add"], params], "add_sync": ["bench", ["add_sync"], params]},
    }
    body = _packb(load)
    child.send(len(body).to_bytes(4, "big") + body)
    while True:
        msg = child.receive()
        if msg["k"] == "ready":
            return child
        if msg["k"] == "failed":
            raise RuntimeError(f"the capsule failed to load: {msg!r}")


def _blocking_latency(child: _Child, tool: str, calls: int, budget: int, first: int) -> list[int]:
    clock = time.perf_counter_ns
    stop = clock() + budget
    out: list[int] = []
    for call_id in range(first, first + calls):
        t0 = clock()
        child.send(_call_frame(call_id, tool))
        reply = child.receive()
        t1 = clock()
        out.append(t1 - t0)
        if reply["id"] != call_id or reply["k"] != "ok":
            raise RuntimeError(f"unexpected reply {reply!r}")
        if t1 >= stop:
            break
    return out


def _serve_blocking(child: _Child, tool: str) -> None:
    calls_made = 0
    try:
        _answer(None)
        for line in sys.stdin:
            command, *args = json.loads(line)
            if command == "latency":
                cpu = _Cpu()
                samples = _blocking_latency(child, tool, args[0], args[1], calls_made + 1)
                _answer(cpu.stop(samples))
                calls_made += len(samples)
            else:
                break
    finally:
        child.close()
    _answer(None)


def _answer(value: Any, ok: bool = True) -> None:
    sys.stdout.write(json.dumps([ok, value]) + "\n")
    sys.stdout.flush()


async def _add(a: int, b: int) -> int:
    return a + b


async def _pipe_asyncio(stack: AsyncExitStack) -> Callable[[], Awaitable[Any]]:
    """The floor for an event-loop client: a future per call id, a persistent reader."""
    child = _pipe_child()
    stack.callback(child.close)
    loop = asyncio.get_running_loop()
    rfd, wfd = child.rfd, child.wfd
    os.set_blocking(rfd, False)
    pending: dict[int, asyncio.Future[Any]] = {}
    buf = bytearray()

    def readable() -> None:
        nonlocal buf
        try:
            buf += os.read(rfd, _CHUNK)
        except BlockingIOError:
            return
        start = 0
        while len(buf) - start >= 4:
            size = int.from_bytes(buf[start : start + 4], "big")
            if len(buf) - start - 4 < size:
                break
            msg = _unpackb(buf[start + 4 : start + 4 + size])
            start += 4 + size
            future = pending.pop(msg["id"], None)
            if future is not None and not future.done():
                future.set_result(msg["value"])
        del buf[:start]

    loop.add_reader(rfd, readable)
    stack.callback(loop.remove_reader, rfd)
    ids = 0

    async def call() -> Any:
        nonlocal ids
        ids += 1
        future = loop.create_future()
        pending[ids] = future
        os.write(wfd, _call_frame(ids, "add"))  # a few dozen bytes: the pipe has room
        return await future

    return call


class _Done:
    def __await__(self) -> Any:
        return iter(())


def _done() -> Any:
    """What a store returns for a write that needs no waiting (``host.DONE`` where it exists,
    so the host takes its fast path; an awaitable that is done for older hosts)."""
    import host

    return getattr(host, "DONE", None) or _Done()


class _NoStore:
    """A state store that keeps nothing: the call path without the audit's disk writes."""

    async def start(self, host_id: str) -> int:
        return 0

    async def aclose(self) -> None:
        pass

    def record(self, record: Any, *, durable: bool) -> Any:
        return _done()

    def finish(self, call_id: str, outcome: Any, *, error_kind: Any, error: Any) -> Any:
        return _done()

    async def tail(self, count: int) -> list[Any]:
        return []

    async def add_grant(self, grant: Any) -> Any:
        return grant

    async def find_grants(self, tool: str, caller: str, args_sha256: str) -> list[Any]:
        return []

    async def grants(self) -> list[Any]:
        return []

    async def revoke_grant(self, grant_id: int) -> bool:
        return False

    async def add_pending(self, pending: Any) -> None:
        pass

    async def remove_pending(self, pending_id: str) -> None:
        pass


async def _open_host(stack: AsyncExitStack, project: Path, *, twin: bool, store: bool) -> Any:
    import inspect

    from host import Host
    from host.testing import in_process

    options: dict[str, Any] = {}
    if not store and "store" in inspect.signature(Host.open).parameters:
        options["store"] = _NoStore()
    opened = Host.open(project, capsule=in_process() if twin else None, **options)
    host = await stack.enter_async_context(opened)
    if await host.call("add", 1, 2) != 3 or await host.call("add_sync", 1, 2) != 3:
        raise RuntimeError("the host gave a wrong answer")
    return host


async def _host(
    stack: AsyncExitStack, project: Path, tool: str, *, twin: bool, store: bool
) -> Callable[[], Awaitable[Any]]:
    """``await host.call(tool, 1, 2)``."""
    host = await _open_host(stack, project, twin=twin, store=store)
    return lambda: host.call(tool, 1, 2)


def _noop(*args: Any) -> None:
    del args


async def _host_hooks(stack: AsyncExitStack, project: Path) -> Callable[[], Awaitable[Any]]:
    """``await host.call("add", 1, 2)`` with five no-op hooks that all run on a success
    (started, done, two success links, before_store); a tree from before hooks has no
    ``host.hook``: it runs as ``host``."""
    host = await _open_host(stack, project, twin=False, store=True)
    if hasattr(host, "hook"):
        for n, kind in enumerate(
            (
                "tool_call_started",
                "tool_call_done",
                "after_tool_call_success",
                "after_tool_call_success",
                "before_store_tool_result",
            )
        ):
            host.hook(_noop, kind, id=f"noop.{n}")
    return lambda: host.call("add", 1, 2)


async def _transport(stack: AsyncExitStack, project: Path) -> Callable[[], Awaitable[Any]]:
    """``transport.call(...)`` on the host's running capsule transport: no mediator."""
    from capsule.protocol import encode

    host = await _open_host(stack, project, twin=False, store=False)
    transport: Any = host.default_session.supervisor.transport
    encoded = encode({"a": 1, "b": 2})
    ids = 10**9  # clear of the mediator's call ids

    def call() -> Awaitable[Any]:
        nonlocal ids
        ids += 1
        return transport.call(ids, "add", encoded, 60.0)

    return call


async def _latency(call: Callable[[], Awaitable[Any]], calls: int, budget: int) -> list[int]:
    clock = time.perf_counter_ns
    stop = clock() + budget
    out: list[int] = []
    for _ in range(calls):
        t0 = clock()
        await call()
        t1 = clock()
        out.append(t1 - t0)
        if t1 >= stop:
            break
    return out


async def _burst(
    call: Callable[[], Awaitable[Any]], calls: int, inflight: int, budget: int
) -> list[float]:
    clock = time.perf_counter_ns
    stop = clock() + budget
    left = calls
    done = 0

    async def caller() -> None:
        nonlocal left, done
        while left > 0 and clock() < stop:
            left -= 1
            await call()
            done += 1

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(inflight):
            tg.start_soon(caller)
    return [done, time.perf_counter() - t0]


async def _serve_loop(name: str, project: Path) -> None:
    async with AsyncExitStack() as stack:
        if name == "inproc":
            call: Callable[[], Awaitable[Any]] = lambda: _add(1, 2)  # noqa: E731
        elif name == "pipe-asyncio":
            call = await _pipe_asyncio(stack)
        elif name.startswith("transport"):
            call = await _transport(stack, project)
        elif name == "host-hooks5":
            call = await _host_hooks(stack, project)
        else:
            tool = "add_sync" if name.endswith("-sync") else "add"
            twin = name == "host-twin"
            store = not (twin or name.endswith("-nostore"))
            call = await _host(stack, project, tool, twin=twin, store=store)
        _answer(None)
        while True:
            line = await anyio.to_thread.run_sync(sys.stdin.readline)
            command, *args = json.loads(line) if line else ["close"]
            args = [int(a) for a in args]
            if command == "latency":
                cpu = _Cpu()
                _answer(cpu.stop(await _latency(call, args[0], args[1])))
            elif command == "burst":
                cpu = _Cpu()
                _answer(cpu.stop(await _burst(call, args[0], args[1], args[2])))
            else:
                break
    _answer(None)


def main(argv: list[str]) -> None:
    """A worker: ``NAME PROJECT``; reads commands on stdin, answers on stdout."""
    name, project = argv[0], Path(argv[1])
    if sys.stdin.readline() == "":  # the runner's "start"
        return
    try:
        if name == "pipe":
            _serve_blocking(_pipe_child(), "add")
        elif name in ("capsule", "capsule-sync"):
            _serve_blocking(_capsule_child(project), "add_sync" if name.endswith("sync") else "add")
        else:
            backend = "trio" if "trio" in name else "asyncio"
            anyio.run(_serve_loop, name, project, backend=backend)
    except BaseException as exc:
        _answer(f"{type(exc).__name__}: {exc}", ok=False)
        raise
