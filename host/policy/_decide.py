"""Deciding: a call's tool, bound arguments and caller -> allow, deny or escalate.

:func:`decide` is pure: it reads nothing but its arguments and does nothing but return a
:class:`Decision`, so ``toolhost policy check`` and tests call it directly, and the
mediator wraps it and enforces what it says (docs/policy.md, "Policy file").

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
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, cast

import anyio

from host._binding import BoundCall
from host.declare import VAR_KEYWORD, VAR_POSITIONAL, ToolSpec
from host.errors import PolicyFileError

from ._files import Caller, Channel, PolicyConfig, Quota, Rule, load_policy
from ._paths import path_truth
from ._regex import MAX_MATCH_CHARS, Pattern, compile_regex, glob
from ._watch import Watch, open_watch

__all__ = [
    "Decision",
    "rule_digest",
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
    rule_digest: str | None = None
    """A digest of what decided: the content of every matching rule of the winning kind
    (or of the default). A remembered answer is bound to it: a changed rule asks again."""

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
        if self.rule_digest is not None:
            data["rule_digest"] = self.rule_digest
        return data


# -- globs ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def tool_glob(pattern: str) -> Pattern:
    """A tool-name glob: ``*`` and ``?`` stop at ``.``, ``**`` does not. Use ``fullmatch``."""
    return glob(pattern, ".")


@functools.lru_cache(maxsize=1024)
def value_glob(pattern: str) -> Pattern:
    """An argument glob: ``*`` and ``?`` stop at ``/``, ``**`` does not. Use ``fullmatch``."""
    return glob(pattern, "/")


# -- conditions ----------------------------------------------------------------------------

Truth = bool | None


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
        if len(value) > MAX_MATCH_CHARS:
            return _UNKNOWN  # too long to match on the event loop: undecidable
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


def _path_glob(pattern: str, path: str) -> bool:
    return value_glob(pattern).fullmatch(path) is not None


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


Test = Callable[[Any], Truth]


def _condition(condition: Any) -> Test:
    """``condition`` compiled into a test of one argument's value."""
    if isinstance(condition, str):
        matcher = value_glob(condition)
        return lambda value: _string(value, lambda s: matcher.fullmatch(s) is not None)
    if not isinstance(condition, dict):
        return lambda value: _equal(value, condition)
    table = cast("Mapping[str, Any]", condition)
    if "path" in table:
        return lambda value: (
            _UNKNOWN
            if type(value) is str and len(value) > MAX_MATCH_CHARS  # too long to match
            else path_truth(value, table, _path_glob)
        )
    tests: list[Test] = []
    if "regex" in table:
        pattern = compile_regex(str(table["regex"]))
        tests.append(lambda value: _string(value, lambda s: pattern.fullmatch(s) is not None))
    for name, op in _COMPARE.items():
        if name in table:
            bound: float = table[name]
            tests.append(lambda value, op=op, bound=bound: _compare(value, op, bound))
    if "in" in table:
        options: list[Any] = table["in"]

        def member(value: Any) -> Truth:
            found = [_equal(value, option) for option in options]
            if any(t is True for t in found):
                return True
            return _UNKNOWN if _UNKNOWN in found else False

        tests.append(member)
    return lambda value: _all([test(value) for test in tests])


def rule_digest(rule: Rule) -> str:
    """A digest of what a rule says (not where it is written): a grant records the digest
    of the rule that asked, so a changed rule asks again."""
    return hashlib.sha256(rule.model_dump_json().encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class _Compiled:
    """One rule with its globs and conditions compiled (once per policy version)."""

    rule: Rule
    tools: tuple[Pattern, ...]
    when: tuple[tuple[str, Test], ...]
    digest: str

    @classmethod
    def of(cls, rule: Rule) -> _Compiled:
        return cls(
            rule,
            tuple(tool_glob(g) for g in rule.tools),
            tuple((name, _condition(cond)) for name, cond in rule.when.items()),
            rule_digest(rule),
        )

    def covers(self, tool: str) -> bool:
        return any(pattern.fullmatch(tool) for pattern in self.tools)

    def matches(
        self, arguments: Mapping[str, Any], caller: Caller, unknown: Collection[str]
    ) -> bool:
        rule = self.rule
        if rule.callers is not None and caller not in rule.callers:
            return False
        truths: list[Truth] = []
        for name, test in self.when:
            if name in arguments:
                truths.append(test(arguments[name]))
            else:
                truths.append(_UNKNOWN if name in unknown else False)  # no such parameter
        truth = _all(truths)
        if truth is None:  # undecidable: only ever the more restrictive reading
            return rule.decision != "allow"
        return truth


# -- the policy ----------------------------------------------------------------------------

_BY_TOOL: Final = 4096
"""Tools whose candidate rules a policy remembers (names come from discovery)."""


class Policy:
    """One version of a project's policy files, compiled for deciding.

    Every rule's globs and conditions are compiled once, here; the rules that can match a
    tool (by its globs) are worked out once per tool name, so a call checks only those.
    """

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self.rules: tuple[Rule, ...] = tuple(rule for _, f in config.files for rule in f.rules)
        self.quotas: tuple[Quota, ...] = tuple(q for _, f in config.files for q in f.quotas)
        self._compiled = tuple(_Compiled.of(rule) for rule in self.rules)
        self._by_tool: dict[str, tuple[_Compiled, ...]] = {}
        self._digests: dict[tuple[int, ...], str] = {}
        self._quotas_by_tool: dict[str, tuple[Quota, ...]] = {}
        self.version = (
            config.version or hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:12]
        )

    def __repr__(self) -> str:
        return f"<Policy {self.version} rules={len(self.rules)} quotas={len(self.quotas)}>"

    @property
    def escalation_timeout(self) -> float:
        return self.config.defaults.escalation_timeout

    @property
    def grant_expiry(self) -> float | None:
        """Seconds an ``always`` grant lasts; None: until revoked."""
        return self.config.defaults.grant_expiry

    def _candidates(self, tool: str) -> tuple[_Compiled, ...]:
        found = self._by_tool.get(tool)
        if found is None:
            found = tuple(c for c in self._compiled if c.covers(tool))
            if len(self._by_tool) < _BY_TOOL:
                self._by_tool[tool] = found
        return found

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
        matched = [c for c in self._candidates(tool) if c.matches(arguments, caller, unknown)]
        if not matched:
            default: Verdict = getattr(self.config.defaults, caller)
            digest = (
                hashlib.sha256(f"defaults.{caller}=escalate".encode()).hexdigest()[:32]
                if default == "escalate"
                else None
            )
            return Decision(
                default,
                f"defaults.{caller}",
                f"no rule matches; the default for {caller} calls is {default}",
                self.version,
                rule_digest=digest,
            )
        # max keeps the first of equals
        winner = max(matched, key=lambda c: _RANK[c.rule.decision]).rule
        approvers: tuple[Channel, ...] | None = None
        if winner.decision == "escalate":
            # Every matching escalate rule's restriction holds: the channels all allow.
            for compiled in matched:
                rule = compiled.rule
                if rule.decision == "escalate" and rule.approvers is not None:
                    allowed = rule.approvers
                    approvers = tuple(
                        c for c in (approvers if approvers is not None else allowed) if c in allowed
                    )
        digest = self._digest(matched) if winner.decision == "escalate" else None
        return Decision(
            winner.decision,
            winner.name,
            winner.reason,
            self.version,
            tuple(c.rule.name for c in matched),
            approvers,
            digest,
        )

    def _digest(self, matched: list[_Compiled]) -> str:
        """What made a call escalate: every matching escalate rule, by name and content (a
        new stricter rule that also escalates changes it, so what was granted under the
        old ones is asked again)."""
        deciding = tuple(c for c in matched if c.rule.decision == "escalate")
        key = tuple(id(c) for c in deciding)
        found = self._digests.get(key)
        if found is None:
            text = "\0".join(f"{c.rule.name}={c.digest}" for c in deciding)
            found = hashlib.sha256(text.encode()).hexdigest()[:32]
            if len(self._digests) < _BY_TOOL:
                self._digests[key] = found
        return found

    def quotas_for(self, tool: str) -> tuple[Quota, ...]:
        """The ``[[quotas]]`` entries whose globs match ``tool`` (worked out once per tool)."""
        found = self._quotas_by_tool.get(tool)
        if found is None:
            found = tuple(
                q for q in self.quotas if any(tool_glob(g).fullmatch(tool) for g in q.tools)
            )
            if len(self._quotas_by_tool) < _BY_TOOL:  # bounded: names come from discovery
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
        self._reading: anyio.Event | None = None
        """Set while a changed policy is parsed in a worker thread (:meth:`latest`)."""
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
        """The policy to decide one call against, re-read here if a file changed (for
        the command line and other code off the event loop: see :meth:`latest`).
        Raises :class:`PolicyFileError`."""
        if self._files is None:
            return self._policy
        watch = self._watch
        if watch is None or watch.changed():
            try:
                if self._refresh(watch):
                    self._settle(self._parse())
            except Exception as exc:  # reading the files failed somehow: fail closed
                self._fail(exc)
        return self.settled()

    async def latest(self) -> Policy:
        """:meth:`current` for the event loop: a changed policy is parsed in a worker
        thread, so a large one never stalls the loop (and every session with it). A call
        that arrives while the files are being parsed waits for that parse and is decided
        against what it finds, never against the policy it replaces."""
        if self._files is None:
            return self._policy
        while (reading := self._reading) is not None:
            await reading.wait()
        watch = self._watch
        if watch is None or watch.changed():
            done = self._reading = anyio.Event()
            try:
                if self._refresh(watch):
                    self._settle(await anyio.to_thread.run_sync(self._parse))
            except Exception as exc:  # reading the files failed somehow: fail closed
                self._fail(exc)
            finally:
                self._reading = None
                done.set()
        return self.settled()

    def settled(self) -> Policy:
        """The policy in force, without looking at the files. Raises
        :class:`PolicyFileError` while the last reading failed."""
        if self._error is not None:
            raise self._error
        return self._policy

    def _refresh(self, watch: Watch | None) -> bool:
        """Whether the files changed since the last reading (stat, then content)."""
        now = time.time()
        signature = self._stat(now)
        racy = any(now - mtime / 1e9 < _RACY for _, mtime, _, _ in signature)
        changed = False
        if signature != self._signature or racy:
            self._signature = signature
            digest = self._read_digest()
            # A malformed policy is read again when touched: what it names (a data
            # folder) may have been fixed outside the file.
            if digest != self._digest or self._error is not None:
                self._digest = digest
                changed = True
        if watch is not None and not watch.add((*self._dirs, *self._paths)):
            self.close()
        return changed

    def _parse(self) -> Policy | Exception:
        """The files read as a policy, or why they are not one (runs in a worker thread:
        touches nothing but its own result)."""
        try:
            return Policy(load_policy(list(self._paths), root=self._root))
        except Exception as exc:  # whatever it is, the new files are not a policy
            return exc

    def _settle(self, outcome: Policy | Exception) -> None:
        if isinstance(outcome, Exception):
            self._fail(outcome)
            return
        self._error = None
        self._policy = outcome
        if self._on_change is not None:
            self._on_change(self._policy)

    def _fail(self, exc: Exception) -> None:
        """From now on every call is refused with this error, until the files change and
        read well (``policy_reload_failed``): never the old policy, never a crash."""
        error = (
            exc
            if isinstance(exc, PolicyFileError)
            else PolicyFileError(
                f"cannot be loaded: {type(exc).__name__}: {str(exc)[:200]}",
                file=", ".join(str(p) for p in self._paths) or "the policy files",
            )
        )
        self._error = error
        if self._on_change is not None:
            self._on_change(error)
