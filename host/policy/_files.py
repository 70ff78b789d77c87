"""The policy files, parsed into pydantic models (docs/policy.md, "Policy file").

``policy.toml`` plus ``policies/*.toml`` are read and validated here; a malformed file is a
:class:`PolicyFileError` naming the file, the line and the field, and the host refuses to
start on it. This module only parses: deciding lives in the policy module.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Final, Literal, cast

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from host.errors import PolicyFileError
from host.settings import (
    CODE_MEMORY_DEFAULTS,
    AuditConfig,
    Caller,
    CapsulesConfig,
    DataFolder,
    Duration,
    EnvConfig,
    Limits,
    StoreConfig,
    parse_duration,
    parse_size,
)

from ._paths import PATH_KEYS, check_path_condition
from ._regex import compile_regex, glob
from ._suggest import did_you_mean, unknown_key

__all__ = [
    "Limits",
    "EnvConfig",
    "CapsulesConfig",
    "DataFolder",
    "Channel",
    "Defaults",
    "Rule",
    "Quota",
    "PolicyFile",
    "PolicyConfig",
    "load_policy",
    "parse_duration",
    "parse_size",
]

Decision = Literal["allow", "deny", "escalate"]
Channel = Literal["app", "terminal", "mcp", "inbox"]
"""Where an approval can come from: ``app`` (an approver the app passed to ``Host.open``),
``terminal`` (the terminal approver), ``mcp`` (the user of the MCP client that made the
call, asked by elicitation: the agent's own channel), ``inbox`` (the approval inbox)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Defaults(_Model):
    """``[defaults]``: the decision when no rule matches, per caller."""

    agent: Decision = "deny"
    script: Decision = "allow"
    app: Decision = "allow"
    tool: Decision = "deny"
    escalation_timeout: Duration = 120.0
    grant_expiry: Duration | None = None
    """How long an ``always`` answer (a grant) lasts, e.g. ``"720h"``; unset: until it is
    revoked."""


_TOOL_GLOB = re.compile(r"^[\w.*?]+$")
_WHEN_KEYS = ("regex", "gt", "ge", "lt", "le", "in", *PATH_KEYS)


def _tool_globs(value: object) -> object:
    if not isinstance(value, list):
        return value  # pydantic says what is wrong with it
    items = cast("list[object]", value)
    for item in items:
        if not isinstance(item, str) or not _TOOL_GLOB.match(item):
            raise ValueError(
                f"{item!r} is not a tool-name glob (letters, digits, '_', '.', "
                "'*' within a name part, '**' across parts, '?')"
            )
        glob(item, ".")
    return items


def _condition(value: Any) -> Any:
    """Check one ``when.PARAM`` condition; the policy module compiles it."""
    if isinstance(value, str):
        glob(value, "/")  # a glob too large to compile is refused here, not at a call
        return value
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, dict):
        table: dict[str, Any] = value  # pyright: ignore[reportUnknownVariableType]
        if any(key in table for key in PATH_KEYS):
            check_path_condition(table)
            glob(str(table["path"]), "/")
            return table
        unknown = sorted(set(table) - set(_WHEN_KEYS))
        if unknown or not table:
            raise ValueError(
                f"a condition table takes {', '.join(_WHEN_KEYS)}"
                + (f", not {', '.join(unknown)}" if unknown else "")
                + (did_you_mean(unknown[0], _WHEN_KEYS) if len(unknown) == 1 else "")
            )
        if "regex" in table:
            pattern = table["regex"]
            if not isinstance(pattern, str):
                raise ValueError("regex takes a string")
            compile_regex(pattern)  # RE2: refuses what it cannot match in linear time
        for op in ("gt", "ge", "lt", "le"):
            bound = table.get(op)
            if op in table and (isinstance(bound, bool) or not isinstance(bound, (int, float))):
                raise ValueError(f"{op} takes a number")
        if "in" in table:
            options = table["in"]
            if not isinstance(options, list) or not all(
                isinstance(o, (str, bool, int, float))
                for o in options  # pyright: ignore[reportUnknownVariableType]
            ):
                raise ValueError("in takes a list of strings, numbers or booleans")
        return table
    if isinstance(value, list):
        raise ValueError("to accept one of several values write {in = [...]}")
    raise ValueError(
        "a condition is a string glob, a number, a boolean, or a table "
        "{regex = ..}, {gt/ge/lt/le = ..}, {in = [..]}, {path = .., base = ..}"
    )


def _conditions(value: object) -> object:
    if not isinstance(value, dict):
        return value  # pydantic says what is wrong with it
    table = cast("dict[object, object]", value)
    for name in table:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"when.{name}: conditions are keyed by parameter name")
    return table


ToolGlobs = Annotated[list[str], Field(min_length=1), BeforeValidator(_tool_globs)]
Condition = Annotated[str | bool | int | float | dict[str, Any], BeforeValidator(_condition)]


class Rule(_Model):
    """One ``[[rules]]`` entry. Every rule that matches a call counts."""

    id: str | None = Field(default=None, min_length=1)
    """The name decisions give for this rule; without it, ``FILE:LINE``."""
    tools: ToolGlobs
    """Globs on canonical tool names: ``*`` stops at ``.``, ``**`` does not."""
    decision: Decision
    callers: list[Caller] | None = None
    """Only calls from these callers match; ``None`` means every caller."""
    when: Annotated[dict[str, Condition], BeforeValidator(_conditions)] = Field(
        default_factory=dict[str, Any]
    )
    """Conditions on the bound arguments, by parameter name (all must hold)."""
    reason: str | None = None
    """Shown to the approver and in the error the caller gets."""
    approvers: list[Channel] | None = None
    """For ``escalate``: the channels whose answer may allow the call (``["inbox"]``:
    nothing on the agent's own channel can approve it); ``None`` means any."""
    _source: str | None = PrivateAttr(default=None)

    @property
    def name(self) -> str:
        """The rule's ``id``, else ``FILE:LINE`` where it is written."""
        return self.id or self._source or "<rule>"


class Quota(_Model):
    """One ``[[quotas]]`` entry: call budgets for each tool its globs match."""

    tools: ToolGlobs
    per_session: int | None = Field(default=None, gt=0)
    """Calls one session may make to each matching tool."""
    per_minute: int | None = Field(default=None, gt=0)
    """Calls the host may make to each matching tool in any 60 seconds."""

    @model_validator(mode="after")
    def _some_budget(self) -> Quota:
        if self.per_session is None and self.per_minute is None:
            raise ValueError("a quota sets per_session, per_minute or both")
        return self


class PolicyFile(_Model):
    """One policy file as written."""

    version: Literal[1] = 1
    defaults: Defaults | None = None
    rules: list[Rule] = Field(default_factory=list[Rule])
    quotas: list[Quota] = Field(default_factory=list[Quota])
    limits: Limits | None = None
    env: EnvConfig | None = None
    capsules: CapsulesConfig | None = None
    audit: AuditConfig | None = None
    store: StoreConfig | None = None


class PolicyConfig(BaseModel):
    """The merged view of every policy file of a project."""

    model_config = ConfigDict(frozen=True)

    files: list[tuple[str, PolicyFile]] = Field(default_factory=list[tuple[str, PolicyFile]])
    """``(name, file)`` in the order rules are read; names are relative to the project."""
    version: str = ""
    """A digest of the files' contents; the audit records it for every call."""
    defaults: Defaults = Defaults()
    limits: Limits = Limits()
    env: EnvConfig = EnvConfig()
    capsules: CapsulesConfig = CapsulesConfig()
    audit: AuditConfig = AuditConfig()
    store: StoreConfig = StoreConfig()


_HEADER = re.compile(r"^\s*\[\[?\s*([^\[\]#]*?)\s*\]\]?\s*(#.*)?$")


class _Lines:
    """A file's lines and where each table header is, found once: naming every rule of
    a file by its line is then linear in the file, not quadratic."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self._headers: dict[str, list[int]] | None = None

    def headers(self, section: str) -> list[int]:
        if self._headers is None:
            found: dict[str, list[int]] = {}
            for i, line in enumerate(self.lines):
                if line.lstrip().startswith("["):
                    match = _HEADER.match(line)
                    if match is not None:
                        found.setdefault(match[1], []).append(i)
            self._headers = found
        return self._headers.get(section, [])


def _line_of(text: str | _Lines, loc: tuple[int | str, ...]) -> int | None:
    """Best-effort line of a validation error's location in the TOML source."""
    index_of = text if isinstance(text, _Lines) else _Lines(text)
    lines = index_of.lines
    section: str | None = None
    index: int | None = None
    key: str | None = None
    parts = list(loc)
    if parts and isinstance(parts[0], str):
        section = str(parts.pop(0))
    if parts and isinstance(parts[0], int):
        index = int(parts.pop(0))
    if parts and isinstance(parts[0], str):
        key = str(parts.pop(0))
    start = 0
    if section is not None:
        hits = index_of.headers(section)
        if hits:
            start = hits[min(index or 0, len(hits) - 1)]
        elif key is None:
            key, section = section, None
    if key is None:
        return start + 1 if section is not None else None
    pattern = re.compile(rf"^\s*(?:{re.escape(section or '')}\.)?{re.escape(key)}(\.|\s*=)")
    for i in range(start, len(lines)):
        if i > start and section is not None and lines[i].lstrip().startswith("["):
            break
        if pattern.match(lines[i]):
            return i + 1
    return start + 1 if section is not None else None


MAX_POLICY_BYTES: Final = 8 * 1024**2
"""Largest policy file read (about 100,000 rules)."""

MAX_NESTING: Final = 32
"""Deepest nesting of arrays and inline tables a policy file may use."""

_TOKEN = re.compile(r'"""|' + r"'''" + r"""|["'#\[\]{}\n]""")
_STRING_END: Final = {
    '"""': re.compile(r'(?:\\.|[^\\])*?"""(?:"{0,2})', re.DOTALL),
    "'''": re.compile(r"(?:.)*?'''(?:'{0,2})", re.DOTALL),
    '"': re.compile(r'(?:\\.|[^"\\\n])*"'),
    "'": re.compile(r"[^'\n]*'"),
}


def _check_shape(text: str, name: str) -> None:
    """Refuse a file too large or nested too deep before the parser sees it (the parser
    recurses once per level: 5,000 nested arrays ended in a ``RecursionError``)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_POLICY_BYTES:
        raise PolicyFileError(
            f"the file takes {size:,} bytes, more than the {MAX_POLICY_BYTES:,} a policy "
            "file may take; split it into policies/*.toml",
            file=name,
        )
    depth = 0
    line = 1
    at = 0
    while True:
        match = _TOKEN.search(text, at)
        if match is None:
            return
        token = match[0]
        at = match.end()
        if token == "\n":
            line += 1
        elif token == "#":
            end = text.find("\n", at)
            at = len(text) if end < 0 else end
        elif token in _STRING_END:
            closed = _STRING_END[token].match(text, at)
            if closed is None:
                return  # an unterminated string: the parser says where
            line += text.count("\n", at, closed.end())
            at = closed.end()
        elif token in "[{":
            depth += 1
            if depth > MAX_NESTING:
                raise PolicyFileError(
                    f"arrays and tables are nested more than {MAX_NESTING} levels deep",
                    file=name,
                    line=line,
                )
        else:
            depth = max(0, depth - 1)


def _parse_file(
    path: Path, text: str | None = None, display: str | None = None, root: Path | None = None
) -> PolicyFile:
    name = str(path)
    if text is None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyFileError(f"cannot read: {exc}", file=name) from exc
    _check_shape(text, name)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise PolicyFileError(
            f"not valid TOML: {exc}", file=name, line=int(m.group(1)) if m else None
        ) from exc
    lines = _Lines(text)
    try:
        # Paths in the file (``[capsules] data``) are checked against the project folder.
        parsed = PolicyFile.model_validate(data, context={"root": root or path.parent})
    except ValidationError as exc:
        errors = exc.errors()
        # An unknown key first: a misspelled key also leaves its field missing, and the
        # key is what to fix.
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc = tuple(first["loc"])
        field = ".".join(str(p) for p in loc) or None
        message = first["msg"]
        if first["type"] == "extra_forbidden":
            message = unknown_key(PolicyFile, loc)
        context = first.get("ctx") or {}
        if first["type"] == "value_error" and "error" in context:
            message = str(context["error"])  # without pydantic's "Value error, " prefix
        given = first.get("input")
        if isinstance(given, (str, int, float)) and first["type"] not in (
            "value_error",
            "extra_forbidden",
        ):
            message += f" (got {given!r:.60})"
        raise PolicyFileError(message, file=name, line=_line_of(lines, loc), field=field) from exc
    for index, rule in enumerate(parsed.rules):
        line = _line_of(lines, ("rules", index))
        rule._source = f"{display or name}:{line}" if line else f"{display or name}:rules[{index}]"  # pyright: ignore[reportPrivateUsage]
    return parsed


def _merge_one(files: list[tuple[str, PolicyFile]], attr: str) -> Any:
    found = [(name, getattr(f, attr)) for name, f in files if getattr(f, attr) is not None]
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise PolicyFileError(
            f"[{attr}] is set in more than one policy file ({names}); keep it in one",
            file=found[1][0],
            field=attr,
        )
    return found[0][1] if found else None


def _display(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return path.relative_to(root).as_posix()
        except ValueError:
            pass
    return str(path)


def load_policy(paths: list[Path], *, root: Path | None = None) -> PolicyConfig:
    """Parse and merge policy files. Raises :class:`PolicyFileError`.

    Args:
        paths: the files, in the order their rules are read.
        root: the project folder; rules without an ``id`` are then named
            ``policy.toml:12`` rather than by their absolute path. Paths in the files
            are relative to it (without it: to the folder of the file naming them).
    """
    digest = hashlib.sha256()
    files: list[tuple[str, PolicyFile]] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyFileError(f"cannot read: {exc}", file=str(path)) from exc
        display = _display(path, root)
        try:
            files.append((display, _parse_file(path, text, display, root)))
        except PolicyFileError:
            raise
        except (RecursionError, MemoryError, ValueError, TypeError, OverflowError) as exc:
            # Whatever else reading the file raises is a malformed file, never a crash.
            raise PolicyFileError(
                f"cannot be read as a policy: {type(exc).__name__}: {str(exc)[:200]}",
                file=str(path),
            ) from exc
        digest.update(f"{display}\0{len(text)}\0".encode())
        digest.update(text.encode())
    merged: dict[str, Any] = {"files": files, "version": digest.hexdigest()[:12]}
    for attr in ("defaults", "limits", "env", "capsules", "audit", "store"):
        value = _merge_one(files, attr)
        if value is not None:
            merged[attr] = value
    _runtime_memory(merged)
    return PolicyConfig(**merged)


def _runtime_memory(merged: dict[str, Any]) -> None:
    """``[limits] code_memory``, when no file sets it, is the code runtime's default."""
    capsules: CapsulesConfig = merged.get("capsules", CapsulesConfig())
    limits: Limits = merged.get("limits", Limits())
    if "code_memory" not in limits.model_fields_set:
        memory = CODE_MEMORY_DEFAULTS[capsules.code_runtime]
        if memory != limits.code_memory:
            merged["limits"] = limits.model_copy(update={"code_memory": memory})
