"""``decide()``: pure policy evaluation, one paired allow/deny test per rule feature.

Policy files are written to a temporary folder and loaded as the host loads them, so
rule names (``policy.toml:LINE``) and parse errors are the real ones.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from host import Decision, Policy, PolicyConfig, PolicyFileError, decide, load_policy
from host._binding import bind
from host.declare._discovery import discover
from host.policy._decide import policy_arguments, tool_glob, value_glob
from host.settings import Caller

Load = Callable[..., Policy]


@pytest.fixture
def load(tmp_path: Path) -> Load:
    """``load(main_toml, **{"policies/x.toml": toml})`` -> the compiled policy."""

    def make(main: str, **extra: str) -> Policy:
        (tmp_path / "policy.toml").write_text(textwrap.dedent(main), encoding="utf-8")
        paths = [tmp_path / "policy.toml"]
        for name, text in sorted(extra.items()):
            path = tmp_path / "policies" / f"{name}.toml"
            path.parent.mkdir(exist_ok=True)
            path.write_text(textwrap.dedent(text), encoding="utf-8")
            paths.append(path)
        return Policy(load_policy(paths, root=tmp_path))

    return make


def verdict(policy: Policy, tool: str, caller: str = "agent", **arguments: Any) -> str:
    return decide(policy, tool, arguments, cast("Caller", caller)).decision


HEAD = """\
version = 1
[defaults]
agent = "deny"
app = "allow"
"""


# -- tool-name globs -----------------------------------------------------------------------


def test_exact_tool_names(load: Load) -> None:
    policy = load(HEAD + '[[rules]]\ntools = ["kanban.list"]\ndecision = "allow"\n')
    assert verdict(policy, "kanban.list") == "allow"
    assert verdict(policy, "kanban.close") == "deny"
    assert verdict(policy, "kanban.list2") == "deny"
    assert verdict(policy, "Kanban.list") == "deny"  # case matters


def test_star_stays_within_one_dotted_part(load: Load) -> None:
    policy = load(HEAD + '[[rules]]\ntools = ["kanban.*"]\ndecision = "allow"\n')
    assert verdict(policy, "kanban.add") == "allow"
    assert verdict(policy, "kanban.board.add") == "deny"
    assert verdict(policy, "kanban") == "deny"


def test_double_star_crosses_dots(load: Load) -> None:
    policy = load(HEAD + '[[rules]]\ntools = ["kanban.**"]\ndecision = "allow"\n')
    assert verdict(policy, "kanban.board.add") == "allow"
    assert verdict(policy, "kanban.add") == "allow"
    assert verdict(policy, "kanbanx.add") == "deny"


def test_question_mark_is_one_character_but_not_a_dot(load: Load) -> None:
    policy = load(HEAD + '[[rules]]\ntools = ["t?.x"]\ndecision = "allow"\n')
    assert verdict(policy, "t1.x") == "allow"
    assert verdict(policy, "t..x") == "deny"
    assert verdict(policy, "t12.x") == "deny"


def test_glob_compilers() -> None:
    assert tool_glob("a.*").fullmatch("a.b")
    assert not tool_glob("a.*").fullmatch("a.b.c")
    assert tool_glob("**").fullmatch("tools.time.format")
    assert value_glob("/tmp/*").fullmatch("/tmp/x")
    assert not value_glob("/tmp/*").fullmatch("/tmp/x/y")
    assert value_glob("/tmp/**").fullmatch("/tmp/x/y")
    assert not value_glob("a+b").fullmatch("aab")  # regex characters are literal


# -- callers -------------------------------------------------------------------------------


def test_callers_limit_a_rule(load: Load) -> None:
    policy = load(
        HEAD
        + """
        [[rules]]
        tools = ["open_pr"]
        callers = ["script"]
        decision = "allow"

        [[rules]]
        tools = ["open_pr"]
        callers = ["app"]
        decision = "deny"
        """
    )
    assert verdict(policy, "open_pr", "script") == "allow"
    assert verdict(policy, "open_pr", "agent") == "deny"  # no rule: the agent default
    assert verdict(policy, "open_pr", "app") == "deny"  # a rule beats the app default


def test_defaults_are_per_caller(load: Load) -> None:
    policy = load(
        """
        version = 1
        [defaults]
        agent = "deny"
        script = "allow"
        app = "escalate"
        tool = "deny"
        """
    )
    assert [verdict(policy, "x", c) for c in ("agent", "script", "app", "tool")] == [
        "deny",
        "allow",
        "escalate",
        "deny",
    ]
    decision = decide(policy, "x", {}, "script")
    assert decision.rule == "defaults.script"
    assert decision.matched == ()


def test_builtin_defaults_without_a_defaults_section(load: Load) -> None:
    policy = load("version = 1\n")
    assert verdict(policy, "x", "agent") == "deny"
    assert verdict(policy, "x", "tool") == "deny"
    assert verdict(policy, "x", "script") == "allow"
    assert verdict(policy, "x", "app") == "allow"


# -- conditions on arguments ---------------------------------------------------------------


def rule(when: str, decision: str = "allow") -> str:
    return HEAD + f'[[rules]]\ntools = ["t"]\ndecision = "{decision}"\n{when}\n'


def test_string_condition_is_a_glob(load: Load) -> None:
    policy = load(rule('when.base = "release/*"'))
    assert verdict(policy, "t", base="release/1.2") == "allow"
    assert verdict(policy, "t", base="release/1.2/evil") == "deny"  # * stops at /
    assert verdict(policy, "t", base="main") == "deny"
    assert verdict(policy, "t", base=None) == "deny"
    assert verdict(policy, "t", base=3) == "deny"


def test_string_condition_exact(load: Load) -> None:
    base = HEAD.replace('agent = "deny"', 'agent = "allow"')
    policy = load(base + '[[rules]]\ntools = ["t"]\ndecision = "deny"\nwhen.base = "main"\n')
    assert verdict(policy, "t", base="main") == "deny"
    assert verdict(policy, "t", base="main ") == "allow"
    assert verdict(policy, "t", base="mainline") == "allow"


def test_regex_must_match_the_whole_value(load: Load) -> None:
    policy = load(rule(r'when.title = { regex = "[a-z ]{1,10}" }'))
    assert verdict(policy, "t", title="write docs") == "allow"
    assert verdict(policy, "t", title="write docs; rm -rf ~") == "deny"
    assert verdict(policy, "t", title="") == "deny"
    assert verdict(policy, "t", title=7) == "deny"


@pytest.mark.parametrize(
    ("op", "limit", "allowed", "denied"),
    [
        ("gt", 10, [11, 10.5], [10, 9, -1]),
        ("ge", 10, [10, 11], [9, 9.99]),
        ("lt", 10, [9, -5], [10, 11]),
        ("le", 10, [10, 0], [10.01, 11]),
    ],
)
def test_comparisons(
    load: Load, op: str, limit: int, allowed: list[Any], denied: list[Any]
) -> None:
    policy = load(rule(f"when.amount = {{ {op} = {limit} }}"))
    for value in allowed:
        assert verdict(policy, "t", amount=value) == "allow", value
    for value in denied:
        assert verdict(policy, "t", amount=value) == "deny", value


def test_a_range_takes_both_bounds(load: Load) -> None:
    policy = load(rule("when.count = { ge = 1, le = 20 }"))
    assert verdict(policy, "t", count=1) == "allow"
    assert verdict(policy, "t", count=20) == "allow"
    assert verdict(policy, "t", count=0) == "deny"
    assert verdict(policy, "t", count=21) == "deny"


def test_in_is_one_of_several_values(load: Load) -> None:
    policy = load(rule('when.sides = { in = [6, 20, "d6"] }'))
    assert verdict(policy, "t", sides=6) == "allow"
    assert verdict(policy, "t", sides=6.0) == "allow"
    assert verdict(policy, "t", sides="d6") == "allow"
    assert verdict(policy, "t", sides=7) == "deny"
    assert verdict(policy, "t", sides="6") == "deny"


def test_scalar_conditions_are_typed_equality(load: Load) -> None:
    policy = load(rule("when.force = true\nwhen.n = 3"))
    assert verdict(policy, "t", force=True, n=3) == "allow"
    assert verdict(policy, "t", force=1, n=3) == "deny"  # 1 is not True
    assert verdict(policy, "t", force=True, n=4) == "deny"


def test_every_condition_must_hold(load: Load) -> None:
    policy = load(rule('when.a = "x"\nwhen.b = { gt = 0 }'))
    assert verdict(policy, "t", a="x", b=1) == "allow"
    assert verdict(policy, "t", a="x", b=0) == "deny"
    assert verdict(policy, "t", a="y", b=1) == "deny"


def test_a_parameter_the_tool_does_not_have_never_matches(load: Load) -> None:
    policy = load(
        HEAD.replace('agent = "deny"', 'agent = "allow"')
        + '[[rules]]\ntools = ["**"]\ndecision = "deny"\nwhen.count = { gt = 100 }\n'
    )
    assert verdict(policy, "add", a=1, b=2) == "allow"
    assert verdict(policy, "roll", count=101) == "deny"
    assert verdict(policy, "roll", count=100) == "allow"


# -- what the host cannot know counts against the caller ----------------------------------


UNCLEAR = [float("nan"), "1000", [1000], b"1000", {"n": 1000}]


@pytest.mark.parametrize("value", UNCLEAR, ids=repr)
def test_an_unclear_value_never_allows(load: Load, value: Any) -> None:
    policy = load(rule("when.amount = { le = 100 }"))
    assert verdict(policy, "t", amount=value) == "deny"


@pytest.mark.parametrize("value", UNCLEAR, ids=repr)
def test_an_unclear_value_still_denies(load: Load, value: Any) -> None:
    base = HEAD.replace('agent = "deny"', 'agent = "allow"')
    policy = load(
        base + '[[rules]]\ntools = ["t"]\ndecision = "deny"\nwhen.amount = { gt = 100 }\n'
    )
    assert verdict(policy, "t", amount=value) == "deny"
    assert verdict(policy, "t", amount=5) == "allow"


def test_a_value_only_the_capsule_knows(load: Load) -> None:
    base = HEAD.replace('agent = "deny"', 'agent = "allow"')
    policy = load(
        base
        + """
        [[rules]]
        tools = ["t"]
        decision = "escalate"
        when.base = "main"

        [[rules]]
        tools = ["u"]
        decision = "allow"
        callers = ["app"]
        when.base = "feature/*"
        """
    )
    unknown = decide(policy, "t", {}, "agent", unknown={"base"})
    assert unknown.decision == "escalate"  # may be "main": a person decides
    assert decide(policy, "t", {}, "agent").decision == "allow"  # no such parameter
    assert decide(policy, "u", {}, "app", unknown={"base"}).rule == "defaults.app"


def test_policy_arguments_from_a_bound_call(make_project: Callable[..., Path]) -> None:
    root = make_project(
        {
            "m": """
            import os

            def f(a: int, *rest: int, base: str = os.sep, **options: object) -> None: ...
            """
        }
    )
    spec = discover(root / "tools").tools["f"]
    arguments, unknown = policy_arguments(spec, bind(spec, [1, 2], {"force": True}))
    assert arguments == {"a": 1, "rest": [2], "options": {"force": True}, "force": True}
    assert unknown == {"base"}
    arguments, unknown = policy_arguments(spec, bind(spec, [1], {"base": "x"}))
    assert arguments["base"] == "x" and unknown == frozenset()


# -- the most restrictive matching rule wins -----------------------------------------------


def test_deny_beats_escalate_beats_allow(load: Load) -> None:
    policy = load(
        HEAD
        + """
        [[rules]]
        tools = ["**"]
        decision = "allow"

        [[rules]]
        id = "ask"
        tools = ["pay"]
        decision = "escalate"
        reason = "money"

        [[rules]]
        id = "stop"
        tools = ["pay"]
        when.amount = { gt = 1000 }
        decision = "deny"
        """
    )
    assert verdict(policy, "read") == "allow"
    small = decide(policy, "pay", {"amount": 5}, "agent")
    assert (small.decision, small.rule, small.reason) == ("escalate", "ask", "money")
    assert small.matched == ("policy.toml:6", "ask")
    big = decide(policy, "pay", {"amount": 5000}, "agent")
    assert (big.decision, big.rule) == ("deny", "stop")
    assert big.matched == ("policy.toml:6", "ask", "stop")


def test_rules_count_across_files(load: Load) -> None:
    policy = load(
        HEAD + '[[rules]]\ntools = ["pay"]\ndecision = "allow"\n',
        extra="""
        version = 1

        [[rules]]
        tools = ["pay"]
        decision = "deny"
        """,
    )
    decision = decide(policy, "pay", {}, "agent")
    assert (decision.decision, decision.rule) == ("deny", "policies/extra.toml:4")


def test_among_equals_the_first_written_names_the_decision(load: Load) -> None:
    policy = load(
        HEAD
        + """
        [[rules]]
        id = "first"
        tools = ["x"]
        decision = "allow"

        [[rules]]
        id = "second"
        tools = ["x"]
        decision = "allow"
        """
    )
    assert decide(policy, "x", {}, "agent").rule == "first"


def test_a_decision_names_its_rule_and_version(load: Load) -> None:
    policy = load(HEAD + '\n\n[[rules]]\ntools = ["x"]\ndecision = "allow"\n')
    decision = decide(policy, "x", {}, "agent")
    assert decision == Decision("allow", "policy.toml:7", None, policy.version, ("policy.toml:7",))
    assert len(policy.version) == 12
    assert decision.to_data()["policy_version"] == policy.version


def test_decide_accepts_a_parsed_config() -> None:
    assert decide(PolicyConfig(), "x", {}, "agent").decision == "deny"
    assert decide(PolicyConfig(), "x", {}, "app").decision == "allow"


def test_decide_is_pure(load: Load) -> None:
    policy = load(rule('when.base = "main"'))
    arguments = {"base": "main"}
    first = decide(policy, "t", arguments, "agent")
    assert [decide(policy, "t", arguments, "agent") for _ in range(3)] == [first] * 3
    assert arguments == {"base": "main"}


def test_the_version_follows_the_contents(load: Load) -> None:
    one = load(HEAD)
    assert load(HEAD).version == one.version
    assert load(HEAD + "\n# a comment\n").version != one.version


# -- malformed files -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "line", "field"),
    [
        ('[[rules]]\ntools = ["x"]\ndecision = "maybe"\n', 7, "rules.0.decision"),
        ('[[rules]]\ntools = ["x y"]\ndecision = "allow"\n', 6, "rules.0.tools"),
        ('[[rules]]\ntools = []\ndecision = "allow"\n', 6, "rules.0.tools"),
        (
            '[[rules]]\ntools = ["x"]\ndecision = "allow"\nwhen.a = ["x", "y"]\n',
            8,
            "rules.0.when.a",
        ),
        (
            '[[rules]]\ntools = ["x"]\ndecision = "allow"\nwhen.a = { regex = "(" }\n',
            8,
            "rules.0.when.a",
        ),
        (
            '[[rules]]\ntools = ["x"]\ndecision = "allow"\nwhen.a = { gt = "1" }\n',
            8,
            "rules.0.when.a",
        ),
        (
            '[[rules]]\ntools = ["x"]\ndecision = "allow"\nwhen.a = { like = "1" }\n',
            8,
            "rules.0.when.a",
        ),
        ('[[rules]]\ntools = ["x"]\ndecision = "allow"\ncallers = ["root"]\n', 8, None),
        ('[[quotas]]\ntools = ["x"]\n', 5, "quotas.0"),
        ('[[quotas]]\ntools = ["x"]\nper_minute = 0\n', 7, "quotas.0.per_minute"),
    ],
)
def test_a_malformed_rule_names_file_line_and_field(
    load: Load, body: str, line: int, field: str | None
) -> None:
    with pytest.raises(PolicyFileError) as info:
        load(HEAD + body)
    error = info.value
    assert error.file.endswith("policy.toml")
    assert error.line == line, error
    if field is not None:
        assert error.field is not None and error.field.startswith(field), error
    assert f"policy.toml:{line}" in str(error)
