"""``__all__`` is the public API: this fails when it drifts from what the modules define.

STYLE.md habit 1 (after anyio's ``tests/test_all_attributes.py``): ``host/__init__.py``
re-exports the public names from private modules and lists them in a tuple ``__all__``.
A public class or function added without listing it, a listed name that no longer
exists, or an error class outside the one tree, fails here.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import types

import pytest

import host
import host.errors
from host.errors import HostError


def defined_in_host(obj: object) -> bool:
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and (module == "host" or module.startswith("host."))


def host_modules() -> list[types.ModuleType]:
    return [host] + [
        importlib.import_module(f"host.{info.name}") for info in pkgutil.iter_modules(host.__path__)
    ]


@pytest.mark.parametrize("module", [host, host.errors], ids=lambda m: m.__name__)
def test_all_is_a_tuple_of_unique_strings(module: types.ModuleType) -> None:
    names = module.__all__
    assert isinstance(names, tuple)
    assert all(type(name) is str for name in names)
    duplicates = sorted({n for n in names if names.count(n) > 1})
    assert duplicates == []


def test_every_name_in_all_exists() -> None:
    missing = [name for name in host.__all__ if not hasattr(host, name)]
    assert missing == []
    namespace: dict[str, object] = {}
    exec("from host import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(host.__all__)


def test_every_public_class_and_function_of_host_is_in_all() -> None:
    unlisted = sorted(
        name
        for name, obj in vars(host).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and defined_in_host(obj)
        and name not in host.__all__
    )
    assert unlisted == [], "public names of host missing from host.__all__"


def test_names_in_all_are_the_objects_they_re_export() -> None:
    for name in host.__all__:
        obj = getattr(host, name)
        if isinstance(obj, types.ModuleType):
            assert obj.__name__ == f"host.{name}"
        elif inspect.isclass(obj) or inspect.isfunction(obj):
            assert defined_in_host(obj), f"{name} is not defined in host"
            assert obj.__name__ == name, f"{name} is re-exported under another name"
        # else: a type alias (``Approver = Callable[...] | SupportsDecide``) or a constant


def test_errors_all_lists_exactly_the_error_classes() -> None:
    defined = sorted(
        name
        for name, obj in vars(host.errors).items()
        if inspect.isclass(obj) and issubclass(obj, HostError) and obj.__module__ == "host.errors"
    )
    assert sorted(host.errors.__all__) == defined


def test_every_error_is_also_public_in_host() -> None:
    unlisted = [name for name in host.errors.__all__ if name not in host.__all__]
    assert unlisted == []
    assert all(getattr(host, name) is getattr(host.errors, name) for name in host.errors.__all__)


def test_host_errors_live_in_the_one_tree() -> None:
    """STYLE habit 2: one exception module. A HostError subclass elsewhere is drift."""
    strays = sorted(
        f"{module.__name__}.{name}"
        for module in host_modules()
        for name, obj in vars(module).items()
        if inspect.isclass(obj)
        and issubclass(obj, HostError)
        and obj.__module__ == module.__name__
        and module is not host.errors
    )
    assert strays == []


def test_every_error_has_a_stable_unique_snake_case_kind() -> None:
    classes = [getattr(host.errors, name) for name in host.errors.__all__]
    kinds = [cls.kind for cls in classes]
    assert len(set(kinds)) == len(kinds)
    for cls in classes:
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", cls.kind), cls
        expected = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()
        assert cls.kind == expected
    assert host.ToolError.kind == "tool_error" and host.CapsuleCrashed.kind == "capsule_crashed"


def test_the_error_tree_drawn_in_the_docstring_matches_the_classes() -> None:
    """Each class is drawn once, under its base class (the nearest line less indented)."""
    drawn: list[tuple[int, str]] = []
    for line in (host.errors.__doc__ or "").splitlines():
        match = re.match(r"^([\s│├└─]*)([A-Z]\w*)\b", line)
        if match and match.group(2) in host.errors.__all__:
            drawn.append((len(match.group(1)), match.group(2)))
    assert sorted(name for _, name in drawn) == sorted(host.errors.__all__)
    for i, (column, name) in enumerate(drawn):
        base = host.errors.__dict__[name].__mro__[1].__name__
        above = [n for c, n in drawn[:i] if c < column]
        assert (above[-1] if above else "Exception") == base, name


def test_testing_module_all_exists() -> None:
    import host.testing

    assert all(hasattr(host.testing, name) for name in host.testing.__all__)
    public = sorted(
        name
        for name, obj in vars(host.testing).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == "host.testing"
    )
    assert sorted(host.testing.__all__) == public
