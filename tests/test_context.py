"""Tool contexts on real capsules of both kinds: what a tool learns about its call, what it
may ask of the host, and what it cannot do.

The context is hidden from declarations and cannot be passed or forged; ``[env]`` is the
only source of environment values (secrets never reach the audit or events); nested calls
pass the full gate, decided for caller ``tool`` and for the caller at the top of the chain,
within ``__uses__``, 8 tools deep and without cycles; the key-value store outlives the
capsule and the host.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from host import (
    ApprovalRequest,
    CapsuleCrashed,
    Event,
    Host,
    HostError,
    InvalidArguments,
    ToolError,
)
from host._context import SessionContext
from host.cli import main as cli_main
from host.testing import in_process

from .mcp_helpers import connect, served, wait_for
from .test_wasm import wasm_prepared

pytestmark = [pytest.mark.anyio, pytest.mark.subprocess]
__all__ = ["wasm_prepared"]

TOOLS = {
    "ctxtools": """
        import asyncio
        import os

        from capsule.context import (
            Attachment,
            CallFailed,
            ContextError,
            EnvNotAllowed,
            Result,
            ToolContext,
        )

        __uses__ = {
            "limited": ["echo"],
            "relay": ["echo", "whoami", "tally", "nap"],
            "nothing": [],
            "selfish": ["selfish"],
        }

        _release = asyncio.Event()


        async def whoami(ctx: ToolContext) -> dict:
            try:
                ctx.metadata["changed"] = True
                mutable = True
            except TypeError:
                mutable = False
            return {
                "tool": ctx.tool,
                "call_id": ctx.call_id,
                "session": ctx.session,
                "caller": ctx.caller,
                "chain": list(ctx.chain),
                "metadata": dict(ctx.metadata),
                "metadata_mutable": mutable,
            }


        def echo(value: str) -> str:
            return value


        def tally(**counts: int) -> int:
            return sum(counts.values())


        async def relay(name: str, args: list, ctx: ToolContext):
            return await ctx.call(name, *args)


        async def catch(name: str, args: list, ctx: ToolContext) -> dict:
            try:
                return {"value": await ctx.call(name, *args)}
            except CallFailed as exc:
                return {"kind": exc.kind, "rule": getattr(exc, "rule", None), "text": str(exc)}


        async def limited(name: str, args: list, ctx: ToolContext) -> dict:
            return await catch(name, args, ctx)


        async def nothing(name: str, args: list, ctx: ToolContext) -> dict:
            return await catch(name, args, ctx)


        async def selfish(ctx: ToolContext) -> dict:
            return await catch("selfish", [], ctx)


        async def env(name: str, ctx: ToolContext) -> dict:
            try:
                return {"value": await ctx.env(name), "type": await ctx.env_type(name)}
            except EnvNotAllowed as exc:
                return {"error": str(exc), "is_key_error": isinstance(exc, KeyError)}


        async def set_env(name: str, value: str, secret: bool, ctx: ToolContext) -> str:
            try:
                await ctx.set_env(name, value, secret=secret)
            except ContextError as exc:
                return f"{exc.kind}: {exc}"
            return "set"


        async def log_in(ctx: ToolContext) -> None:
            await ctx.set_env("MINE", "mine-" + "SECRET-55443")  # say, a token it fetched


        async def chatty(ctx: ToolContext) -> str:
            token = await ctx.env("TOKEN")
            mine = await ctx.env("MINE")
            ctx.emit("secret.seen", {"token": token, token: [mine]})
            await ctx.progress(f"using {token} and {mine}", 0.5)
            await ctx.call("echo", token + mine)
            raise RuntimeError(f"failed with {token}")


        async def kv_get(key: str, ctx: ToolContext):
            try:
                return await ctx.get_value(key, "absent")
            except ContextError as exc:
                return f"{exc.kind}: {exc}"


        async def kv_set(key: str, value, ctx: ToolContext) -> str:
            try:
                await ctx.set_value(key, value)
            except ContextError as exc:
                return f"{exc.kind}: {exc}"
            return "set"


        async def pass_on(ctx: ToolContext) -> str:
            return await ctx.call("echo", ctx)


        async def forge(other: int, op: str, ctx: ToolContext) -> list:
            args = {"key": "k"} if op == "get" else {"name": "whoami", "args": [], "kwargs": {}}
            ok, answer = await ctx._channel.request(other, op, args)
            return [ok, answer]


        async def nap() -> str:
            await _release.wait()
            _release.clear()
            return "rested"


        async def release() -> None:
            _release.set()


        async def late(ctx: ToolContext) -> str:
            async def later() -> None:
                await _release.wait()
                try:
                    await ctx.get_value("k")
                except ContextError as exc:
                    print("late request:", exc.kind)

            asyncio.get_running_loop().create_task(later())
            return "returned"


        async def fire_and_forget(ctx: ToolContext) -> str:
            task = asyncio.get_running_loop().create_task(ctx.call("nap"))
            await asyncio.sleep(0)  # the request is on its way
            _keep.append(task)
            return "gone"


        _keep = []


        async def flood(count: int, ctx: ToolContext) -> int:
            for i in range(count):
                ctx.emit("tick", i)
            return count


        def die() -> None:
            os._exit(3)


        async def leaky(ctx: ToolContext) -> Result[dict]:
            token = await ctx.env("TOKEN")
            return Result({"token": token}, attachments=[Attachment("t.txt", "text/plain", b"t")])


        async def steps(ctx: ToolContext) -> str:
            await ctx.progress("half way", 0.5)
            await ctx.progress(f"done with {await ctx.env('TOKEN')}", 1.0)
            return "stepped"
    """,
    "chain": "from capsule.context import CallFailed, ToolContext\n\n"
    + "".join(
        f"""
async def c{i}(ctx: ToolContext) -> dict:
    try:
        return await ctx.call("c{i + 1}")
    except CallFailed as exc:
        return {{"kind": exc.kind, "at": "c{i}", "depth": len(ctx.chain),
                 "limit": getattr(exc, "limit", None)}}
"""
        for i in range(10)
    )
    + """

async def c10(ctx: ToolContext) -> dict:
    return {"kind": None}


async def loop_a(ctx: ToolContext) -> dict:
    return await ctx.call("loop_b")


async def loop_b(ctx: ToolContext) -> dict:
    try:
        return await ctx.call("loop_a")
    except CallFailed as exc:
        return {"kind": exc.kind, "rule": exc.rule, "reason": exc.reason}
""",
}

TOKEN = "tok-SECRET-8127364"
MINE = "mine-SECRET-55443"
POLICY = f"""
    version = 1

    [defaults]
    agent = "allow"
    tool = "allow"

    [[rules]]
    id = "no-echo-for-agents"
    tools = ["echo"]
    callers = ["agent"]
    decision = "deny"

    [[rules]]
    id = "ask-about-agents"
    tools = ["tally"]
    callers = ["agent"]
    decision = "escalate"

    [env]
    set = {{ PLAIN = "plain-value", TOKEN = "{TOKEN}" }}
    secret = ["TOKEN"]
    pass = ["NOT_SET_ANYWHERE"]
"""
WASM = """
    [capsules]
    default = "wasm"
"""


@pytest.fixture(
    params=["subprocess", pytest.param("wasm", marks=[pytest.mark.wasm, pytest.mark.slow])]
)
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "wasm":
        request.getfixturevalue("wasm_prepared")
    return str(request.param)


@pytest.fixture
def project(make_project: Callable[..., Path], kind: str) -> Path:
    return make_project(tools=TOOLS, policy=POLICY + (WASM if kind == "wasm" else ""))


@pytest.fixture(autouse=True)
def _no_not_set(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    yield


class Recorder:
    """Every event, for assertions (and an approver that records and denies)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.requests: list[ApprovalRequest] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    async def deny(self, request: ApprovalRequest) -> bool:
        self.requests.append(request)
        return False

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]


# -- what a tool learns about its call -------------------------------------------------------


async def test_a_tool_sees_its_own_call(project: Path) -> None:
    async with Host.open(project) as host:
        seen = Recorder()
        host.on("policy_decision", seen)
        async with host.session(metadata={"user": "ann", "tags": ["a"]}) as session:
            me = await session.call("whoami")
            decided = seen.of("policy_decision")[-1]
            assert me == {
                "tool": "whoami",
                "call_id": decided.data["call_id"],
                "session": session.id,
                "caller": "app",
                "chain": ["app"],
                "metadata": {"user": "ann", "tags": ["a"]},
                "metadata_mutable": False,
            }
            assert session.metadata == {"user": "ann", "tags": ["a"]}
            # Through a nested call: caller tool, the chain above it, the same session.
            nested = await session.call("relay", "whoami", [])
            assert nested["caller"] == "tool" and nested["chain"] == ["app", "relay"]
            assert nested["session"] == session.id
        # From agent code: caller agent; the context itself never reaches the code.
        out = await host.run_code("me = await whoami()\nme['caller'], me['chain']")
        assert out.ok and out.value == ["agent", ["agent"]]
        records = await host.store.tail(100)
        nested_record = next(r for r in records if r.tool == "whoami" and r.caller == "tool")
        relay_record = next(r for r in records if r.tool == "relay")
        assert nested_record.chain == f"app > relay ({relay_record.call_id})"
        assert relay_record.chain is None


async def test_the_context_is_hidden_and_no_caller_can_pass_it(
    make_project: Callable[..., Path],
) -> None:
    project = make_project(
        tools={
            "hidden": """
                from capsule.context import ToolContext

                async def whoami(greeting: str, ctx: ToolContext, **extra: str) -> str:
                    return f"{greeting} {ctx.caller} {sorted(extra)}"
            """
        },
        policy='version = 1\n[defaults]\nagent = "allow"\n',
    )
    async with Host.open(project) as host:
        declared = host.scope.render_model() + host.scope.render_pyi()
        assert "ctx" not in declared and "ToolContext" not in declared
        schema = host.scope.schemas()["whoami"]["input"]
        assert "ctx" not in json.dumps(schema)
        assert await host.call("whoami", "hi", other="x") == "hi app ['other']"
        with pytest.raises(InvalidArguments, match="the tool's context"):
            await host.call("whoami", "hi", ctx={"caller": "app"})
        out = await host.run_code("await whoami('hi', ctx='forged')")
        assert not out.ok and out.error is not None
        assert out.error.kind == "invalid_arguments"
        assert "the tool's context" in out.error.message
        (record,) = [r for r in await host.store.tail(10) if r.caller == "agent"]
        assert record.outcome == "denied" and record.error_kind == "invalid_arguments"


async def test_a_context_cannot_be_passed_on(project: Path) -> None:
    async with Host.open(project) as host:
        with pytest.raises(ToolError) as caught:
            await host.call("pass_on")
        assert caught.value.type_name == "TypeError"
        assert "a ToolContext cannot be passed on" in caught.value.error_message
        assert not [r for r in await host.store.tail(10) if r.tool == "echo"]


# -- the environment and secrets --------------------------------------------------------------


async def test_env_is_what_the_policy_gives_and_secrets_stay_hidden(project: Path) -> None:
    seen = Recorder()
    async with Host.open(project) as host:
        host.on("*", seen)
        assert await host.call("env", "PLAIN") == {"value": "plain-value", "type": "text"}
        assert await host.call("env", "TOKEN") == {"value": TOKEN, "type": "secret"}
        refused = await host.call("env", "CANARY_SECRET")  # in the host's environment
        assert refused["is_key_error"]
        assert "[env] pass" in refused["error"] and "CANARY_SECRET" in refused["error"]
        assert os.environ["CANARY_SECRET"] not in json.dumps(refused)
        unset = await host.call("env", "NOT_SET_ANYWHERE")
        assert "does not have it" in unset["error"]
        # A session may set its own names (secret unless it says not), never the policy's.
        assert await host.call("set_env", "NOTE", "plain note", False) == "set"
        assert await host.call("env", "NOTE") == {"value": "plain note", "type": "text"}
        await host.call("log_in")
        assert await host.call("env", "MINE") == {"value": MINE, "type": "secret"}
        refused_change = await host.call("set_env", "TOKEN", "x", False)
        assert refused_change.startswith("context_error") and "policy's [env]" in refused_change
        assert await host.call("set_env", "MINE", "unmasked?", False) == "set"
        assert (await host.call("env", "MINE"))["type"] == "secret"  # it stays secret
        await host.call("log_in")
        async with host.session() as other:  # another session does not see it
            assert "error" in await other.call("env", "MINE")
        with pytest.raises(ToolError):
            await host.call("chatty")
        records = await host.store.tail(100)
    for secret in (TOKEN, MINE):
        assert secret not in repr(records)
        assert secret not in repr(seen.events)
    echo = next(r for r in records if r.tool == "echo")
    assert echo.args_summary is not None and "⟨secret TOKEN⟩" in echo.args_summary
    chatty = next(r for r in records if r.tool == "chatty")
    assert chatty.error is not None and "⟨secret TOKEN⟩" in chatty.error
    (event,) = seen.of("tool_event")
    assert event.data["event"] == "secret.seen"
    assert event.data["data"] == {"token": "⟨secret TOKEN⟩", "⟨secret TOKEN⟩": ["⟨secret MINE⟩"]}
    progress = [e for e in seen.of("progress") if e.data["tool"] == "chatty"]
    assert progress[0].data["message"] == "using ⟨secret TOKEN⟩ and ⟨secret MINE⟩"
    assert progress[0].data["fraction"] == 0.5


async def test_a_results_value_is_redacted_for_agent_code(project: Path) -> None:
    async with Host.open(project) as host:
        # Redacted where the call returns, not only in the run's value.
        out = await host.run_code("r = await leaky()\n[r, r['token'].startswith('tok-')]")
        assert out.ok and out.value == [{"token": "⟨secret TOKEN⟩"}, False]
        assert [a.data for a in out.attachments] == [b"t"]
        assert (await host.call("leaky")).value == {"token": TOKEN}  # the app: as it is


async def test_events_are_rate_limited(project: Path) -> None:
    seen = Recorder()
    async with Host.open(project) as host:
        host.on("*", seen)
        assert await host.call("flood", 2000) == 2000
    ticks = seen.of("tool_event")
    assert 0 < len(ticks) < 2000
    assert [e.data["data"] for e in ticks[:5]] == [0, 1, 2, 3, 4]
    (dropped, *_) = seen.of("tool_events_dropped")
    assert dropped.data["dropped"] == 1


# -- nested calls -----------------------------------------------------------------------------


async def test_nested_calls_are_decided_for_the_original_caller(project: Path) -> None:
    seen = Recorder()
    async with Host.open(project, approver=seen.deny) as host:
        # The app may echo, so a tool the app called may too.
        assert await host.call("relay", "echo", ["hi"]) == "hi"
        # Agent code may call relay, but not echo: nor may relay on its behalf.
        out = await host.run_code("await relay('echo', ['hi'])")
        assert not out.ok and out.error is not None
        assert out.error.kind == "tool_error" and "policy_denied" in out.error.message
        # Escalated for the agent: escalated, whoever the tool is; the request shows why.
        out = await host.run_code("await relay('tally', [], )")
        assert not out.ok and out.error is not None and "not_approved" in out.error.message
        (request,) = seen.requests
        assert request.caller == "tool" and request.tool == "tally"
        assert request.chain == ("agent", "relay") and request.rule == "ask-about-agents"
        assert request.reason is not None and "original caller agent" in request.reason
        records = await host.store.tail(100)
    denied = [r for r in records if r.tool == "echo" and r.caller == "tool"]
    assert [r.outcome for r in denied] == ["ok", "denied"]
    assert denied[1].rule == "no-echo-for-agents" and denied[1].chain is not None
    assert denied[1].chain.startswith("agent > relay (")
    escalated = next(r for r in records if r.tool == "tally")
    assert escalated.outcome == "denied" and escalated.error_kind == "not_approved"


async def test_uses_limits_what_a_tool_may_call(project: Path) -> None:
    async with Host.open(project) as host:
        assert await host.call("limited", "echo", ["hi"]) == {"value": "hi"}
        got = await host.call("limited", "whoami", [])
        assert got["kind"] == "policy_denied" and got["rule"] == "uses"
        assert "limited may call only the tools its __uses__ lists (echo)" in got["text"]
        assert "add 'whoami'" in got["text"]
        # A tool its file lists nothing for may call whatever policy allows.
        assert (await host.call("catch", "whoami", []))["value"]["chain"] == ["app", "catch"]
        records = await host.store.tail(100)
    refused = next(r for r in records if r.rule == "uses")
    assert refused.tool == "whoami" and refused.caller == "tool" and refused.outcome == "denied"


async def test_an_empty_uses_entry_lets_a_tool_call_nothing(project: Path) -> None:
    """``[]`` is a list of no tools, not "no list": every nested call is refused."""
    async with Host.open(project) as host:
        for name, args in (("echo", ["hi"]), ("whoami", [])):
            got = await host.call("nothing", name, args)
            assert got["kind"] == "policy_denied" and got["rule"] == "uses", got
            assert "nothing may call only the tools its __uses__ lists (none)" in got["text"]


async def test_a_tool_calling_itself_is_a_cycle(project: Path) -> None:
    """Its ``__uses__`` lists itself and policy allows it: still a cycle, refused."""
    async with Host.open(project) as host:
        got = await host.call("selfish")
        assert got["kind"] == "policy_denied" and got["rule"] == "call_cycle", got
        assert "app > selfish" in got["text"]


async def test_depth_and_cycles_are_refused(project: Path) -> None:
    async with Host.open(project) as host:
        deep = await host.call("c0")
        # c8 has 8 tools above it (c0..c7): its call to c9 would be the 9th level.
        assert deep == {"kind": "limit_exceeded", "at": "c8", "depth": 9, "limit": "call_depth"}
        cycle = await host.call("loop_a")
        assert cycle["kind"] == "policy_denied" and cycle["rule"] == "call_cycle"
        assert "app > loop_a > loop_b" in cycle["reason"]
        records = await host.store.tail(100)
    (too_deep,) = [r for r in records if r.tool == "c9"]
    assert too_deep.outcome == "denied" and too_deep.error_kind == "limit_exceeded"
    assert too_deep.chain is not None and too_deep.chain.startswith("app > c0 > c1")


async def test_nested_calls_end_with_the_call_that_made_them(project: Path) -> None:
    seen = Recorder()
    async with Host.open(project) as host:
        host.on("*", seen)
        assert await host.call("fire_and_forget") == "gone"

        def settled() -> bool:
            naps = [e for e in seen.of("policy_decision") if e.data["tool"] == "nap"]
            return bool(seen.of("context_refused")) or bool(naps)

        await wait_for(settled)
        if seen.of("context_refused"):  # refused: the call had ended when it was served
            assert seen.of("context_refused")[0].data["op"] == "call"
        else:  # cancelled while it waited in nap
            with anyio.fail_after(30):
                while True:
                    records = await host.store.tail(20)
                    nap = [r for r in records if r.tool == "nap"]
                    if nap and nap[0].outcome != "started":
                        break
                    await anyio.sleep(0.01)
            assert nap[0].outcome == "unknown" and nap[0].error_kind == "cancelled"
        assert await host.call("echo", "still serving") == "still serving"


# -- the key-value store ----------------------------------------------------------------------


async def test_the_store_outlives_the_capsule_and_the_host(project: Path) -> None:
    limits = {"max_value_size": 1000, "max_session_store": 2500}
    async with Host.open(project, limits=limits) as host:
        async with host.session("chat-42") as session:
            assert await session.call("kv_get", "k") == "absent"
            assert await session.call("kv_set", "k", {"n": [1, 2, b"\x00"]}) == "set"
            with pytest.raises(CapsuleCrashed):
                await session.call("die")  # the capsule dies: module state is gone
            assert await session.call("kv_get", "k") == {"n": [1, 2, b"\x00"]}
            too_big = await session.call("kv_set", "big", "x" * 2000)
            assert too_big.startswith("context_limit") and "max_value_size" in too_big
            for n in range(2):
                assert await session.call("kv_set", f"k{n}", "y" * 900) == "set"
            full = await session.call("kv_set", "k9", "y" * 900)
            assert full.startswith("context_limit") and "max_session_store" in full
            assert await session.call("kv_set", "k0", None) == "set"  # None removes it
            assert await session.call("kv_set", "k9", "y" * 900) == "set"
        async with host.session() as other:
            assert await other.call("kv_get", "k") == "absent"
        with pytest.raises(HostError, match="letters, digits"):
            async with host.session("../escape"):
                pass
    async with Host.open(project, session="chat-42") as host:
        assert await host.call("kv_get", "k") == {"n": [1, 2, b"\x00"]}
        assert await host.call("kv_get", "k0") == "absent"


async def test_a_host_failure_serving_a_request_is_the_tools_error(
    make_project: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    project = make_project(tools=TOOLS, policy=POLICY)

    async def broken(self: SessionContext, key: str) -> None:
        raise RuntimeError(f"a bug while reading {key}")

    monkeypatch.setattr(SessionContext, "_get", broken)
    async with Host.open(project) as host:
        got = await host.call("kv_get", "k")
        assert got == "context_error: ctx.get: the host failed to serve it (its log has the detail)"
        assert await host.call("echo", "still serving") == "still serving"


# -- forging ----------------------------------------------------------------------------------


async def test_forged_context_requests_are_refused_and_audited(project: Path) -> None:
    seen = Recorder()
    async with Host.open(project) as host:
        host.on("*", seen)
        # A call id that is not in flight at all.
        ok, answer = await host.call("forge", 987654, "get")
        assert not ok and answer["kind"] == "context_closed"
        assert "not in flight on this capsule" in answer["message"]
        # A call that is in flight, but to a tool that takes no context.
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.call, "nap")
            await wait_for(
                lambda: any(e.data.get("tool") == "nap" for e in seen.of("policy_decision"))
            )
            nap = next(e for e in seen.of("policy_decision") if e.data["tool"] == "nap")
            number = int(nap.data["call_id"].rsplit(".", 1)[1])
            ok, answer = await host.call("forge", number, "call")
            assert not ok and "sent without a context" in answer["message"]
            await host.call("release")
        # A request after the call returned (a task the tool left behind).
        assert await host.call("late") == "returned"
        await host.call("release")
        await wait_for(
            lambda: any("late request" in e.data.get("data", "") for e in seen.of("console"))
        )
        records = await host.store.tail(100)
    refused = [r for r in records if r.error_kind == "context_refused"]
    assert [r.tool for r in refused] == ["ctx.get", "ctx.call"]
    assert all(r.caller == "tool" and r.outcome == "denied" for r in refused)
    assert not [r for r in records if r.tool == "whoami"]  # the forged call never ran
    assert len(seen.of("context_refused")) == 2


async def test_the_twin_serves_contexts_too(make_project: Callable[..., Path]) -> None:
    project = make_project(tools=TOOLS, policy=POLICY)
    async with Host.open(project, capsule=in_process()) as host:
        assert (await host.call("relay", "whoami", []))["chain"] == ["app", "relay"]
        assert await host.call("kv_set", "k", 1) == "set"
        assert await host.call("kv_get", "k") == 1
        assert (await host.call("limited", "whoami", []))["rule"] == "uses"
        with pytest.raises(InvalidArguments, match="the tool's context"):
            await host.call("whoami", ctx=None)


async def test_progress_reaches_the_mcp_client(make_project: Callable[..., Path]) -> None:
    project = make_project(tools=TOOLS, policy=POLICY)
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async with served(project) as server, connect(server) as client:
        result = await client.call_tool("steps", {}, progress_callback=on_progress)
        assert result.structured_content == {"result": "stepped"}
        await wait_for(lambda: len(progress) == 2)
    assert progress == [(0.5, 1.0, "half way"), (1.0, 1.0, "done with ⟨secret TOKEN⟩")]


def test_scope_manifest_shows_uses(
    make_project: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    project = make_project(tools=TOOLS, policy=POLICY)
    with pytest.raises(SystemExit) as exited:
        cli_main(["scope", "--project", str(project), "--format", "manifest"])
    assert exited.value.code == 0
    manifest = json.loads(capsys.readouterr().out)
    uses = {t["name"]: t["uses"] for t in manifest["tools"]}
    assert uses["limited"] == ["echo"]
    assert uses["relay"] == ["echo", "whoami", "tally", "nap"]
    assert uses["whoami"] is None
