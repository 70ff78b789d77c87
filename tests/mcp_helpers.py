"""Shared parts of the MCP tests: a project, a recording client, a loopback HTTP server.

The client is the official ``mcp`` SDK's ``ClientSession``, never a mock; the server is
``host.serve`` over real capsules.
"""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp import ClientSession
from mcp.client.session import ClientRequestContext
from mcp.shared.memory import create_client_server_memory_streams

from host import Approver, Host, Session
from host.serve import McpServer
from host.serve._tools import NameStyle

POLICY = """\
version = 1

[defaults]
agent = "deny"
escalation_timeout = "60s"

[[rules]]
id = "harmless"
tools = ["add", "fail", "leak", "nan", "deep", "count", "blob", "extra"]
decision = "allow"

[[rules]]
id = "notes-need-ok"
tools = ["note"]
decision = "escalate"
reason = "Notes are visible to everyone."

[[rules]]
id = "inbox-only"
tools = ["launch"]
decision = "escalate"
approvers = ["inbox"]
reason = "Launching needs someone away from the agent's own screen."

[[rules]]
id = "never-wipe"
tools = ["wipe"]
decision = "deny"
reason = "Wiping is never allowed."

[env]
set = {MCP_TEST_TOKEN = "tok-3c1f9e0d7b"}
secret = ["MCP_TEST_TOKEN"]
"""

TOOLS = {
    "desk": '''
        import os
        from typing import TypedDict


        class Note(TypedDict):
            """A note as written."""

            text: str
            length: int


        _count = 0


        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b


        def note(text: str) -> Note:
            """Write a note: appends it to out/notes.log (a side effect)."""
            with open("out/notes.log", "a", encoding="utf-8") as f:
                f.write(text + "\\n")
            return {"text": text, "length": len(text)}


        def wipe(folder: str) -> str:
            """Wipe a folder (policy denies it): writes the canary file if it ever runs."""
            with open("out/canary.txt", "w", encoding="utf-8") as f:
                f.write("wiped " + folder)
            return "wiped"


        def launch(target: str) -> str:
            """Launch something: appends to out/launched.log (a side effect)."""
            with open("out/launched.log", "a", encoding="utf-8") as f:
                f.write(target + "\\n")
            return "launched " + target


        def fail(message: str) -> None:
            """Always raises ValueError(message)."""
            raise ValueError(message)


        def leak() -> None:
            """Raises with a secret in its message."""
            raise RuntimeError("token is " + os.environ["MCP_TEST_TOKEN"])


        def nan() -> float:
            """Returns a float JSON cannot hold."""
            return float("nan")


        def deep(levels: int) -> object:
            """Returns lists nested ``levels`` deep."""
            value: object = []
            for _ in range(levels):
                value = [value]
            return value


        def count() -> int:
            """Counts its calls in module state (lost when the capsule restarts)."""
            global _count
            _count += 1
            return _count


        def blob(data: bytes) -> bytes:
            """Returns its bytes reversed."""
            return data[::-1]
    ''',
}


def make_mcp_project(root: Path) -> Path:
    (root / "tools").mkdir(parents=True)
    # The tools write in a folder of the project: a subprocess capsule cannot create files
    # directly in the project folder (Landlock; README, "The capsule").
    (root / "out").mkdir()
    for name, source in TOOLS.items():
        (root / "tools" / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    (root / "policy.toml").write_text(POLICY, encoding="utf-8")
    return root


Answer = str | dict[str, Any] | None
"""What the recording client answers to an elicitation: a decision, the whole content
(``{"decision": ..., "confirm": True}``), or None: decline."""


class Recorder:
    """The client side's callbacks: elicitation answers, logs, notifications."""

    def __init__(
        self,
        answers: list[Answer] | None = None,
        on_ask: Callable[[types.ElicitRequestParams], Awaitable[None]] | None = None,
    ) -> None:
        self.answers = list(answers or [])
        self.on_ask = on_ask
        self.asked: list[types.ElicitRequestParams] = []
        self.logs: list[types.LoggingMessageNotificationParams] = []
        self.list_changed = 0

    async def elicit(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        del context
        self.asked.append(params)
        if self.on_ask is not None:
            await self.on_ask(params)
        answer = self.answers.pop(0) if self.answers else "deny"
        if answer is None:
            return types.ElicitResult(action="decline")
        content = answer if isinstance(answer, dict) else {"decision": answer}
        return types.ElicitResult(action="accept", content=content)

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(params)

    async def message(self, message: Any) -> None:
        if isinstance(message, Exception):
            raise message
        if isinstance(message, types.ToolListChangedNotification):
            self.list_changed += 1

    def kwargs(self, elicitation: bool = True) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "logging_callback": self.log,
            "message_handler": self.message,
            "client_info": types.Implementation(name="toolhost-tests", version="1"),
        }
        if elicitation:
            kw["elicitation_callback"] = self.elicit
        return kw

    def events(self, name: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for log in self.logs:
            data = log.data
            if isinstance(data, dict) and data.get("event") == name:
                found.append(data)
        return found


async def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait until ``predicate()`` holds (checked as the event loop turns), or fail."""
    with anyio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110 - polling test state
            await anyio.sleep(0.01)


@asynccontextmanager
async def connect(
    server: McpServer,
    recorder: Recorder | None = None,
    elicitation: bool = True,
    session: Session | None = None,
) -> AsyncIterator[ClientSession]:
    """One in-memory client connection to ``server`` (handshake era), in ``session`` if
    one is given (``serve_streams(session=...)``)."""
    recorder = recorder or Recorder()
    async with (
        create_client_server_memory_streams() as (client_streams, server_streams),
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(partial(server.serve_streams, *server_streams, session=session))
        async with ClientSession(*client_streams, **recorder.kwargs(elicitation)) as session:
            await session.initialize()
            yield session
        tg.cancel_scope.cancel()


@asynccontextmanager
async def served(
    project: Path,
    *,
    approver: Approver | None = None,
    reload: bool = False,
    names: NameStyle = "safe",
) -> AsyncIterator[McpServer]:
    async with (
        Host.open(project, approver=approver or _deny) as host,
        McpServer(host, reload=reload, reload_interval=0.05, names=names).running() as server,
    ):
        yield server


async def _deny(request: Any) -> bool:
    del request
    return False


def error_of(result: types.CallToolResult) -> dict[str, Any]:
    """The host's error data of a failed call, checked for what every client reads: an
    ``isError`` result, ``KIND: MESSAGE`` as its text, and no structured content (which
    a strict client holds against the tool's output schema)."""
    assert result.is_error, result
    assert result.structured_content is None, result
    assert result.meta is not None, result
    data: dict[str, Any] = result.meta["toolhost/error"]
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    assert block.text == f"{data['kind']}: {data['message']}", (block.text, data)
    return data
