"""The policy files, parsed into pydantic models (DESIGN.md section 7).

``policy.toml`` plus ``policies/*.toml`` are read and validated here; a malformed file is a
:class:`PolicyFileError` naming the file, the line and the field, and the host refuses to
start on it. This module only parses: deciding lives in the policy module.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .errors import PolicyFileError

__all__ = [
    "Limits",
    "EnvConfig",
    "CapsulesConfig",
    "DataFolder",
    "Defaults",
    "Rule",
    "Quota",
    "PolicyFile",
    "PolicyConfig",
    "load_policy",
    "parse_duration",
    "parse_size",
]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZES = {
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
}


def parse_duration(value: Any) -> float:
    """``"60s"``, ``"500ms"``, ``"2m"``, ``"1h"`` or a number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '60s'")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    else:
        raise ValueError(f"{value!r} is not a duration (write '60s', '500ms', '2m' or '1h')")
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return seconds


def parse_size(value: Any) -> int:
    """``"256MiB"``, ``"1MiB"``, ``"64KiB"`` or a number of bytes -> bytes."""
    if isinstance(value, bool):
        raise ValueError("a size is a number of bytes or a string like '256MiB'")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        size = int(float(m.group(1)) * _SIZES[m.group(2) or "B"])
    else:
        raise ValueError(f"{value!r} is not a size (write '256MiB', '1MiB' or a byte count)")
    if size <= 0:
        raise ValueError("a size must be positive")
    return size


Duration = Annotated[float, BeforeValidator(parse_duration)]
Size = Annotated[int, BeforeValidator(parse_size)]
Decision = Literal["allow", "deny", "escalate"]
Caller = Literal["agent", "script", "app", "tool"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Limits(_Model):
    """``[limits]``: time, memory, call and output budgets (DESIGN.md section 9)."""

    call_timeout: Duration = 60.0
    """Seconds one tool call may take; on expiry the capsule is killed and restarted."""
    load_timeout: Duration = 30.0
    """Seconds importing the tool files may take when a capsule starts."""
    code_timeout: Duration = 30.0
    code_memory: Size = 256 * 1024**2
    code_max_calls: int = Field(default=100, gt=0)
    code_max_output: Size = 1024**2
    max_pending_approvals: int = Field(default=20, gt=0)
    max_argument_size: Size = 4 * 1024**2
    """Bytes the encoded arguments of one call may take; more is refused before policy."""
    max_frame: Size = 16 * 1024**2
    """Bytes one frame may take on the wire (results included)."""
    max_restarts: int = Field(default=5, gt=0)
    """Crashes within ``restart_window`` after which a capsule's tools are unavailable."""
    restart_window: Duration = 60.0
    unavailable_for: Duration = 30.0
    """How long a crash-looping capsule stays unavailable before one more try."""


class EnvConfig(_Model):
    """``[env]``: what the tool capsule's environment holds (nothing else)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    pass_: list[str] = Field(default_factory=list[str], alias="pass")
    """Host environment variables passed to the tool capsules."""
    secret: list[str] = Field(default_factory=list[str])
    """Variables whose values are never shown in approvals, audit or logs."""
    set: dict[str, str] = Field(default_factory=dict[str, str])
    """Fixed values to set in the tool capsules."""


_OWN_FOLDERS = ("tools", "src/tools", "policies", "hooks", "src/hooks", ".agent")
"""Project folders toolhost reads or writes itself: no data folder may overlap them."""


DEFAULT_DATA_QUOTA = 256 * 1024**2
"""The quota of a writable data folder whose policy gives none."""


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


class DataFolder(_Model):
    """``[capsules] data``: a project folder the tool capsules may use.

    Written ``data = "notes"`` (read-only) or ``data = { path = "notes", writable = true }``.
    """

    path: str = Field(min_length=1)
    """The folder, relative to the project; it must exist and lie inside the project."""
    writable: bool = Field(default=False, strict=True)
    """Whether tools may create, change and delete files in it (read-only by default)."""
    quota: Size | None = None
    """Bytes of disk a writable folder may use (a Wasm capsule enforces it); ``None`` on a
    read-only folder. A writable one without ``quota`` gets :data:`DEFAULT_DATA_QUOTA`."""

    @model_validator(mode="before")
    @classmethod
    def _default_quota(cls, value: object) -> object:
        if not isinstance(value, dict):
            return value
        given = cast("dict[str, object]", value)
        if given.get("writable") is True and "quota" not in given:
            return {**given, "quota": DEFAULT_DATA_QUOTA}
        return given

    @field_validator("quota")
    @classmethod
    def _quota_needs_writable(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("writable") is not True:
            raise ValueError(
                "a quota limits what tools may write: it needs writable = true "
                "(a read-only folder cannot grow)"
            )
        return value

    def resolve(self, root: Path) -> Path:
        """The folder on the host, symbolic links followed.

        Raises:
            ValueError: why the folder is refused (missing, a file, outside the project,
                the project itself or overlapping a folder toolhost uses itself).
        """
        if Path(self.path).is_absolute():
            hint = " (the whole file system)" if Path(self.path) == Path("/") else ""
            raise ValueError(
                f"{self.path!r}{hint} is an absolute path: name a folder inside the project, "
                "relative to it"
            )
        project = root.resolve()
        target = (project / self.path).resolve()
        if not target.is_relative_to(project):
            raise ValueError(
                f"{self.path!r} is outside the project (it resolves to {target}): "
                "name a folder inside it"
            )
        if target == project:
            raise ValueError(
                f"{self.path!r} is the project itself (its policy, tools and state): "
                "name a folder inside it"
            )
        for own in _OWN_FOLDERS:
            if _overlaps(target, (project / own).resolve()):
                raise ValueError(
                    f"{self.path!r} overlaps the project's {own!r} folder, which toolhost "
                    "reads or writes itself: name a separate folder"
                )
        if not target.exists():
            raise ValueError(f"{self.path!r} does not exist (looked for {target})")
        if not target.is_dir():
            raise ValueError(f"{self.path!r} is a file, not a folder")
        return target

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> DataFolder:
        context = cast("dict[str, object]", info.context or {})
        root = context.get("root")
        if isinstance(root, Path):
            self.resolve(root)
        return self


def _data_shorthand(value: object) -> object:
    if isinstance(value, str):
        return {"path": value}
    if not isinstance(value, dict):
        raise ValueError(
            'data is a folder name, "notes", or a table { path = "notes", writable = true }'
        )
    return cast("dict[str, object]", value)


class CapsulesConfig(_Model):
    """``[capsules]``: where tool files load and where agent code runs."""

    default: Literal["subprocess", "wasm"] = "subprocess"
    wasm: list[str] = Field(default_factory=list[str])
    code: Literal["wasm", "subprocess"] = "wasm"
    data: Annotated[DataFolder | None, BeforeValidator(_data_shorthand)] = None
    """A project folder the tool capsules may use: a Wasm capsule sees it at ``/data``."""


class AuditConfig(_Model):
    """``[audit]``: how durable a decision is before its call runs."""

    durability: Literal["process", "power"] = "process"
    """``process``: safe against the host being killed or crashing (the default, about a
    microsecond per call); ``power``: also against a power cut (a disk sync per decision,
    shared by the calls in flight together). Read when the host starts."""


class Defaults(_Model):
    """``[defaults]``: the decision when no rule matches, per caller."""

    agent: Decision = "deny"
    script: Decision = "allow"
    app: Decision = "allow"
    tool: Decision = "deny"
    escalation_timeout: Duration = 120.0


_TOOL_GLOB = re.compile(r"^[\w.*?]+$")
_WHEN_KEYS = ("regex", "gt", "ge", "lt", "le", "in")


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
    return items


def _condition(value: Any) -> Any:
    """Check one ``when.PARAM`` condition; the policy module compiles it."""
    if isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        table: dict[str, Any] = value  # pyright: ignore[reportUnknownVariableType]
        unknown = sorted(set(table) - set(_WHEN_KEYS))
        if unknown or not table:
            raise ValueError(
                f"a condition table takes {', '.join(_WHEN_KEYS)}"
                + (f", not {', '.join(unknown)}" if unknown else "")
            )
        if "regex" in table:
            pattern = table["regex"]
            if not isinstance(pattern, str):
                raise ValueError("regex takes a string")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"regex {pattern!r} does not compile: {exc}") from exc
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
        "{regex = ..}, {gt/ge/lt/le = ..}, {in = [..]}"
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


def _line_of(text: str, loc: tuple[int | str, ...]) -> int | None:
    """Best-effort line of a validation error's location in the TOML source."""
    lines = text.splitlines()
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
        header = re.compile(rf"^\s*\[\[?\s*{re.escape(section)}\s*\]\]?\s*(#.*)?$")
        hits = [i for i, line in enumerate(lines) if header.match(line)]
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


def _parse_file(
    path: Path, text: str | None = None, display: str | None = None, root: Path | None = None
) -> PolicyFile:
    name = str(path)
    if text is None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyFileError(f"cannot read: {exc}", file=name) from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise PolicyFileError(
            f"not valid TOML: {exc}", file=name, line=int(m.group(1)) if m else None
        ) from exc
    try:
        # Paths in the file (``[capsules] data``) are checked against the project folder.
        parsed = PolicyFile.model_validate(data, context={"root": root or path.parent})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(first["loc"])
        field = ".".join(str(p) for p in loc) or None
        message = first["msg"]
        context = first.get("ctx") or {}
        if first["type"] == "value_error" and "error" in context:
            message = str(context["error"])  # without pydantic's "Value error, " prefix
        given = first.get("input")
        if isinstance(given, (str, int, float)) and first["type"] != "value_error":
            message += f" (got {given!r:.60})"
        raise PolicyFileError(message, file=name, line=_line_of(text, loc), field=field) from exc
    for index, rule in enumerate(parsed.rules):
        line = _line_of(text, ("rules", index))
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
        files.append((display, _parse_file(path, text, display, root)))
        digest.update(f"{display}\0{len(text)}\0".encode())
        digest.update(text.encode())
    merged: dict[str, Any] = {"files": files, "version": digest.hexdigest()[:12]}
    for attr in ("defaults", "limits", "env", "capsules", "audit"):
        value = _merge_one(files, attr)
        if value is not None:
            merged[attr] = value
    return PolicyConfig(**merged)
