"""Patterns in policy: regexes and globs, matched in time linear in the text.

A policy's ``when.PARAM = { regex = ... }`` and its globs are matched against arguments
the agent chose, on the host's event loop. Python's ``re`` backtracks: ``(a|aa)+`` took
seconds on a 38-character argument. Here every pattern is compiled with RE2
(``google-re2``), which never backtracks, and a pattern it cannot take (backreferences,
lookaround, possessive or atomic groups, conditionals, ``\\Z``, huge repeats) is refused
when the policy is read, naming the file and line. Text longer than
:data:`MAX_MATCH_CHARS` is not matched at all: the condition is undecidable, which
counts as met for deny and escalate rules and never for allow rules.
"""

from __future__ import annotations

import functools
from typing import Final, TypeAlias

import re2

__all__ = ["MAX_MATCH_CHARS", "Pattern", "compile_regex", "glob"]

Pattern: TypeAlias = "re2._Regexp[str]"  # pyright: ignore[reportPrivateUsage]

MAX_MATCH_CHARS: Final = 64 * 1024
"""Longest text a pattern is matched against (beyond it, the match is undecidable)."""

MAX_PATTERN_CHARS: Final = 4096
"""Longest pattern a policy may write."""

_MAX_MEM: Final = 1 << 20
"""Memory RE2 may use for one compiled pattern (a larger program is refused)."""


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = _MAX_MEM
    options.log_errors = False  # the error is ours to report, not abseil's on stderr
    options.never_capture = True  # conditions only ask whether it matches: faster
    return options


@functools.lru_cache(maxsize=4096)
def compile_regex(pattern: str) -> Pattern:
    """``pattern`` compiled for ``fullmatch``. Raises ``ValueError`` saying why RE2
    cannot take it (the policy loader turns it into a ``PolicyFileError``)."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"regex is longer than {MAX_PATTERN_CHARS} characters")
    try:
        return re2.compile(pattern, _options())
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(
            f"regex {pattern!r:.80} cannot be used: {reason} (policy regexes use RE2 "
            "syntax, matched in linear time: no backreferences, lookaround or "
            "possessive repeats)"
        ) from None


def _glob_source(pattern: str, sep: str) -> str:
    out: list[str] = ["(?s)"]
    not_sep = f"[^{re2.escape(sep)}]"
    i = 0
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
            out.append(re2.escape(pattern[i]))
            i += 1
    return "".join(out)


@functools.lru_cache(maxsize=4096)
def glob(pattern: str, sep: str) -> Pattern:
    """A glob as a pattern for ``fullmatch``: ``*`` and ``?`` stop at ``sep``, ``**``
    does not. Raises ``ValueError`` for a glob too large to compile."""
    return compile_regex(_glob_source(pattern, sep))
