"""Policy mistakes that silently change nothing, found against the discovered tools.

A policy can be well-formed and still not say what its writer meant. These turn a deny
or escalate rule into nothing, without a word:

* a tool glob that matches no tool (``wipe_note`` for ``wipe_notes``), in a rule or a
  quota; the nearest tool name is suggested;
* ``when.PARAM`` on a parameter that none of the tools a glob matches has (``when.day``
  on ``wipe_notes(older_than)``): the condition never holds for them;
* a regex anchored at one end (``^prod``) under whole-match semantics: it matches the
  value ``prod`` only, not ``production``.

:func:`lint_policy` finds them; the host runs it when it starts and when the policy
reloads (each warning a ``policy_warning`` event, printed by the command line) and
``toolhost policy lint`` lists them (exit status 1 if any). A warning names the file,
the line and what is wrong. :func:`missing_policy` says what is in force when a project
has no policy file at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from host.declare import VAR_KEYWORD, ToolSpec

from ._decide import tool_glob
from ._files import Defaults, PolicyConfig, PolicyFile, Rule, _line_of  # pyright: ignore[reportPrivateUsage]
from ._suggest import nearest

__all__ = ["PolicyWarning", "lint_policy", "missing_policy"]


@dataclass(frozen=True, slots=True)
class PolicyWarning:
    """One policy mistake: where it is written and what is wrong."""

    file: str
    """The policy file, relative to the project."""
    line: int | None
    field: str
    """Where in the file: ``rules.1.tools``, ``rules.0.when.day``, ``quotas.2.tools``."""
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.message}"

    def to_data(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "field": self.field,
            "message": self.message,
            "text": str(self),
        }


def missing_policy(root: Path, defaults: Defaults | None = None) -> str:
    """What a project with no policy file runs on, in one sentence."""
    d = defaults or Defaults()
    decisions = ", ".join(f"{c} {getattr(d, c)}" for c in ("agent", "tool", "script", "app"))
    return (
        f"{root} has no policy.toml or policies/*.toml: the defaults are in force "
        f"(calls by {decisions}; escalations time out after {d.escalation_timeout:g} s; "
        "[limits], [env] and [capsules] at their defaults, so tools see no host variables); "
        "write a policy.toml there to change them"
    )


# -- where in the file ---------------------------------------------------------------------


class _Source:
    """One policy file's text, to find the line of a key inside a rule."""

    def __init__(self, name: str, root: Path | None) -> None:
        path = root / name if root is not None else Path(name)
        try:
            self.text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            self.text = ""  # it changed since it was parsed: lines are best effort

    def line(self, section: str, index: int, key: str, param: str | None = None) -> int | None:
        if not self.text:
            return None
        if param is not None:
            found = self._param_line(section, index, param)
            if found is not None:
                return found
        return _line_of(self.text, (section, index, key))

    def _param_line(self, section: str, index: int, param: str) -> int | None:
        """The line of ``when.PARAM`` in entry ``index`` of ``[[section]]``."""
        lines = self.text.splitlines()
        header = re.compile(rf"^\s*\[\[\s*{re.escape(section)}\s*\]\]")
        starts = [i for i, line in enumerate(lines) if header.match(line)]
        if index >= len(starts):
            return None
        name = rf"(?:{re.escape(param)}|\"{re.escape(param)}\"|'{re.escape(param)}')"
        dotted = re.compile(rf"^\s*when\s*\.\s*{name}\s*[.=]")
        bare = re.compile(rf"^\s*{name}\s*[.=]")
        in_when = False
        for i in range(starts[index] + 1, len(lines)):
            line = lines[i].strip()
            if line.startswith("[["):
                break
            if line.startswith("["):
                in_when = (
                    re.match(rf"^\[\s*{re.escape(section)}\s*\.\s*when\s*\]", line) is not None
                )
                continue
            if dotted.match(lines[i]) or (in_when and bare.match(lines[i])):
                return i + 1
        return None


# -- the checks ----------------------------------------------------------------------------


def _matches(glob: str, tools: Mapping[str, ToolSpec]) -> list[ToolSpec]:
    pattern = tool_glob(glob)
    return [spec for name, spec in tools.items() if pattern.fullmatch(name)]


def _globs(
    kind: str,
    index: int,
    globs: Sequence[str],
    tools: Mapping[str, ToolSpec],
    source: _Source,
    file: str,
) -> list[PolicyWarning]:
    out: list[PolicyWarning] = []
    none = not any(_matches(glob, tools) for glob in globs)
    for glob in globs:
        if _matches(glob, tools):
            continue
        message = f"{glob!r} matches no tool"
        if none:
            message += f", so this {kind[:-1]} never applies"
        match = nearest(glob, tools)
        message += f"; did you mean {match!r}?" if match else f" (the tools: {_list(tools)})"
        line = source.line(kind, index, "tools")
        out.append(PolicyWarning(file, line, f"{kind}.{index}.tools", message))
    return out


def _list(names: Mapping[str, Any] | Sequence[str], most: int = 8) -> str:
    items = sorted(names)
    shown = ", ".join(items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


def _params(
    rule: Rule, index: int, tools: Mapping[str, ToolSpec], source: _Source, file: str
) -> list[PolicyWarning]:
    out: list[PolicyWarning] = []
    for param in rule.when:
        for glob in rule.tools:
            specs = _matches(glob, tools)
            if not specs or any(
                p.name == param or p.kind == VAR_KEYWORD for spec in specs for p in spec.params
            ):
                continue  # no tool (said above), or one that may take the parameter
            names = list(dict.fromkeys(p.name for spec in specs for p in spec.params))
            one = len(specs) == 1
            who = repr(specs[0].name) if one else f"none of the tools {glob!r} matches"
            message = (
                f"{who} {'has' if one else 'have'} no parameter {param!r}, so the condition "
                f"never holds and this {rule.decision} rule never matches "
                f"{'it' if one else 'them'}"
            )
            match = nearest(param, names)
            if match is not None:
                message += f"; did you mean {match!r}?"
            else:
                message += (
                    f" ({'its' if one else 'their'} parameters: {', '.join(names) or 'none'})"
                )
            line = source.line("rules", index, "when", param)
            out.append(PolicyWarning(file, line, f"rules.{index}.when.{param}", message))
    return out


def _escaped(text: str, at: int) -> bool:
    """Whether the character at ``at`` is escaped by an odd run of backslashes."""
    run = 0
    while at - run - 1 >= 0 and text[at - run - 1] == "\\":
        run += 1
    return run % 2 == 1


def _branches(pattern: str) -> list[str]:
    """The top-level alternatives of a regex (``a|b(c|d)`` -> ``a``, ``b(c|d)``)."""
    out: list[str] = []
    depth, start, in_class = 0, 0, False
    for i, ch in enumerate(pattern):
        if _escaped(pattern, i):
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
    out.append(pattern[start:])
    return out


def _unanchored(branch: str) -> tuple[str, str | None]:
    """A branch anchored at one end only, rewritten for whole-match semantics
    (``^prod`` -> ``prod.*``), and which end it was anchored at; else ``(branch, None)``."""
    body, start, end = branch, False, False
    for anchor in ("^", "\\A"):
        if body.startswith(anchor):
            body, start = body[len(anchor) :], True
            break
    for anchor in ("$", "\\Z", "\\z"):
        if body.endswith(anchor) and not _escaped(body, len(body) - len(anchor)):
            body, end = body[: -len(anchor)], True
            break
    if start and not end and not body.endswith((".*", ".+", ".*?", ".+?")):
        return f"{body}.*", "prefix"
    if end and not start and not body.startswith((".*", ".+")):
        return f".*{body}", "suffix"
    return branch, None  # no anchor, both (redundant), or already open at the other end


def anchor_hint(pattern: str) -> str | None:
    """What is wrong with a regex anchored at one end only, under whole-match semantics:
    ``^prod`` matches ``prod`` and nothing longer, where a search would match a prefix."""
    branches = _branches(pattern)
    fixed = [_unanchored(b) for b in branches]
    wrong = [(branch, kind) for branch, (_, kind) in zip(branches, fixed, strict=True) if kind]
    if not wrong:
        return None
    branch, kind = wrong[0]
    fix = "|".join(text for text, _ in fixed)
    which = "it" if len(branches) == 1 else f"the alternative {branch!r}"
    body = branch.removeprefix("^").removeprefix("\\A")
    for anchor in ("$", "\\Z", "\\z"):
        if body.endswith(anchor):
            body = body[: -len(anchor)]
            break
    return (
        f"regex {pattern!r} must match the whole value (the anchors are implied), so {which} "
        f"matches what {body!r} matches and nothing longer; for a {kind} write {fix!r}"
    )


def _regexes(rule: Rule, index: int, source: _Source, file: str) -> list[PolicyWarning]:
    out: list[PolicyWarning] = []
    for param, condition in rule.when.items():
        if not isinstance(condition, dict) or not isinstance(condition.get("regex"), str):
            continue
        hint = anchor_hint(condition["regex"])
        if hint is not None:
            line = source.line("rules", index, "when", param)
            out.append(PolicyWarning(file, line, f"rules.{index}.when.{param}", hint))
    return out


def _lint_file(
    name: str, policy: PolicyFile, tools: Mapping[str, ToolSpec], root: Path | None
) -> list[PolicyWarning]:
    source = _Source(name, root)
    out: list[PolicyWarning] = []
    for index, rule in enumerate(policy.rules):
        out += _globs("rules", index, rule.tools, tools, source, name)
        out += _params(rule, index, tools, source, name)
        out += _regexes(rule, index, source, name)
    for index, quota in enumerate(policy.quotas):
        out += _globs("quotas", index, quota.tools, tools, source, name)
    return out


def lint_policy(
    config: PolicyConfig, tools: Mapping[str, ToolSpec], *, root: Path | None = None
) -> list[PolicyWarning]:
    """Every policy mistake of ``config`` against the discovered ``tools``, in file order.

    Args:
        config: the parsed policy.
        tools: the discovered tools by canonical name.
        root: the project folder the file names are relative to (their lines are read
            from the files again; without it the names are taken as paths).
    """
    return [w for name, policy in config.files for w in _lint_file(name, policy, tools, root)]
