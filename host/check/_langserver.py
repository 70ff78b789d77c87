"""A pyright language server (``pyright-langserver --stdio``) kept running by a host.

The language server protocol is JSON-RPC with ``Content-Length`` headers over the
process's stdin and stdout. :class:`LangServer` sends requests and notifications, reads
every message on a task of its own, answers the few requests the server makes of a client
(``workspace/configuration`` and the like) with nothing, and fails every waiting request
when the process ends. Facts relied on (pyright 1.1.4xx, measured when this was written):

* the PyPI package ships the server as ``pyright/dist/langserver.index.js``, run by
  ``node`` directly here (the package's own wrapper may download node or check PyPI);
* pull diagnostics (``textDocument/diagnostic``, LSP 3.17) answer at once for an open
  document, where pushed ones wait for a debounce (about 300 ms a change);
* a ``__builtins__.pyi`` at the workspace root adds its names to the builtins.

The process runs with a scrubbed environment (no variable of the host's), in a new user
and network namespace where the kernel allows one (``unshare``), so it has no network.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

__all__ = ["LangServer", "ServerGone", "server_command"]

_MAX_MESSAGE = 64 * 1024 * 1024


class ServerGone(Exception):
    """The language server is not running (it failed to start, or it died)."""


def server_command(heap: int | None = None) -> list[str]:
    """``node [--max-old-space-size=MiB] .../langserver.index.js --stdio``.

    ``heap``: bytes node's JavaScript heap may grow to; past it, node ends the server
    (a check that makes pyright's types explode in memory ends there, not in the host's
    memory).

    Raises:
        ServerGone: node or pyright's server script cannot be found.
    """
    spec = importlib.util.find_spec("pyright")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    scripts = [Path(p) / "dist" / "langserver.index.js" for p in locations]
    script = next((s for s in scripts if s.is_file()), None)
    if script is None:
        raise ServerGone("pyright's language server is not installed (pip install pyright)")
    node = shutil.which("node")
    if node is None:
        home = Path.home() / ".cache" / "pyright-python"
        found = sorted(home.glob("*/bin/node")) if home.is_dir() else []
        if not found:
            raise ServerGone("node is not installed (run `pyright --version` once to fetch it)")
        node = str(found[-1])
    flags = [f"--max-old-space-size={max(64, heap // 2**20)}"] if heap is not None else []
    return [node, *flags, str(script), "--stdio"]


class LangServer:
    """One language server process and the messages to and from it."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self._next_id = 0
        self._waiting: dict[int, tuple[anyio.Event, list[Any]]] = {}
        self._send_lock = anyio.Lock()
        self.alive = True
        self.gone = anyio.Event()

    @classmethod
    async def start(
        cls, command: Sequence[str], *, cwd: Path, env: dict[str, str], tg: anyio.abc.TaskGroup
    ) -> LangServer:
        try:
            process = await anyio.open_process(
                list(command), cwd=cwd, env=env, stderr=subprocess.DEVNULL
            )
        except OSError as exc:
            raise ServerGone(f"the language server could not start: {exc}") from exc
        server = cls(process)
        tg.start_soon(server._read)
        return server

    async def _send(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        stdin = self.process.stdin
        if stdin is None or not self.alive:
            raise ServerGone("the language server is not running")
        async with self._send_lock:
            try:
                await stdin.send(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                raise ServerGone("the language server closed its input") from exc

    async def notify(self, method: str, params: Any) -> None:
        await self._send({"method": method, "params": params})

    async def request(self, method: str, params: Any) -> Any:
        """The result of a request. Raises :class:`ServerGone` (it died) or
        :class:`LookupError` (it answered with an error)."""
        self._next_id += 1
        call_id = self._next_id
        slot: tuple[anyio.Event, list[Any]] = (anyio.Event(), [])
        self._waiting[call_id] = slot
        try:
            await self._send({"id": call_id, "method": method, "params": params})
            await slot[0].wait()
        finally:
            self._waiting.pop(call_id, None)
        if not slot[1]:
            raise ServerGone("the language server ended")
        answer = slot[1][0]
        if not isinstance(answer, dict):
            raise LookupError("the language server answered nonsense")
        reply: dict[str, Any] = answer  # pyright: ignore[reportUnknownVariableType]
        if reply.get("error") is not None:
            raise LookupError(f"the language server failed {method}: {reply['error']}")
        return reply.get("result")

    async def _read(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        buffer = b""
        try:
            while True:
                end = buffer.find(b"\r\n\r\n")
                while end < 0:
                    buffer += await stdout.receive()
                    end = buffer.find(b"\r\n\r\n")
                length = -1
                for line in buffer[:end].split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                if not 0 <= length <= _MAX_MESSAGE:
                    return  # not the protocol: the server is treated as dead
                buffer = buffer[end + 4 :]
                while len(buffer) < length:
                    buffer += await stdout.receive()
                body, buffer = buffer[:length], buffer[length:]
                await self._dispatch(json.loads(body))
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        except (ValueError, ServerGone):
            pass
        finally:
            self.alive = False
            for event, _ in list(self._waiting.values()):
                event.set()
            self.gone.set()
            with anyio.CancelScope(shield=True):
                await self.kill()

    async def _dispatch(self, message: Any) -> None:
        if not isinstance(message, dict):
            return
        msg: dict[str, Any] = message  # pyright: ignore[reportUnknownVariableType]
        if "method" in msg and "id" in msg:  # a request of the server's: answer it
            result: Any = None
            if msg["method"] == "workspace/configuration":
                params: Any = msg.get("params")
                items: Any = None
                if isinstance(params, dict):
                    mapping: dict[str, Any] = params  # pyright: ignore[reportUnknownVariableType]
                    items = mapping.get("items")
                count = len(items) if isinstance(items, list) else 0  # pyright: ignore[reportUnknownArgumentType]
                result = [None] * count
            await self._send({"id": msg["id"], "result": result})
        elif "id" in msg and "method" not in msg:
            slot = self._waiting.get(msg["id"]) if isinstance(msg["id"], int) else None
            if slot is not None:
                slot[1].append(msg)
                slot[0].set()

    async def kill(self) -> None:
        """End the process (bounded)."""
        self.alive = False
        with contextlib.suppress(ProcessLookupError, OSError):
            if self.process.returncode is None:
                self.process.kill()
        with anyio.move_on_after(5), contextlib.suppress(OSError, anyio.BrokenResourceError):
            await self.process.aclose()
