"""Import the tool files once, as one package, and find what each really exports.

The tools folder becomes the package ``tools`` (so siblings import each other
relatively, ``from ._helpers import slug``), and each file is imported on its own: one
file that raises at import time does not keep the others from loading.

The export rules mirror the host's ``ast`` discovery exactly; the host compares the two
lists and refuses a file whose run-time exports differ from what it declared:

* with ``__all__``: the names it lists; without: every public top-level name;
* a function (or a wrapper that keeps ``__wrapped__``) is a tool if it was defined in this
  file, or is listed in ``__all__``;
* an instance of a class defined in the tools package, or a ``types.SimpleNamespace``, is
  an object export: its public methods (from project classes in its MRO) or its public
  callable members are tools named ``OBJECT.MEMBER``;
* classes, modules and data are never tools.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import types
from collections.abc import Callable
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


def install_package(tools_dir: str, package: str = PACKAGE) -> None:
    """Make ``tools_dir`` importable as ``package`` (with or without an ``__init__.py``)."""
    parent = tools_dir.rsplit("/", 1)[0] if "/" in tools_dir else "."
    if parent not in sys.path:
        sys.path.insert(0, parent)
    init = f"{tools_dir}/__init__.py"
    try:
        with open(init, "rb"):
            pass
        has_init = True
    except OSError:
        has_init = False
    if has_init:
        spec = importlib.util.spec_from_file_location(
            package, init, submodule_search_locations=[tools_dir]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[package] = module
        spec.loader.exec_module(module)
    else:
        module = types.ModuleType(package)
        module.__path__ = [tools_dir]
        module.__package__ = package
        sys.modules[package] = module


def import_file(module: str, package: str = PACKAGE) -> types.ModuleType:
    """Import ``package.module`` (once)."""
    return importlib.import_module(f"{package}.{module}")


def _is_function(obj: object) -> bool:
    if isinstance(obj, type):
        return False
    return inspect.isroutine(obj) or (callable(obj) and hasattr(obj, "__wrapped__"))


def _project_class(cls: type, package: str) -> bool:
    return cls.__module__ == package or cls.__module__.startswith(package + ".")


def _object_members(obj: object, package: str) -> list[str] | None:
    """The public callable members of an object export, or None if it is not one."""
    if type(obj) is types.SimpleNamespace:
        return sorted(
            name
            for name, value in vars(obj).items()
            if not name.startswith("_") and _is_function(value)
        )
    cls = type(obj)
    if not _project_class(cls, package):
        return None
    members: set[str] = set()
    for klass in cls.__mro__:
        if not _project_class(klass, package):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(value, (staticmethod, classmethod)) or inspect.isfunction(value):
                members.add(name)
    return sorted(members)


def runtime_exports(module: types.ModuleType, package: str = PACKAGE) -> list[str]:
    """Tool names this module really exports, by the rules above, sorted."""
    namespace = vars(module)
    listed = namespace.get("__all__")
    if listed is not None:
        candidates = [str(name) for name in listed]
    else:
        candidates = [name for name in namespace if not name.startswith("_")]
    names: list[str] = []
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
        members = _object_members(obj, package)
        if members:
            names.extend(f"{name}.{member}" for member in members)
    return sorted(names)


def resolve(
    module: types.ModuleType,
    name: str,
    path: list[str],
    params: list[tuple[str, int]],
) -> Target:
    """Find the callable at ``path`` (export, then member) inside ``module``."""
    obj: Any = module
    for part in path:
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{'.'.join(path)} is not callable")
    is_async = inspect.iscoroutinefunction(obj) or inspect.iscoroutinefunction(
        getattr(obj, "__wrapped__", None)
    )
    return Target(name, obj, tuple((p, k) for p, k in params), is_async)
