"""Agent code checked against the declarations before it runs.

:class:`CodeChecker` keeps one pyright language server per host that the sessions share,
started on the first check and started again when it has died. Its workspace is a
private folder holding ``__builtins__.pyi`` (the scope's ``tool_globals.pyi``: every tool
an ``async def`` builtin, ``tools.FILE.EXPORT`` and the error classes) and a
``pyrightconfig.json``. A check opens the source as a document of its own, pulls its
diagnostics and closes it, so checks of several sessions can overlap.

One session's code must not cost another its check. Each server's JavaScript heap is
bounded (``[limits] code_check_memory``) and each check is time-boxed; a check that
fails on the shared server (it died, or this or another check made it too slow: it is
then killed) is tried once more on a server of its own, one such check at a time, so the
check that broke the server fails alone and the others it took down with it pass. A
session whose check failed alone is suspect: its later checks go straight to that lane,
away from the shared server.

What the agent's REPL allows is not reported: top-level ``await`` (``async for``/``with``),
a bare last expression, names earlier runs of the session bound (``known``) and imports
of the run's own modules. The rest, errors only, become :class:`CodeDiagnostic` records
(line and column, a kind a model can act on, pyright's message).

A check is time-boxed (``[limits] code_check_timeout``, each of its two tries): a server
that is slow, cannot start or dies gives status ``unavailable`` with a note, never an
exception.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.abc

from host.capsules import CodeCheck, CodeDiagnostic, CodeError
from host.declare import HELPERS_PYI, Scope, ToolSpec

from ._langserver import LangServer, ServerGone, server_command
from ._quick import Signature, parse, quick_check, signatures, stub_names

__all__ = ["CodeChecker", "bound_names", "check_lines", "merged", "refusal"]

_HOST_PARENT = str(Path(__file__).resolve().parents[2])
"""Where ``host`` is importable from: the stub imports the error classes of ``host.errors``."""
_CONFIG: dict[str, Any] = {
    "typeCheckingMode": "standard",
    "reportUnusedCoroutine": "error",  # a tool call never awaited
    "reportUnusedExpression": "none",  # the last expression is the run's value
    "reportMissingModuleSource": "none",
    "enableTypeIgnoreComments": True,
}
_TOP_LEVEL = (
    '"await" allowed only within async function',
    'Use of "async" not allowed outside of async function',
)
"""Messages about what the sandbox allows at top level (it compiles with top-level await)."""
_UNDEFINED = re.compile(r'^"([^"]+)" is not defined')
_IMPORT = re.compile(r'^Import "([^"]+)" could not be resolved')
_KINDS: dict[str, Any] = {
    "reportUnusedCoroutine": "not_awaited",
    "reportUndefinedVariable": "unknown_name",
    "reportMissingImports": "unknown_name",
    "reportAttributeAccessIssue": "unknown_attribute",
    "reportCallIssue": "call",
}
_MAX_MESSAGE = 600
_MAX_DIAGNOSTICS = 50
_SUSPECTS = 1024
"""Sessions remembered as suspect (their check failed alone), the oldest forgotten first."""
Lane = Literal["shared", "alone"]

Status = Literal["clean", "errors", "unavailable"]


def bound_names(source: str | ast.Module | None) -> set[str]:
    """The names a run's top level binds (read with ``ast``; nothing runs), from its
    code or its tree (``parse``; ``None``: it does not parse, so none)."""
    tree = parse(source) if isinstance(source, str) else source
    if tree is None:
        return set()
    names: set[str] = set()

    def targets(node: ast.AST) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                names.add(sub.id)

    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                targets(target)
        elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
            targets(stmt.target)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    targets(item.optional_vars)
        for sub in ast.walk(stmt):
            if isinstance(sub, ast.NamedExpr):
                names.add(sub.target.id)
    return names


def refusal(check: CodeCheck) -> CodeError:
    """Why a run was refused (``code_check = "refuse"``), in words a model can act on."""
    if check.status == "unavailable":
        message = (
            f"the code did not run: it could not be checked ({check.note}) and code_check "
            "is refuse; run it again in a moment"
        )
    else:
        count = len(check.diagnostics)
        lines = [f"  {d}" for d in check.diagnostics]
        message = "\n".join(
            [
                f"the code did not run: checked against the tool declarations, it has "
                f"{count} error{'s' if count != 1 else ''}:",
                *lines,
                "fix these lines and run the code again",
            ]
        )
    return CodeError(kind="check_failed", type="CheckFailed", message=message)


def check_lines(check: CodeCheck) -> list[str]:
    """What the check found, one line each (for people and models reading text)."""
    if check.status == "unavailable":
        return [f"check: not checked ({check.note})"]
    return [f"check: {d} [{d.kind}]" for d in check.diagnostics]


def _env(home: Path) -> dict[str, str]:
    """The server's whole environment: nothing of the host's (no secrets). Its temporary
    folder is in the checker's own (``.tmp``, which pyright does not analyse): pyright
    makes a ``pyright-PID-*`` folder there and, killed, never removes it; in the system's
    it would be left behind by every server, and a crowded ``/tmp`` makes every capsule
    start slower (a Landlock rule per entry above a project under it)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TMPDIR": str(home / ".tmp"),
    }


def _isolated(command: list[str]) -> list[str] | None:
    """``command`` in a new user and network namespace (no network), if ``unshare`` exists."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    return [unshare, "--user", "--map-root-user", "--net", "--", *command]


class CodeChecker:
    """A host's checker: a language server the sessions share, started lazily and again
    when it died, and a lane of its own for a check that failed there (see the module).

    Args:
        scope: the declarations checked against.
        task_group: where the servers' reader tasks run.
        timeout: seconds each try of a check may take (``code_check_timeout``).
        memory: bytes each server's JavaScript heap may grow to (``code_check_memory``;
            None: node's default).
    """

    def __init__(
        self,
        scope: Scope,
        *,
        task_group: anyio.abc.TaskGroup,
        timeout: float,
        memory: int | None = None,
        tools: Iterable[ToolSpec] = (),
    ) -> None:
        self._scope = scope
        self._signatures: dict[str, Signature] = signatures(tools)
        self._stub: frozenset[str] | None = None
        """The stub's top-level names, read when first needed."""
        self._tg = task_group
        self.timeout = timeout
        self.memory = memory
        self._servers: dict[Lane, LangServer | None] = {"shared": None, "alone": None}
        self._locks: dict[Lane, anyio.Lock] = {"shared": anyio.Lock(), "alone": anyio.Lock()}
        self._alone = anyio.Lock()
        """Held by the one check on the lane of its own."""
        self._waiting_alone = 0
        self._suspects: dict[str, None] = {}
        """Sessions whose check failed alone (insertion order: the oldest first)."""
        self._root: Path | None = None
        self._docs = 0
        self.starts = 0
        """Language servers started, on both lanes."""
        self.retried = 0
        """Checks tried again alone after the shared server failed them."""
        self.isolated = False
        """Whether the server runs without network (its own network namespace)."""
        self._closed = False

    def retool(self, scope: Scope, tools: Iterable[ToolSpec] = ()) -> None:
        """New declarations: the next check starts a server that reads them."""
        self._scope = scope
        self._signatures = signatures(tools)
        self._stub = None
        for lane in self._servers:
            server, self._servers[lane] = self._servers[lane], None
            if server is not None:
                self._tg.start_soon(server.kill)

    def quick(
        self,
        source: str | ast.Module | None,
        *,
        known: Iterable[str] = (),
        modules: Iterable[str] = (),
    ) -> list[CodeDiagnostic]:
        """The quick checks (``_quick``) of the code or its tree: microseconds, no
        language server."""
        if self._stub is None:
            self._stub = frozenset(stub_names(_stub(self._scope)))
        return quick_check(source, self._signatures, (*known, *modules), self._stub)

    def suspect(self, session: str) -> bool:
        """Whether ``session``'s checks run away from the shared server (one failed alone)."""
        return session in self._suspects

    def forget(self, session: str) -> None:
        """The session closed."""
        self._suspects.pop(session, None)

    def _workspace(self) -> Path:
        """The checker's folder. What it may import is only what it holds: the stub, the
        host's packages (the stub's error classes) through links in ``lib/``, and an empty
        environment (``env/``): no site-packages, and not the folder above ``host`` (a
        checkout, or site-packages), whose other files agent code could import to have
        pyright quote their constants back."""
        root = self._root
        if root is None:
            root = self._root = Path(tempfile.mkdtemp(prefix="toolhost-check-"))
        _write(root / "__builtins__.pyi", _stub(self._scope))
        (root / ".tmp").mkdir(exist_ok=True)
        lib = root / "lib"
        lib.mkdir(exist_ok=True)
        for package in ("host", "capsule"):
            link = lib / package
            if not link.is_symlink():
                link.symlink_to(Path(_HOST_PARENT) / package, target_is_directory=True)
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        (root / "env" / "lib" / f"python{version}" / "site-packages").mkdir(
            parents=True, exist_ok=True
        )
        config = {
            **_CONFIG,
            "extraPaths": [str(lib)],
            "venvPath": str(root),
            "venv": "env",
            "pythonVersion": version,
        }
        _write(root / "pyrightconfig.json", json.dumps(config))
        return root

    async def _initialize(self, server: LangServer, root: Path) -> None:
        uri = root.as_uri()
        await server.request(
            "initialize",
            {
                "processId": os.getpid(),
                "rootUri": uri,
                "workspaceFolders": [{"uri": uri, "name": "agent"}],
                "capabilities": {"textDocument": {"diagnostic": {"dynamicRegistration": False}}},
            },
        )
        await server.notify("initialized", {})

    async def _running(self, lane: Lane) -> LangServer:
        async with self._locks[lane]:
            server = self._servers[lane]
            if server is not None and server.alive:
                return server
            if self._closed:
                raise ServerGone("the host is closing")
            root = await anyio.to_thread.run_sync(self._workspace)
            command = server_command(self.memory)
            isolated = _isolated(command)
            for attempt in ([isolated] if isolated else []) + [command]:
                server = await LangServer.start(attempt, cwd=root, env=_env(root), tg=self._tg)
                try:
                    await self._initialize(server, root)
                except (ServerGone, LookupError):
                    await server.kill()
                    continue  # no namespaces here: run it plain (still no host secrets)
                except BaseException:  # cancelled (the check's time is up): no orphan
                    with anyio.CancelScope(shield=True):
                        await server.kill()
                    raise
                self._servers[lane] = server
                self.starts += 1
                self.isolated = attempt is isolated
                return server
            raise ServerGone("the language server did not start")

    async def _drop(self, lane: Lane, server: LangServer) -> None:
        """End ``server`` (dead, or busy with what made a check fail), unless another
        already took its place on the lane."""
        if self._servers[lane] is server:
            self._servers[lane] = None
        with anyio.CancelScope(shield=True):
            await server.kill()

    async def check(
        self,
        source: str,
        *,
        mode: Literal["warn", "refuse"],
        known: Iterable[str] = (),
        modules: Iterable[str] = (),
        session: str | None = None,
    ) -> CodeCheck:
        """Check ``source`` (for ``session``); never raises for the checker's own
        failures."""
        relative = _relative_imports(source)
        if relative:  # never handed to pyright: it would read files outside the workspace
            return CodeCheck(mode=mode, status="errors", diagnostics=relative)
        suspect = session is not None and session in self._suspects
        raw = await self._attempt(source, "shared") if not suspect else None
        if not isinstance(raw, list):  # perhaps another check took the server down with it
            raw = await self._try_alone(source, session, retry=not suspect)
        if isinstance(raw, str):
            return CodeCheck(mode=mode, status="unavailable", note=raw)
        diagnostics = _read(raw, set(known), set(modules))
        return CodeCheck(
            mode=mode, status="errors" if diagnostics else "clean", diagnostics=diagnostics
        )

    async def _attempt(self, source: str, lane: Lane) -> list[Any] | str:
        """The raw diagnostics of one try on ``lane``, or why there are none (the server
        that failed it is ended: dead, or busy with what took too long)."""
        server: LangServer | None = None
        try:
            with anyio.fail_after(self.timeout):
                server = await self._running(lane)
                return await self._diagnostics(server, source)
        except TimeoutError:
            note = f"the check took longer than {self.timeout:g} s (code_check_timeout)"
        except (ServerGone, LookupError, OSError) as exc:
            note = f"the checker failed: {exc}"
        if server is not None:
            await self._drop(lane, server)
        return note

    async def _try_alone(self, source: str, session: str | None, *, retry: bool) -> list[Any] | str:
        """A try on the lane of its own, one check at a time; a session whose check fails
        there is suspect from then on. Its server is ended when no check waits for it."""
        self._waiting_alone += 1
        try:
            async with self._alone:
                self.retried += retry
                raw = await self._attempt(source, "alone")
                if isinstance(raw, str) and session is not None:
                    self._suspects[session] = None
                    while len(self._suspects) > _SUSPECTS:
                        del self._suspects[next(iter(self._suspects))]
                return raw
        finally:
            self._waiting_alone -= 1
            server = self._servers["alone"]
            if not self._waiting_alone and server is not None:
                await self._drop("alone", server)

    async def _diagnostics(self, server: LangServer, source: str) -> list[Any]:
        assert self._root is not None
        self._docs += 1
        uri = (self._root / f"run_{self._docs}.py").as_uri()
        document = {"uri": uri, "languageId": "python", "version": 1, "text": source}
        await server.notify("textDocument/didOpen", {"textDocument": document})
        try:
            report = await server.request("textDocument/diagnostic", {"textDocument": {"uri": uri}})
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(ServerGone):
                await server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        items: Any = _field(report, "items")
        if not isinstance(items, list):
            raise LookupError("the language server sent no diagnostics")
        return items  # pyright: ignore[reportUnknownVariableType]

    async def aclose(self) -> None:
        self._closed = True
        for lane in self._servers:
            server, self._servers[lane] = self._servers[lane], None
            with anyio.CancelScope(shield=True):
                if server is not None:
                    await server.kill()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)


def _stub(scope: Scope) -> str:
    """What agent code sees as builtins: the declarations' stub and code mode's helpers."""
    return scope.render_pyi() + HELPERS_PYI


def _write(path: Path, text: str) -> None:
    """``text`` into ``path`` if it holds anything else, in one step: a server of the
    other lane may be reading it (and watches it)."""
    with contextlib.suppress(OSError):
        if path.read_text(encoding="utf-8") == text:
            return
    temporary = path.with_name(f".{path.name}.new")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def merged(full: CodeCheck, quick: list[CodeDiagnostic]) -> CodeCheck:
    """The full check's findings with the quick checks' (one of each line and kind: the
    two point at different columns of the same mistake)."""
    if full.status == "unavailable":
        if not quick:
            return full
        return full.model_copy(update={"status": "errors", "diagnostics": quick, "level": "quick"})
    places = {(d.line, d.kind) for d in full.diagnostics}
    extra = [d for d in quick if (d.line, d.kind) not in places]
    if not extra:
        return full
    diagnostics = sorted([*full.diagnostics, *extra], key=lambda d: (d.line, d.column))
    return full.model_copy(update={"status": "errors", "diagnostics": diagnostics})


def _relative_imports(source: str) -> list[CodeDiagnostic]:
    """A diagnostic for each relative import in ``source`` (agent code is no package: it
    cannot import relatively, and a relative import climbing out of the checker's folder
    would have pyright read, and quote, any file it can reach). Empty when there is none
    or the source does not parse (pyright then says why)."""
    try:
        flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        tree: ast.AST = compile(source, "<run>", "exec", flags=flags, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found = [
        CodeDiagnostic(
            line=node.lineno,
            column=node.col_offset + 1,
            kind="unknown_name",
            message="relative imports are not available in agent code (it is not a "
            "package): import the run's modules by their names",
            rule="relativeImport",
        )
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]
    return found[:_MAX_DIAGNOSTICS]


def _field(value: Any, key: str) -> Any:
    """``value[key]`` when ``value`` is a JSON object, else None."""
    if isinstance(value, dict):
        mapping: dict[str, Any] = value  # pyright: ignore[reportUnknownVariableType]
        return mapping.get(key)
    return None


def _read(raw: list[Any], known: set[str], modules: set[str]) -> list[CodeDiagnostic]:
    out: list[CodeDiagnostic] = []
    for item in raw:
        if not isinstance(item, dict):
            continue
        d: dict[str, Any] = item  # pyright: ignore[reportUnknownVariableType]
        if d.get("severity", 1) != 1:
            continue  # errors only
        message = str(d.get("message", "")).replace("\xa0", " ")
        if message.startswith(_TOP_LEVEL):
            continue
        rule = d.get("code", d.get("rule"))  # pull diagnostics name the rule "code"
        rule = rule if isinstance(rule, str) else None
        match = _UNDEFINED.match(message)
        if rule == "reportUndefinedVariable" and match and match.group(1) in known:
            continue
        match = _IMPORT.match(message)
        if match and match.group(1).split(".")[0] in modules:
            continue
        start: Any = _field(_field(d, "range"), "start")
        kind = "syntax" if rule is None else _KINDS.get(rule, "type")
        line: Any = _field(start, "line")
        column: Any = _field(start, "character")
        out.append(
            CodeDiagnostic(
                line=(line if isinstance(line, int) else 0) + 1,
                column=(column if isinstance(column, int) else 0) + 1,
                kind=kind,
                message=message[:_MAX_MESSAGE],
                rule=rule,
            )
        )
    out.sort(key=lambda d: (d.line, d.column))
    return out[:_MAX_DIAGNOSTICS]
