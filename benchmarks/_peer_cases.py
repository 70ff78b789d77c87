"""The peers of ``benchmarks.peers``, each in a worker process of its own.

A worker serves one peer (``python -m benchmarks._peer_cases NAME FOLDER``) and answers
the runner's JSON-line commands on stdin, as the workers of ``benchmarks._cases`` do (it
reuses their timing loops and CPU readings):

* ``["latency", OP, CALLS, BUDGET_NS]`` and ``["burst", OP, CALLS, INFLIGHT, BUDGET_NS]``:
  the operation ``OP`` (an index into the peer's ``OPS``) one call at a time, or from many
  concurrent callers, on the peer's warm session;
* ``["session"]``: open one more session of the peer (kept open), make its first call,
  answer the seconds it took;
* ``["memory"]``: the memory the sessions opened so far hold, per session (PSS).

Every peer serves the same two tools from the same source file (``TOOLS``): the trivial
``add`` and ``customer``, which builds a ~2 KB structured record; the code-mode peers run
snippets that call ``add`` once or ten times.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio

from ._cases import _answer, _burst, _Cpu, _descendants, _latency

_ROOT = Path(__file__).resolve().parent.parent

TOOLS = '''\
"""The peers' tools: a trivial one and a realistic one (a ~2 KB structured record)."""

from typing_extensions import TypedDict


class Address(TypedDict):
    street: str
    city: str
    postcode: str
    country: str


class Line(TypedDict):
    sku: str
    title: str
    quantity: int
    unit_price: float


class Order(TypedDict):
    id: str
    placed: str
    status: str
    lines: list[Line]
    total: float


class Customer(TypedDict):
    id: int
    name: str
    email: str
    address: Address
    tags: list[str]
    orders: list[Order]


async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def customer(customer_id: int) -> Customer:
    """A customer and their recent orders, as a CRM or shop API would return them."""
    orders: list[Order] = []
    for n in range(5):
        lines: list[Line] = [
            {
                "sku": f"SKU-{customer_id % 97:02d}-{n}{k}",
                "title": f"Stainless steel widget, model {n}{k}",
                "quantity": 1 + (n + k) % 3,
                "unit_price": 9.5 + n + k,
            }
            for k in range(2)
        ]
        orders.append(
            {
                "id": f"ORD-{customer_id:06d}-{n:03d}",
                "placed": f"2026-11-{1 + n:02d}T10:{n:02d}:00Z",
                "status": "shipped" if n else "processing",
                "lines": lines,
                "total": sum(line["quantity"] * line["unit_price"] for line in lines),
            }
        )
    return {
        "id": customer_id,
        "name": "Ada Lovelace",
        "email": f"ada.{customer_id}@example.com",
        "address": {
            "street": "12 Analytical Engine Row",
            "city": "London",
            "postcode": "NW1 6XE",
            "country": "GB",
        },
        "tags": ["vip", "newsletter", "early-adopter"],
        "orders": orders,
    }
'''

POLICY = """\
version = 1

[defaults]
agent = "allow"
"""

FASTMCP = """\
import sys

sys.path.insert(0, sys.argv[1])

from fastmcp import FastMCP
from peer_tools import add, customer

mcp = FastMCP("peers")
mcp.tool(add)
mcp.tool(customer)
mcp.run(show_banner=False)
"""

# Code mode: the same work in each peer's dialect (smolagents' interpreter has no await).
SNIPPET_ONE = "await add(1, 2)"
SNIPPET_TEN = "t = 0\nfor i in range(10):\n    t += await add(i, 1)\nt"


def write_folder(folder: Path) -> Path:
    """The project every peer serves: ``tools/peer_tools.py``, a policy allowing the
    agent, and the FastMCP server script."""
    tools = folder / "project" / "tools"
    tools.mkdir(parents=True, exist_ok=True)
    (tools / "peer_tools.py").write_text(TOOLS, encoding="utf-8")
    (folder / "project" / "policy.toml").write_text(POLICY, encoding="utf-8")
    (folder / "fastmcp_server.py").write_text(FASTMCP, encoding="utf-8")
    return folder


def _tools_module(folder: Path) -> Any:
    """``peer_tools`` imported in this process (for the in-process peers' host functions)."""
    sys.path.insert(0, str(folder / "project" / "tools"))
    import peer_tools  # pyright: ignore[reportMissingImports]

    return peer_tools


def _sync_add(a: int, b: int) -> int:
    return a + b


# -- memory ----------------------------------------------------------------------------------


def pss(pid: int) -> int:
    """Proportional set size of ``pid`` in bytes (shared pages split between sharers)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _tree(pid: int) -> list[int]:
    return [pid, *_descendants(pid)]


# -- the peers -------------------------------------------------------------------------------


class Peer:
    """One peer in a worker: a warm session for the timed operations, and new sessions."""

    OPS: tuple[str, ...] = ()
    """The operations, by index: what ``latency`` and ``burst`` run."""
    server_side = False
    """Whether a session's memory is only its new processes (the client's share, in this
    worker, is left out), not this worker's own growth."""

    def __init__(self, folder: Path, stack: AsyncExitStack, *, quick: bool = False) -> None:
        self.quick = quick
        """A smoke run: skip waiting for the peer to settle."""
        self.folder = folder
        self.project = folder / "project"
        self.stack = stack
        self.sessions = 0
        self._before_pids: set[int] = set()
        self._before_pss = 0

    async def open(self) -> None:
        """Start the peer and its warm session."""

    def op(self, index: int) -> Callable[[], Awaitable[Any]]:
        raise NotImplementedError

    async def new_session(self) -> None:
        """Open one more session, kept open, and make its first call."""
        raise NotImplementedError

    def mark(self) -> None:
        """Remember the memory before the first new session."""
        pids = _tree(os.getpid())
        self._before_pids = set(pids)
        self._before_pss = sum(pss(p) for p in pids)

    def memory(self) -> dict[str, Any]:
        pids = _tree(os.getpid())
        new = [p for p in pids if p not in self._before_pids]
        if self.server_side:
            held = sum(pss(p) for p in new)
        else:
            held = sum(pss(p) for p in pids) - self._before_pss
        return {
            "pss_per_session": held / max(1, self.sessions),
            "processes_per_session": len(new) / max(1, self.sessions),
            "sessions": self.sessions,
        }


class HostPeer(Peer):
    """This host, the app's call: ``await host.call(...)`` through the mediator to a
    subprocess tool capsule."""

    OPS = ("add", "customer")

    async def open(self) -> None:
        from host import Host

        self.host = await self.stack.enter_async_context(Host.open(self.project))
        if await self.host.call("add", 1, 2) != 3:
            raise RuntimeError("host: wrong answer")
        record = await self.host.call("customer", 7)
        if record["id"] != 7:
            raise RuntimeError("host: wrong record")

    def op(self, index: int) -> Callable[[], Awaitable[Any]]:
        if self.OPS[index] == "add":
            return lambda: self.host.call("add", 1, 2)
        return lambda: self.host.call("customer", 7)

    async def new_session(self) -> None:
        session = await self.stack.enter_async_context(self.host.session())
        if await session.call("add", 1, 2) != 3:
            raise RuntimeError("host session: wrong answer")


class RunCodePeer(HostPeer):
    """This host's code mode: warm ``run_code`` in the Wasm sandbox, its calls mediated,
    with the default settings (the check: ``warn``)."""

    OPS = ("code-1", "code-10")
    CHECK: Any = None
    """The ``check`` of every run (None: the project's, by default ``warn``)."""

    async def open(self) -> None:
        await super().open()
        for source in (SNIPPET_ONE, SNIPPET_TEN):
            result = await self.host.run_code(source, check=self.CHECK)
            if not result.ok:
                raise RuntimeError(f"run_code: {result.error}")
        # The idle guest imports asyncio and friends in the background: let it finish
        # (a condition, not a sleep: the guest's CPU time stops growing).
        guest_cpu = -1
        with anyio.move_on_after(0 if self.quick else 30):
            while True:
                cpu = sum(_cpu_of(p) for p in _descendants(os.getpid()))
                if cpu == guest_cpu:
                    break
                guest_cpu = cpu
                await anyio.sleep(0.5)

    def op(self, index: int) -> Callable[[], Awaitable[Any]]:
        source = SNIPPET_ONE if self.OPS[index] == "code-1" else SNIPPET_TEN

        check = self.CHECK

        async def run() -> Any:
            result = await self.host.run_code(source, check=check)
            if not result.ok:
                raise RuntimeError(f"run_code: {result.error}")
            return result.value

        return run

    async def new_session(self) -> None:
        session = await self.stack.enter_async_context(self.host.session())
        result = await session.run_code(SNIPPET_ONE, check=self.CHECK)
        if not result.ok or result.value != 3:
            raise RuntimeError(f"run_code in a new session: {result}")


def _cpu_of(pid: int) -> int:
    from ._cases import _cpu_ns

    return _cpu_ns(pid)


class McpPeer(Peer):
    """An MCP server over stdio, driven by the official client (``mcp.ClientSession``);
    a session is a server process (stdio serves one client)."""

    OPS = ("add", "customer")
    server_side = True

    def params(self) -> Any:
        raise NotImplementedError

    async def connect(self) -> Any:
        from mcp import ClientSession, stdio_client

        read, write = await self.stack.enter_async_context(stdio_client(self.params()))
        client = await self.stack.enter_async_context(ClientSession(read, write))
        await client.initialize()
        return client

    async def open(self) -> None:
        self.client = await self.connect()
        await self._call(self.client, "add", {"a": 1, "b": 2})

    @staticmethod
    async def _call(client: Any, tool: str, arguments: dict[str, Any]) -> Any:
        result = await client.call_tool(tool, arguments)
        if result.is_error or result.structured_content is None:
            raise RuntimeError(f"{tool}: unexpected result {result}")
        return result.structured_content

    def op(self, index: int) -> Callable[[], Awaitable[Any]]:
        if self.OPS[index] == "add":
            return lambda: self._call(self.client, "add", {"a": 1, "b": 2})
        return lambda: self._call(self.client, "customer", {"customer_id": 7})

    async def new_session(self) -> None:
        client = await self.connect()
        await self._call(client, "add", {"a": 1, "b": 2})


class FastMcpPeer(McpPeer):
    """FastMCP over stdio: the tools run in the server's own process."""

    def params(self) -> Any:
        from mcp import StdioServerParameters

        return StdioServerParameters(
            command=sys.executable,
            args=[str(self.folder / "fastmcp_server.py"), str(self.project / "tools")],
            env={"PYTHONDONTWRITEBYTECODE": "1", "FASTMCP_LOG_LEVEL": "WARNING"},
        )


class ServePeer(McpPeer):
    """``toolhost serve`` over stdio: the mediator in the server, the tools in a capsule."""

    def params(self) -> Any:
        from mcp import StdioServerParameters

        boot = "from host.cli import main; main()"
        return StdioServerParameters(
            command=sys.executable,
            args=["-c", boot, "serve", "--project", str(self.project)],
            cwd=str(_ROOT),
            env={"PYTHONDONTWRITEBYTECODE": "1"},
        )


class MontyPeer(Peer):
    """pydantic-monty: a Rust Python interpreter in a ``monty`` worker process per session
    (``AsyncMonty``'s pool); the tools are host functions of this process."""

    OPS = ("code-1", "code-10")

    async def open(self) -> None:
        import pydantic_monty

        tools = _tools_module(self.folder)
        self.lookup = {"add": tools.add}
        self.pool = await self.stack.enter_async_context(
            pydantic_monty.AsyncMonty(min_processes=1, max_processes=256)
        )
        # A checkout allows 1,000 host calls and name lookups in all by default; the warm
        # session makes tens of thousands.
        limits: Any = {"max_suspensions": 1 << 40}
        self.session = await self.stack.enter_async_context(self.pool.checkout(limits=limits))
        if await self.session.feed_run(SNIPPET_TEN, external_lookup=self.lookup) != 55:
            raise RuntimeError("monty: wrong answer")

    def op(self, index: int) -> Callable[[], Awaitable[Any]]:
        source = SNIPPET_ONE if self.OPS[index] == "code-1" else SNIPPET_TEN
        return lambda: self.session.feed_run(source, external_lookup=self.lookup)

    async def new_session(self) -> None:
        session = await self.stack.enter_async_context(self.pool.checkout())
        if await session.feed_run(SNIPPET_ONE, external_lookup=self.lookup) != 3:
            raise RuntimeError("monty session: wrong answer")


class SmolagentsPeer(Peer):
    """smolagents' ``LocalPythonExecutor``: an AST interpreter in this process, no
    isolation; its default per-run timeout (a thread per run) stays on, as users get it.
    Its interpreter has no ``await``: the snippets call ``add`` directly."""

    OPS = ("code-1", "code-10")

    def executor(self) -> Any:
        from smolagents.local_python_executor import LocalPythonExecutor

        executor = LocalPythonExecutor([])
        executor.send_tools({"add": _sync_add})
        return executor

    async def open(self) -> None:
        self.held: list[Any] = []
        self.warm = self.executor()
        if self.warm(SNIPPET_TEN.replace("await ", "")).output != 55:
            raise RuntimeError("smolagents: wrong answer")

    def op(self, index: int) -> Callable[[], Awaitable[Any]]:
        source = SNIPPET_ONE if self.OPS[index] == "code-1" else SNIPPET_TEN
        source = source.replace("await ", "")
        warm = self.warm

        async def run() -> Any:
            return warm(source).output

        return run

    async def new_session(self) -> None:
        executor = self.executor()
        if executor(SNIPPET_ONE.replace("await ", "")).output != 3:
            raise RuntimeError("smolagents session: wrong answer")
        self.held.append(executor)


class RunCodeOffPeer(RunCodePeer):
    """Warm ``run_code`` with the check off."""

    CHECK = "off"


PEERS: dict[str, type[Peer]] = {
    "host": HostPeer,
    "serve": ServePeer,
    "fastmcp": FastMcpPeer,
    "run_code": RunCodePeer,
    "run_code-off": RunCodeOffPeer,
    "monty": MontyPeer,
    "smolagents": SmolagentsPeer,
}


async def _serve(name: str, folder: Path, quick: bool) -> None:
    async with AsyncExitStack() as stack:
        peer = PEERS[name](folder, stack, quick=quick)
        await peer.open()
        _answer(list(peer.OPS))
        while True:
            line = await anyio.to_thread.run_sync(sys.stdin.readline)
            command, *args = json.loads(line) if line else ["close"]
            if command == "latency":
                cpu = _Cpu()
                _answer(cpu.stop(await _latency(peer.op(args[0]), args[1], args[2])))
            elif command == "burst":
                cpu = _Cpu()
                _answer(cpu.stop(await _burst(peer.op(args[0]), args[1], args[2], args[3])))
            elif command == "session":
                if peer.sessions == 0:
                    peer.mark()
                t0 = time.perf_counter()
                await peer.new_session()
                peer.sessions += 1
                _answer(time.perf_counter() - t0)
            elif command == "memory":
                _answer(peer.memory())
            else:
                break
    _answer(None)


def main(argv: list[str]) -> None:
    """A worker: ``NAME FOLDER [quick]``; reads commands on stdin, answers on stdout."""
    name, folder, quick = argv[0], Path(argv[1]), argv[2:] == ["quick"]
    if sys.stdin.readline() == "":  # the runner's "start"
        return
    try:
        anyio.run(_serve, name, folder, quick)
    except BaseException as exc:
        _answer(f"{type(exc).__name__}: {exc}", ok=False)
        raise


if __name__ == "__main__":
    main(sys.argv[1:])
