"""What discovery finds: a tool's parameters, the tool, the tool file, the whole folder.

These are the facts read from the tool files (``_discovery`` finds them, ``_build``
declares them); nothing here reads a file. A parameter's kind is an ``inspect.Parameter``
kind value; the binder and the policy compare it with the constants below.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = [
    "POSITIONAL_ONLY",
    "POSITIONAL_OR_KEYWORD",
    "VAR_POSITIONAL",
    "KEYWORD_ONLY",
    "VAR_KEYWORD",
    "NO_DEFAULT",
    "Param",
    "ToolSpec",
    "ToolFile",
    "Discovery",
]

POSITIONAL_ONLY: Final = int(inspect.Parameter.POSITIONAL_ONLY)
POSITIONAL_OR_KEYWORD: Final = int(inspect.Parameter.POSITIONAL_OR_KEYWORD)
VAR_POSITIONAL: Final = int(inspect.Parameter.VAR_POSITIONAL)
KEYWORD_ONLY: Final = int(inspect.Parameter.KEYWORD_ONLY)
VAR_KEYWORD: Final = int(inspect.Parameter.VAR_KEYWORD)


class _NoDefault:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Final = _NoDefault()
"""Marks a parameter without a default, or whose default is not a literal."""


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of a tool, as written in the source."""

    name: str
    kind: int
    """An ``inspect.Parameter`` kind value (0 positional-only ... 4 ``**kwargs``)."""
    annotation: str | None = None
    """The annotation's source text, if any."""
    default: str | None = None
    """The default's source text, if any."""
    value: Any = NO_DEFAULT
    """The default's value when it is a literal (``ast.literal_eval``), else NO_DEFAULT."""

    @property
    def required(self) -> bool:
        return self.default is None and self.kind not in (VAR_POSITIONAL, VAR_KEYWORD)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool: where it is defined and how it is called."""

    name: str
    """The canonical tool name: ``now``, ``kanban.add``, ``tools.math.print``."""
    file: str
    """The tool file's module name (``kanban`` for ``tools/kanban.py``)."""
    export: str
    """The top-level name in that file."""
    member: str | None
    """For an object export's method, the method's name."""
    params: tuple[Param, ...]
    is_async: bool
    source: Path
    """The file that defines the function (a sibling, when re-exported via ``__all__``)."""
    line: int
    docstring: str | None = None
    returns: str | None = None
    """The return annotation's source text, if any."""
    installed: bool = True
    """False when the export shadows a builtin or host global (only ``tools.F.E`` works)."""
    context: str | None = None
    """The hidden parameter annotated ``capsule.context.ToolContext``, if any: it is not in
    ``params``, so no caller can bind it; the capsule fills it in."""
    context_at: tuple[int, int] = (0, POSITIONAL_OR_KEYWORD)
    """Where the context parameter sits in the full signature, and its kind."""
    uses: tuple[str, ...] | None = None
    """The tools this one may call through its context (canonical names), from the
    file's ``__uses__``; None when the file declares nothing for it (no limit but policy)."""

    @property
    def path(self) -> tuple[str, ...]:
        """``(FILE, EXPORT[, MEMBER])``: the explicit path under ``tools``."""
        return (
            (self.file, self.export)
            if self.member is None
            else (
                self.file,
                self.export,
                self.member,
            )
        )

    @property
    def qualified(self) -> str:
        """``tools.FILE.EXPORT[.MEMBER]``, which always reaches this tool."""
        return "tools." + ".".join(self.path)

    @property
    def param_kinds(self) -> list[tuple[str, int]]:
        return [(p.name, p.kind) for p in self.params]

    @property
    def capsule_params(self) -> list[tuple[str, int]]:
        """Every parameter's (name, kind) as the function has them: the context's too."""
        kinds = self.param_kinds
        if self.context is not None:
            at, kind = self.context_at
            kinds.insert(at, (self.context, kind))
        return kinds

    @property
    def runtime_name(self) -> str:
        """``EXPORT[.MEMBER]``: the name inside its file (as ``__uses__`` keys name it)."""
        return ".".join(self.path[1:])


@dataclass(frozen=True, slots=True)
class ToolFile:
    """One file in the tools folder."""

    module: str
    path: Path
    private: bool
    exports: tuple[str, ...] = ()
    """Canonical names of the tools this file exports."""


@dataclass(frozen=True, slots=True)
class Discovery:
    """Everything discovery found in a tools folder."""

    tools_dir: Path
    files: tuple[ToolFile, ...]
    tools: Mapping[str, ToolSpec] = field(default_factory=dict[str, ToolSpec])

    def runtime_names(self, module: str) -> list[str]:
        """What the capsule will report for ``module``: ``EXPORT[.MEMBER]``, sorted."""
        return sorted(
            ".".join(spec.path[1:]) for spec in self.tools.values() if spec.file == module
        )
