"""Tool files in a Wasm capsule (``[capsules] wasm = ["math"]``): same protocol, same
module persistence, but the tools run in a CPython-WASI guest with no network, no
processes and no files except their own folder, read-only, and the policy's data folder
(``[capsules] data``), read-only unless the policy says it is writable.

:func:`start_wasm_capsule` is a transport factory like ``start_subprocess``, and is started
through the same ``start_process``: the guest runs the ordinary serve loop
(``capsule._wasi.tool_capsule_main``) over its child's stdin/stdout pipes. :func:`mixed_factory`
starts the subprocess capsule for the other files next to it and routes each call by
tool, so the supervisor sees one capsule (restarted as one). :func:`tool_capsules` picks
the factory a policy asks for.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Final, Literal

import anyio
import anyio.abc
import anyio.to_thread

from host._events import EventBus
from host.settings import CapsulesConfig, DataFolder

from . import _forkserver, _wasm, _wasm_cache
from ._capsule_pool import CapsulePool
from ._guard import containment
from ._subprocess import (
    SubprocessTransport,
    exit_reason,
    start_process,
    subprocess_capsules,
)
from ._transport import LoadFailed, LoadReport, LoadRequest, Transport, TransportFactory

__all__ = [
    "start_wasm_capsule",
    "mixed_factory",
    "tool_capsules",
    "capsule_of",
    "DATA_GUEST",
    "DATA_ENV",
]

TOOLS_GUEST: Final = "/project/tools"
"""Where a Wasm capsule sees the tools folder (read-only)."""

DATA_GUEST: Final = "/data"
"""Where a Wasm capsule sees the policy's data folder (``[capsules] data``)."""

DATA_ENV: Final = "TOOLHOST_DATA"
"""The variable that tells tool code where the data folder is: ``/data`` in a Wasm
capsule, the folder's host path in a subprocess capsule; unset without a data folder."""

logger = logging.getLogger("toolhost.capsule")

MEMORY: Final = 1024 * 1024 * 1024
"""The memory cap of one Wasm tool capsule."""


def _exit_reason(code: int | None, tail: bytes) -> str:
    text = tail.decode("utf-8", "replace").strip().splitlines()
    trap = [line for line in text if line.startswith(_wasm.TRAP_PREFIX)]
    if trap:
        return "the guest trapped: " + trap[-1][len(_wasm.TRAP_PREFIX) :]
    quota = [line for line in text if line.startswith(_wasm.QUOTA_PREFIX)]
    if quota or code == _wasm.QUOTA_EXIT:
        said = quota[-1][len("toolhost-wasm: ") :] if quota else "the data folder is over its quota"
        return f"it was stopped: {said}"
    return exit_reason(code)


async def _check_quota(folder: Path, fd: int, quota: int) -> None:
    """Refuse to start a capsule on a data folder (``fd``, opened at ``folder``) already
    over its quota: a capsule the quota stopped would otherwise be restarted to write
    more."""
    try:
        used = await anyio.to_thread.run_sync(_wasm.disk_usage, fd)
    except OSError as exc:
        raise LoadFailed(
            "the policy's data folder is over its quota or cannot be measured "
            f"({exc.strerror or type(exc).__name__}): "
            f"free space in {folder} (delete files) and call again",
            LoadReport(),
        ) from None
    if used > quota:
        raise LoadFailed(
            f"the policy's data folder is over its quota ({used} bytes used, the quota is "
            f"{quota}): free space in {folder} (delete files) and call again",
            LoadReport(),
        )


async def start_wasm_capsule(
    request: LoadRequest,
    events: EventBus,
    task_group: anyio.abc.TaskGroup,
    *,
    data: _wasm.Preopen | None = None,
) -> SubprocessTransport:
    """Start a Wasm tool capsule, load ``request.files`` into it, return it serving.

    ``data`` is the policy's data folder, already checked, mounted at its ``guest`` path
    (:data:`DATA_GUEST`), which :data:`DATA_ENV` names to the tools.
    """
    try:
        prepared = await _wasm_cache.prepare()
    except _wasm.WasmUnavailable as exc:
        raise LoadFailed(f"the Wasm runtime is unavailable: {exc}", LoadReport()) from exc
    for reason in prepared.rejected:  # what was found wrong in the cache and built again
        events.emit("cache_rejected", request.session, cache="wasm", reason=reason)
    env = {**request.env, "MSGPACK_PUREPYTHON": "1"}
    preopens = [
        _wasm.Preopen(prepared.lib, _wasm.LIB_GUEST, writable=False),
        _wasm.Preopen(request.tools_dir, TOOLS_GUEST, writable=False),
    ]
    if data is not None:
        env[DATA_ENV] = data.guest
        preopens.append(data)
    spec = _wasm.GuestSpec(
        cwasm=prepared.cwasm,
        argv=_wasm.guest_argv("from capsule._wasi import tool_capsule_main; tool_capsule_main()"),
        env=env,
        preopens=preopens,
        memory=MEMORY,
    )

    async def spawn() -> tuple[anyio.abc.Process, int, int]:
        # From the fork server, as code sandboxes start: faster, and the spec (the
        # variables passed to the tools) goes over its socket, to a child born
        # non-dumpable. Else a child of the host's own.
        if _forkserver.wanted():
            try:
                return await _forkserver.spawn_leased(prepared.cwasm, spec)
            except (_forkserver.ForkUnavailable, OSError) as exc:
                logger.warning("starting a Wasm capsule without the fork server: %s", exc)
        return await _wasm.spawn_guest(spec)

    guest_request = dataclasses.replace(request, tools_dir=TOOLS_GUEST)
    return await start_process(guest_request, events, task_group, spawn=spawn, reason=_exit_reason)


class _Mixed:
    """Two capsules presented as one: calls are routed by tool name."""

    def __init__(self, parts: list[Transport], routes: Mapping[str, Transport]) -> None:
        self._parts: list[Transport] = parts
        self._routes = routes
        report = LoadReport()
        for part in parts:
            report.files.update(part.report.files)
        report.pid = parts[0].report.pid
        report.python = parts[0].report.python
        self._report = report

    @property
    def report(self) -> LoadReport:
        return self._report

    @property
    def alive(self) -> bool:
        return all(part.alive for part in self._parts)

    async def call(
        self,
        call_id: int,
        tool: str,
        encoded: bytes,
        timeout: float,
        context: Mapping[str, Any] | None = None,
    ) -> Any:
        route = self._routes[tool]
        if context is None:
            return await route.call(call_id, tool, encoded, timeout)
        return await route.call(call_id, tool, encoded, timeout, context)

    async def kill(self, reason: str) -> None:
        # Every part at once, and whatever happens to the caller meanwhile: a part slow
        # to exit (each waits for its process, bounded) or a cancellation must never
        # leave another part running.
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for part in self._parts:
                    tg.start_soon(part.kill, reason)

    async def linked(self) -> None:
        """When one part ends, end the other: the supervisor restarts them as one."""
        # Polled: the Transport interface has no "ended" event to wait on.
        while all(part.alive for part in self._parts):  # noqa: ASYNC110
            await anyio.sleep(0.25)
        await self.kill("a sibling capsule ended")


def _subset(request: LoadRequest, files: list[str]) -> LoadRequest:
    tools = {name: target for name, target in request.tools.items() if target[0] in files}
    return dataclasses.replace(request, files=files, tools=tools)


def _open_beneath(root: Path, folder: Path) -> int:
    """A descriptor of ``folder``, reached from the project folder ``root`` one name at a
    time and never through a symbolic link (``O_NOFOLLOW`` on each), so it is the folder
    the check saw, or an error."""
    project = root.resolve()
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    fd = os.open(project, flags)
    try:
        for name in folder.relative_to(project).parts:
            inner = os.open(name, flags | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _data_folder(data: DataFolder | None, root: Path) -> tuple[Path, int] | None:
    """The data folder checked again now (it may have gone, or become a link, since), and
    opened once: everything after this uses the descriptor, never the path."""
    if data is None:
        return None
    try:
        folder = data.resolve(root)
    except ValueError as exc:
        raise LoadFailed(f"the policy's data folder is refused: {exc}", LoadReport()) from None
    try:
        return folder, _open_beneath(root, folder)
    except OSError as exc:
        raise LoadFailed(
            f"the policy's data folder is refused: {data.path!r} changed while it was "
            f"checked ({exc.strerror or type(exc).__name__}; a link where a folder was?)",
            LoadReport(),
        ) from None


def mixed_factory(
    wasm_files: Collection[str],
    *,
    default: str,
    fallback: TransportFactory,
    data: DataFolder | None = None,
    root: Path | None = None,
) -> TransportFactory:
    """Tool files in ``wasm_files`` (all of them when ``default`` is ``"wasm"``) load into a
    Wasm capsule; the rest into ``fallback``'s capsule.

    ``data`` (relative to the project folder ``root``) is checked at every start and given
    to both: the Wasm capsule mounts it, the other one only learns its path.
    """
    chosen = set(wasm_files)

    async def start(request: LoadRequest, events: EventBus, task_group: anyio.abc.TaskGroup) -> Any:
        opened = _data_folder(data, root or Path(request.cwd))
        try:
            return await started(request, events, task_group, opened)
        finally:
            if opened is not None:
                os.close(opened[1])  # the capsule has its own copy, or never started

    async def started(
        request: LoadRequest,
        events: EventBus,
        task_group: anyio.abc.TaskGroup,
        opened: tuple[Path, int] | None,
    ) -> Any:
        folder = None if opened is None else opened[0]
        in_wasm = [f for f in request.files if default == "wasm" or f in chosen]
        others = [f for f in request.files if f not in in_wasm]
        parts: list[Transport] = []
        routes: dict[str, Transport] = {}

        async def wasm(request: LoadRequest, events: EventBus, tg: anyio.abc.TaskGroup) -> Any:
            mount = None
            if opened is not None:
                assert data is not None
                path, fd = opened
                quota = data.quota if data.writable else None
                mount = _wasm.Preopen(
                    str(path), DATA_GUEST, writable=data.writable, quota=quota, fd=fd
                )
                if quota is not None:
                    await _check_quota(path, fd, quota)
            return await start_wasm_capsule(request, events, tg, data=mount)

        async def native(request: LoadRequest, events: EventBus, tg: anyio.abc.TaskGroup) -> Any:
            if folder is not None:
                request = dataclasses.replace(request, env={**request.env, DATA_ENV: str(folder)})
            return await fallback(request, events, tg)

        try:
            for files, factory in ((others, native), (in_wasm, wasm)):
                if not files:
                    continue
                sub = _subset(request, files)
                part: Transport = await factory(sub, events, task_group)
                parts.append(part)
                routes.update(dict.fromkeys(sub.tools, part))
        except BaseException:
            with anyio.CancelScope(shield=True):
                for part in parts:
                    await part.kill("a sibling capsule failed to load")
            raise
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return await native(request, events, task_group)
        mixed = _Mixed(parts, routes)
        task_group.start_soon(mixed.linked)
        return mixed

    return start


def _caches() -> tuple[Path, ...]:
    """The host's cache folders, which tools may never write."""
    found = [_wasm_cache.cache_root()]
    scopes = os.environ.get("TOOLHOST_CACHE_DIR")
    if scopes:
        found.append(Path(scopes))
    return tuple(found)


def tool_capsules(
    capsules: CapsulesConfig,
    root: Path,
    *,
    egress_port: int | None = None,
    pool: CapsulePool | None = None,
) -> TransportFactory:
    """The transport factory ``[capsules]`` asks for, for the project folder ``root``:
    subprocess capsules (under ``[capsules] python``, if set; confined to the project's
    guard; taking the capsules ``pool`` starts ahead), plus a Wasm capsule for the files
    it names. ``egress_port``: the egress proxy's port, for a ``network`` that names
    hosts (the capsules may connect to it)."""
    network: Literal["none", "all"] | list[int] = (
        capsules.network if isinstance(capsules.network, str) else capsules.network_ports()
    )
    if egress_port is not None and capsules.network_hosts():
        network = [*capsules.network_ports(), egress_port]
    native = subprocess_capsules(
        capsules.interpreter(root),
        root,
        _caches(),
        zygote=capsules.zygote,
        network=network,
        pool=pool,
    )
    if capsules.default == "wasm" or capsules.wasm or capsules.data is not None:
        return mixed_factory(
            capsules.wasm,
            default=capsules.default,
            fallback=native,
            data=capsules.data,
            root=root,
        )
    return native


def _size(size: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"


def capsule_of(capsules: CapsulesConfig, file: str) -> tuple[dict[str, Any], str]:
    """Where ``[capsules]`` runs the tools of ``file``, as data and as text whose last
    line says where (``toolhost policy check`` prints them); for a subprocess capsule,
    also how it is confined, and a warning line before it when Landlock is missing."""
    kind = "wasm" if capsules.default == "wasm" or file in capsules.wasm else "subprocess"
    text = f"capsule: {kind}"
    data: dict[str, Any] = {"kind": kind, "data": None}
    if kind == "subprocess" and capsules.python is not None:
        data["python"] = capsules.python
        text += f" under {capsules.python}"
    warning = None
    if kind == "subprocess":
        held = containment()
        data["containment"] = held.to_data()
        if held.landlock:
            text += f", confined by Landlock (ABI {held.abi})"
        warning = held.warning()
    folder = capsules.data
    if folder is not None:
        mode = "writable" if folder.writable else "read-only"
        if folder.quota is not None:
            mode += f", quota {_size(folder.quota)}"
        if kind == "wasm":
            where = DATA_GUEST
            text += f", data folder {folder.path} ({mode}) at {DATA_GUEST}"
        else:
            where = None
            text += f", data folder {folder.path} named by ${DATA_ENV} (not enforced here)"
        data["data"] = {
            "path": folder.path,
            "writable": folder.writable,
            "quota": folder.quota,
            "guest": where,
        }
    if warning is not None:
        text = f"warning: {warning}\n{text}"
    return data, text
