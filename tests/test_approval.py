"""Escalation to a callback approver: approve, deny, timeout, hang, raise, remember.

The tools of the "desk" project append what they received to a marker file: that file
is the canary. A call that was not approved must leave it untouched, and a call that
ran must have received exactly what the approver was shown.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from hashlib import sha256
from pathlib import Path
from typing import Any

import anyio
import pytest

from capsule.protocol import encode
from host import (
    Approval,
    ApprovalRequest,
    DenyAll,
    Grant,
    Host,
    LimitExceeded,
    NotApproved,
    PolicyDenied,
    SQLiteStore,
)
from host.policy._approval import Ticket
from host.testing import in_process

pytestmark = pytest.mark.anyio

DESK_POLICY = """\
version = 1

[defaults]
agent = "deny"
app = "allow"
escalation_timeout = "{timeout}"

[[rules]]
id = "ask"
tools = ["launch", "record"]
decision = "escalate"
reason = "Launching is irreversible."

[limits]
max_pending_approvals = {pending}

[env]
pass = ["DESK_MARKER"]
"""


DESK_TOOLS = {
    "desk": '''
        import json
        import os
        from pathlib import Path


        def _note(entry: object) -> None:
            with Path(os.environ["DESK_MARKER"]).open("a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\\n")


        def launch(target: str = "moon") -> str:
            """Irreversible: appends the target to the marker file."""
            _note({"launch": target})
            return f"launched {target}"


        def record(items: list[int], note: dict[str, str], text: str = "") -> dict:
            """Appends exactly what it received to the marker file."""
            _note({"record": {"items": items, "note": note, "text": text}})
            return {"items": items, "note": note, "text": text}


        def read() -> str:
            return "read"
        '''
}
"""The desk's tools; their source never changes, so their declarations are cached. The
marker path comes from ``DESK_MARKER`` (passed to subprocess capsules by the policy)."""


CAPSULES = [
    pytest.param(in_process(), id="twin"),
    pytest.param(None, id="subprocess", marks=pytest.mark.subprocess),
]
"""The in-process twin, and a real capsule process: a refused call must run nothing in
either (the twin alone would not show a capsule that ran something on its own)."""


class Desk:
    """A project whose tools write to a marker file, and helpers to inspect it."""

    def __init__(self, root: Path, marker: Path) -> None:
        self.root = root
        self.marker = marker

    def ran(self) -> list[Any]:
        if not self.marker.exists():
            return []
        return [json.loads(line) for line in self.marker.read_text().splitlines()]

    def write_policy(self, text: str) -> None:
        (self.root / "policy.toml").write_text(textwrap.dedent(text), encoding="utf-8")

    @asynccontextmanager
    async def open(self, approver: Any = None, **kwargs: Any) -> AsyncIterator[Host]:
        kwargs.setdefault("capsule", in_process())
        async with Host.open(self.root, approver=approver, **kwargs) as host:
            yield host


@pytest.fixture
def desk(
    make_project: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Desk]:
    # In a folder of its own: a subprocess capsule may not create files directly in the
    # folders above the project (Landlock; README, "The capsule").
    marker = tmp_path / "out" / "marker.jsonl"
    marker.parent.mkdir()
    monkeypatch.setenv("DESK_MARKER", str(marker))

    def make(timeout: str = "5s", pending: int = 20, policy: str | None = None) -> Desk:
        text = DESK_POLICY.format(timeout=timeout, pending=pending) if policy is None else policy
        return Desk(make_project(DESK_TOOLS, policy=text), marker)

    return make


class Recorder:
    """An approver callback that records requests and answers from a script."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.requests: list[ApprovalRequest] = []

    async def __call__(self, request: ApprovalRequest) -> Any:
        self.requests.append(request)
        answer = self.answers.pop(0) if self.answers else False
        return answer(request) if callable(answer) else answer


# -- answers -------------------------------------------------------------------------------


async def test_approve_runs_the_call_once(desk: Callable[..., Desk]) -> None:
    d = desk()
    approver = Recorder(True)
    async with d.open(approver) as host:
        assert await host.call("launch", "mars") == "launched mars"
        (request,) = approver.requests
        assert request.tool == "launch"
        assert request.caller == "app"
        assert request.session_id == host.default_session.id
        assert request.call_id.startswith(host.host_id + ".")
        assert dict(request.arguments) == {"target": "mars"}
        assert request.rendered == 'target = "mars"'
        assert request.rule == "ask"
        assert request.reason == "Launching is irreversible."
        assert request.warnings == ()
        assert request.timeout == 5.0
        assert request.size > 0 and len(request.args_sha256) == 64
        (record,) = await host.store.tail(1)
        assert (record.outcome, record.decision, record.approval) == ("ok", "escalate", "once")
    assert d.ran() == [{"launch": "mars"}]


@pytest.mark.parametrize("capsule", CAPSULES)
async def test_deny_does_not_run(desk: Callable[..., Desk], capsule: Any) -> None:
    d = desk()
    async with d.open(Recorder(False), capsule=capsule) as host:
        with pytest.raises(NotApproved) as info:
            await host.call("launch", "mars")
        assert info.value.reason == "denied"
        assert info.value.rule == "ask"
        assert "the call did not run" in str(info.value)
        (record,) = await host.store.tail(1)
        assert (record.outcome, record.approval, record.error_kind) == (
            "denied",
            "denied",
            "not_approved",
        )
    assert d.ran() == []


async def test_a_note_from_the_approver_reaches_the_caller(desk: Callable[..., Desk]) -> None:
    d = desk()
    async with d.open(Recorder(Approval(False, note="not on a Friday"))) as host:
        with pytest.raises(NotApproved, match="not on a Friday"):
            await host.call("launch")
    assert d.ran() == []


@pytest.mark.parametrize("capsule", CAPSULES)
async def test_no_answer_in_time_is_a_timeout(desk: Callable[..., Desk], capsule: Any) -> None:
    d = desk(timeout="0.3s")

    async def slow(request: ApprovalRequest) -> bool:
        await anyio.sleep_forever()  # never answers (would approve, far too late)
        return True

    async with d.open(slow, capsule=capsule) as host:
        with pytest.raises(NotApproved) as info:
            await host.call("launch")
        assert info.value.reason == "timeout"
        assert "did not run" in str(info.value)
        (record,) = await host.store.tail(1)
        assert (record.outcome, record.approval) == ("denied", "timeout")
    assert d.ran() == []


async def test_a_hanging_approver_denies(desk: Callable[..., Desk]) -> None:
    d = desk(timeout="0.3s")

    async def hang(request: ApprovalRequest) -> bool:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with d.open(hang) as host:
        with pytest.raises(NotApproved) as info:
            await host.call("launch")
        assert info.value.reason == "timeout"
        assert await host.store.pending() == []  # the open request was withdrawn
    assert d.ran() == []


@pytest.mark.parametrize("capsule", CAPSULES)
async def test_a_raising_approver_denies(desk: Callable[..., Desk], capsule: Any) -> None:
    d = desk()

    async def broken(request: ApprovalRequest) -> bool:
        raise RuntimeError("the approval service is down")

    async with d.open(broken, capsule=capsule) as host:
        with pytest.raises(NotApproved) as info:
            await host.call("launch")
        assert info.value.reason == "approver_failed"
        assert info.value.detail == "the approver raised RuntimeError"
    assert d.ran() == []


@pytest.mark.parametrize("answer", ["yes", 1, None, {"allow": True}], ids=repr)
async def test_anything_but_an_approval_denies(desk: Callable[..., Desk], answer: Any) -> None:
    d = desk()
    async with d.open(Recorder(answer)) as host:
        with pytest.raises(NotApproved) as info:
            await host.call("launch")
        assert info.value.reason == "approver_failed"
    assert d.ran() == []


async def test_an_approver_object_with_decide(desk: Callable[..., Desk]) -> None:
    d = desk()

    class Desk2:
        def __init__(self) -> None:
            self.seen: list[str] = []

        async def decide(self, request: ApprovalRequest) -> Approval:
            self.seen.append(request.tool)
            return request.allow()

    approver = Desk2()
    async with d.open(approver) as host:
        assert await host.call("launch", "venus") == "launched venus"
    assert approver.seen == ["launch"]


@pytest.mark.parametrize("capsule", CAPSULES)
async def test_the_headless_default_denies_all(desk: Callable[..., Desk], capsule: Any) -> None:
    d = desk()
    async with d.open(capsule=capsule) as host:  # stdin is not a terminal under pytest
        assert isinstance(host.mediator.escalations.approver, DenyAll)
        with pytest.raises(NotApproved) as info:
            await host.call("launch")
        assert "no approver is configured" in str(info.value)
        assert await host.call("read") == "read"  # allowed calls are unaffected
    assert d.ran() == []


@pytest.mark.parametrize("capsule", CAPSULES)
async def test_a_denied_rule_never_reaches_the_approver(
    desk: Callable[..., Desk], capsule: Any
) -> None:
    d = desk(
        policy='version = 1\n[[rules]]\ntools = ["**"]\ndecision = "deny"\n'
        '[env]\npass = ["DESK_MARKER"]\n'  # a capsule that ran the tool would write it
    )
    approver = Recorder(True)
    async with d.open(approver, capsule=capsule) as host:
        with pytest.raises(PolicyDenied):
            await host.call("launch")
    assert approver.requests == [] and d.ran() == []


# -- remembering ---------------------------------------------------------------------------


async def test_allow_once_asks_again(desk: Callable[..., Desk]) -> None:
    d = desk()
    approver = Recorder(True, True)
    async with d.open(approver) as host:
        await host.call("launch", "a")
        await host.call("launch", "a")
    assert len(approver.requests) == 2
    assert d.ran() == [{"launch": "a"}] * 2


async def test_remember_for_the_session(desk: Callable[..., Desk]) -> None:
    d = desk()
    approver = Recorder(Approval(True, "session"), True, True)
    async with d.open(approver) as host:
        await host.call("launch", "a")
        await host.call("launch", "a")  # remembered
        assert len(approver.requests) == 1
        await host.call("launch", "b")  # other arguments: asked
        assert len(approver.requests) == 2
        async with host.session() as other:
            await other.call("launch", "a")  # another session: asked
        assert len(approver.requests) == 3
        records = await host.store.tail(4)
        assert [r.approval for r in records] == ["session", "session", "once", "once"]
    assert len(d.ran()) == 4


async def test_remember_a_denial_for_the_session(desk: Callable[..., Desk]) -> None:
    d = desk()
    approver = Recorder(Approval(False, "session"))
    async with d.open(approver) as host:
        for _ in range(2):
            with pytest.raises(NotApproved, match="remembered"):
                await host.call("launch", "a")
    assert len(approver.requests) == 1 and d.ran() == []


@pytest.mark.parametrize("capsule", CAPSULES)
async def test_always_survives_a_restart(desk: Callable[..., Desk], capsule: Any) -> None:
    d = desk()
    async with d.open(Recorder(Approval(True, "always")), capsule=capsule) as host:
        await host.call("launch", "a")
        (grant,) = await host.store.grants()
        assert (grant.tool, grant.caller, grant.allow, grant.scope) == (
            "launch",
            "app",
            True,
            "call",
        )
        assert grant.summary == 'target="a"'
    approver = Recorder(True)
    async with d.open(approver, capsule=capsule) as host:  # a new host on the same project
        await host.call("launch", "a")
        assert approver.requests == []
        (record,) = await host.store.tail(1)
        assert record.approval == f"grant {grant.id}"
        await host.call("launch", "b")  # the grant covers the exact arguments only
        assert len(approver.requests) == 1
        assert await host.store.revoke_grant(grant.id or 0)
        with pytest.raises(NotApproved):
            await host.call("launch", "a")  # revoked: asked again (and denied)
        assert len(approver.requests) == 2
    assert d.ran() == [{"launch": "a"}, {"launch": "a"}, {"launch": "b"}]


async def test_always_widened_to_the_tool(desk: Callable[..., Desk]) -> None:
    d = desk()
    async with d.open(Recorder(lambda r: r.allow("always", "tool"))) as host:
        await host.call("launch", "a")
        (grant,) = await host.store.grants()
        assert grant.scope == "tool" and grant.args_sha256 is None
    approver = Recorder()
    async with d.open(approver) as host:
        await host.call("launch", "b")
        await host.call("launch", "c")
        with pytest.raises(NotApproved):  # another tool is not covered
            await host.call("record", [1], {})
    assert len(approver.requests) == 1
    assert [e.get("launch") for e in d.ran()] == ["a", "b", "c"]


async def test_a_grant_is_per_caller(desk: Callable[..., Desk]) -> None:
    d = desk(policy=DESK_POLICY.format(timeout="5s", pending=20).replace('agent = "deny"', ""))
    approver = Recorder(Approval(True, "always"), False)
    async with d.open(approver) as host:
        await host.call("launch", "a")
        with pytest.raises(NotApproved):
            await host.default_session.call_as("agent", "launch", ("a",), {})
    assert len(approver.requests) == 2 and approver.requests[1].caller == "agent"


async def test_always_deny_survives_a_restart(desk: Callable[..., Desk]) -> None:
    d = desk()
    async with d.open(Recorder(lambda r: r.deny("always"))) as host:
        with pytest.raises(NotApproved):
            await host.call("launch", "a")
    approver = Recorder(True)
    async with d.open(approver) as host:
        with pytest.raises(NotApproved, match="remembered"):
            await host.call("launch", "a")
        assert await host.call("launch", "b") == "launched b"
    assert len(approver.requests) == 1
    assert d.ran() == [{"launch": "b"}]


async def test_a_remembered_deny_beats_a_remembered_allow(desk: Callable[..., Desk]) -> None:
    d = desk()
    approver = Recorder()
    async with d.open(approver) as host:
        asked = host.policy.current().decide("launch", {"target": "y"}, "app")
        assert asked.rule == "ask" and asked.rule_digest is not None
        await host.store.add_grant(  # the whole tool, under the rule that asks
            Grant("launch", "app", True, None, rule="ask", rule_digest=asked.rule_digest)
        )
        await host.store.add_grant(Grant("launch", "app", False, _sha_of("x")))  # any rule
        with pytest.raises(NotApproved, match="remembered"):
            await host.call("launch", "x")
        assert await host.call("launch", "y") == "launched y"
    assert approver.requests == [] and d.ran() == [{"launch": "y"}]


def _sha_of(target: str) -> str:
    return sha256(encode({"target": target})).hexdigest()


# -- binding: what runs is exactly what was approved, once --------------------------------


@pytest.mark.parametrize("capsule", CAPSULES)
async def test_mutating_arguments_after_the_request_changes_nothing(
    desk: Callable[..., Desk], capsule: Any
) -> None:
    d = desk()
    items = [1, 2, 3]
    note = {"to": "ops"}

    async def tamper(request: ApprovalRequest) -> Approval:
        items.append(666)  # the caller's own objects
        note["to"] = "attacker"
        shown = request.arguments  # the request's copy
        shown["items"].append(999)  # type: ignore[index]
        shown["note"]["to"] = "attacker"  # type: ignore[index]
        return request.allow()

    async with d.open(tamper, capsule=capsule) as host:
        result = await host.call("record", items, note, text="hello")
    expected = {"items": [1, 2, 3], "note": {"to": "ops"}, "text": "hello"}
    assert result == expected
    assert d.ran() == [{"record": expected}]


@pytest.mark.parametrize("capsule", CAPSULES)
async def test_an_approval_replayed_for_another_call_does_nothing(
    desk: Callable[..., Desk], capsule: Any
) -> None:
    d = desk()
    saved: list[Approval] = []

    async def replay(request: ApprovalRequest) -> Approval:
        if not saved:
            saved.append(request.allow())
        return saved[0]

    async with d.open(replay, capsule=capsule) as host:
        assert await host.call("launch", "a") == "launched a"
        with pytest.raises(NotApproved) as info:
            await host.call("launch", "a")  # the same arguments, another call
        assert info.value.reason == "mismatch"
        with pytest.raises(NotApproved):
            await host.call("launch", "b")
    assert d.ran() == [{"launch": "a"}]


def test_a_ticket_is_one_shot_and_bound() -> None:
    encoded = b"\x81\xa1a\x01"
    digest = sha256(encoded).hexdigest()

    def ticket() -> Ticket:
        return Ticket("h.1", "s", "launch", digest, "once")

    for call_id, session, tool, data in [
        ("h.2", "s", "launch", encoded),
        ("h.1", "t", "launch", encoded),
        ("h.1", "s", "record", encoded),
        ("h.1", "s", "launch", b"\x81\xa1a\x02"),
    ]:
        with pytest.raises(NotApproved) as info:
            ticket().redeem(call_id, session, tool, data)
        assert info.value.reason == "mismatch"
    once = ticket()
    once.redeem("h.1", "s", "launch", encoded)
    with pytest.raises(NotApproved):
        once.redeem("h.1", "s", "launch", encoded)


# -- pending approvals: a cap per session, identical requests joined -----------------------


class Gate:
    """An approver that holds every request until released."""

    def __init__(self, answer: Any = True) -> None:
        self.answer = answer
        self.requests: list[ApprovalRequest] = []
        self.release = anyio.Event()

    async def __call__(self, request: ApprovalRequest) -> Any:
        self.requests.append(request)
        await self.release.wait()
        return self.answer(request) if callable(self.answer) else self.answer


async def wait_for(predicate: Callable[[], bool], what: str) -> None:
    """Poll until ``predicate()`` holds (a test helper: nothing to wait on but state)."""
    with anyio.fail_after(10):
        while not predicate():  # noqa: ASYNC110 - polling test state
            await anyio.sleep(0.01)
    assert predicate(), what


async def test_pending_requests_are_capped_per_session(desk: Callable[..., Desk]) -> None:
    d = desk(pending=2)
    gate = Gate()
    results: list[Any] = []
    async with d.open(gate) as host:
        async with anyio.create_task_group() as tg:

            async def launch(target: str) -> None:
                results.append(await host.call("launch", target))

            tg.start_soon(launch, "a")
            tg.start_soon(launch, "b")
            await wait_for(lambda: len(gate.requests) == 2, "two open requests")
            assert len(await host.store.pending()) == 2
            with pytest.raises(LimitExceeded) as info:
                await host.call("launch", "c")
            assert info.value.limit == "max_pending_approvals"
            async with host.session() as other:  # the cap is per session
                other_call = anyio.Event()

                async def elsewhere() -> None:
                    results.append(await other.call("launch", "d"))
                    other_call.set()

                tg.start_soon(elsewhere)
                await wait_for(lambda: len(gate.requests) == 3, "another session's request")
                gate.release.set()
                await other_call.wait()
        (refused,) = [r for r in await host.store.tail(10) if r.error_kind == "limit_exceeded"]
        assert refused.outcome == "denied"
        assert await host.store.pending() == []
    assert sorted(results) == ["launched a", "launched b", "launched d"]
    assert sorted(e["launch"] for e in d.ran()) == ["a", "b", "d"]


async def test_identical_requests_are_asked_once(desk: Callable[..., Desk]) -> None:
    d = desk()
    gate = Gate(lambda r: r.allow("session"))
    async with d.open(gate) as host, anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(host.call, "launch", "same")
        await wait_for(lambda: len(gate.requests) == 1, "one request")
        # The other two joined it: they wait on the open request's answer.
        opened: Any = host.mediator.escalations._open  # pyright: ignore[reportPrivateUsage]
        await wait_for(
            lambda: [e.done.statistics().tasks_waiting for e in opened.values()] == [2],
            "two calls joined to the open request",
        )
        assert host.mediator.escalations.open_requests(host.default_session.id) == 1
        gate.release.set()
    assert len(gate.requests) == 1
    assert d.ran() == [{"launch": "same"}] * 3


async def test_a_joined_request_is_denied_with_the_first(desk: Callable[..., Desk]) -> None:
    d = desk()
    gate = Gate(False)
    outcomes: list[str] = []
    async with d.open(gate) as host:

        async def launch() -> None:
            try:
                await host.call("launch", "same")
            except NotApproved as exc:
                outcomes.append(exc.reason)

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(launch)
            await wait_for(lambda: len(gate.requests) == 1, "one request")
            gate.release.set()
    assert outcomes == ["denied"] * 3 and len(gate.requests) == 1 and d.ran() == []


async def test_allow_once_covers_one_of_the_joined_calls(desk: Callable[..., Desk]) -> None:
    d = desk()
    gate = Gate(True)
    async with d.open(gate) as host, anyio.create_task_group() as tg:
        tg.start_soon(host.call, "launch", "same")
        tg.start_soon(host.call, "launch", "same")
        await wait_for(lambda: len(gate.requests) == 1, "one request")
        gate.release.set()
    assert len(gate.requests) == 2  # the second call was asked about in its turn
    assert d.ran() == [{"launch": "same"}] * 2


async def test_an_escalation_waits_in_place_without_blocking_others(
    desk: Callable[..., Desk],
) -> None:
    d = desk()
    gate = Gate(True)
    async with d.open(gate) as host, anyio.create_task_group() as tg:
        tg.start_soon(host.call, "launch", "later")
        await wait_for(lambda: len(gate.requests) == 1, "the request")
        assert await host.call("read") == "read"
        assert d.ran() == []
        gate.release.set()
    assert d.ran() == [{"launch": "later"}]


@pytest.mark.parametrize("capsule", CAPSULES)
async def test_a_store_that_fails_mid_escalation_fails_closed(
    desk: Callable[..., Desk], capsule: Any
) -> None:
    d = desk()

    class NoPending(SQLiteStore):
        async def add_pending(self, pending: Any) -> None:
            from host.audit import StoreUnavailable

            raise StoreUnavailable("disk full")

    approver = Recorder(True)
    store = NoPending(d.root / ".agent" / "state.db")
    async with d.open(approver, store=store, capsule=capsule) as host:
        with pytest.raises(PolicyDenied) as info:
            await host.call("launch")
        assert info.value.rule == "audit_unavailable"
    assert approver.requests == [] and d.ran() == []
