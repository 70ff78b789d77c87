"""The MCP server over its real transports, with the official ``mcp`` client.

* stdio: a real ``toolhost serve`` process (its event loop asyncio or trio), the client
  under both backends;
* streamable HTTP: ``host.serve.asgi_app`` on uvicorn on a loopback port. uvicorn runs
  on asyncio only, in a thread of its own, and these clients run under asyncio only
  too: the SDK's HTTP client (httpx2) leaves async generators unfinished under trio,
  which ``filterwarnings = error`` turns into failures that are not the server's.
"""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import psutil
import pytest
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from host import ApprovalRequest
from host.serve import CLIENTS_FILE, RUN_CODE, ClientTokens, ServeApp, asgi_app

from .inbox_helpers import Served, served_app
from .mcp_helpers import Recorder, error_of, make_mcp_project, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parent.parent
CODE = "a = await note('first')\nprint('between')\nb = await note('second')\n[a['text'], b['text']]"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_mcp_project(tmp_path / "project")


def _structured(result: types.CallToolResult) -> Any:
    assert result.structured_content is not None, result
    return result.structured_content


# -- stdio ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("server_backend", ["asyncio", "trio"])
async def test_stdio(project: Path, server_backend: str) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-c",
            "from host.cli import main; main()",
            "serve",
            "--project",
            str(project),
            "--reload",
            "--backend",
            server_backend,
        ],
        cwd=str(ROOT),
    )
    recorder = Recorder(["approve_once", "approve_once"])
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, **recorder.kwargs()) as client,
    ):
        await client.initialize()
        names = [t.name for t in (await client.list_tools()).tools]
        assert "note" in names and names[-1] == RUN_CODE
        assert _structured(await client.call_tool("add", {"a": 2, "b": 3})) == {"result": 5}
        result = await client.call_tool(RUN_CODE, {"code": CODE})
        assert _structured(result)["value"] == ["first", "second"], result
        assert len(recorder.asked) == 2
        denied = await client.call_tool("wipe", {"folder": "/"})
        assert error_of(denied)["kind"] == "policy_denied"
        (project / "tools" / "more.py").write_text(
            'def extra(word: str) -> str:\n    """Shout."""\n    return word.upper()\n'
        )
        await wait_for(lambda: recorder.list_changed >= 1, timeout=90)
        assert _structured(await client.call_tool("extra", {"word": "a"})) == {"result": "A"}
    assert not (project / "out" / "canary.txt").exists()
    assert (project / "out" / "notes.log").read_text().splitlines() == ["first", "second"]


async def test_stdio_client_without_handshake_falls_back(project: Path) -> None:
    """``mcp.Client`` probes the 2026 era first; the server answers so that it falls
    back to ``initialize``, and the connection keeps its session across calls."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-c", "from host.cli import main; main()", "serve", "--project", str(project)],
        cwd=str(ROOT),
    )
    async with Client(params) as client:
        assert client.protocol_version == "2025-11-25"
        first = await client.call_tool("count", {})
        second = await client.call_tool("count", {})
        assert (_structured(first), _structured(second)) == ({"result": 1}, {"result": 2})


async def test_stdio_serves_its_one_client_in_the_session_the_host_opened(project: Path) -> None:
    """A stdio server has one client: its calls run in the host's default session, whose
    capsule started with the server, not in a second session with a second capsule."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-c", "from host.cli import main; main()", "serve", "--project", str(project)],
        cwd=str(ROOT),
    )
    async with Client(params) as client:
        assert _structured(await client.call_tool("count", {})) == {"result": 1}
        (server,) = [p for p in psutil.Process().children(recursive=True) if "serve" in p.cmdline()]
        tree = server.children(recursive=True)
        keepers = [p for p in tree if any("_keeper_child.py" in a for a in p.cmdline())]
        capsules = [p for p in tree if p.ppid() in {k.pid for k in keepers}]
        assert len(capsules) == 1, [p.cmdline() for p in tree]
        assert _structured(await client.call_tool("count", {})) == {"result": 2}


# -- streamable HTTP ------------------------------------------------------------------------


asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])
"""uvicorn and the SDK's HTTP client: see the module's docstring."""


@pytest.fixture
def http(project: Path) -> Iterator[tuple[Served, ServeApp, list[ApprovalRequest]]]:
    asked: list[ApprovalRequest] = []

    async def fallback(request: ApprovalRequest) -> bool:
        asked.append(request)
        return False

    # Built outside any event loop: the app opens the host in uvicorn's own loop.
    app = asgi_app(project, reload=True, approver=fallback)
    with served_app(app) as server:
        yield server, app.state.toolhost, asked


def _token(project: Path, name: str = "tests") -> str:
    """A client token for ``name`` (``toolhost clients add``): HTTP serving asks for one."""
    return ClientTokens(project / ".agent" / CLIENTS_FILE).add(name)


@asynccontextmanager
async def _transport(url: str, token: str) -> AsyncIterator[Any]:
    """The SDK's streamable HTTP transport, sending ``token`` as a bearer token."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        create_mcp_http_client(headers=headers) as web,
        streamable_http_client(url, http_client=web) as streams,
    ):
        yield streams


@asynccontextmanager
async def http_client(url: str, recorder: Recorder, token: str) -> AsyncIterator[ClientSession]:
    async with (
        _transport(url, token) as (read, write),
        ClientSession(read, write, **recorder.kwargs()) as client,
    ):
        await client.initialize()
        yield client


@asyncio_only
async def test_http(http: tuple[Served, ServeApp, list[ApprovalRequest]]) -> None:
    server, serve, asked = http
    assert serve.host is not None and serve.mcp is not None
    token = _token(serve.host.project.root)
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    def emit(event: Any) -> None:
        if event.data.get("tool") == "add":
            serve.host.events.emit("progress", event.session, call_id=event.data["call_id"],
                                   fraction=1.0, message="added")  # fmt: skip

    serve.host.on("policy_decision", emit)
    a_rec = Recorder(["approve_once", "approve_once"])
    b_rec = Recorder()
    async with (
        http_client(server.base + "/mcp", a_rec, token) as a,
        http_client(server.base + "/mcp", b_rec, token) as b,
    ):
        await wait_for(lambda: len(serve.mcp.sessions) == 2)
        init = a.initialize_result
        assert init is not None and init.capabilities.tools is not None
        assert init.capabilities.tools.list_changed is True
        assert _structured(await a.call_tool("count", {})) == {"result": 1}
        assert _structured(await b.call_tool("count", {})) == {"result": 1}
        assert _structured(await a.call_tool("count", {})) == {"result": 2}
        # Elicitation rides the call's own stream; the code goes on between answers.
        result = await a.call_tool(RUN_CODE, {"code": CODE})
        assert _structured(result)["value"] == ["first", "second"]
        assert len(a_rec.asked) == 2
        await a.call_tool("add", {"a": 1, "b": 1}, progress_callback=on_progress)
        await wait_for(lambda: progress == [1.0])
        await wait_for(lambda: bool(a_rec.events("policy_decision")))
        # An inbox-only rule: never elicited, the fallback's allow would not count.
        refused = await a.call_tool("launch", {"target": "moon"})
        assert refused.is_error and a_rec.asked[2:] == []
        assert [r.tool for r in asked] == ["launch"]
        # The tool list changes under --reload: both clients are told.
        (serve.host.project.tools_dir / "more.py").write_text(
            'def extra(word: str) -> str:\n    """Shout."""\n    return word.upper()\n'
        )
        await wait_for(lambda: a_rec.list_changed >= 1 and b_rec.list_changed >= 1, timeout=90)
        assert _structured(await b.call_tool("extra", {"word": "b"})) == {"result": "B"}
    # The clients' DELETE closed their sessions.
    await wait_for(lambda: not serve.mcp.sessions)


@asyncio_only
async def test_http_checks_and_eras(
    http: tuple[Served, ServeApp, list[ApprovalRequest]],
) -> None:
    server, serve, _ = http
    assert serve.host is not None
    token = _token(serve.host.project.root)
    async with httpx2.AsyncClient() as web:
        # DNS rebinding: a foreign Host header is refused before MCP sees it.
        response = await web.post(
            server.base + "/mcp",
            headers={
                "Host": "evil.example:80",
                "Content-Type": "application/json",
                "Authorization": f"Bearer {token}",
            },
            content=b"{}",
        )
        assert response.status_code == 421
    # A client that starts sessionless (2026 era) is sent to the handshake, and gets a
    # session that lasts across its calls.
    async with Client(_transport(server.base + "/mcp", token)) as client:
        assert client.protocol_version == "2025-11-25"
        first = await client.call_tool("count", {})
        second = await client.call_tool("count", {})
        assert (_structured(first), _structured(second)) == ({"result": 1}, {"result": 2})
    assert serve.mcp is not None
    await wait_for(lambda: not serve.mcp.sessions)


@asyncio_only
async def test_http_command(project: Path) -> None:
    """``toolhost serve --transport http --port 0``: says its URL, serves the clients
    ``toolhost clients add`` made (and no one else), stops on SIGINT."""
    import signal

    toolhost = [sys.executable, "-c", "from host.cli import main; main()"]
    where = ["--project", str(project)]
    refused = await anyio.run_process(
        [*toolhost, "serve", "--transport", "http", *where], cwd=str(ROOT), check=False
    )
    assert refused.returncode == 2 and b"toolhost clients add NAME" in refused.stderr
    added = await anyio.run_process([*toolhost, "clients", "add", "ci", *where], cwd=str(ROOT))
    token = added.stdout.decode().strip()
    assert token.startswith("thc_") and token.encode() not in added.stderr
    command = [
        *toolhost,
        "serve",
        "--transport",
        "http",
        "--port",
        "0",
        "--project",
        str(project),
    ]
    process = await anyio.open_process(command, cwd=str(ROOT))
    try:
        assert process.stderr is not None
        seen = b""
        with anyio.fail_after(60):
            while b"/mcp\n" not in seen or not re.search(rb"token=\S+\n", seen):
                seen += await process.stderr.receive()
        url = seen.decode().split("MCP at ", 1)[1].split()[0]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
        assert "authenticate with their tokens (1 client;" in seen.decode()
        async with Client(_transport(url, token)) as client:
            assert _structured(await client.call_tool("add", {"a": 1, "b": 2})) == {"result": 3}
        async with httpx2.AsyncClient() as web:  # the SDK's client without it cannot start
            bare = await web.post(url, json={}, headers={"accept": "application/json"})
            assert bare.status_code == 401 and bare.headers["www-authenticate"].startswith("Bearer")
        # The approval inbox beside it: its URL carries the token a browser needs.
        inbox = seen.decode().split("approval inbox at ", 1)[1].split()[0]
        assert inbox.startswith(url.removesuffix("/mcp") + "/inbox/?token=")
        async with httpx2.AsyncClient() as web:
            base = inbox.split("?", 1)[0]
            assert (await web.get(base + "events")).status_code == 401
            opened = await web.get(inbox)
            assert opened.status_code == 200 and 'name="csrf-token" content=""' not in opened.text
        process.send_signal(signal.SIGINT)
        with anyio.fail_after(30):
            assert await process.wait() == 130  # interrupted, as any command
    finally:
        if process.returncode is None:
            process.kill()
        await process.aclose()
