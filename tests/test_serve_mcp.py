"""The MCP server in memory: the official ``mcp`` client against ``host.serve``.

Real tool capsules and a real Wasm sandbox behind the server; the client is the SDK's
``ClientSession`` over the SDK's in-memory streams (handshake era). Every test runs
under asyncio and trio.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp.shared.exceptions import MCPError

from host import ApprovalRequest, Host
from host.declare import prose
from host.serve import APPROVAL_SCHEMA, RUN_CODE, McpServer
from host.serve._tools import lean

from .mcp_helpers import Recorder, connect, error_of, make_mcp_project, served, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.subprocess]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_mcp_project(tmp_path / "project")


def text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def error(result: types.CallToolResult) -> dict[str, Any]:
    return error_of(result)


async def test_tools_are_the_declarations(project: Path) -> None:
    async with served(project) as server, connect(server) as client:
        host = server.host
        init = client.initialize_result
        assert init is not None and init.protocol_version == "2025-11-25"
        assert init.capabilities.tools is not None and init.capabilities.tools.list_changed
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert list(tools) == [t.name for t in host.scope.tools] + [RUN_CODE]
        schemas = host.scope.schemas()
        for decl in host.scope.tools:
            tool = tools[decl.name]
            # The docstring, less the sections the schemas hold (parameters, returns).
            assert tool.description == prose(decl.docstring)
            # The declared schema, lean: what only repeats the tool's name, its
            # description or the dialect (MCP's default) is left out of every agent's
            # context, and so is an empty list of required parameters.
            declared = schemas[decl.name]["input"]
            assert tool.input_schema == {
                k: v
                for k, v in declared.items()
                if k not in ("$schema", "title", "description") and v != []
            }
            assert decl.docstring is not None
            assert declared["description"] in decl.docstring and declared["title"] == decl.name
        # A TypedDict result is described as it is (its root is an object) ...
        note = schemas["note"]["output"]
        assert tools["note"].output_schema == lean({**note, "type": "object"})
        assert "$schema" not in json.dumps(tools["note"].output_schema)
        # ... anything else is wrapped as {"result": value}.
        add = tools["add"].output_schema
        assert add is not None and add["properties"] == {"result": {"type": "integer"}}
        assert tools["fail"].output_schema is not None  # -> None: {"result": null}
        code = tools[RUN_CODE]
        assert code.description is not None and host.scope.render_model() in code.description
        assert code.input_schema["required"] == ["code"]


async def test_a_connection_given_a_session_runs_in_it_and_leaves_it_open(project: Path) -> None:
    """``serve_streams(session=...)``: the client's calls share the session's capsule
    (module state) with the app, and the session outlives the connection; a connection
    without one gets a session of its own, closed with it."""
    async with served(project) as server:
        host = server.host
        shared = host.default_session
        async with connect(server, session=shared) as client:
            assert (await client.call_tool("count", {})).structured_content == {"result": 1}
            assert await shared.call("count") == 2  # the same capsule, the same module
        assert await shared.call("count") == 3  # still open after the connection ended
        async with connect(server) as client:
            assert (await client.call_tool("count", {})).structured_content == {"result": 1}
            (own,) = [s for s in host._sessions if s is not shared]  # pyright: ignore[reportPrivateUsage]
        await wait_for(lambda: own not in host._sessions)  # pyright: ignore[reportPrivateUsage]
        assert await shared.call("count") == 4


async def test_calls_results_and_errors(project: Path) -> None:
    async with served(project) as server, connect(server) as client:
        result = await client.call_tool("add", {"a": 2, "b": 40})
        assert not result.is_error
        assert result.structured_content == {"result": 42} and text(result) == "42"

        # A tool that raises: a result with isError and the host's error kind.
        failed = error(await client.call_tool("fail", {"message": "no such card"}))
        assert failed["kind"] == "tool_error" and failed["error_message"] == "no such card"
        assert "traceback" not in failed  # the tool's frames stay in the host

        # Arguments that do not fit: a tool error the model can fix.
        bad = error(await client.call_tool("add", {"a": "two", "b": 3}))
        assert bad["kind"] == "invalid_arguments" and bad["parameter"] == "a"

        # A secret in an error message never reaches the client.
        leaked = await client.call_tool("leak", {})
        assert "tok-3c1f9e0d7b" not in json.dumps(leaked.model_dump(mode="json"))
        assert "⟨secret MCP_TEST_TOKEN⟩" in error(leaked)["message"]

        # A value JSON cannot hold is an error, never an empty success.
        nan = error(await client.call_tool("nan", {}))
        assert nan["kind"] == "not_serializable"
        deep = error(await client.call_tool("deep", {"levels": 300}))
        assert deep["kind"] == "not_serializable" and "nested deeper" in deep["message"]
        assert not (await client.call_tool("deep", {"levels": 100})).is_error

        # Bytes cross as base64, both ways.
        blob = await client.call_tool("blob", {"data": "AAEC"})  # b"\x00\x01\x02"
        assert blob.structured_content == {"result": "AgEA"}

        # An unknown tool is a protocol error, not a result.
        with pytest.raises(MCPError) as info:
            await client.call_tool("kanban.nope", {})
        assert info.value.error.code == types.INVALID_PARAMS
        assert "kanban.nope" in info.value.error.message

        (record,) = [r for r in await server.host.store.tail(20) if r.tool == "add"][:1]
        assert record.caller == "agent"


async def test_a_denied_call_runs_nothing(project: Path) -> None:
    async with served(project) as server, connect(server) as client:
        denied = error(await client.call_tool("wipe", {"folder": "/"}))
        assert denied["kind"] == "policy_denied" and denied["rule"] == "never-wipe"
        assert denied["reason"] == "Wiping is never allowed."
        with anyio.fail_after(30):
            result = await client.call_tool(RUN_CODE, {"code": "await wipe('/home')"})
        assert result.is_error and result.structured_content is not None
        assert result.structured_content["calls"] == [
            {"tool": "wipe", "decision": "deny", "ok": False, "error": "policy_denied"}
        ]
    assert not (project / "out" / "canary.txt").exists()


async def test_run_code_asks_for_each_side_effect_and_goes_on(project: Path) -> None:
    seen: list[list[str]] = []

    async def on_ask(params: types.ElicitRequestParams) -> None:
        log = project / "out" / "notes.log"
        seen.append(log.read_text().splitlines() if log.exists() else [])

    recorder = Recorder(["approve_once", "approve_once"], on_ask=on_ask)
    code = "a = await note('first')\nprint('between')\nb = await note('second')\n[a, b]"
    async with served(project) as server, connect(server, recorder) as client:
        result = await client.call_tool(RUN_CODE, {"code": code})
        assert not result.is_error, text(result)
        data = result.structured_content
        assert data is not None
        assert data["value"] == [{"text": "first", "length": 5}, {"text": "second", "length": 6}]
        assert data["stdout"] == "between\n"
        assert data["calls"] == [
            {"tool": "note", "decision": "escalate", "ok": True, "error": None},
            {"tool": "note", "decision": "escalate", "ok": True, "error": None},
        ]
        assert "between" in text(result) and "note (escalate, ok)" in text(result)
        # Two questions, two answers; the code ran on between them.
        assert len(recorder.asked) == 2
        assert seen == [[], ["first"]]
        question = recorder.asked[0]
        assert isinstance(question, types.ElicitRequestFormParams)
        assert question.requested_schema == APPROVAL_SCHEMA
        assert 'text = "first"' in question.message and "notes-need-ok" in question.message

        # The sandbox persists across run_code calls of the session.
        await client.call_tool(RUN_CODE, {"code": "x = 41"})
        again = await client.call_tool(RUN_CODE, {"code": "x + 1"})
        assert again.structured_content is not None and again.structured_content["value"] == 42
    assert (project / "out" / "notes.log").read_text().splitlines() == ["first", "second"]


async def test_answers_deny_decline_and_remember(project: Path) -> None:
    recorder = Recorder(["deny", None, "approve_session"])
    async with served(project) as server, connect(server, recorder) as client:
        denied = error(await client.call_tool("note", {"text": "one"}))
        assert denied["kind"] == "not_approved" and denied["reason"] == "denied"
        declined = error(await client.call_tool("note", {"text": "one"}))
        assert "decline" in declined["message"]
        assert not (project / "out" / "notes.log").exists()
        for _ in range(2):  # approved for the session: asked once
            assert not (await client.call_tool("note", {"text": "two"})).is_error
        assert len(recorder.asked) == 3
    async with served(project) as server, connect(server, Recorder(["approve_once"])) as client:
        # A new connection is a new session: its grants start empty.
        assert not (await client.call_tool("note", {"text": "two"})).is_error


async def test_a_cut_view_is_never_approved_in_one_step(project: Path) -> None:
    """The bounded view cuts long arguments: over MCP the question then shows them in
    full, and an allow counts only with the confirmation set (as the terminal and the
    inbox demand); arguments too long to show at all cannot be approved over MCP."""
    long = "start " + "x" * 9000 + " the-end-of-it"
    recorder = Recorder(
        [
            "approve_once",  # not confirmed
            {"decision": "approve_once", "confirm": False},
            {"decision": "approve_once", "confirm": True},
            {"decision": "approve_once", "confirm": True},  # too long to show
        ]
    )
    async with served(project) as server, connect(server, recorder) as client:
        for _ in range(2):
            refused = error(await client.call_tool("note", {"text": long}))
            assert refused["kind"] == "not_approved" and "not confirmed" in refused["message"]
        assert not (project / "out" / "notes.log").exists()
        assert not (await client.call_tool("note", {"text": long})).is_error
        asked = recorder.asked[0]
        assert long in asked.message and "in full" in asked.message  # nothing cut
        schema: Any = asked.requested_schema
        assert schema["properties"]["confirm"]["type"] == "boolean"
        huge = "y" * 40_000
        too_long = error(await client.call_tool("note", {"text": huge}))
        assert "too long to approve over MCP" in too_long["message"]
        assert "too long to show here in full" in recorder.asked[3].message
        assert huge not in recorder.asked[3].message
    assert (project / "out" / "notes.log").read_text().splitlines() == [long]


async def test_a_plain_request_needs_no_confirmation(project: Path) -> None:
    recorder = Recorder(["approve_once"])
    async with served(project) as server, connect(server, recorder) as client:
        assert not (await client.call_tool("note", {"text": "short"})).is_error
        schema: Any = recorder.asked[0].requested_schema
        assert "confirm" not in schema["properties"]


async def test_an_inbox_only_rule_is_never_elicited(project: Path) -> None:
    asked: list[ApprovalRequest] = []

    async def fallback(request: ApprovalRequest) -> bool:
        asked.append(request)
        return True  # the app's channel: not enough for this rule

    recorder = Recorder(["approve_always"] * 3)
    async with (
        served(project, approver=fallback) as server,
        connect(server, recorder) as client,
    ):
        refused = error(await client.call_tool("launch", {"target": "moon"}))
        assert refused["kind"] == "not_approved" and refused["reason"] == "channel_not_allowed"
        result = await client.call_tool(RUN_CODE, {"code": "await launch('mars')"})
        assert result.is_error
    assert recorder.asked == []  # the agent's own client was never asked
    assert [r.approvers for r in asked] == [("inbox",), ("inbox",)]
    assert not (project / "out" / "launched.log").exists()


async def test_without_elicitation_the_fallback_decides(project: Path) -> None:
    asked: list[ApprovalRequest] = []

    async def fallback(request: ApprovalRequest) -> bool:
        asked.append(request)
        return request.arguments["text"] == "yes"

    async with (
        served(project, approver=fallback) as server,
        connect(server, elicitation=False) as client,
    ):
        assert not (await client.call_tool("note", {"text": "yes"})).is_error
        assert error(await client.call_tool("note", {"text": "no"}))["kind"] == "not_approved"
    assert [r.caller for r in asked] == ["agent", "agent"]


async def test_progress_and_log_notifications(project: Path) -> None:
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    recorder = Recorder()
    async with served(project) as server, connect(server, recorder) as client:

        def emit(event: Any) -> None:  # what ctx.progress sends, for the call being made
            if event.data.get("tool") == "add":
                call_id = event.data["call_id"]
                server.host.events.emit("progress", event.session, call_id=call_id, fraction=0.5)
                server.host.events.emit(
                    "progress", event.session, call_id=call_id, fraction=1.0, message="done"
                )

        server.host.on("policy_decision", emit)
        await client.call_tool("add", {"a": 1, "b": 2}, progress_callback=on_progress)
        await wait_for(lambda: len(progress) == 2)
        assert progress == [(0.5, 1.0, None), (1.0, 1.0, "done")]
        # A call without a progress token gets none.
        await client.call_tool("add", {"a": 1, "b": 2})
        await client.call_tool("wipe", {"folder": "x"})
        await wait_for(lambda: len(recorder.events("policy_denied")) == 1)
        decisions = recorder.events("policy_decision")
        assert [d["decision"] for d in decisions] == ["allow", "allow", "deny"]
        assert decisions[0]["tool"] == "add" and decisions[0]["rule"] == "harmless"
        assert len(progress) == 2


async def test_each_connection_is_a_session(project: Path) -> None:
    async with served(project) as server:
        async with connect(server) as a, connect(server) as b:
            assert (await a.call_tool("count", {})).structured_content == {"result": 1}
            assert (await a.call_tool("count", {})).structured_content == {"result": 2}
            assert (await b.call_tool("count", {})).structured_content == {"result": 1}
            await a.call_tool(RUN_CODE, {"code": "x = 'a'"})
            b_result = await b.call_tool(RUN_CODE, {"code": "x"})
            assert b_result.is_error  # b's sandbox has no x
            assert len(server.sessions) == 2
        await wait_for(lambda: not server.sessions)


async def test_reload_changes_the_tool_list(project: Path) -> None:
    recorder = Recorder()
    async with served(project, reload=True) as server, connect(server, recorder) as client:
        assert (await client.call_tool("count", {})).structured_content == {"result": 1}
        assert (await client.call_tool("count", {})).structured_content == {"result": 2}
        (project / "tools" / "more.py").write_text(
            'def extra(word: str) -> str:\n    """Shout a word."""\n    return word.upper()\n'
        )
        await wait_for(lambda: recorder.list_changed >= 1, timeout=90)
        names = [t.name for t in (await client.list_tools()).tools]
        assert "extra" in names and names[-1] == RUN_CODE
        result = await client.call_tool("extra", {"word": "hi"})
        assert result.structured_content == {"result": "HI"}
        # The capsule was restarted: module state is gone, and the client was told.
        assert (await client.call_tool("count", {})).structured_content == {"result": 1}
        await wait_for(lambda: bool(recorder.events("tools_reloaded")))
        assert recorder.events("tools_reloaded")[0]["state_lost"] is True
        # A tool file that cannot be declared keeps the tools served before.
        (project / "tools" / "more.py").write_text("def extra(:\n")
        await wait_for(lambda: bool(recorder.events("tools_reload_failed")), timeout=90)
        assert (await client.call_tool("extra", {"word": "x"})).structured_content == {
            "result": "X"
        }
        assert server.reloads == 1


async def test_reload_tools_on_the_host(project: Path) -> None:
    async with Host.open(project) as host:
        assert await host.reload_tools() is False  # nothing changed
        assert await host.call("count") == 1
        (project / "tools" / "desk.py").write_text(
            (project / "tools" / "desk.py").read_text() + "\n\ndef more() -> int:\n    return 7\n"
        )
        assert await host.reload_tools() is True
        assert await host.call("more") == 7
        assert await host.call("count") == 1  # a new capsule
        kinds = [e.kind for e in host.events.recent]
        assert "tools_reloaded" in kinds


async def test_a_server_over_an_open_host_restores_its_approver(project: Path) -> None:
    async def mine(request: ApprovalRequest) -> bool:
        del request
        return False

    async with Host.open(project, approver=mine) as host:
        async with McpServer(host).running():
            assert host.mediator.escalations.approver is not mine
        assert host.mediator.escalations.approver is mine


def test_portable_schemas_mean_the_same_without_type_arrays_or_empty_schemas() -> None:
    from host.serve._tools import portable

    any_value = [{"type": t} for t in ("object", "array", "string", "number", "boolean", "null")]
    assert portable({"type": ["string", "null"], "description": "d"}) == {
        "description": "d",
        "anyOf": [{"type": "string"}, {"type": "null"}],
    }
    assert portable({"description": "anything"}) == {"description": "anything", "anyOf": any_value}
    nested = {
        "type": "object",
        "properties": {"a": {}, "b": {"type": "array", "items": {"type": ["integer", "null"]}}},
        "$defs": {"X": {"title": "X"}},
        "additionalProperties": False,
    }
    assert portable(nested) == {
        "type": "object",
        "properties": {
            "a": {"anyOf": any_value},
            "b": {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "null"}]}},
        },
        "$defs": {"X": {"title": "X", "anyOf": any_value}},
        "additionalProperties": False,
    }
    both = portable({"type": ["string", "integer"], "anyOf": [{"minLength": 1}, {"minimum": 0}]})
    assert both == {
        "anyOf": [{"minLength": 1}, {"minimum": 0}],
        "allOf": [{"anyOf": [{"type": "string"}, {"type": "integer"}]}],
    }
    assert nested["properties"]["a"] == {}  # the input is left as it was
