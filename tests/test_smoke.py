"""The bundled example project works end to end through a real subprocess capsule."""

from __future__ import annotations

import pytest

from host import Host, ToolError

from .conftest import AGENT_SRC

pytestmark = [pytest.mark.anyio, pytest.mark.subprocess]


async def test_example_project_round_trip() -> None:
    async with Host.open(AGENT_SRC) as host:
        assert await host.call("add", 2, 3) == 5
        task = await host.tools.kanban.kanban.add("write docs")
        assert task == {"id": "write-docs", "title": "write docs", "status": "open"}
        assert await host.call("kanban.list") == [task]
        with pytest.raises(ToolError) as info:
            await host.call("kanban.close", "nope")
        assert info.value.type_name == "KeyError"
