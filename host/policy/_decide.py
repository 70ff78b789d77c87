"""Deciding: a call's tool, bound arguments and caller -> allow, deny or escalate.

:func:`decide` is pure: it reads nothing but its arguments and does nothing but return a
:class:`Decision`, so ``toolhost policy check`` and tests call it directly, and the
mediator wraps it and enforces what it says (README, "Policy file").

The rules:

* a rule matches a call when one of its ``tools`` globs matches the canonical tool name
  (``*`` and ``?`` stay within a dotted part, ``**`` crosses parts), its ``callers`` (if
  any) include the caller, and every ``when`` condition holds;
* every matching rule counts, across all files; the most restrictive wins (deny >
  escalate > allow; among equals, the first written); no match -> the caller's default;
* conditions name parameters; a name the tool does not have never holds (values passed
  through ``**kwargs`` count under their own names);
* a condition the host cannot decide (the parameter's default is not a literal, so only
  the capsule knows the value; a NaN; a number written as a string; a container where a
  scalar was expected) counts as met for deny and escalate rules and as not met for
  allow rules: an unclear case never makes a call more permitted.

:class:`PolicySource` is the one part of this module that touches files: it re-reads the
policy files when they change and hands out one compiled :class:`Policy` per call.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, cast

from host._binding import BoundCall
from host.declare import VAR_KEYWORD, VAR_POSITIONAL, ToolSpec
from host.errors import PolicyFileError

from ._files import Caller, Channel, PolicyConfig, Quota, Rule, load_policy
from ._paths import path_truth
from ._watch import Watch, open_watch

__all__ = [
    "Decision",
    "Policy",
    "PolicySource",
    "decide",
    "policy_arguments",
    "tool_glob",
    "value_glob",
]

Verdict = Literal["allow", "deny", "escalate"]
_RANK: Final = {"allow": 0, "escalate": 1, "deny": 2}
_UNKNOWN: Final = None
"""The third truth value: the host cannot tell whether a condition holds."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What policy decided about one call, and which rule decided it."""

    decision: Verdict
    rule: str
    """The deciding rule's ``id``, its ``FILE:LINE``, or ``defaults.CALLER``."""
    reason: str | None = None
    policy_version: str = ""
    """The version of the policy files this decision was made against."""
    matched: tuple[str, ...] = ()
    """Every rule that matched, in the order written."""
    approvers: tuple[Channel, ...] | None = None
    """For ``escalate``: the channels whose answer may allow the call (every matching
    escalate rule's ``approvers``, intersected); ``None``: any channel."""

    def to_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "decision": self.decision,
            "rule": self.rule,
            "reason": self.reason,
            "policy_version": self.policy_version,
            "matched": list(self.matched),
        }
        if self.approvers is not None:
            data["approvers"] = list(self.approvers)
        return data


# -- globs ---------------------------------------------------------------------------------


def _glob(pattern: str, sep: str) -> re.Pattern[str]:
    out: list[str] = []
    i = 0
    not_sep = f"[^{re.escape(sep)}]"
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append(not_sep + "*")
            i += 1
        elif pattern[i] == "?":
            out.append(not_sep)
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)


@functools.lru_cache(maxsize=1024)
def tool_glob(pattern: str) -> re.Pattern[str]:
    """A tool-name glob: ``*`` and ``?`` stop at ``.``, ``**`` does not. Use ``fullmatch``."""
    return _glob(pattern, ".")


@functools.lru_cache(maxsize=1024)
def value_glob(pattern: str) -> re.Pattern[str]:
    """An argument glob: ``*`` and ``?`` stop at ``/``, ``**`` does not. Use ``fullmatch``."""
    return _glob(pattern, "/")


# -- conditions ----------------------------------------------------------------------------

Truth = bool | None
_MISSING: Final = object()
_UNKNOWN_VALUE: Final = object()


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _equal(value: Any, expected: Any) -> Truth:
    """Typed equality: a bool only equals a bool, a number a number, a str a str."""
    if value is None:
        return False
    if type(value) is bool or type(expected) is bool:
        return type(value) is bool and type(expected) is bool and value == expected
    if _is_number(expected):
        if _is_number(value):
            return _UNKNOWN if math.isnan(value) else value == expected
        return False if type(value) is str else _UNKNOWN
    if type(value) is str:
        return value == expected
    return False if _is_number(value) else _UNKNOWN


def _string(value: Any, test: Callable[[str], bool]) -> Truth:
    if type(value) is str:
        return test(value)
    if value is None or type(value) in (bool, int, float):
        return False
    return _UNKNOWN  # bytes or a container: the string may sit inside


_COMPARE: Final[dict[str, Callable[[float, float], bool]]] = {
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
}


def _path_glob(glob: str, path: str) -> bool:
    return value_glob(glob).fullmatch(path) is not None


def _all(truths: Sequence[Truth]) -> Truth:
    if any(t is False for t in truths):
        return False
    return True if all(t is True for t in truths) else _UNKNOWN


def _compare(value: Any, op: Callable[[float, float], bool], bound: float) -> Truth:
    if _is_number(value):
        number: float = value
        return _UNKNOWN if math.isnan(number) else op(number, bound)
    if value is None or type(value) is bool:
        return False
    return _UNKNOWN  # a number written as a string, or a container


def _condition(value: Any, condition: Any) -> Truth:
    if value is _MISSING:
        return False  # the tool has no such parameter
    if value is _UNKNOWN_VALUE:
        return _UNKNOWN
    if isinstance(condition, str):
        glob = value_glob(condition)
        return _string(value, lambda s: glob.fullmatch(s) is not None)
    if not isinstance(condition, dict):
        return _equal(value, condition)
    table = cast("Mapping[str, Any]", condition)
    if "path" in table:
        return path_truth(value, table, _path_glob)
    truths: list[Truth] = []
    if "regex" in table:
        pattern = re.compile(str(table["regex"]))
        truths.append(_string(value, lambda s: pattern.fullmatch(s) is not None))
    truths.extend(
        _compare(value, op, table[name]) for name, op in _COMPARE.items() if name in table
    )
    if "in" in table:
        options: list[Any] = table["in"]
        found = [_equal(value, option) for option in options]
        truths.append(
            True if any(t is True for t in found) else (_UNKNOWN if _UNKNOWN in found else False)
        )
    return _all(truths)


def _rule_matches(
    rule: Rule,
    tool: str,
    arguments: Mapping[str, Any],
    caller: Caller,
    unknown: Collection[str],
) -> bool:
    if rule.callers is not None and caller not in rule.callers:
        return False
    if not any(tool_glob(g).fullmatch(tool) for g in rule.tools):
        return False
    truth = _all(
        [
            _condition(arguments.get(name, _UNKNOWN_VALUE if name in unknown else _MISSING), cond)
            for name, cond in rule.when.items()
        ]
    )
    if truth is None:  # undecidable: only ever the more restrictive reading
        return rule.decision != "allow"
    return truth


# -- the policy ----------------------------------------------------------------------------


class Policy:
    """One version of a project's policy files, compiled for deciding."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self.rules: tuple[Rule, ...] = tuple(rule for _, f in config.files for rule in f.rules)
        self.quotas: tuple[Quota, ...] = tuple(q for _, f in config.files for q in f.quotas)
        self._quotas_by_tool: dict[str, tuple[Quota, ...]] = {}
        self.version = (
            config.version or hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:12]
        )

    def __repr__(self) -> str:
        return f"<Policy {self.version} rules={len(self.rules)} quotas={len(self.quotas)}>"

    @property
    def escalation_timeout(self) -> float:
        return self.config.defaults.escalation_timeout

    def decide(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        caller: Caller,
        *,
        unknown: Collection[str] = (),
    ) -> Decision:
        """The decision for a call of ``tool`` (canonical name) with bound ``arguments``.

        ``unknown`` names parameters the tool has whose value the host cannot know (their
        default is not a literal and the caller did not pass them).
        """
        matched = [r for r in self.rules if _rule_matches(r, tool, arguments, caller, unknown)]
        if not matched:
            default: Verdict = getattr(self.config.defaults, caller)
            return Decision(
                default,
                f"defaults.{caller}",
                f"no rule matches; the default for {caller} calls is {default}",
                self.version,
            )
        winner = max(matched, key=lambda r: _RANK[r.decision])  # max keeps the first of equals
        approvers: tuple[Channel, ...] | None = None
        if winner.decision == "escalate":
            # Every matching escalate rule's restriction holds: the channels all allow.
            for rule in matched:
                if rule.decision == "escalate" and rule.approvers is not None:
                    allowed = rule.approvers
                    approvers = tuple(
                        c for c in (approvers if approvers is not None else allowed) if c in allowed
                    )
        return Decision(
            winner.decision,
            winner.name,
            winner.reason,
            self.version,
            tuple(r.name for r in matched),
            approvers,
        )

    def quotas_for(self, tool: str) -> tuple[Quota, ...]:
        """The ``[[quotas]]`` entries whose globs match ``tool`` (worked out once per tool)."""
        found = self._quotas_by_tool.get(tool)
        if found is None:
            found = tuple(
                q for q in self.quotas if any(tool_glob(g).fullmatch(tool) for g in q.tools)
            )
            if len(self._quotas_by_tool) < 4096:  # bounded: names come from discovery
                self._quotas_by_tool[tool] = found
        return found


def decide(
    policy: Policy | PolicyConfig,
    tool: str,
    arguments: Mapping[str, Any],
    caller: Caller,
    *,
    unknown: Collection[str] = (),
) -> Decision:
    """Decide one call: pure, no I/O. ``arguments`` are bound by parameter name."""
    if isinstance(policy, PolicyConfig):
        policy = Policy(policy)
    return policy.decide(tool, arguments, caller, unknown=unknown)


def policy_arguments(spec: ToolSpec, bound: BoundCall) -> tuple[dict[str, Any], frozenset[str]]:
    """What conditions see of a bound call: the arguments by name (``**kwargs`` entries
    under their own names too), and the parameters whose value only the capsule knows."""
    arguments = dict(bound.arguments)
    unknown: set[str] = set()
    for param in spec.params:
        if param.kind == VAR_KEYWORD:
            extra = bound.arguments.get(param.name)
            if isinstance(extra, dict):
                for key, value in cast("dict[str, Any]", extra).items():
                    arguments.setdefault(key, value)
        elif param.kind != VAR_POSITIONAL and param.name not in bound.arguments:
            unknown.add(param.name)
    return arguments, frozenset(unknown)


# -- live reload ---------------------------------------------------------------------------

_RACY: Final = 2.0
"""Seconds within which a file's mtime cannot tell two edits apart; compare contents then."""


class PolicySource:
    """The policy in force. With files, it is re-read whenever one of them changes.

    Each call asks :meth:`current` once and is decided against the one :class:`Policy` it
    got, so a reload never changes a decision half-way. While a policy file is malformed,
    :meth:`current` raises :class:`PolicyFileError` (calls fail closed) until it is fixed.
    """

    def __init__(
        self,
        config: PolicyConfig,
        *,
        files: Callable[[], list[Path]] | None = None,
        root: Path | None = None,
        on_change: Callable[[Policy | PolicyFileError], None] | None = None,
    ) -> None:
        self._policy = Policy(config)
        self._files = files
        self._root = root
        self._on_change = on_change
        self._error: PolicyFileError | None = None
        self._dirs: tuple[Path, ...] = (root, root / "policies") if root is not None else ()
        """Folders whose listing names the files: re-listed only when they change."""
        self._listed: tuple[tuple[int, int] | None, ...] | None = None
        self._paths: list[Path] = []
        self._watch: Watch | None = None
        """Tells whether any policy file may have changed, so most calls stat nothing."""
        if files is not None:
            self._watch = open_watch(self._dirs)  # before the first look: no edit is missed
        self._signature = self._stat() if files is not None else ()
        self._digest = self._read_digest() if files is not None else ""
        if self._watch is not None and not self._watch.add(self._paths):
            self.close()  # cannot follow every file: check them on every call instead

    def close(self) -> None:
        """Stop watching the files (the policy is then checked on every call)."""
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()

    @property
    def policy(self) -> Policy:
        """The last good policy (whatever the files say now)."""
        return self._policy

    def _list(self, now: float) -> list[Path]:
        """The policy files; the folders are listed again only when they changed."""
        assert self._files is not None
        key: list[tuple[int, int] | None] = []
        for folder in self._dirs:
            try:
                st = os.stat(folder)
            except OSError:
                key.append(None)
                continue
            key.append((st.st_mtime_ns, st.st_ino))
        racy = any(k is not None and now - k[0] / 1e9 < _RACY for k in key)
        if not self._dirs or racy or tuple(key) != self._listed:
            self._listed = tuple(key)
            self._paths = self._files()
        return self._paths

    def _stat(self, now: float | None = None) -> tuple[tuple[str, int, int, int], ...]:
        out: list[tuple[str, int, int, int]] = []
        for path in self._list(time.time() if now is None else now):
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.append((str(path), st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)

    def _read_digest(self) -> str:
        digest = hashlib.sha256()
        for path in self._paths:
            digest.update(str(path).encode() + b"\0")
            try:
                digest.update(path.read_bytes())
            except OSError:
                digest.update(b"\0unreadable")
        return digest.hexdigest()

    def current(self) -> Policy:
        """The policy to decide one call against. Raises :class:`PolicyFileError`."""
        if self._files is None:
            return self._policy
        watch = self._watch
        if watch is None or watch.changed():
            now = time.time()
            signature = self._stat(now)
            racy = any(now - mtime / 1e9 < _RACY for _, mtime, _, _ in signature)
            if signature != self._signature or racy:
                self._signature = signature
                digest = self._read_digest()
                # A malformed policy is read again when touched: what it names (a data
                # folder) may have been fixed outside the file.
                if digest != self._digest or self._error is not None:
                    self._digest = digest
                    self._reload()
            if watch is not None and not watch.add((*self._dirs, *self._paths)):
                self.close()
        if self._error is not None:
            raise self._error
        return self._policy

    def _reload(self) -> None:
        try:
            config = load_policy(self._paths, root=self._root)
        except PolicyFileError as exc:
            self._error = exc
            if self._on_change is not None:
                self._on_change(exc)
            return
        self._error = None
        self._policy = Policy(config)
        if self._on_change is not None:
            self._on_change(self._policy)
