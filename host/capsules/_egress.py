"""The egress proxy: tool capsules reach the hosts the policy names, and no other.

Landlock filters the ports a capsule may connect to, never the addresses. When ``[capsules]
network`` names hosts (``"api.example.com:443"``), the host runs one HTTP ``CONNECT``
proxy on a loopback port for its capsules: their Landlock rules let them connect to that
port (and to the plain ports the policy lists) and nowhere else, and their environment
points the usual variables at it (``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY`` and the
lower-case ones), which ``urllib``, ``requests`` and ``httpx`` follow. The proxy opens a
tunnel only to a named host and port, by the name as written (it resolves it itself), and
answers anything else ``403``; a plain HTTP request (not ``CONNECT``) is ``405``. Each
tunnel and each refusal is an event (``egress_tunnel``, ``egress_refused``).

What it does not do: look inside a tunnel (TLS is the client's business), or tell the
capsules apart (one proxy per host; every capsule may reach every named host). A process
of the host's user outside a capsule may use it too, and reaches no more than the named
hosts through it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import Final

import anyio
import anyio.abc

from host._events import EventBus

__all__ = ["EgressProxy", "proxy_env"]

logger = logging.getLogger(__name__)

_MAX_HEAD: Final = 8192
_HEAD_TIMEOUT: Final = 10.0
_CONNECT_TIMEOUT: Final = 10.0
MAX_TUNNELS: Final = 256
"""Tunnels open at once; more are answered ``503``."""
_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)


def proxy_env(port: int) -> dict[str, str]:
    """The variables that send a capsule's HTTP clients through the proxy on ``port``."""
    url = f"http://127.0.0.1:{port}"
    env: dict[str, str] = {}
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = url
    env["NO_PROXY"] = env["no_proxy"] = ""
    return env


class EgressProxy:
    """One ``CONNECT`` proxy for the host's capsules, allowing ``allowed`` (host, port)s."""

    def __init__(self, allowed: Iterable[tuple[str, int]]) -> None:
        self.allowed = frozenset((host.lower().rstrip("."), port) for host, port in allowed)
        self.events: EventBus | None = None
        """Where tunnels and refusals are said (set once the host has its bus)."""
        self.port = 0
        """The loopback port it listens on (once started)."""
        self.open = 0
        """Tunnels open now."""

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Listen on a free loopback port and serve in ``task_group`` until it ends."""
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        task_group.start_soon(self._serve, listener)

    async def _serve(self, listener: anyio.abc.Listener[anyio.abc.SocketStream]) -> None:
        async with listener:
            await listener.serve(self._handle)

    def _say(self, kind: str, **data: object) -> None:
        if self.events is not None:
            self.events.emit(kind, None, **data)

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        """One client connection; whatever it sends, it never ends the proxy (or the
        host whose task group serves it)."""
        try:
            await self._serve_client(client)
        except Exception:
            logger.exception("the egress proxy failed a connection")

    async def _serve_client(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            try:
                with anyio.fail_after(_HEAD_TIMEOUT):
                    head, rest = await _read_head(client)
            except (TimeoutError, ValueError, *_GONE):
                return
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = line.split(" ")
            if len(parts) != 3 or parts[0] != "CONNECT":
                await _answer(client, 405, "the egress proxy takes CONNECT only (https)")
                self._say("egress_refused", target=line[:200], reason="not CONNECT")
                return
            host, _, port_text = parts[1].rpartition(":")
            digits = port_text.isascii() and port_text.isdigit() and len(port_text) <= 5
            port = int(port_text) if digits else -1
            name = host.lower().rstrip(".")
            if (name, port) not in self.allowed:
                await _answer(
                    client,
                    403,
                    f"{parts[1][:200]} is not in the policy's [capsules] network",
                )
                self._say("egress_refused", target=parts[1][:200], reason="not allowed")
                return
            if self.open >= MAX_TUNNELS:
                await _answer(client, 503, f"{MAX_TUNNELS} tunnels are open already")
                self._say("egress_refused", target=parts[1], reason="too many tunnels")
                return
            self.open += 1
            try:
                await self._tunnel(client, name, port, rest)
            finally:
                self.open -= 1

    async def _tunnel(
        self, client: anyio.abc.SocketStream, host: str, port: int, rest: bytes
    ) -> None:
        try:
            with anyio.fail_after(_CONNECT_TIMEOUT):
                upstream = await anyio.connect_tcp(host, port)
        except (TimeoutError, OSError) as exc:
            await _answer(client, 502, f"{host}:{port} could not be reached")
            self._say("egress_refused", target=f"{host}:{port}", reason=f"unreachable: {exc}")
            return
        async with upstream:
            with contextlib.suppress(*_GONE):
                await client.send(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if rest:
                    await upstream.send(rest)
            self._say("egress_tunnel", target=f"{host}:{port}")
            async with anyio.create_task_group() as tg:
                tg.start_soon(_pipe, client, upstream)
                tg.start_soon(_pipe, upstream, client)


async def _read_head(client: anyio.abc.SocketStream) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > _MAX_HEAD:
            raise ValueError("request head too long")
        data += await client.receive()
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


async def _answer(client: anyio.abc.SocketStream, status: int, text: str) -> None:
    reasons = {403: "Forbidden", 405: "Method Not Allowed", 502: "Bad Gateway", 503: "Busy"}
    body = (text + "\n").encode()
    head = (
        f"HTTP/1.1 {status} {reasons.get(status, 'Refused')}\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(*_GONE):
        await client.send(head + body)


async def _pipe(source: anyio.abc.SocketStream, target: anyio.abc.SocketStream) -> None:
    """Copy ``source`` to ``target`` until it ends; then end ``target``'s sending side."""
    with contextlib.suppress(*_GONE):
        async for chunk in source:
            await target.send(chunk)
    with contextlib.suppress(*_GONE):
        await target.send_eof()
