"""Path conditions: ``when.PARAM = { path = "/etc/**", base = "/srv/data" }``.

A plain glob compares text, so ``../../etc/passwd`` slips past ``"/etc/**"``. A path
condition joins the argument to its base, normalises it lexically and refuses NUL before
matching; what cannot be read as a path counts against the caller (README, "Policy file").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from host import PolicyFileError, decide, load_policy

DENY = """\
version = 1
[defaults]
agent = "allow"

[[rules]]
id = "no-etc"
tools = ["read_file"]
when.path = {condition}
decision = "deny"
"""

ALLOW = """\
version = 1
[defaults]
agent = "deny"

[[rules]]
id = "only-data"
tools = ["read_file"]
when.path = {condition}
decision = "allow"
"""


def _decide(tmp_path: Path, template: str, condition: str, value: Any) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(template.format(condition=condition), encoding="utf-8")
    return decide(load_policy([path]), "read_file", {"path": value}, "agent").decision


WITH_BASE = '{ path = "/etc/**", base = "/srv/data" }'


@pytest.mark.parametrize(
    ("value", "decision"),
    [
        ("../../../../etc/passwd", "deny"),  # joined and normalised: /etc/passwd
        ("/etc/passwd", "deny"),  # an absolute argument replaces the base, as os.path.join
        ("//etc///passwd", "deny"),
        ("/srv/data/../../etc/./shadow", "deny"),
        ("/etc", "deny"),  # `/etc/**` also means the folder itself
        ("notes/today.txt", "allow"),  # /srv/data/notes/today.txt
        ("../data/x/../y", "allow"),  # /srv/data/y
        ("/etcetera/x", "allow"),
        ("notes\x00/../../../../etc/passwd", "deny"),  # NUL: unclear, against the caller
        (b"/etc/passwd", "deny"),  # bytes: unclear
        (["/etc", "passwd"], "deny"),  # a container: unclear
        (None, "allow"),  # not a path at all: the condition does not hold
        (3, "allow"),
    ],
)
def test_a_deny_rule_reads_the_argument_as_a_path(
    tmp_path: Path, value: Any, decision: str
) -> None:
    assert _decide(tmp_path, DENY, WITH_BASE, value) == decision


def test_a_plain_glob_compares_text(tmp_path: Path) -> None:
    # The documented difference, kept: only a path condition normalises.
    assert _decide(tmp_path, DENY, '"/etc/**"', "../../../../etc/passwd") == "allow"
    assert _decide(tmp_path, DENY, '"/etc/**"', "/etc/passwd") == "deny"


@pytest.mark.parametrize(
    ("value", "decision"),
    [
        ("notes/today.txt", "allow"),
        ("/srv/data/notes/today.txt", "allow"),
        ("./notes//today.txt", "allow"),
        ("../secrets/key", "deny"),  # /srv/secrets/key: outside
        ("notes/../../secrets/key", "deny"),
        ("/etc/passwd", "deny"),
        ("notes/\x00", "deny"),  # NUL: unclear, never more permitted
        (b"notes/today.txt", "deny"),
    ],
)
def test_an_allow_rule_never_allows_what_it_cannot_read(
    tmp_path: Path, value: Any, decision: str
) -> None:
    condition = '{ path = "**", base = "/srv/data" }'  # a relative glob: under the base
    assert _decide(tmp_path, ALLOW, condition, value) == decision


@pytest.mark.parametrize(
    ("value", "deny", "allow"),
    [
        ("/etc/passwd", "deny", "deny"),
        ("secrets/../../etc/passwd", "deny", "deny"),  # relative, no base: unclear
        ("notes.txt", "deny", "deny"),
        ("/srv/data/notes.txt", "allow", "allow"),
    ],
)
def test_without_a_base_a_relative_path_is_unclear(
    tmp_path: Path, value: str, deny: str, allow: str
) -> None:
    assert _decide(tmp_path, DENY, '{ path = "/etc/**" }', value) == deny
    assert _decide(tmp_path, ALLOW, '{ path = "/srv/data/**" }', value) == allow


@pytest.mark.parametrize(
    ("condition", "says"),
    [
        ('{ path = "/etc/**", base = "data" }', "base takes an absolute folder"),
        ('{ path = "" }', "path takes a glob of paths"),
        ('{ path = "/etc/**", regex = "x" }', "a path condition takes path and base only"),
        ('{ base = "/srv" }', "path takes a glob of paths"),
        ('{ path = "/etc/\\u0000" }', "path must not contain a NUL character"),
    ],
)
def test_a_malformed_path_condition_is_refused(tmp_path: Path, condition: str, says: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(DENY.format(condition=condition), encoding="utf-8")
    with pytest.raises(PolicyFileError) as caught:
        load_policy([path])
    assert "rules.0.when.path" in str(caught.value) and says in str(caught.value)
