"""MCP logging: the capability is declared, ``logging/setLevel`` is honoured per session,
and ``ctx.log`` reaches the client of that call's session only, with secrets replaced.

The client is the official ``mcp`` SDK's ``ClientSession`` over the in-memory transport,
serving real capsules; the bytes of the handshake are checked over stdio by a raw client.
"""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPDeprecationWarning

from host import Host

from .mcp_helpers import Recorder, connect, served
from .test_serve_versions import RawClient

pytestmark = [pytest.mark.anyio, pytest.mark.subprocess]

TOOL = '''
import os

from capsule.context import ToolContext


async def chatty(word: str, ctx: ToolContext) -> str:
    """Logs at four levels, once with the secret in the text."""
    await ctx.log(f"debug {word}", level="debug")
    await ctx.log(f"info {word}")
    await ctx.log(f"warning {word}", level="warning")
    await ctx.log("token " + os.environ["LOG_TOKEN"], level="error")
    return word


async def wrong_level(ctx: ToolContext) -> str:
    """Asks for a level MCP does not have."""
    try:
        await ctx.log("x", level="loud")  # type: ignore[arg-type]
    except ValueError as exc:
        return str(exc)
    return "accepted"
'''

POLICY = """
version = 1
[defaults]
agent = "allow"
[env]
set = {LOG_TOKEN = "tok-5e1d0c9b4a"}
secret = ["LOG_TOKEN"]
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "tools").mkdir(parents=True)
    (root / "tools" / "talk.py").write_text(textwrap.dedent(TOOL), encoding="utf-8")
    (root / "policy.toml").write_text(textwrap.dedent(POLICY), encoding="utf-8")
    return root


def _tool_logs(recorder: Recorder) -> list[tuple[str, Any]]:
    return [(m.level, m.data) for m in recorder.logs if m.logger == "chatty"]


async def test_ctx_log_reaches_the_calling_client_at_the_level_it_set(project: Path) -> None:
    mine, theirs = Recorder(), Recorder()
    async with (
        served(project) as server,
        connect(server, mine) as client,
        connect(server, theirs) as other,
    ):
        await other.list_tools()
        result = await client.call_tool("chatty", {"word": "one"})
        assert not result.is_error, result
        assert _tool_logs(mine) == [
            ("debug", "debug one"),
            ("info", "info one"),
            ("warning", "warning one"),
            ("error", "token ⟨secret LOG_TOKEN⟩"),  # never the secret itself
        ]
        with warnings.catch_warnings():  # the SDK warns: logging leaves MCP in 2026-07-28
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.set_logging_level("warning")
        await client.call_tool("chatty", {"word": "two"})
        assert _tool_logs(mine)[4:] == [
            ("warning", "warning two"),
            ("error", "token ⟨secret LOG_TOKEN⟩"),
        ]
        await other.call_tool("chatty", {"word": "three"})  # the other session: all levels
        await anyio.sleep(0.1)
    assert [data for _, data in _tool_logs(theirs)][:3] == [
        "debug three",
        "info three",
        "warning three",
    ]
    assert not any("one" in str(d) or "two" in str(d) for _, d in _tool_logs(theirs))
    assert not any("three" in str(d) for _, d in _tool_logs(mine))


async def test_ctx_log_is_an_event_and_refuses_unknown_levels(project: Path) -> None:
    async with Host.open(project) as host, host.events("tool_log") as stream:
        assert await host.call("chatty", "four") == "four"
        seen: list[dict[str, Any]] = []
        with anyio.fail_after(10):
            async for event in stream:
                seen.append(dict(event.data))
                if len(seen) == 4:
                    break
        assert [(e["tool"], e["level"]) for e in seen] == [
            ("chatty", "debug"),
            ("chatty", "info"),
            ("chatty", "warning"),
            ("chatty", "error"),
        ]
        assert seen[3]["message"] == "token ⟨secret LOG_TOKEN⟩"
        said = await host.call("wrong_level")
        assert said.startswith("level is one of debug, info, notice")


def test_logging_is_declared_and_set_level_answers(project: Path) -> None:
    client = RawClient(project)
    try:
        client.send(
            {
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"},
                },
            }
        )
        init = client.next(lambda m: m.get("id") == 1)
        assert "logging" in init["result"]["capabilities"], init
        client.send({"method": "notifications/initialized"})
        client.send({"id": 2, "method": "logging/setLevel", "params": {"level": "error"}})
        answer = client.next(lambda m: m.get("id") == 2)
        assert answer.get("result") == {} and "error" not in answer, answer
        client.send(
            {
                "id": 3,
                "method": "tools/call",
                "params": {"name": "chatty", "arguments": {"word": "x"}},
            }
        )
        logs: list[dict[str, Any]] = []
        while True:
            message = client.next(
                lambda m: m.get("id") == 3 or m.get("method") == "notifications/message"
            )
            if message.get("id") == 3:
                break
            if message["params"].get("logger") == "chatty":
                logs.append(message["params"])
        assert [m["level"] for m in logs] == ["error"], logs
    finally:
        client.close()
