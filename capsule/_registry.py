"""Import the tool files once, as one package, and find what each really exports.

The tools folder becomes the package ``tools`` (so siblings import each other
relatively, ``from ._helpers import slug``), and each file is imported on its own: one
file that raises at import time does not keep the others from loading.

The package loads from source only, compiled afresh at every start: never from a
``.pyc`` (one planted in ``tools/__pycache__`` would run instead of the source that the
declarations show, and keep running after the source changed), never from a sourceless
``.pyc`` or an extension module dropped into the folder, and nothing is written back into
it. Compiling costs a few milliseconds for a typical tools folder.

The export rules mirror the host's ``ast`` discovery exactly (listed in
``host.declare._discovery``, applied in ``host.declare._exports``); the host compares the
two lists and refuses a file whose run-time exports differ from what it declared:

* with ``__all__``: the names it lists; without: every public top-level name;
* a function (or a wrapper that keeps ``__wrapped__``) is a tool if it was defined in this
  file, or is listed in ``__all__``;
* an instance of a class defined in the tools package, or a ``types.SimpleNamespace``, is
  an object export: its public methods (from project classes in its MRO) or its public
  function members (defined in the tools package) are tools named ``OBJECT.MEMBER``. An
  object the file imported from a sibling is an export only when ``__all__`` lists it:
  while a file loads, the sibling modules it imports from are recorded, and an object that
  is a top-level value of one of them is taken as imported;
* classes, modules and data are never tools.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import sys
import types
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PACKAGE", "Target", "install_package", "import_file", "runtime_exports", "resolve"]

PACKAGE = "tools"


@dataclass(frozen=True, slots=True)
class Target:
    """One callable tool, ready to call."""

    name: str
    fn: Callable[..., Any]
    params: tuple[tuple[str, int], ...]
    is_async: bool
    by_name: bool = False
    """Every parameter may be passed by name (no positional-only, no ``*args``/``**kwargs``):
    the bound argument map is then the call's keyword arguments as it is."""
    context: str | None = None
    """The parameter annotated ``ToolContext`` (in ``params`` too), which the capsule
    fills in for each call; None for a tool that takes no context."""


class _SourceLoader(importlib.machinery.SourceFileLoader):
    """A tool module's code, compiled from its source every time; no bytecode is read
    or written."""

    def get_code(self, fullname: str) -> types.CodeType:
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


class _SourceOnly:
    """Finds the modules of the tool packages, first on ``sys.meta_path``: ``.py`` files
    only, each with :class:`_SourceLoader`; anything else in a tool package (a sourceless
    ``.pyc``, an extension module) is not found. (A meta path finder by its methods:
    ``importlib.abc`` is slow to import in the Wasm guest.)"""

    def __init__(self) -> None:
        self.packages: set[str] = set()
        self._finders: dict[str, importlib.machinery.FileFinder] = {}

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        del target
        if fullname.split(".", 1)[0] not in self.packages or "." not in fullname:
            return None  # the package itself is installed by install_package
        for entry in path or ():
            finder = self._finders.get(entry)
            if finder is None:
                finder = importlib.machinery.FileFinder(
                    entry, (_SourceLoader, importlib.machinery.SOURCE_SUFFIXES)
                )
                self._finders[entry] = finder
            spec = finder.find_spec(fullname)
            if spec is not None:
                return spec
        raise ModuleNotFoundError(
            f"No module named {fullname!r} (tool files load from .py source only)",
            name=fullname,
        )

    def invalidate_caches(self) -> None:
        for finder in self._finders.values():
            finder.invalidate_caches()


_source_only = _SourceOnly()


def install_package(tools_dir: str, package: str = PACKAGE) -> None:
    """Make ``tools_dir`` importable as ``package`` (with or without an ``__init__.py``),
    from source only."""
    parent = tools_dir.rsplit("/", 1)[0] if "/" in tools_dir else "."
    if parent not in sys.path:
        sys.path.insert(0, parent)
    _source_only.packages.add(package)
    if _source_only not in sys.meta_path:
        sys.meta_path.insert(0, _source_only)
    init = f"{tools_dir}/__init__.py"
    try:
        with open(init, "rb"):
            pass
        has_init = True
    except OSError:
        has_init = False
    if has_init:
        spec = importlib.util.spec_from_file_location(
            package,
            init,
            loader=_SourceLoader(package, init),
            submodule_search_locations=[tools_dir],
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[package] = module
        with _recording_imports(package):
            spec.loader.exec_module(module)
    else:
        module = types.ModuleType(package)
        module.__path__ = [tools_dir]
        module.__package__ = package
        sys.modules[package] = module


_sources: dict[str, set[str]] = {}
"""Module name -> the package modules it imported names from (recorded while loading)."""


def _in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@contextlib.contextmanager
def _recording_imports(package: str) -> Generator[None]:
    """Record, for each module of ``package`` being imported, which modules it imports from.

    ``from .state import board`` runs ``__import__("state", globals, ..., ("board",), 1)``;
    this is the only run-time trace of where a top-level name came from.
    """
    original = builtins.__import__

    def recording(
        name: str,
        globals: Mapping[str, object] | None = None,
        locals: Mapping[str, object] | None = None,
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> types.ModuleType:
        module = original(name, globals, locals, fromlist or (), level)
        importer = globals.get("__name__") if globals is not None else None
        if isinstance(importer, str) and _in_package(importer, package) and fromlist:
            found = _sources.setdefault(importer, set())
            found.add(module.__name__)
            for item in fromlist:
                sub = getattr(module, item, None)
                if isinstance(sub, types.ModuleType):
                    found.add(sub.__name__)  # ``from . import state``: names are read off it
        return module

    builtins.__import__ = recording
    try:
        yield
    finally:
        builtins.__import__ = original


def import_file(module: str, package: str = PACKAGE) -> types.ModuleType:
    """Import ``package.module`` (once), recording where its imported names come from."""
    with _recording_imports(package):
        return importlib.import_module(f"{package}.{module}")


def _imported_values(module: types.ModuleType, package: str) -> set[int]:
    """Ids of the top-level values of the package modules ``module`` imported from."""
    ids: set[int] = set()
    for source in _sources.get(module.__name__, ()):
        other = sys.modules.get(source)
        if other is not None and other is not module and _in_package(source, package):
            ids.update(id(value) for value in vars(other).values())
    return ids


def _is_function(obj: object) -> bool:
    if isinstance(obj, type):
        return False
    return inspect.isroutine(obj) or (callable(obj) and hasattr(obj, "__wrapped__"))


def _project_class(cls: type, package: str) -> bool:
    return cls.__module__ == package or cls.__module__.startswith(package + ".")


def _namespace_member(value: object, package: str) -> bool:
    """A function defined in the tools package (not a bound method, not a builtin)."""
    module = getattr(value, "__module__", None)
    return (
        _is_function(value)
        and not inspect.ismethod(value)
        and isinstance(module, str)
        and _in_package(module, package)
    )


def _object_members(obj: object, package: str) -> list[str] | None:
    """The public callable members of an object export, or None if it is not one."""
    if type(obj) is types.SimpleNamespace:
        return sorted(
            name
            for name, value in vars(obj).items()
            if not name.startswith("_") and _namespace_member(value, package)
        )
    cls = type(obj)
    if not _project_class(cls, package):
        return None
    names = {
        name
        for klass in cls.__mro__
        if _project_class(klass, package)
        for name in vars(klass)
        if not name.startswith("_")
    }
    members: list[str] = []
    for name in sorted(names):
        # The class that defines the name first in the MRO decides what it is, as for
        # attribute lookup: a subclass's ``name = None`` hides a base class's method.
        owner = next(klass for klass in cls.__mro__ if name in vars(klass))
        value = vars(owner)[name]
        if _project_class(owner, package) and (
            isinstance(value, (staticmethod, classmethod)) or inspect.isfunction(value)
        ):
            members.append(name)
    return members


def runtime_exports(module: types.ModuleType, package: str = PACKAGE) -> list[str]:
    """Tool names this module really exports, by the rules above, sorted."""
    namespace = vars(module)
    listed = namespace.get("__all__")
    if listed is not None:
        candidates = [str(name) for name in listed]
    else:
        candidates = [name for name in namespace if not name.startswith("_")]
    names: list[str] = []
    imported: set[int] | None = None
    for name in candidates:
        if name not in namespace:
            continue
        obj = namespace[name]
        if isinstance(obj, (type, types.ModuleType)):
            continue
        if _is_function(obj):
            if listed is not None or getattr(obj, "__module__", None) == module.__name__:
                names.append(name)
            continue
        if listed is None:
            if imported is None:
                imported = _imported_values(module, package)
            if id(obj) in imported:
                continue  # imported from a sibling: an export only when __all__ lists it
        members = _object_members(obj, package)
        if members:
            names.extend(f"{name}.{member}" for member in members)
    return sorted(names)


def resolve(
    module: types.ModuleType,
    name: str,
    path: list[str],
    params: list[tuple[str, int]],
    context: str | None = None,
) -> Target:
    """Find the callable at ``path`` (export, then member) inside ``module``.

    ``params`` are every parameter's (name, kind), the context's included; ``context`` is
    the name of the parameter the capsule fills with a ``ToolContext``, if any.

    A path that is missing or not callable at run time does not fail the load here: the
    file's run-time exports then differ from what discovery declared, and the host refuses
    the file with both lists in the reason (an error here would hide that comparison).
    Should a call reach such a target anyway, it raises ``TypeError``.
    """
    obj: Any = module
    try:
        for part in path:
            obj = getattr(obj, part)
    except AttributeError:
        obj = None
    if not callable(obj):
        problem = f"{'.'.join(path)} is not callable at run time ({type(obj).__name__})"

        def not_callable(*args: Any, **kwargs: Any) -> Any:
            raise TypeError(problem)

        obj = not_callable
    is_async = inspect.iscoroutinefunction(obj) or inspect.iscoroutinefunction(
        getattr(obj, "__wrapped__", None)
    )
    kinds = tuple((p, k) for p, k in params)
    by_name = all(k in (1, 3) for _, k in kinds)
    return Target(name, obj, kinds, is_async, by_name, context if type(context) is str else None)
