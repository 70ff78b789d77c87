"""Hooks around every call, on real capsules (subprocess and Wasm): their order, the
chains (``None`` keeps the value), a raising hook, the bound on ``tool_call_started``,
refused calls, secrets, hooks from files and from ``host.hook``."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from host import Host, ToolError
from host.errors import HostError, PolicyDenied, UnknownTool
from host.hooks import HookContext, ToolCallInfo, ToolResult, hook

from .test_cli import toolhost
from .test_wasm import wasm_prepared

pytestmark = pytest.mark.anyio
__all__ = ["wasm_prepared"]

SECRET = "s3cr3t-token-value"

TOOLS = {
    "files": """
        __progress_argument__ = {"write_file": "path"}


        def write_file(path: str, text: str) -> int:
            '''Pretend to write a file.'''
            return len(text)


        def fail(message: str) -> int:
            raise ValueError(message)


        def secret_echo(text: str) -> str:
            return text
    """,
    "boxed": """
        def shout(text: str) -> str:
            return text.upper()


        def boxed_fail() -> str:
            raise RuntimeError("boxed failure")
    """,
}

POLICY = f"""
    version = 1
    [defaults]
    agent = "allow"

    [[rules]]
    id = "no-secrets"
    tools = ["secret_echo"]
    callers = ["agent"]
    decision = "deny"

    [env]
    set = {{ TOKEN = "{SECRET}" }}
    secret = ["TOKEN"]
"""

WASM = '\n    [capsules]\n    wasm = ["boxed"]\n'


class Recorder:
    """Hooks that record what they saw, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def all(self, host: Host) -> None:
        async def started(ctx: HookContext, call: ToolCallInfo, progress: Any) -> None:
            self.seen.append(("tool_call_started", (call.tool, progress, ctx.caller)))

        def done(ctx: HookContext, call: ToolCallInfo, result: ToolResult) -> None:
            self.seen.append(("tool_call_done", result.ok))

        async def success(ctx: HookContext, call: ToolCallInfo, result: ToolResult) -> Any:
            self.seen.append(("after_tool_call_success", result.value))
            return None

        async def failure(ctx: HookContext, call: ToolCallInfo, result: ToolResult) -> Any:
            self.seen.append(("after_tool_call_failure", result.error and result.error.kind))
            return None

        async def store(ctx: HookContext, call: ToolCallInfo, result: ToolResult) -> Any:
            self.seen.append(("before_store_tool_result", result.ok))
            return None

        host.hook(started, "tool_call_started")
        host.hook(done, "tool_call_done")
        host.hook(success, "after_tool_call_success")
        host.hook(failure, "after_tool_call_failure")
        host.hook(store, "before_store_tool_result")


@pytest.mark.parametrize("kind", ["subprocess", pytest.param("wasm", marks=pytest.mark.wasm)])
async def test_the_order_of_hooks_for_a_success_and_a_failure(
    make_project: Callable[..., Path], kind: str, request: pytest.FixtureRequest
) -> None:
    if kind == "wasm":
        request.getfixturevalue("wasm_prepared")
    project = make_project(TOOLS, POLICY + (WASM if kind == "wasm" else ""))
    async with Host.open(project) as host:
        recorder = Recorder()
        recorder.all(host)
        events: list[str] = []
        host.on("*", lambda e: events.append(e.kind) if e.kind.startswith("tool_call") else None)
        assert await host.call("shout", "hi") == "HI"
        assert recorder.seen == [
            ("tool_call_started", ("shout", None, "app")),
            ("tool_call_done", True),
            ("after_tool_call_success", "HI"),
            ("before_store_tool_result", True),
        ]
        recorder.seen.clear()
        with pytest.raises(ToolError):
            await host.call("boxed_fail")
        assert recorder.seen == [
            ("tool_call_started", ("boxed_fail", None, "app")),
            ("tool_call_done", False),
            ("after_tool_call_failure", "tool_error"),
            ("before_store_tool_result", False),
        ]
        assert events == ["tool_call_started", "tool_call_done"] * 2
        recorder.seen.clear()
        assert await host.call("write_file", "index.html", "<p>") == 3
        assert recorder.seen[0] == ("tool_call_started", ("write_file", "index.html", "app"))
        started = [e for e in host.events.recent if e.kind == "tool_call_started"][-1]
        assert started.data["progress"] == "index.html"


async def test_chains_replace_keep_and_survive_a_raising_hook(
    make_project: Callable[..., Path],
) -> None:
    project = make_project(TOOLS, POLICY)
    async with Host.open(project) as host:
        seen: list[Any] = []

        def double(ctx: HookContext, call: ToolCallInfo, result: ToolResult) -> Any:
            return result.value * 2

        def keep(ctx: HookContext, call: ToolCallInfo, result: ToolResult) -> Any:
            seen.append(result.value)
            return None

        def broken(ctx: HookContext, call: ToolCallInfo, result: ToolResult) -> Any:
            raise RuntimeError(f"broken hook {SECRET}")

        def last(ctx: HookContext, call: ToolCallInfo, result: ToolResult) -> Any:
            seen.append(result.value)
            return ToolResult.success(result.value + 1)

        host.hook(double, "after_tool_call_success", id="double")
        host.hook(keep, "after_tool_call_success", id="keep")
        host.hook(broken, "after_tool_call_success", id="broken")
        host.hook(last, "before_store_tool_result", id="last")
        assert await host.call("write_file", "a", "abc") == 7  # 3 * 2, kept, kept, + 1
        assert seen == [6, 6]
        failed = [e for e in host.events.recent if e.kind == "hook_failed"]
        assert [e.data["hook"] for e in failed] == ["broken"]
        assert SECRET not in repr(failed) and "⟨secret TOKEN⟩" in failed[0].data["error"]


async def test_a_raising_started_hook_never_fails_the_call(
    make_project: Callable[..., Path],
) -> None:
    """``tool_call_started`` hooks observe: one that raises, sync or async, is reported
    (``hook_failed``) and the call runs all the same; the hooks after it still run."""
    project = make_project(TOOLS, POLICY)
    async with Host.open(project) as host:
        ran: list[str] = []

        def broken_sync(ctx: HookContext, call: ToolCallInfo, progress: Any) -> None:
            raise RuntimeError("sync started hook broke")

        def after_sync(ctx: HookContext, call: ToolCallInfo, progress: Any) -> None:
            ran.append("after sync")

        async def broken_async(ctx: HookContext, call: ToolCallInfo, progress: Any) -> None:
            raise RuntimeError("async started hook broke")

        def after_async(ctx: HookContext, call: ToolCallInfo, progress: Any) -> None:
            ran.append("after async")

        host.hook(broken_sync, "tool_call_started", id="broken-sync")
        host.hook(after_sync, "tool_call_started", id="after-sync")
        assert await host.call("shout", "still") == "STILL"
        host.hook(broken_async, "tool_call_started", id="broken-async")
        host.hook(after_async, "tool_call_started", id="after-async")
        assert await host.call("shout", "again") == "AGAIN"
        assert ran == ["after sync", "after sync", "after async"]
        failed = [e.data["hook"] for e in host.events.recent if e.kind == "hook_failed"]
        assert failed == ["broken-sync", "broken-sync", "broken-async"]
        records = await host.store.tail(2)
        assert [r.outcome for r in records] == ["ok", "ok"]


async def test_a_failure_chain_may_recover_or_replace_the_error(
    make_project: Callable[..., Path],
) -> None:
    project = make_project(TOOLS, POLICY)
    async with Host.open(project) as host:

        def recover(ctx: HookContext, call: ToolCallInfo, result: ToolResult) -> Any:
            assert result.error is not None
            return "recovered" if "soft" in str(result.error) else HostError("replaced")

        remove = host.hook(recover, "after_tool_call_failure")
        assert await host.call("fail", "soft") == "recovered"
        with pytest.raises(HostError, match="replaced"):
            await host.call("fail", "hard")
        remove()
        with pytest.raises(ToolError):
            await host.call("fail", "soft")


async def test_tool_call_started_waits_only_as_long_as_its_bound(
    make_project: Callable[..., Path],
) -> None:
    project = make_project(TOOLS, POLICY)
    async with Host.open(project) as host:
        host.hooks.started_timeout = 0.05
        release = anyio.Event()
        over = anyio.Event()
        finished: list[str] = []

        async def slow(ctx: HookContext, call: ToolCallInfo, progress: Any) -> None:
            await release.wait()  # never set until the call is over
            finished.append(call.tool)
            over.set()

        host.hook(slow, "tool_call_started")
        assert await host.call("write_file", "x", "yz") == 2  # went on without the hook
        assert [e.kind for e in host.events.recent if e.kind == "hook_timed_out"]
        release.set()  # the hook was not cancelled: it finishes on its own
        with anyio.fail_after(10):
            await over.wait()
        assert finished == ["write_file"]


async def test_refused_calls_get_no_tool_hooks_but_policy_hooks_see_them(
    make_project: Callable[..., Path],
) -> None:
    project = make_project(TOOLS, POLICY)
    async with Host.open(project) as host:
        recorder = Recorder()
        recorder.all(host)
        denied = anyio.Event()
        policy_seen: list[Any] = []

        async def on_denied(ctx: HookContext, event: Any) -> None:
            policy_seen.append((event.kind, event.data["tool"], ctx.session))
            denied.set()

        host.hook(on_denied, "policy_denied")
        with pytest.raises(UnknownTool):
            await host.call("nope")
        with pytest.raises(HostError):
            await host.call("write_file", 1)  # invalid arguments
        result = await host.run_code(f"await secret_echo({SECRET!r})")
        assert not result.ok and result.error is not None
        assert result.error.type == "PolicyDenied"
        assert recorder.seen == []
        with anyio.fail_after(10):
            await denied.wait()
        assert ("policy_denied", "secret_echo", host.default_session.id) in policy_seen


async def test_secrets_are_redacted_for_hooks_and_absent_from_events(
    make_project: Callable[..., Path],
) -> None:
    project = make_project(TOOLS, POLICY)
    async with Host.open(project) as host:
        calls: list[ToolCallInfo] = []
        host.hook(lambda ctx, call, progress: calls.append(call), "tool_call_started")
        assert await host.call("write_file", f"/tmp/{SECRET}", SECRET) == len(SECRET)
        assert calls[0].arguments == {
            "path": "/tmp/⟨secret TOKEN⟩",
            "text": "⟨secret TOKEN⟩",
        }
        assert SECRET not in repr(list(host.events.recent))


HOOKS_FILE = """
    from host.hooks import hook


    @hook("after_tool_call_success")
    def upper(ctx, call, result):
        if isinstance(result.value, str):
            return result.value + "!"


    @hook("before_store_tool_result", id="mark")
    async def mark(ctx, call, result):
        if isinstance(result.value, str):
            return result.value + "?"
"""


async def test_hooks_from_files_run_first_in_file_then_definition_order(
    make_project: Callable[..., Path],
) -> None:
    project = make_project(TOOLS, POLICY)
    (project / "hooks").mkdir()
    (project / "hooks" / "b_second.py").write_text(textwrap.dedent(HOOKS_FILE))
    (project / "hooks" / "a_first.py").write_text(
        textwrap.dedent("""
            from host.hooks import hook

            @hook("after_tool_call_success")
            def star(ctx, call, result):
                return "*" + result.value
        """)
    )
    (project / "hooks" / "_helper.py").write_text("raise RuntimeError('not a hooks file')\n")
    async with Host.open(project) as host:

        @hook("before_store_tool_result", id="app.last")
        def app_last(ctx: HookContext, call: ToolCallInfo, result: ToolResult) -> Any:
            return result.value + "#"

        host.hook(app_last)
        assert [h.id for h in host.hooks.hooks] == [
            "a_first.star",
            "b_second.upper",
            "mark",
            "app.last",
        ]
        assert host.hooks.hooks[0].source == "hooks/a_first.py:4"
        assert await host.call("shout", "hi") == "*HI!?#"
        with pytest.raises(HostError, match="id 'mark'"):
            host.hook(app_last, "tool_call_done", id="mark")
        with pytest.raises(HostError, match="unknown hook kind"):
            host.hook(app_last, "after_everything")  # pyright: ignore[reportArgumentType]


async def test_a_broken_hooks_file_stops_the_host_naming_it(
    make_project: Callable[..., Path],
) -> None:
    project = make_project(TOOLS, POLICY)
    (project / "hooks").mkdir()
    (project / "hooks" / "bad.py").write_text("import no_such_module_here\n")
    with pytest.raises(HostError, match=r"hooks/bad\.py failed to load"):
        async with Host.open(project):
            pass


async def test_denied_by_policy_for_the_app_too(make_project: Callable[..., Path]) -> None:
    project = make_project(TOOLS, POLICY.replace('callers = ["agent"]', 'callers = ["app"]'))
    async with Host.open(project) as host:
        recorder = Recorder()
        recorder.all(host)
        with pytest.raises(PolicyDenied):
            await host.call("secret_echo", "x")
        assert recorder.seen == []
        assert not [e for e in host.events.recent if e.kind.startswith("tool_call")]


@pytest.mark.subprocess
def test_toolhost_hooks_lists_them_in_order(make_project: Callable[..., Path]) -> None:
    project = make_project(TOOLS, POLICY)
    assert "no hooks" in toolhost("hooks", "--project", str(project)).stdout
    (project / "hooks").mkdir()
    (project / "hooks" / "redact.py").write_text(textwrap.dedent(HOOKS_FILE))
    done = toolhost("hooks", "--project", str(project))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["redact.upper", "after_tool_call_success"],
        ["mark", "before_store_tool_result"],
    ]
    listed = json.loads(toolhost("hooks", "--json", "--project", str(project)).stdout)
    assert listed["hooks"][1] == {
        "id": "mark",
        "kind": "before_store_tool_result",
        "source": "hooks/redact.py:11",
    }
    (project / "hooks" / "zz.py").write_text("raise RuntimeError('no')\n")
    broken = toolhost("hooks", "--project", str(project))
    assert broken.returncode == 1 and "hooks/zz.py failed to load" in broken.stderr


async def test_the_example_project_hides_emails_in_kanban_results() -> None:
    from .conftest import AGENT_SRC

    async with Host.open(AGENT_SRC, session_logs=False) as host:
        assert [h.id for h in host.hooks.hooks] == ["redact-emails"]
        task = await host.call("kanban.add", "mail bob@example.org today")
        assert task["title"] == "mail <email> today"
        assert await host.call("add", 2, 3) == 5  # other tools are left alone
        await host.call("kanban.close", task["id"])


NESTED = {
    "relay": """
        from capsule.context import ToolContext

        __uses__ = {"relay": ["shout"]}


        async def relay(text: str, ctx: ToolContext) -> str:
            return await ctx.call("shout", text)
    """,
    "loud": """
        def shout(text: str) -> str:
            return text.upper()
    """,
}

NESTED_POLICY = """
    version = 1
    [defaults]
    tool = "allow"
"""


async def test_a_nested_call_runs_the_hooks_too_marked_by_its_caller_and_chain(
    make_project: Callable[..., Path],
) -> None:
    project = make_project(NESTED, NESTED_POLICY)
    seen: list[tuple[str, str, str, tuple[str, ...], Any]] = []
    async with Host.open(project) as host:

        def started(ctx: HookContext, call: ToolCallInfo, progress: Any) -> None:
            seen.append(("started", call.tool, ctx.caller, ctx.chain, None))

        def success(ctx: HookContext, call: ToolCallInfo, result: ToolResult) -> Any:
            seen.append(("success", call.tool, ctx.caller, ctx.chain, result.value))
            if call.tool == "shout":
                return f"<{result.value}>"  # the nested result, reshaped for its caller
            return None

        host.hook(started, "tool_call_started")
        host.hook(success, "after_tool_call_success")
        assert await host.call("relay", "hi") == "<HI>"
    assert seen == [
        ("started", "relay", "app", (), None),
        ("started", "shout", "tool", ("app", "relay"), None),
        ("success", "shout", "tool", ("app", "relay"), "HI"),
        ("success", "relay", "app", (), "<HI>"),
    ]


async def test_hooks_see_the_session_metadata(make_project: Callable[..., Path]) -> None:
    project = make_project(TOOLS, POLICY)
    seen: list[dict[str, Any]] = []
    async with Host.open(project) as host:
        host.hook(lambda ctx, call, progress: seen.append(dict(ctx.metadata)), "tool_call_started")
        async with host.session(metadata={"user": "ana", "thread": 7}) as session:
            assert await session.call("shout", "x") == "X"
        await host.call("shout", "y")
    assert seen == [{"user": "ana", "thread": 7}, {}]
