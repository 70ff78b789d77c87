"""HTTP sessions end: an idle one is closed and its capsules released, and sessions are
capped per client (the client its token names, not its address) and in all.

Many clients (the conformance runner, the TypeScript client's ``close()``, the Inspector)
leave without a DELETE. A raw HTTP client does exactly that here, against
``toolhost serve``'s app behind uvicorn, and the host's own figures (``/stats``) say
whether the session's capsule is gone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from host.serve import CLIENTS_FILE, ClientTokens, ServeApp, asgi_app

from .inbox_helpers import Served, served_app, wait_until
from .mcp_helpers import make_mcp_project

pytestmark = pytest.mark.subprocess

HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def _rpc(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC response of a request, plain or at the end of an event stream (after
    the notifications that went first)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data: "):
                message = json.loads(line.removeprefix("data: "))
                if "id" in message:
                    return message
        raise AssertionError(f"no response in {response.text!r}")
    return response.json()


class RawSession:
    """An MCP session over plain HTTP requests: nothing sent that the test did not ask.

    ``token``: the client token it sends (default: the HTTP client's own headers')."""

    def __init__(self, client: httpx2.Client, token: str | None = None) -> None:
        self.client = client
        self.id: str | None = None
        self.next_id = 1
        self.auth = {"authorization": f"Bearer {token}"} if token is not None else {}

    def open(self) -> httpx2.Response:
        response = self.client.post(
            "/mcp",
            headers={**HEADERS, **self.auth},
            json={
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"},
                },
            },
        )
        if response.status_code == 200:
            self.id = response.headers["mcp-session-id"]
            self.notify("notifications/initialized")
        return response

    def _headers(self) -> dict[str, str]:
        assert self.id is not None
        return {
            **HEADERS,
            **self.auth,
            "mcp-session-id": self.id,
            "mcp-protocol-version": "2025-11-25",
        }

    def notify(self, method: str) -> None:
        self.client.post("/mcp", headers=self._headers(), json={"jsonrpc": "2.0", "method": method})

    def call(self, tool: str, arguments: dict[str, Any]) -> httpx2.Response:
        self.next_id += 1
        return self.client.post(
            "/mcp",
            headers=self._headers(),
            json={
                "jsonrpc": "2.0",
                "id": self.next_id,
                "method": "tools/call",
                "params": {"name": tool, "arguments": arguments},
            },
        )

    def delete(self) -> httpx2.Response:
        return self.client.delete("/mcp", headers=self._headers())


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_mcp_project(tmp_path / "project")


@contextmanager
def _serve(project: Path, **options: Any) -> Iterator[tuple[Served, ServeApp, httpx2.Client]]:
    """The app behind uvicorn, and an HTTP client that sends client ``alpha``'s token
    (``beta`` has one too: ``TOKENS``)."""
    tokens = ClientTokens(project / ".agent" / CLIENTS_FILE)
    TOKENS.update({name: tokens.add(name) for name in ("alpha", "beta")})
    app = asgi_app(project, **options)
    serve: ServeApp = app.state.toolhost
    alpha = {"authorization": f"Bearer {TOKENS['alpha']}"}
    with (
        served_app(app) as served,
        httpx2.Client(base_url=served.base, timeout=60, headers=alpha) as client,
    ):
        yield served, serve, client


TOKENS: dict[str, str] = {}
"""The client tokens of the app ``_serve`` serves, by client name."""


def _stats(served: Served, serve: ServeApp, client: httpx2.Client) -> dict[str, Any]:
    token = serve.inbox_url(served.base).split("token=", 1)[1]  # the inbox's, not a client's
    response = client.get("/stats", headers={"authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    return response.json()


def test_an_idle_session_is_closed_and_its_capsule_released(project: Path) -> None:
    with _serve(project, idle_timeout=1.0) as (served, serve, client):
        before = _stats(served, serve, client)["capsules"]["subprocess"]
        session = RawSession(client)
        assert session.open().status_code == 200
        counted = _rpc(session.call("count", {}))
        assert counted["result"]["structuredContent"] == {"result": 1}, counted
        assert _stats(served, serve, client)["capsules"]["subprocess"] == before + 1
        assert serve.mcp is not None and len(serve.mcp.sessions) == 1
        # the client goes away without a DELETE
        start = time.monotonic()
        wait_until(lambda: _stats(served, serve, client)["capsules"]["subprocess"] == before, 30)
        assert time.monotonic() - start < 20
        assert serve.mcp.sessions == []
        assert session.call("count", {}).status_code == 404  # the session is gone


def test_a_busy_session_is_not_idle(project: Path) -> None:
    with _serve(project, idle_timeout=1.0) as (_served, _serve_app, client):
        session = RawSession(client)
        assert session.open().status_code == 200
        for _ in range(4):  # requests closer together than the idle time keep it open
            assert _rpc(session.call("count", {}))["result"]["isError"] is False
            time.sleep(0.5)
        assert session.call("count", {}).status_code == 200


def test_sessions_are_capped_per_client(project: Path) -> None:
    with _serve(project, max_sessions_per_client=2) as (_served, _serve_app, client):
        first, second, third = RawSession(client), RawSession(client), RawSession(client)
        assert first.open().status_code == 200 and second.open().status_code == 200
        refused = third.open()
        assert refused.status_code == 429, refused.text
        message = refused.json()["error"]["message"]
        assert "already has 2 open MCP sessions" in message and "DELETE" in message
        # Another client from the same address has sessions of its own to open.
        assert RawSession(client, TOKENS["beta"]).open().status_code == 200
        assert first.delete().status_code == 200
        assert third.open().status_code == 200  # an ended session no longer counts


def test_sessions_are_capped_in_all(project: Path) -> None:
    with _serve(project, max_sessions=1) as (_served, _serve_app, client):
        first, second = RawSession(client), RawSession(client)
        assert first.open().status_code == 200
        refused = second.open()
        assert refused.status_code == 503, refused.text
        assert "Too many open sessions" in refused.text
