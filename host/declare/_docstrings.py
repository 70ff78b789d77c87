"""Parameter descriptions from docstrings, for the JSON Schemas.

The model block keeps a tool's docstring verbatim; the schemas want it in pieces: a
summary for the tool, a description per parameter, one for the return value. Three
conventions are read, and a docstring may mix them::

    Google                 NumPy                  Sphinx
    Args:                  Parameters             :param count: how many
        count: how many    ----------             :returns: the total
    Returns:               count : int
        the total              how many

Anything not recognised stays in the summary; nothing is ever invented.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

__all__ = ["Docstring", "parse_docstring", "prose"]

_PARAM_SECTIONS: Final = frozenset(
    {
        "args",
        "arguments",
        "parameters",
        "params",
        "keyword args",
        "keyword arguments",
        "other parameters",
    }
)
_RETURN_SECTIONS: Final = frozenset({"returns", "return", "yields", "yield"})
_OTHER_SECTIONS: Final = frozenset(
    {
        "raises",
        "raise",
        "example",
        "examples",
        "note",
        "notes",
        "see also",
        "attributes",
        "warning",
        "warnings",
        "references",
        "todo",
        "methods",
        "warns",
    }
)
_SECTIONS: Final = _PARAM_SECTIONS | _RETURN_SECTIONS | _OTHER_SECTIONS
_GOOGLE_ITEM = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_NUMPY_ITEM = re.compile(r"^\*{0,2}(\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?::.*)?$")
_SPHINX = re.compile(
    r"^:(param|parameter|arg|argument|key|keyword|returns?)(?:\s+([^:]*?))?\s*:\s*(.*)$"
)
_DASHES = re.compile(r"^\s*-{3,}\s*$")


@dataclass(frozen=True, slots=True)
class Docstring:
    summary: str | None = None
    params: dict[str, str] = field(default_factory=dict[str, str])
    returns: str | None = None
    prose: str | None = None
    """The docstring without its parameter and return sections (which the schemas hold),
    every other section (``Raises``, ``Example``, ...) kept where it was."""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _join(lines: list[str]) -> str:
    return " ".join(part for line in lines if (part := line.strip()))


def _items(body: list[str], pattern: re.Pattern[str], inline: bool) -> list[tuple[str, str]]:
    """``(names, description)`` per item at the body's shallowest indentation."""
    lines = [line for line in body if line.strip()]
    if not lines:
        return []
    base = min(_indent(line) for line in lines)
    out: list[tuple[str, list[str]]] = []
    for line in lines:
        match = pattern.match(line.strip()) if _indent(line) == base else None
        if match is not None:
            out.append((match.group(1), [match.group(2)] if inline else []))
        elif out:
            out[-1][1].append(line)
    return [(names, _join(desc)) for names, desc in out]


def parse_docstring(text: str | None) -> Docstring:
    """Split a cleaned docstring into summary, parameter descriptions and return text."""
    if not text:
        return Docstring()
    lines = text.expandtabs().splitlines()
    summary_end = len(lines)
    params: dict[str, str] = {}
    returns: list[str] = []
    dropped: set[int] = set()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        header = stripped.rstrip(":").lower()
        numpy = (
            i + 1 < len(lines) and _DASHES.match(lines[i + 1]) is not None and header in _SECTIONS
        )
        google = stripped.endswith(":") and header in _SECTIONS and not numpy
        if numpy or google:
            summary_end = min(summary_end, i)
            start = i + (2 if numpy else 1)
            end = start
            while end < len(lines):
                nxt = lines[end]
                if numpy and end + 1 < len(lines) and _DASHES.match(lines[end + 1]):
                    break
                if google and nxt.strip() and _indent(nxt) <= _indent(line):
                    break
                end += 1
            body = lines[start:end]
            if header in _PARAM_SECTIONS:
                pattern = _GOOGLE_ITEM if google else _NUMPY_ITEM
                for names, desc in _items(body, pattern, inline=google):
                    for name in re.split(r"\s*,\s*", names):
                        if desc:
                            params.setdefault(name.lstrip("*"), desc)
            elif header in _RETURN_SECTIONS:
                returns.append(_join(body))
            if header in _PARAM_SECTIONS or header in _RETURN_SECTIONS:
                dropped.update(range(i, end))
            i = end
            continue
        match = _SPHINX.match(stripped)
        if match is not None:
            summary_end = min(summary_end, i)
            desc = [match.group(3)]
            dropped.add(i)
            i += 1
            while i < len(lines) and lines[i].strip() and _indent(lines[i]) > _indent(line):
                desc.append(lines[i])
                dropped.add(i)
                i += 1
            if match.group(1).startswith("return"):
                returns.append(_join(desc))
            elif match.group(2):
                name = match.group(2).split()[-1].lstrip("*")
                params.setdefault(name, _join(desc))
            continue
        i += 1
    summary = "\n".join(lines[:summary_end]).strip() or None
    kept: list[str] = []
    for n, line in enumerate(lines):
        if n not in dropped and (line.strip() or (kept and kept[-1].strip())):
            kept.append(line.rstrip())
    prose = "\n".join(kept).strip() or None
    return Docstring(summary, params, " ".join(r for r in returns if r) or None, prose)


def prose(docstring: str | None) -> str | None:
    """``docstring`` without the parameter and return sections the JSON Schemas hold."""
    return parse_docstring(docstring).prose
