"""D: the policy fails closed and cannot stall the host (issue 12, findings 4 and 5).

A policy edited into anything that cannot be read (nested 5,000 deep, too large, a regex
RE2 cannot take, bytes that are not UTF-8, a parser that raises something unexpected)
refuses the next call and every call after it, audited, with a ``policy_reload_failed``
event, never the old policy; the same files at start are a clean ``PolicyFileError``.
Regexes and globs match in linear time, and loading is linear in the number of rules.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host import Host, PolicyFileError
from host.policy import PolicyConfig, decide, load_policy

from ._bank import Bank, kinds
from ._bank import bank as bank  # the fixture

pytestmark = pytest.mark.anyio

OPEN = """\
version = 1

[defaults]
app = "allow"

[env]
pass = ["BANK_CANARY"]
"""
"""Everything is allowed: the canary fills unless the broken edit refuses the calls."""


def _edits() -> dict[str, bytes]:
    deep = "x = " + "[" * 5000 + "]" * 5000
    tables = "x = " + "{a = " * 5000 + "1" + "}" * 5000
    rule = '[[rules]]\ntools = ["transfer"]\ndecision = "deny"\n'
    backref = OPEN + rule + 'when.to = { regex = "(a)\\\\1" }\n'
    huge = OPEN + "# " + "x" * (9 * 1024 * 1024) + "\n"
    return {
        "nested arrays": deep.encode(),
        "nested tables": tables.encode(),
        "a regex RE2 refuses": backref.encode(),
        "too large": huge.encode(),
        "not UTF-8": OPEN.encode() + b"# \xff\xfe\n",
    }


EDITS = _edits()


async def _check_refused(bank: Bank, host: Host, calls: int) -> list[Any]:
    failed: list[Any] = []
    host.on("policy_reload_failed", failed.append)
    for _ in range(calls):
        with pytest.raises(PolicyFileError):
            await host.call("transfer", "mallory")
    records = await host.store.tail(calls)
    assert [(r.outcome, r.error_kind) for r in records] == [("denied", "policy_file_error")] * calls
    return failed


@pytest.mark.parametrize("edit", list(EDITS))
async def test_a_broken_edit_refuses_every_call_until_fixed(
    bank: Callable[..., Bank], edit: str
) -> None:
    b = bank(policy=OPEN)
    async with b.open() as host:
        assert await host.call("transfer", "alice") == "sent 1 to alice"
        (b.root / "policy.toml").write_bytes(EDITS[edit])
        failed = await _check_refused(b, host, 3)  # never the old, open policy
        assert len(failed) == 1  # said once
        b.write_policy(OPEN)
        assert await host.call("transfer", "bob") == "sent 1 to bob"
    assert [r["transfer"] for r in b.ran()] == ["alice", "bob"]


async def test_whatever_the_loader_raises_fails_closed(
    bank: Callable[..., Bank], monkeypatch: pytest.MonkeyPatch
) -> None:
    from host.policy import _decide

    def broken(*args: Any, **kwargs: Any) -> PolicyConfig:
        raise RuntimeError("something nobody planned for")

    b = bank(policy=OPEN)
    async with b.open() as host:
        assert await host.call("transfer", "alice") == "sent 1 to alice"
        monkeypatch.setattr(_decide, "load_policy", broken)
        b.write_policy(OPEN + "\n# touched\n")
        failed = await _check_refused(b, host, 2)
    assert "RuntimeError" in str(failed[0].data["error"])
    assert [r["transfer"] for r in b.ran()] == ["alice"]


@pytest.mark.subprocess
async def test_a_broken_edit_refuses_calls_to_a_real_capsule(bank: Callable[..., Bank]) -> None:
    b = bank(policy=OPEN)
    async with b.open(capsule=None) as host:
        assert await host.call("transfer", "alice") == "sent 1 to alice"
        (b.root / "policy.toml").write_bytes(EDITS["nested arrays"])
        await _check_refused(b, host, 2)
        assert kinds(host, "policy_reload_failed")
    assert [r["transfer"] for r in b.ran()] == ["alice"]


@pytest.mark.parametrize("edit", ["nested arrays", "nested tables", "too large"])
async def test_at_start_the_same_files_are_a_clean_error(
    bank: Callable[..., Bank], edit: str
) -> None:
    b = bank(policy=OPEN)
    (b.root / "policy.toml").write_bytes(EDITS[edit])
    with pytest.raises(PolicyFileError) as info:
        async with b.open():
            pass
    assert "policy.toml" in str(info.value)
    assert b.ran() == []


def test_the_command_line_says_what_is_wrong_without_a_traceback(
    bank: Callable[..., Bank],
) -> None:
    b = bank(policy=OPEN)
    (b.root / "policy.toml").write_bytes(EDITS["nested arrays"])
    done = subprocess.run(
        [
            *(sys.executable, "-c", "from host.cli import main; main()"),
            *("policy", "check", "transfer", "x", "--project", str(b.root)),
        ],
        cwd=Path(__file__).resolve().parents[2],  # this checkout's host
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr
    assert "nested more than" in done.stderr and "policy.toml:1" in done.stderr


# -- regexes and globs in linear time ---------------------------------------------------------


def _policy(tmp_path: Path, body: str) -> PolicyConfig:
    path = tmp_path / "policy.toml"
    path.write_text('version = 1\n[defaults]\napp = "allow"\n' + textwrap.dedent(body))
    return load_policy([path], root=tmp_path)


@pytest.mark.parametrize(
    "pattern",
    ["(a|aa)+", "(a+)+b", "(x+x+)+y", "([a-z]+)*[0-9]"],
    ids=["a|aa", "nested plus", "x+x+", "class star"],
)
def test_catastrophic_patterns_match_in_linear_time(tmp_path: Path, pattern: str) -> None:
    config = _policy(
        tmp_path,
        f"""
        [[rules]]
        id = "catastrophe"
        tools = ["transfer"]
        decision = "deny"
        when.to = {{ regex = "{pattern}" }}
        """,
    )
    # With a backtracking engine each of these takes longer than the age of the universe.
    for text in ("a" * 37 + "b", "a" * 60_000 + "!", "x" * 50_000, "ab" * 30_000):
        decision = decide(config, "transfer", {"to": text}, "app")
        assert decision.decision in ("allow", "deny")


def test_many_star_globs_match_in_linear_time(tmp_path: Path) -> None:
    config = _policy(
        tmp_path,
        """
        [[rules]]
        id = "stars"
        tools = ["transfer"]
        decision = "deny"
        when.to = "*a*a*a*a*a*a*a*a*a*a*b"
        """,
    )
    assert decide(config, "transfer", {"to": "a" * 60_000}, "app").decision == "allow"
    assert decide(config, "transfer", {"to": "a" * 20 + "b"}, "app").decision == "deny"


@pytest.mark.parametrize(
    "pattern",
    ["(a)\\\\1", "(?=a)b", "(?<!a)b", "a*+", "(?>a)", "(?(1)a|b)", "a\\\\Z", "a{1001}"],
    ids=[
        "backreference",
        "lookahead",
        "lookbehind",
        "possessive",
        "atomic",
        "conditional",
        "\\Z",
        "huge repeat",
    ],
)
def test_a_pattern_re2_cannot_take_names_file_and_line(tmp_path: Path, pattern: str) -> None:
    with pytest.raises(PolicyFileError) as info:
        _policy(
            tmp_path,
            f"""
            [[rules]]
            tools = ["transfer"]
            decision = "deny"
            when.to = {{ regex = "{pattern}" }}
            """,
        )
    assert info.value.line == 8 and info.value.file.endswith("policy.toml")
    assert "RE2" in str(info.value)


def test_text_too_long_to_match_is_undecidable_never_permissive(tmp_path: Path) -> None:
    config = _policy(
        tmp_path,
        """
        [[rules]]
        id = "allow-small"
        tools = ["transfer"]
        decision = "allow"
        when.to = { regex = "[a-z]+" }

        [[rules]]
        id = "deny-evil"
        tools = ["balance"]
        decision = "deny"
        when.to = { regex = "evil" }
        """,
    )
    defaults = config.defaults.model_copy(update={"app": "escalate"})
    config = config.model_copy(update={"defaults": defaults})
    long = "a" * (65 * 1024)
    assert decide(config, "transfer", {"to": "abc"}, "app").decision == "allow"
    assert decide(config, "transfer", {"to": long}, "app").decision == "escalate"  # not allowed
    assert decide(config, "balance", {"to": long}, "app").decision == "deny"  # counted as met


# -- loading is linear in the number of rules ---------------------------------------------------


def _calls_to_load(tmp_path: Path, rules: int) -> int:
    """How many Python and C function calls loading ``rules`` rules without ids takes
    (a count, not a time: the same on a busy machine as on an idle one)."""
    path = tmp_path / f"policy-{rules}.toml"
    path.write_text(
        "version = 1\n"
        + "".join(
            f'[[rules]]\ntools = ["t{i}.*"]\ndecision = "allow"\nwhen.x = "v{i}"\n\n'
            for i in range(rules)
        )
    )
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        config = load_policy([path], root=tmp_path)
    finally:
        sys.setprofile(None)
    assert len(config.files[0][1].rules) == rules
    assert config.files[0][1].rules[-1].name == f"policy-{rules}.toml:{5 * rules - 3}"
    return count


@pytest.mark.slow
def test_loading_twenty_thousand_rules_is_linear(tmp_path: Path) -> None:
    small = _calls_to_load(tmp_path, 2_000)
    large = _calls_to_load(tmp_path, 20_000)
    # Ten times the rules: about ten times the work (a quadratic step makes it a hundred).
    assert large < 15 * small, (small, large)
