"""Run pyright and read what it prints: the one brittle edge of the declarations.

Everything that depends on pyright's command line, its JSON report or the way it prints a
type lives here, so a pyright upgrade that changes any of them is fixed in one file. The
rest of the host sees :class:`Diagnostic` records and plain type text.

Facts this module relies on (pyright 1.1.414, measured when this module was written):

* ``--outputjson`` prints one JSON report on stdout and never checks PyPI for updates;
  the exit status is 0 (no errors) or 1 (errors) when the run itself worked;
* probing ``_x: None = module.export`` fails with ``Type "T" is not assignable to declared
  type "None"``, and T keeps alias names (``reveal_type`` would expand them);
* a function prints as ``(a: int, /, b: str = ..., *args: int, key: str, **kw: float) ->
  R``; TypeVars print with their scope (``T@first``); a union return is parenthesised;
* with ``standard`` checking, a type pyright cannot infer prints as ``Unknown``;
* overloads print as ``Overload[sig, sig]`` and ``functools`` wrappers as their class
  (``_lru_cache_wrapper[R]``, ``_Wrapped[P, R, P2, R2]``).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, ValidationError

from host.errors import DeclarationError

__all__ = [
    "SETTINGS",
    "Diagnostic",
    "Run",
    "SigParam",
    "Signature",
    "version",
    "start",
    "run",
    "declared_type",
    "parse_signature",
    "overloads",
    "wrapped_return",
    "unwrap_coroutine",
    "python_text",
    "is_fatal",
]

SETTINGS: Final[Mapping[str, Any]] = {
    "typeCheckingMode": "standard",  # "off" and "basic" print Unknown as Any
    "strictListInference": True,  # else [1, "a"] is list[Unknown]
    "strictDictionaryInference": True,
    "strictSetInference": True,
    "reportAssignmentType": "error",  # the probe reads types from these errors
    "reportAttributeAccessIssue": "error",
}
"""The pyright configuration of a scope build (part of the cache key)."""


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One pyright diagnostic."""

    file: str
    """The file's path, or its name for a file :func:`run` wrote."""
    line: int
    """1-based."""
    severity: str
    message: str
    rule: str | None = None

    def __str__(self) -> str:
        rule = f" ({self.rule})" if self.rule else ""
        first = self.message.splitlines()[0] if self.message else ""
        return f"{self.file}:{self.line}: {self.severity}: {first}{rule}"


class _Position(BaseModel):
    model_config = ConfigDict(extra="ignore")
    line: int


class _Range(BaseModel):
    model_config = ConfigDict(extra="ignore")
    start: _Position


class _Diagnostic(BaseModel):
    model_config = ConfigDict(extra="ignore")
    file: str = ""
    severity: str
    message: str
    range: _Range | None = None
    rule: str | None = None


class _Report(BaseModel):
    model_config = ConfigDict(extra="ignore")
    version: str = ""
    generalDiagnostics: list[_Diagnostic] = []


def version() -> str:
    """The installed pyright's version, without starting it."""
    try:
        return importlib.metadata.version("pyright")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class Run:
    """A pyright process checking a folder: started by :func:`start`, read by :meth:`wait`.

    Starting and waiting are apart so the caller can do its own work meanwhile (a scope
    build parses the tool files while pyright runs).
    """

    def __init__(self, process: subprocess.Popen[bytes], root: Path, timeout: float) -> None:
        self._process = process
        self._root = root
        self._timeout = timeout

    def wait(self) -> list[Diagnostic]:
        """The diagnostics. Raises :class:`DeclarationError` if pyright failed."""
        try:
            try:
                stdout, stderr = self._process.communicate(timeout=self._timeout)
            except subprocess.TimeoutExpired as exc:
                raise DeclarationError(f"pyright took longer than {self._timeout:g} s") from exc
            return self._read(stdout, stderr)
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Stop pyright if it still runs, and remove its folder."""
        if self._process.poll() is None:
            self._process.kill()
            self._process.communicate()
        shutil.rmtree(self._root, ignore_errors=True)

    def _read(self, stdout: bytes, stderr: bytes) -> list[Diagnostic]:
        code = self._process.returncode
        if code not in (0, 1):
            detail = (stderr or stdout).decode(errors="replace").strip()[-2000:]
            raise DeclarationError(f"pyright failed (exit {code}): {detail}")
        try:
            report = _Report.model_validate_json(stdout)
        except ValidationError as exc:
            raise DeclarationError(f"pyright's report is unreadable: {exc}") from exc
        prefix = str(self._root.resolve()) + os.sep
        out: list[Diagnostic] = []
        for d in report.generalDiagnostics:
            name = d.file.removeprefix(prefix) if d.file.startswith(prefix) else d.file
            line = d.range.start.line + 1 if d.range is not None else 0
            out.append(Diagnostic(name, line, d.severity, d.message, d.rule))
        return out


def start(
    files: Mapping[str, str],
    *,
    include: Sequence[Path] = (),
    extra_paths: Sequence[Path] = (),
    settings: Mapping[str, Any] = SETTINGS,
    timeout: float = 300.0,
) -> Run:
    """Start checking ``files`` (name -> text, written to a fresh folder) with ``include``.

    Raises :class:`DeclarationError` when pyright cannot start.
    """
    root = Path(tempfile.mkdtemp(prefix="toolhost-pyright-"))
    try:
        for name, text in files.items():
            (root / name).write_text(text, encoding="utf-8")
        config = {
            **settings,
            "include": [*files, *(os.path.relpath(Path(p).resolve(), root) for p in include)],
            "extraPaths": [str(Path(p).resolve()) for p in extra_paths],
            "pythonVersion": f"{sys.version_info.major}.{sys.version_info.minor}",
        }
        (root / "pyrightconfig.json").write_text(json.dumps(config), encoding="utf-8")
        command = [sys.executable, "-m", "pyright", "--outputjson", "-p", str(root)]
        command += ["--pythonpath", sys.executable]
        env = {**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"}
        process = subprocess.Popen(
            command,
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        shutil.rmtree(root, ignore_errors=True)
        raise DeclarationError(f"pyright could not run: {exc}") from exc
    return Run(process, root, timeout)


def run(
    files: Mapping[str, str],
    *,
    include: Sequence[Path] = (),
    extra_paths: Sequence[Path] = (),
    settings: Mapping[str, Any] = SETTINGS,
    timeout: float = 300.0,
) -> list[Diagnostic]:
    """:func:`start`, then wait for the diagnostics."""
    return start(
        files, include=include, extra_paths=extra_paths, settings=settings, timeout=timeout
    ).wait()


def is_fatal(diagnostic: Diagnostic) -> bool:
    """Whether a diagnostic in a tool file means pyright cannot analyse that file.

    Type errors inside a tool are the tool's business, and an import that does not
    resolve fails at load time, where the capsule isolates the file. What is fatal is an
    unconditional error (pyright gives it no rule): code that cannot run at all, such as
    ``return`` or ``nonlocal`` at module level, which ``ast`` alone accepts.
    """
    return diagnostic.severity == "error" and diagnostic.rule is None


# -- reading printed types -----------------------------------------------------------------

_DECLARED = re.compile(r'^Type "(.*)" is not assignable to declared type "None"$')


def declared_type(message: str) -> str | None:
    """The type T from a probe line's ``Type "T" is not assignable ...`` error."""
    match = _DECLARED.match(message.splitlines()[0] if message else "")
    return match.group(1) if match else None


_OPEN: Final = "([{"
_CLOSE: Final = ")]}"


def _unquoted(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """``(index, char, depth)`` for each character from ``start`` outside quotes, ``depth``
    being how many brackets are open once the character is read."""
    depth, quote = 0, ""
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        yield i, ch, depth


def _split(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside brackets and quotes."""
    parts: list[str] = []
    start = 0
    for i, ch, depth in _unquoted(text):
        if depth == 0 and ch not in _CLOSE and text.startswith(sep, i):
            parts.append(text[start:i].strip())
            start = i + len(sep)
    tail = text[start:].strip()
    if tail or parts:
        parts.append(tail)
    return parts


def _closing(text: str, start: int) -> int:
    """The index of the bracket closing the one at ``start``, or -1."""
    for i, ch, depth in _unquoted(text, start):
        if depth == 0 and ch in _CLOSE:
            return i
    return -1


@dataclass(frozen=True, slots=True)
class SigParam:
    name: str
    kind: int
    """An ``inspect.Parameter`` kind value."""
    type: str | None
    has_default: bool


@dataclass(frozen=True, slots=True)
class Signature:
    params: tuple[SigParam, ...]
    returns: str


def parse_signature(text: str) -> Signature | None:
    """``(a: int, /, *, b: str = ...) -> R`` as parameters and return text, else None."""
    text = text.strip()
    if not text.startswith("("):
        return None
    end = _closing(text, 0)
    if end < 0 or not text[end + 1 :].startswith(" -> "):
        return None
    params: list[SigParam] = []
    kind = 1  # positional-or-keyword until "/" or "*"
    for part in _split(text[1:end]):
        if part == "/":
            params = [SigParam(p.name, 0, p.type, p.has_default) for p in params]
            continue
        if part == "*":
            kind = 3
            continue
        if part == "...":  # ``(...) -> R``: any arguments
            params += [SigParam("args", 2, None, False), SigParam("kwargs", 4, None, False)]
            continue
        this = kind
        if part.startswith("**"):
            this, part = 4, part[2:]
        elif part.startswith("*"):
            this, part, kind = 2, part[1:], 3
        head, *default = _split(part, " = ")
        name, colon, annotation = head.partition(":")
        params.append(
            SigParam(name.strip(), this, annotation.strip() if colon else None, bool(default))
        )
    return Signature(tuple(params), text[end + 5 :].strip())


def overloads(text: str) -> list[str] | None:
    """The signatures of ``Overload[sig, sig]``, else None."""
    if not text.startswith("Overload[") or _closing(text, 8) != len(text) - 1:
        return None
    return _split(text[9:-1])


def _generic(text: str) -> tuple[str, list[str]] | None:
    open_at = text.find("[")
    if open_at <= 0 or _closing(text, open_at) != len(text) - 1:
        return None
    return text[:open_at], _split(text[open_at + 1 : -1])


_WRAPPERS: Final = {"_lru_cache_wrapper": 0, "_Wrapped": 3, "partial": 0, "_CacheWrapper": 0}
"""Wrapper classes pyright prints instead of a signature -> which argument is the return."""


def wrapped_return(text: str) -> tuple[str, str] | None:
    """``(wrapper class, return text)`` for a functools-style wrapper type, else None."""
    found = _generic(text)
    if found is None or found[0] not in _WRAPPERS:
        return None
    index = _WRAPPERS[found[0]]
    args = found[1]
    return found[0], (args[index] if index < len(args) else "Unknown")


def unwrap_coroutine(text: str) -> str | None:
    """``X`` from ``CoroutineType[Any, Any, X]`` (an ``async def``'s return), else None."""
    found = _generic(text)
    if found is None or found[0] not in ("CoroutineType", "Coroutine") or len(found[1]) != 3:
        return None
    return found[1][2]


_SCOPED = re.compile(r"\b([A-Za-z_]\w*)@[A-Za-z_][\w.]*")


def python_text(text: str) -> str:
    """Pyright's type text as a Python expression: ``T@first`` -> ``T``, no outer parens."""
    text = _SCOPED.sub(r"\1", text.strip())
    while text.startswith("(") and _closing(text, 0) == len(text) - 1:
        text = text[1:-1].strip()
    return text
