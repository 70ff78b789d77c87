"""Find the tool files and what they export, by reading them with ``ast``.

No user code runs in the host process: every fact here comes from parsing the source.
The rules (mirrored at run time by ``capsule._registry``, and checked against it when a
capsule loads) are:

* every ``tools/NAME.py`` is a tool file (NAME an NFKC-normalised identifier, not a
  keyword); files whose name starts with ``_`` are private helpers: importable by
  siblings, exporting nothing;
* with ``__all__`` (a literal list or tuple of strings, optionally extended with
  ``+=``), the file exports the names it lists; without it, every public top-level name
  it defines;
* a function (``def``, ``async def``, a top-level ``f = lambda ...``, or an alias
  ``g = f``) is one tool. A name imported from a sibling file is followed to its
  definition when ``__all__`` lists it;
* an object (``name = SomeClass(...)`` for a class defined in the tools package, or
  ``name = SimpleNamespace(a=f, ...)``) exports its public methods (members) as tools
  named ``name.method``; properties are not methods;
* classes, constants and other data are not tools;
* a module-level ``__uses__ = {"send_email": ["notify"]}`` (a literal dict) lists, for a
  tool of this file (named as inside it: ``EXPORT`` or ``EXPORT.MEMBER``), the tools it may
  call through its context (canonical names, or ``tools.FILE.EXPORT``); a tool it does not
  list may call any tool policy allows. Keys and names that reach no tool are errors.

Each top-level name is bound by the last statement that binds it (``def``, assignment,
import, ``del``), as at run time. Names bound only inside ``if``/``try`` blocks are not
seen; the load check then refuses the file, naming both lists.

A tool's name is how the agent writes the call: ``now``, ``kanban.add``. An export whose
name shadows a Python builtin or a host global is not installed as a global; its tool name
is ``tools.FILE.EXPORT``. Two files exporting the same global name is an error naming both.

This module walks the folder (file names, private files, one owner per global name); each
file is read by ``_reading``, its tools are picked by ``_exports``, and the results are
the types of ``_specs``.
"""

from __future__ import annotations

import ast
import dataclasses
import keyword
import unicodedata
from collections.abc import Mapping
from pathlib import Path

from host.errors import DeclarationError

from ._exports import exports_of
from ._reading import Finder, Module, parse_module
from ._specs import Discovery, ToolFile, ToolSpec

__all__ = ["discover"]


def _tool_modules(tools_dir: Path) -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    for path in sorted(tools_dir.glob("*.py")):
        name = path.stem
        if name.startswith(".") or not path.is_file():
            continue  # editor lock files and the like; Python cannot import them either
        problem = None
        if not name.isidentifier():
            problem = "is not a Python identifier"
        elif keyword.iskeyword(name):
            problem = "is a Python keyword, so ``tools.NAME`` cannot be written"
        elif unicodedata.normalize("NFKC", name) != name:
            # Python reads identifiers in code NFKC-normalised: ``tools.NAME`` would
            # name another file than this one.
            problem = "is not NFKC-normalised, so ``tools.NAME`` in code would mean another name"
        if problem is not None:
            raise DeclarationError(
                f"tool file name {path.name!r} {problem}; rename it", file=str(path)
            )
        found.append((name, path))
    return found


def _where(spec: ToolSpec) -> str:
    here = f"{spec.file}.py"
    if spec.source.name == here:
        return f"{here} (line {spec.line})"
    return f"{here} (from {spec.source.name} line {spec.line})"


def discover(tools_dir: Path) -> Discovery:
    """Read every tool file in ``tools_dir``. Raises :class:`DeclarationError`."""
    modules = {name: parse_module(name, path) for name, path in _tool_modules(tools_dir)}
    finder = Finder(modules)
    tools: dict[str, ToolSpec] = {}
    owners: dict[str, ToolSpec] = {}  # global (or tools.F.E) name -> first tool claiming it
    files: list[ToolFile] = []
    for name, mod in modules.items():
        private = name.startswith("_")
        if private:
            files.append(ToolFile(name, mod.path, True))
            continue
        specs = list(exports_of(finder, mod))
        for spec in specs:
            key = spec.export if spec.installed else f"tools.{spec.file}.{spec.export}"
            other = owners.get(key)
            if other is not None and other.file != spec.file:
                raise DeclarationError(
                    f"{spec.export!r} is exported by two files: "
                    f"{_where(other)} and {_where(spec)}; rename one of them",
                    file=str(spec.source),
                    line=spec.line,
                )
            owners.setdefault(key, spec)
            tools[spec.name] = spec
        files.append(ToolFile(name, mod.path, False, tuple(s.name for s in specs)))
    for name, mod in modules.items():
        if not name.startswith("_"):
            _apply_uses(mod, tools)
    return Discovery(tools_dir=tools_dir, files=tuple(files), tools=tools)


def _apply_uses(mod: Module, tools: dict[str, ToolSpec]) -> None:
    """Give the tools of ``mod`` the ``uses`` lists its ``__uses__`` declares."""
    entry = mod.assigns.get("__uses__")
    if entry is None:
        return
    node, line = entry

    def error(problem: str) -> DeclarationError:
        return DeclarationError(f"__uses__ {problem}", file=str(mod.path), line=line)

    try:
        declared = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise error(
            'must be a literal dict, {"tool": ["other.tool", ...]}, with nothing computed'
        ) from None
    if not isinstance(declared, dict):
        raise error('must be a dict: {"tool": ["other.tool", ...]}')
    by_name: Mapping[str, ToolSpec] = {
        **{spec.qualified: spec for spec in tools.values()},
        **tools,
    }
    mine = {spec.runtime_name: spec for spec in tools.values() if spec.file == mod.name}
    for key, names in declared.items():  # pyright: ignore[reportUnknownVariableType]
        spec = mine.get(key) if isinstance(key, str) else None
        if spec is None:
            raise error(
                f"names {key!r}, which is no tool of {mod.name}.py (its tools: "
                f"{', '.join(sorted(mine)) or 'none'})"
            )
        if not isinstance(names, (list, tuple)) or not all(
            isinstance(n, str)
            for n in names  # pyright: ignore[reportUnknownVariableType]
        ):
            raise error(f"[{key!r}] must be a list of tool names")
        uses: list[str] = []
        for used in names:  # pyright: ignore[reportUnknownVariableType]
            target = by_name.get(used)  # pyright: ignore[reportUnknownArgumentType]
            if target is None:
                raise error(f"[{key!r}] names {used!r}, which is no tool")
            uses.append(target.name)
        tools[spec.name] = dataclasses.replace(spec, uses=tuple(dict.fromkeys(uses)))
