"""Policy enforced by a running host: bad input, callers, quotas and live reload.

Each refusal is a typed error, is audited, and runs nothing: the desk's marker file (see
``test_approval``) is the canary.
"""

from __future__ import annotations

import os
import textwrap
import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from host import (
    Event,
    InvalidArguments,
    LimitExceeded,
    NotApproved,
    PolicyDenied,
    PolicyFileError,
    UnknownTool,
)
from host.policy import PolicySource

from .test_approval import CAPSULES, DESK_POLICY, Desk, Gate, Recorder, wait_for
from .test_approval import desk as desk  # the fixture

pytestmark = pytest.mark.anyio

CALLERS = ("agent", "script", "app", "tool")


def policy(body: str, **defaults: str) -> str:
    head = "version = 1\n[defaults]\n" + "".join(f'{k} = "{v}"\n' for k, v in defaults.items())
    return head + textwrap.dedent(body) + '\n[env]\npass = ["DESK_MARKER"]\n'


# -- a policy that denies everything -------------------------------------------------------


@pytest.mark.parametrize("capsule", CAPSULES)
async def test_a_deny_everything_policy(desk: Callable[..., Desk], capsule: Any) -> None:
    d = desk(policy=policy('[[rules]]\nid = "nothing"\ntools = ["**"]\ndecision = "deny"\n'))
    approver = Recorder(True)
    async with d.open(approver, capsule=capsule) as host:
        for caller in CALLERS:
            for name in ("launch", "read", "record"):
                args = ([1], {}) if name == "record" else ()
                with pytest.raises(PolicyDenied) as info:
                    await host.default_session.call_as(caller, name, args, {})  # type: ignore[arg-type]
                assert info.value.rule == "nothing"
        records = await host.store.tail(100)
    assert len(records) == 12
    assert {(r.outcome, r.decision, r.rule) for r in records} == {("denied", "deny", "nothing")}
    assert {r.caller for r in records} == set(CALLERS)
    assert approver.requests == [] and d.ran() == []


# -- unknown tool names: exact match only --------------------------------------------------

LOOKALIKES = [
    "launch ",  # trailing space
    " launch",
    "Launch",
    "l\u0430unch",  # Cyrillic a
    "\uff4caunch",  # fullwidth l
    "launch\u200b",  # zero-width space
    "launc",
    "launch.",
    "tools.desk.launch ",
    "",
]


@pytest.mark.parametrize("name", LOOKALIKES, ids=ascii)
async def test_unknown_names_are_never_matched_fuzzily(
    desk: Callable[..., Desk], name: str
) -> None:
    d = desk(policy=policy("", app="allow"))
    approver = Recorder(True)
    async with d.open(approver) as host:
        with pytest.raises(UnknownTool) as info:
            await host.call(name, "mars")
        assert info.value.name == name
        (record,) = await host.store.tail(1)
        assert (record.outcome, record.error_kind, record.decision) == (
            "denied",
            "unknown_tool",
            None,
        )
        assert await host.call("tools.desk.launch", "ok") == "launched ok"  # the real name
    assert d.ran() == [{"launch": "ok"}]


# -- invalid and huge arguments: refused before policy and approval ------------------------


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {"target": "a", "extra": 1}),
        (("a", "b"), {}),
        ((object(),), {}),
        (({1, 2},), {}),
        ((), {"target": 2**70}),
    ],
    ids=["extra keyword", "too many", "object", "set", "huge int"],
)
@pytest.mark.parametrize("capsule", CAPSULES)
async def test_invalid_arguments_come_before_policy(
    desk: Callable[..., Desk], args: tuple[Any, ...], kwargs: dict[str, Any], capsule: Any
) -> None:
    d = desk()  # launch escalates
    approver = Recorder(True)
    decisions: list[Event] = []
    async with d.open(approver, capsule=capsule) as host:
        host.on("policy_decision", decisions.append)
        with pytest.raises(InvalidArguments):
            await host.call("launch", *args, **kwargs)
        (record,) = await host.store.tail(1)
    assert (record.outcome, record.error_kind, record.decision) == (
        "denied",
        "invalid_arguments",
        None,
    )
    assert approver.requests == [] and decisions == [] and d.ran() == []


async def test_huge_arguments_never_reach_the_approver(desk: Callable[..., Desk]) -> None:
    d = desk()
    approver = Recorder(True)
    async with d.open(approver, limits={"max_argument_size": 4096}) as host:
        with pytest.raises(InvalidArguments, match="max_argument_size"):
            await host.call("launch", "x" * 10_000)
        (record,) = await host.store.tail(1)
        assert record.error_kind == "invalid_arguments" and record.args_summary is None
        assert await host.call("launch", "x" * 100) == "launched " + "x" * 100
    assert len(approver.requests) == 1 and len(approver.requests[0].arguments["target"]) == 100


# -- callers are distinct ------------------------------------------------------------------


async def test_each_caller_has_its_own_default(desk: Callable[..., Desk]) -> None:
    d = desk(policy=policy("", agent="deny", script="allow", app="escalate", tool="deny"))
    approver = Recorder(True)
    async with d.open(approver) as host:
        session = host.default_session
        with pytest.raises(PolicyDenied) as info:
            await session.call_as("agent", "read", (), {})
        assert info.value.rule == "defaults.agent"
        with pytest.raises(PolicyDenied):
            await session.call_as("tool", "read", (), {})
        assert await session.call_as("script", "read", (), {}) == "read"
        assert await host.call("read") == "read"  # app: escalated, approved
        assert [r.caller for r in approver.requests] == ["app"]
        # the globals a script sees call as the script, whatever the name
        scope = session.globals_for("script")
        assert await scope["read"]() == "read"
        assert await scope["tools"].desk.launch("x") == "launched x"
        records = await host.store.tail(4)
    assert [r.caller for r in records] == ["script", "app", "script", "script"]


async def test_a_policy_can_trust_a_script_more_than_generated_code(
    desk: Callable[..., Desk],
) -> None:
    d = desk(
        policy=policy(
            """
            [[rules]]
            tools = ["launch"]
            callers = ["script"]
            decision = "allow"

            [[rules]]
            tools = ["launch"]
            callers = ["agent"]
            decision = "escalate"
            """,
            agent="deny",
        )
    )
    approver = Recorder(False)
    async with d.open(approver) as host:
        session = host.default_session
        assert await session.call_as("script", "launch", ("a",), {}) == "launched a"
        with pytest.raises(NotApproved):
            await session.call_as("agent", "launch", ("b",), {})
    assert d.ran() == [{"launch": "a"}]


# -- quotas --------------------------------------------------------------------------------


QUOTA = """
[[quotas]]
tools = ["launch"]
per_session = 2
"""


async def test_a_per_session_budget(desk: Callable[..., Desk]) -> None:
    d = desk(policy=policy(QUOTA, app="allow"))
    async with d.open() as host:
        await host.call("launch", "1")
        await host.call("launch", "2")
        with pytest.raises(LimitExceeded) as info:
            await host.call("launch", "3")
        assert info.value.limit == "per_session"
        assert await host.call("read") == "read"  # other tools are not counted
        async with host.session() as other:  # a new session has its own budget
            await other.call("launch", "4")
        (record,) = [r for r in await host.store.tail(10) if r.error_kind == "limit_exceeded"]
        assert record.outcome == "denied"
    assert [e["launch"] for e in d.ran()] == ["1", "2", "4"]


async def test_a_per_minute_budget_spans_sessions(desk: Callable[..., Desk]) -> None:
    d = desk(policy=policy('[[quotas]]\ntools = ["launch", "rec*"]\nper_minute = 2\n', app="allow"))
    async with d.open() as host:
        await host.call("launch", "1")
        async with host.session() as other:
            await other.call("launch", "2")
            with pytest.raises(LimitExceeded) as info:
                await other.call("launch", "3")
        assert info.value.limit == "per_minute" and "try again in" in str(info.value)
        await host.call("record", [1], {})  # each tool has its own budget
    assert len(d.ran()) == 3


async def test_a_call_that_does_not_run_gives_its_place_back(desk: Callable[..., Desk]) -> None:
    d = desk(
        policy=policy(
            QUOTA.replace("per_session = 2", "per_session = 1")
            + '[[rules]]\ntools = ["launch"]\ndecision = "escalate"\n',
            app="allow",
        )
    )
    approver = Recorder(False, False, True)
    async with d.open(approver) as host:
        for _ in range(2):
            with pytest.raises(NotApproved):
                await host.call("launch", "a")
        assert await host.call("launch", "a") == "launched a"
        with pytest.raises(LimitExceeded):  # refused before anyone is asked
            await host.call("launch", "b")
    assert len(approver.requests) == 3


# -- live reload ---------------------------------------------------------------------------


async def test_editing_the_policy_swaps_it_for_the_next_call(desk: Callable[..., Desk]) -> None:
    d = desk(policy=policy("", app="allow"))
    changes: list[Event] = []
    async with d.open() as host:
        host.on("policy_reloaded", changes.append)
        assert await host.call("launch", "a") == "launched a"
        first = host.policy.policy.version
        d.write_policy(policy('[[rules]]\nid = "closed"\ntools = ["launch"]\ndecision = "deny"\n'))
        with pytest.raises(PolicyDenied) as info:
            await host.call("launch", "b")
        assert info.value.rule == "closed"
        second = host.policy.policy.version
        records = await host.store.tail(2)
    assert first != second
    assert [r.policy_version for r in records] == [first, second]
    assert [e.data["policy_version"] for e in changes] == [second]
    assert d.ran() == [{"launch": "a"}]


async def test_a_call_in_flight_keeps_the_version_it_was_decided_against(
    desk: Callable[..., Desk],
) -> None:
    d = desk()  # launch escalates
    gate = Gate(True)
    async with d.open(gate) as host:
        before = host.policy.policy.version
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.call, "launch", "in-flight")
            await wait_for(lambda: len(gate.requests) == 1, "the escalation")
            d.write_policy(
                DESK_POLICY.format(timeout="5s", pending=20).replace(
                    'decision = "escalate"', 'decision = "deny"'
                )
            )
            with pytest.raises(PolicyDenied):
                await host.call("launch", "after")
            gate.release.set()
        after = host.policy.policy.version
        records = {r.args_summary: r for r in await host.store.tail(2)}
    assert before != after
    flight = records['target="in-flight"']
    assert (flight.outcome, flight.decision, flight.policy_version) == ("ok", "escalate", before)
    assert gate.requests[0].policy_version == before
    late = records['target="after"']
    assert (late.outcome, late.decision, late.policy_version) == ("denied", "deny", after)
    assert d.ran() == [{"launch": "in-flight"}]


@pytest.mark.parametrize("capsule", CAPSULES)
async def test_a_broken_edit_fails_closed_until_fixed(
    desk: Callable[..., Desk], capsule: Any
) -> None:
    d = desk(policy=policy("", app="allow"))
    failures: list[Event] = []
    async with d.open(capsule=capsule) as host:
        host.on("policy_reload_failed", failures.append)
        d.write_policy(policy('[[rules]]\ntools = ["launch"]\ndecision = "perhaps"\n'))
        with pytest.raises(PolicyFileError) as info:
            await host.call("launch", "a")
        assert info.value.line == 5 and info.value.field == "rules.0.decision"
        (record,) = await host.store.tail(1)
        assert (record.outcome, record.error_kind) == ("denied", "policy_file_error")
        d.write_policy(policy("", app="allow"))
        assert await host.call("launch", "b") == "launched b"
    assert len(failures) == 1 and "perhaps" in failures[0].data["error"]
    assert d.ran() == [{"launch": "b"}]


async def test_a_changed_policy_is_parsed_off_the_event_loop(
    desk: Callable[..., Desk], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsing a changed policy (20,000 rules took seconds) never stalls the loop, and a
    call that arrives meanwhile waits for the parse and is decided by the new policy."""
    d = desk(policy=policy("", app="allow"))
    parsing = threading.Event()
    ticked = threading.Event()
    go_on = threading.Event()
    seen_loop_running: list[bool] = []
    parse = PolicySource._parse  # pyright: ignore[reportPrivateUsage]

    def slow_parse(self: PolicySource) -> object:
        parsing.set()
        # The loop's ticker must run while this parse is under way: on the loop it could not.
        seen_loop_running.append(ticked.wait(30))
        go_on.wait(30)
        return parse(self)

    monkeypatch.setattr(PolicySource, "_parse", slow_parse)
    async with d.open() as host, anyio.create_task_group() as tg:
        assert await host.call("launch", "a") == "launched a"

        async def ticker() -> None:
            await wait_for(parsing.is_set, "the parse")
            ticked.set()

        tg.start_soon(ticker)
        d.write_policy(policy('[[rules]]\nid = "closed"\ntools = ["launch"]\ndecision = "deny"\n'))
        outcomes: list[str] = []

        async def call(target: str) -> None:
            try:
                outcomes.append(await host.call("launch", target))
            except PolicyDenied as exc:
                outcomes.append(f"denied by {exc.rule}")

        tg.start_soon(call, "first")
        await wait_for(parsing.is_set, "the parse")
        tg.start_soon(call, "second")  # arrives while the files are parsed
        await anyio.sleep(0.05)
        assert outcomes == []
        go_on.set()
        await wait_for(lambda: len(outcomes) == 2, "both calls")
    assert seen_loop_running == [True]
    assert outcomes == ["denied by closed", "denied by closed"]
    assert d.ran() == [{"launch": "a"}]


# Each reload test calls ``launch``, whose every run the desk's marker file records: a
# call the new policy refuses must not have run (an error alone would not show that).


async def test_a_new_policy_file_is_picked_up(desk: Callable[..., Desk]) -> None:
    d = desk(policy=policy("", app="allow"))
    async with d.open() as host:
        assert await host.call("launch", "before") == "launched before"
        extra = d.root / "policies" / "lockdown.toml"
        extra.parent.mkdir()
        extra.write_text('version = 1\n[[rules]]\ntools = ["launch"]\ndecision = "deny"\n')
        with pytest.raises(PolicyDenied) as info:
            await host.call("launch", "during")
        assert info.value.rule == "policies/lockdown.toml:2"
        extra.unlink()
        assert await host.call("launch", "after") == "launched after"
    assert d.ran() == [{"launch": "before"}, {"launch": "after"}]


_DENY_LAUNCH = policy('[[rules]]\nid = "shut"\ntools = ["launch"]\ndecision = "deny"\n')


async def test_an_edit_by_atomic_rename_is_seen_by_the_next_call(
    desk: Callable[..., Desk],
) -> None:
    d = desk(policy=policy("", app="allow"))
    async with d.open() as host:
        assert await host.call("launch", "before") == "launched before"
        temp = d.root / "policy.toml.new"
        temp.write_text(textwrap.dedent(_DENY_LAUNCH), encoding="utf-8")
        os.replace(temp, d.root / "policy.toml")  # how editors and deploy tools write
        with pytest.raises(PolicyDenied):
            await host.call("launch", "after")
    assert d.ran() == [{"launch": "before"}]


async def test_a_symlinked_policy_follows_its_target(
    desk: Callable[..., Desk], tmp_path_factory: pytest.TempPathFactory
) -> None:
    d = desk(policy=policy("", app="allow"))
    target = tmp_path_factory.mktemp("shared") / "policy.toml"
    target.write_text((d.root / "policy.toml").read_text())
    (d.root / "policy.toml").unlink()
    (d.root / "policy.toml").symlink_to(target)
    async with d.open() as host:
        assert await host.call("launch", "before") == "launched before"
        target.write_text(textwrap.dedent(_DENY_LAUNCH), encoding="utf-8")  # outside the project
        with pytest.raises(PolicyDenied):
            await host.call("launch", "after")
    assert d.ran() == [{"launch": "before"}]


async def test_without_inotify_every_call_checks_the_files(
    desk: Callable[..., Desk], monkeypatch: pytest.MonkeyPatch
) -> None:
    import host.policy._decide

    monkeypatch.setattr(host.policy._decide, "open_watch", lambda paths: None)
    d = desk(policy=policy("", app="allow"))
    async with d.open() as opened:
        assert await opened.call("launch", "before") == "launched before"
        d.write_policy(_DENY_LAUNCH)
        with pytest.raises(PolicyDenied):
            await opened.call("launch", "after")
    assert d.ran() == [{"launch": "before"}]


async def test_a_policy_given_to_open_is_not_reloaded(desk: Callable[..., Desk]) -> None:
    from host import PolicyConfig

    d = desk(policy=policy("", app="allow"))
    async with d.open(policy=PolicyConfig()) as host:
        d.write_policy(policy('[[rules]]\ntools = ["**"]\ndecision = "deny"\n'))
        assert await host.call("launch", "kept") == "launched kept"
    assert d.ran() == [{"launch": "kept"}]


# -- policy events -------------------------------------------------------------------------


async def test_decisions_are_observable(desk: Callable[..., Desk]) -> None:
    d = desk()
    seen: list[Event] = []
    async with d.open(Recorder(False)) as host:
        host.on("*", seen.append)
        await host.call("read")
        with pytest.raises(NotApproved):
            await host.call("launch")
    kinds = [e.kind for e in seen if e.kind.startswith("policy_")]
    assert kinds == ["policy_decision", "policy_decision", "policy_escalation", "policy_denied"]
    decision = next(e for e in seen if e.kind == "policy_decision")
    assert decision.data["decision"] == "allow" and decision.data["rule"] == "defaults.app"
