"""Policy mistakes that silently change nothing are said: at start, on reload, and by
``toolhost policy lint`` (README, "Policy file": "Mistakes that change nothing").

A tool glob matching no tool, ``when.PARAM`` on a parameter the tool lacks, and a regex
anchored at one end under whole-match semantics each turn a rule into nothing. Each is a
warning naming the file, the line and what is wrong, with the nearest name when one is
close. Misspelled keys are errors that name the key.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from host import Event, Host, PolicyFileError, PolicyWarning, lint_policy, load_policy
from host.declare import discover, resolve_project
from host.testing import in_process

from .conftest import AGENT_SRC
from .test_policy_cli import toolhost

TOOLS = {
    "notes": """
        def wipe_notes(older_than: int = 0) -> int:
            return older_than

        def add_note(text: str, *, tags: list[str] | None = None) -> int:
            return 1

        def read_file(path: str) -> str:
            return path

        def anything(**options: object) -> int:
            return len(options)
        """,
}

MISTAKES = """\
version = 1

[[rules]]
id = "no-wipe"
tools = ["wipe_note"]
decision = "deny"

[[rules]]
tools = ["wipe_notes"]
when.olderthan = { gt = 30 }
decision = "escalate"

[[rules]]
tools = ["add_note", "read_*"]
when.day = "monday"
decision = "deny"

[[rules]]
tools = ["read_file"]
decision = "deny"
[rules.when]
path = { regex = "^/etc" }

[[rules]]
tools = ["read_file"]
when.path = { regex = "secret$" }
decision = "escalate"

[[quotas]]
tools = ["add_notes"]
per_session = 3
"""

CLEAN = """\
version = 1

[[rules]]
tools = ["**"]
when.older_than = { gt = 30 }
decision = "deny"

[[rules]]
tools = ["read_file"]
when.path = { regex = "^/etc/.*" }
decision = "deny"

[[rules]]
tools = ["read_file"]
when.path = { regex = "^/etc/.*$|/root/.*" }
decision = "deny"

[[rules]]
tools = ["anything"]
when.colour = "red"
decision = "deny"

[[rules]]
tools = ["read_file"]
when.path = { regex = "^/srv/[^/]+$" }
decision = "allow"
"""


def _lint(make_project: Callable[..., Path], policy: str) -> list[PolicyWarning]:
    root = make_project(TOOLS, policy=policy)
    project = resolve_project(root)
    config = load_policy(project.policy_files, root=project.root)
    return lint_policy(config, discover(project.tools_dir).tools, root=project.root)


def test_each_mistake_is_a_warning_with_file_line_and_the_nearest_name(
    make_project: Callable[..., Path],
) -> None:
    found = [str(w) for w in _lint(make_project, MISTAKES)]
    assert found == [
        "policy.toml:5: rules.0.tools: 'wipe_note' matches no tool, so this rule never "
        "applies; did you mean 'wipe_notes'?",
        "policy.toml:10: rules.1.when.olderthan: 'wipe_notes' has no parameter 'olderthan', "
        "so the condition never holds and this escalate rule never matches it; did you mean "
        "'older_than'?",
        "policy.toml:15: rules.2.when.day: 'add_note' has no parameter 'day', so the "
        "condition never holds and this deny rule never matches it (its parameters: text, "
        "tags)",
        "policy.toml:15: rules.2.when.day: 'read_file' has no parameter 'day', so the "
        "condition never holds and this deny rule never matches it (its parameters: path)",
        "policy.toml:22: rules.3.when.path: regex '^/etc' must match the whole value (the "
        "anchors are implied), so it matches what '/etc' matches and nothing longer; for a "
        "prefix write '/etc.*'",
        "policy.toml:26: rules.4.when.path: regex 'secret$' must match the whole value (the "
        "anchors are implied), so it matches what 'secret' matches and nothing longer; for a "
        "suffix write '.*secret'",
        "policy.toml:30: quotas.0.tools: 'add_notes' matches no tool, so this quota never "
        "applies; did you mean 'add_note'?",
    ]


def test_a_glob_without_a_match_among_others_that_match_is_still_said(
    make_project: Callable[..., Path],
) -> None:
    policy = 'version = 1\n[[rules]]\ntools = ["read_file", "wipe_nots"]\ndecision = "deny"\n'
    (warning,) = _lint(make_project, policy)
    assert warning.to_data() == {
        "file": "policy.toml",
        "line": 3,
        "field": "rules.0.tools",
        "message": "'wipe_nots' matches no tool; did you mean 'wipe_notes'?",
        "text": "policy.toml:3: rules.0.tools: 'wipe_nots' matches no tool; "
        "did you mean 'wipe_notes'?",
    }


def test_what_is_right_is_not_warned_about(make_project: Callable[..., Path]) -> None:
    # `**` with a condition some tool can meet; anchored at both ends or opened with `.*`;
    # a parameter taken through **kwargs.
    assert _lint(make_project, CLEAN) == []


def test_the_example_project_has_no_warnings() -> None:
    project = resolve_project(AGENT_SRC)
    config = load_policy(project.policy_files, root=project.root)
    assert lint_policy(config, discover(project.tools_dir).tools, root=project.root) == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            '[[rules]]\ntools = ["a"]\ndecision = "deny"\n\n[[rules]]\ntools = ["b"]\n'
            'decison = "deny"\n',
            "policy.toml:8: rules.1.decison: unknown key 'decison' in rules.1; "
            "did you mean 'decision'?",
        ),
        (
            '[defaluts]\nagent = "deny"\n',
            "policy.toml:2: defaluts: unknown key 'defaluts'; did you mean 'defaults'?",
        ),
        (
            '[limits]\ncall_timout = "3s"\n',
            "policy.toml:3: limits.call_timout: unknown key 'call_timout' in limits; "
            "did you mean 'call_timeout'?",
        ),
        (
            '[env]\npas = ["HOME"]\n',
            "policy.toml:3: env.pas: unknown key 'pas' in env; did you mean 'pass'?",
        ),
        (
            '[[rules]]\ntools = ["a"]\nwhen.x = { regx = "a+" }\ndecision = "deny"\n',
            "rules.0.when.x: a condition table takes regex, gt, ge, lt, le, in, path, base, "
            "not regx; did you mean 'regex'?",
        ),
    ],
)
def test_a_misspelled_key_is_named_with_the_nearest_key(
    make_project: Callable[..., Path], body: str, says: str
) -> None:
    root = make_project(TOOLS, policy="version = 1\n" + body)
    with pytest.raises(PolicyFileError) as caught:
        load_policy([root / "policy.toml"], root=root)
    assert str(caught.value).endswith(says)


# -- at start and on reload ----------------------------------------------------------------


@pytest.mark.anyio
async def test_warnings_are_events_at_start_and_on_reload(
    make_project: Callable[..., Path],
) -> None:
    root = make_project(TOOLS, policy=MISTAKES)
    async with Host.open(root, capsule=in_process()) as host:
        first = [e for e in host.events.recent if e.kind == "policy_warning"]
        assert len(first) == 7
        assert first[0].data["file"] == "policy.toml" and first[0].data["line"] == 5
        assert "did you mean 'wipe_notes'?" in first[0].data["message"]
        later: list[Event] = []
        host.on("policy_warning", later.append)
        (root / "policy.toml").write_text(
            textwrap.dedent(
                """\
                version = 1
                [[rules]]
                tools = ["wipe_notes"]
                when.days = { gt = 1 }
                decision = "deny"
                """
            ),
            encoding="utf-8",
        )
        assert await host.call("wipe_notes", 5) == 5  # reloads: the rule never matches
        assert [e.data["text"] for e in later] == [
            "policy.toml:4: rules.0.when.days: 'wipe_notes' has no parameter 'days', so the "
            "condition never holds and this deny rule never matches it (its parameters: "
            "older_than)"
        ]


# -- on the command line -------------------------------------------------------------------


def test_policy_lint_lists_the_warnings_and_exits_1(make_project: Callable[..., Path]) -> None:
    root = make_project(TOOLS, policy=MISTAKES)
    done = toolhost("policy", "lint", "--project", str(root))
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 8 and lines[-1] == "7 policy warnings (policy.toml)"
    assert lines[0].startswith("policy.toml:5: rules.0.tools: 'wipe_note' matches no tool")
    done = toolhost("policy", "lint", "--json", "--project", str(root))
    data = json.loads(done.stdout)
    assert done.returncode == 1 and data["ok"] is False and data["files"] == ["policy.toml"]
    assert [w["field"] for w in data["warnings"]][:2] == ["rules.0.tools", "rules.1.when.olderthan"]


def test_policy_lint_on_the_example_project_is_clean() -> None:
    done = toolhost("policy", "lint", "--project", str(AGENT_SRC))
    assert (done.returncode, done.stdout) == (
        0,
        "no policy warnings (policy.toml, policies/agent.toml)\n",
    )


def test_a_call_on_the_command_line_prints_the_warnings_once(
    make_project: Callable[..., Path],
) -> None:
    root = make_project(TOOLS, policy=MISTAKES)
    done = toolhost("call", "wipe_notes", "3", "--project", str(root))
    assert done.returncode == 0 and done.stdout == "3\n"
    warnings = [line for line in done.stderr.splitlines() if "policy warning" in line]
    assert len(warnings) == 7
    assert warnings[0] == (
        "toolhost: policy warning: policy.toml:5: rules.0.tools: 'wipe_note' matches no "
        "tool, so this rule never applies; did you mean 'wipe_notes'?"
    )


def test_the_ci_check_lints_the_example_project() -> None:
    ci = (AGENT_SRC.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "toolhost policy lint --project agent_src" in ci


@pytest.mark.anyio
async def test_the_policy_is_checked_again_when_the_tools_change(
    make_project: Callable[..., Path],
) -> None:
    root = make_project(
        {**TOOLS, "extra": "def export_notes() -> int:\n    return 1\n"},
        policy='version = 1\n[[rules]]\ntools = ["export_notes"]\ndecision = "deny"\n',
    )
    async with Host.open(root, capsule=in_process()) as host:
        assert [e for e in host.events.recent if e.kind == "policy_warning"] == []
        later: list[Event] = []
        host.on("policy_warning", later.append)
        (root / "tools" / "extra.py").unlink()
        assert await host.reload_tools()
        assert [e.data["message"] for e in later] == [
            "'export_notes' matches no tool, so this rule never applies; did you mean 'wipe_notes'?"
        ]
