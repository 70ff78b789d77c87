"""Tool names over MCP: ones every model API accepts by default, the dotted ones on demand.

Model APIs take a tool's name as a function name (``^[a-zA-Z0-9_-]{1,64}$``); a client
that hands MCP tools to its model as they are fails on ``kanban.add``. By default each
tool's MCP name is safe (``kanban_add``), stable, and maps back to exactly one tool; two
tools that would share one are an error at start that names both. Code mode keeps the
dotted names.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from host import Host
from host.errors import DeclarationError
from host.serve import McpServer
from host.serve._tools import mcp_name

from .conftest import AGENT_SRC
from .mcp_helpers import connect, error_of, served

pytestmark = [pytest.mark.anyio, pytest.mark.subprocess]

SAFE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def test_safe_names_follow_the_model_rule_and_are_stable() -> None:
    assert mcp_name("kanban.add") == "kanban_add"
    assert mcp_name("tools.time.format") == "tools_time_format"
    assert mcp_name("add") == "add"
    assert mcp_name("kanban.add", "dotted") == "kanban.add"
    assert mcp_name("café.brew") == "caf__brew"
    long = "board." + "x" * 80
    cut = mcp_name(long)
    assert SAFE.fullmatch(cut) and len(cut) == 64
    assert cut == mcp_name(long)  # stable
    assert cut != mcp_name("board." + "x" * 79 + "y")  # the digest tells them apart


async def test_the_example_project_is_served_with_safe_names() -> None:
    async with served(AGENT_SRC) as server, connect(server) as client:
        tools = (await client.list_tools()).tools
        names = [t.name for t in tools]
        assert all(SAFE.fullmatch(n) for n in names), names
        assert "kanban_add" in names and "tools_time_format" in names and "run_code" in names
        assert not any("." in n for n in names)
        added = await client.call_tool("kanban_add", {"title": "name me"})
        assert not added.is_error, added
        assert added.structured_content is not None
        assert added.structured_content["title"] == "name me"
        # the policy and the host's messages keep the canonical name
        closed = await client.call_tool("kanban_close", {"task_id": "name-me"})
        assert "kanban.close" in error_of(closed)["message"]
        # code mode keeps the dotted names
        code = await client.call_tool("run_code", {"code": "len(await kanban.list())"})
        assert code.structured_content is not None
        assert code.structured_content["value"] == 1, code
        with pytest.raises(Exception, match=r"kanban\.add"):
            await client.call_tool("kanban.add", {"title": "x"})  # not a name it serves


async def test_dotted_names_on_demand() -> None:
    async with served(AGENT_SRC, names="dotted") as server, connect(server) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert "kanban.add" in names and "kanban_add" not in names
        added = await client.call_tool("kanban.add", {"title": "dotted"})
        assert not added.is_error, added


async def test_two_tools_with_one_safe_name_are_an_error_naming_both(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "tools").mkdir(parents=True)
    (project / "tools" / "board.py").write_text(
        textwrap.dedent(
            """
            class Board:
                def add(self, title: str) -> str:
                    return title


            board = Board()


            def board_add(title: str) -> str:
                return title
            """
        )
    )
    async with Host.open(project) as host:
        with pytest.raises(DeclarationError) as info:
            McpServer(host)
        message = str(info.value)
        assert "board.add" in message and "board_add" in message and "--names dotted" in message
        async with McpServer(host, names="dotted").running() as server, connect(server) as c:
            names = [t.name for t in (await c.list_tools()).tools]
            assert {"board.add", "board_add"} <= set(names)
