"""E: a remembered answer answers the rule that asked (issue 13, class 6).

``pay-v1`` ("payments need a person") is answered ``always`` or for the ``session``; the
policy then says ``pay-v3`` ("payments now need the CFO"). A call escalated by the new
rule, or by the same rule changed, asks again; an identical call escalated under the new
rule never joins a request shown with the old rule's reason; a remembered deny and a
policy deny still win over every grant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from host import Approval, ApprovalRequest, NotApproved, PolicyDenied

from ._bank import Bank, wait_for
from ._bank import bank as bank  # the fixture

pytestmark = pytest.mark.anyio


def pay(rule_id: str, reason: str, *, extra: str = "") -> str:
    return f"""\
version = 1

[defaults]
app = "allow"
escalation_timeout = "10s"

[[rules]]
id = "{rule_id}"
tools = ["transfer"]
decision = "escalate"
reason = "{reason}"
{extra}
[env]
pass = ["BANK_CANARY"]
"""


V1 = pay("pay-v1", "payments need a person")
V3 = pay("pay-v3", "payments now need the CFO")


class Person:
    """An approver who answers from a script and remembers what they were shown."""

    def __init__(self, *answers: Approval | bool) -> None:
        self.answers = list(answers)
        self.shown: list[tuple[str, str | None]] = []

    async def __call__(self, request: ApprovalRequest) -> Approval | bool:
        self.shown.append((request.rule, request.reason))
        return self.answers.pop(0) if self.answers else False


def edited(bank: Bank, text: str) -> None:
    bank.write_policy(text)


@pytest.mark.parametrize("remember", ["always", "session"])
@pytest.mark.parametrize(
    "then",
    [
        V3,  # another rule
        pay("pay-v1", "payments now need the CFO"),  # the same id, saying something else
        V1.replace('tools = ["transfer"]', 'tools = ["transfer"]\napprovers = ["app"]'),
        V1 + '\n[[rules]]\nid = "pay-v3"\ntools = ["transfer"]\ndecision = "escalate"\n'
        'reason = "payments now need the CFO"\n',  # the old rule, and a stricter one too
    ],
    ids=["new rule", "changed reason", "changed approvers", "stricter rule added"],
)
async def test_a_remembered_allow_does_not_answer_a_changed_rule(
    bank: Callable[..., Bank], remember: str, then: str
) -> None:
    b = bank(policy=V1)
    person = Person(Approval(True, remember, "tool"))  # then: deny everything
    async with b.open(person) as host:
        assert await host.call("transfer", "alice") == "sent 1 to alice"
        assert await host.call("transfer", "bob") == "sent 1 to bob"  # remembered: no ask
        assert person.shown == [("pay-v1", "payments need a person")]
        edited(b, then)
        with pytest.raises(NotApproved):
            await host.call("transfer", "carol")
        records = await host.store.tail(1)
    assert len(person.shown) == 2  # asked again, shown what the rules say now
    assert [r["transfer"] for r in b.ran()] == ["alice", "bob"]  # carol's never ran
    assert (records[0].outcome, records[0].decision) == ("denied", "escalate")


async def test_an_unchanged_rule_keeps_its_grant(bank: Callable[..., Bank]) -> None:
    b = bank(policy=V1)
    person = Person(Approval(True, "always", "tool"))
    async with b.open(person) as host:
        assert await host.call("transfer", "alice") == "sent 1 to alice"
        # another rule elsewhere in the file changes: pay-v1 still says the same
        edited(b, V1 + '\n[[rules]]\nid = "reads"\ntools = ["balance"]\ndecision = "allow"\n')
        assert await host.call("transfer", "bob") == "sent 1 to bob"
        (grant,) = await host.store.grants()
    assert person.shown == [("pay-v1", "payments need a person")]
    assert (grant.rule, grant.reason) == ("pay-v1", "payments need a person")
    assert grant.rule_digest is not None
    assert [r["transfer"] for r in b.ran()] == ["alice", "bob"]


async def test_the_grant_survives_a_restart_under_the_same_rule_only(
    bank: Callable[..., Bank],
) -> None:
    b = bank(policy=V1)
    async with b.open(Person(Approval(True, "always", "tool"))) as host:
        assert await host.call("transfer", "alice") == "sent 1 to alice"
    async with b.open() as host:  # deny-all: only the grant lets it through
        assert await host.call("transfer", "bob") == "sent 1 to bob"
    edited(b, V3)
    async with b.open() as host:
        with pytest.raises(NotApproved):
            await host.call("transfer", "carol")
    assert [r["transfer"] for r in b.ran()] == ["alice", "bob"]


async def test_an_identical_call_under_a_new_rule_does_not_join_the_old_request(
    bank: Callable[..., Bank],
) -> None:
    b = bank(policy=V1)
    release = anyio.Event()
    shown: list[tuple[str, str | None]] = []

    async def person(request: ApprovalRequest) -> bool:
        shown.append((request.rule, request.reason))
        await release.wait()
        return request.rule == "pay-v1"  # the person approves what they read: pay-v1 only

    results: list[Any] = []
    async with b.open(person) as host:

        async def call() -> None:
            try:
                results.append(await host.call("transfer", "bob"))
            except NotApproved as exc:
                results.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await wait_for(lambda: len(shown) == 1, "the first request")
            edited(b, V3)
            tg.start_soon(call)  # identical tool, caller and arguments
            await wait_for(lambda: len(shown) == 2, "a request of its own")
            release.set()
    assert shown == [
        ("pay-v1", "payments need a person"),
        ("pay-v3", "payments now need the CFO"),
    ]
    assert sorted(map(str, results)) == sorted(
        ["sent 1 to bob", str(next(r for r in results if isinstance(r, NotApproved)))]
    )
    assert b.ran() == [{"transfer": "bob", "amount": 1}]  # once: the pay-v1 approval


async def test_a_remembered_deny_still_wins_under_a_new_rule(bank: Callable[..., Bank]) -> None:
    b = bank(policy=V1)
    person = Person(Approval(False, "always", "tool"), True)
    async with b.open(person) as host:
        with pytest.raises(NotApproved):
            await host.call("transfer", "alice")
        edited(b, V3)
        with pytest.raises(NotApproved, match="remembered"):
            await host.call("transfer", "bob")
    assert len(person.shown) == 1 and b.ran() == []


async def test_a_policy_deny_wins_over_every_grant(bank: Callable[..., Bank]) -> None:
    b = bank(policy=V1)
    person = Person(Approval(True, "always", "tool"), Approval(True, "session", "tool"))
    async with b.open(person) as host:
        assert await host.call("transfer", "alice") == "sent 1 to alice"
        edited(b, V1.replace('decision = "escalate"', 'decision = "deny"'))
        with pytest.raises(PolicyDenied):
            await host.call("transfer", "bob")
    assert [r["transfer"] for r in b.ran()] == ["alice"]
