"""Discovery: what tool files and exports exist, read with ``ast`` (no user code runs).

The last section cross-checks discovery against the capsule's run-time rules
(``capsule._registry``) on tricky files: the host refuses a file whose run-time exports
differ from what discovery declared, so the two must agree on every ordinary pattern.
"""

from __future__ import annotations

import itertools
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from capsule import _registry
from host import DeclarationError, Discovery, ToolSpec, discover
from host.declare._exports import HOST_GLOBALS
from host.declare._specs import (
    KEYWORD_ONLY,
    NO_DEFAULT,
    POSITIONAL_ONLY,
    POSITIONAL_OR_KEYWORD,
    VAR_KEYWORD,
    VAR_POSITIONAL,
)

MakeProject = Callable[..., Path]


@pytest.fixture
def tools(make_project: MakeProject) -> Callable[..., Discovery]:
    """``tools(a="source", _b="source")``: write the tool files, return their discovery."""

    def run(**files: str) -> Discovery:
        return discover(make_project(files) / "tools")

    return run


def names(found: Discovery) -> list[str]:
    return sorted(found.tools)


# -- functions --------------------------------------------------------------------------------


def test_public_sync_and_async_functions_are_tools(tools: Callable[..., Discovery]) -> None:
    found = tools(
        clock='''
        """Module docstring."""
        import datetime

        async def now(tz: str = "UTC") -> str:
            """The time.

            Args:
                tz: a zone.
            """
            return ""

        def add(a: int, b: int) -> int:
            return a + b

        def _private() -> None: ...

        class Clock:
            def tick(self) -> None: ...

        LIMIT = 3
        ''',
    )
    assert names(found) == ["add", "now"]
    now = found.tools["now"]
    assert now.is_async and not found.tools["add"].is_async
    assert (now.file, now.export, now.member, now.installed) == ("clock", "now", None, True)
    assert now.path == ("clock", "now") and now.qualified == "tools.clock.now"
    assert now.docstring == "The time.\n\nArgs:\n    tz: a zone."
    assert now.returns == "str"
    assert now.line == 5 and now.source.name == "clock.py"
    assert found.tools["add"].docstring is None
    (file,) = found.files
    assert (file.module, file.private, sorted(file.exports)) == ("clock", False, ["add", "now"])


def test_params_capture_kinds_defaults_literal_values_and_annotations(
    tools: Callable[..., Discovery],
) -> None:
    found = tools(
        f="""
        import os

        def f(a, b: int, /, c: "list[str]" = ["x"], *rest: int, d: dict[str, int] = {"k": -1},
              e=None, g=os.sep, h=(1, 2), i=-2.5, j=b"\\x00", **extra: object) -> None: ...
        """
    )
    params = {p.name: p for p in found.tools["f"].params}
    assert [(p.name, p.kind) for p in found.tools["f"].params] == [
        ("a", POSITIONAL_ONLY),
        ("b", POSITIONAL_ONLY),
        ("c", POSITIONAL_OR_KEYWORD),
        ("rest", VAR_POSITIONAL),
        ("d", KEYWORD_ONLY),
        ("e", KEYWORD_ONLY),
        ("g", KEYWORD_ONLY),
        ("h", KEYWORD_ONLY),
        ("i", KEYWORD_ONLY),
        ("j", KEYWORD_ONLY),
        ("extra", VAR_KEYWORD),
    ]
    assert found.tools["f"].param_kinds[0] == ("a", POSITIONAL_ONLY)
    assert params["a"].annotation is None and params["a"].required
    assert params["b"].annotation == "int" and params["b"].required
    assert params["c"].annotation == "'list[str]'"
    assert (params["c"].default, params["c"].value) == ("['x']", ["x"])
    assert (params["d"].default, params["d"].value) == ("{'k': -1}", {"k": -1})
    assert params["e"].value is None and not params["e"].required
    assert (params["g"].default, params["g"].value) == ("os.sep", NO_DEFAULT)
    assert params["h"].value == (1, 2) and params["i"].value == -2.5
    assert params["j"].value == b"\x00"
    assert not params["rest"].required and not params["extra"].required
    assert params["rest"].annotation == "int" and params["extra"].annotation == "object"


# -- objects ------------------------------------------------------------------------------


def test_a_project_class_instance_exports_its_public_methods(
    tools: Callable[..., Discovery],
) -> None:
    found = tools(
        _base="""
        class Base:
            def inherited(self, x: int) -> int:
                return x

            def overridden(self) -> None: ...

            def hidden(self) -> None: ...
        """,
        board="""
        import functools
        from ._base import Base

        class Board(Base):
            def add(self, title: str) -> None:
                '''Add one.'''

            async def close(self, task_id: str) -> None: ...

            def overridden(self, y: str) -> None: ...

            hidden = None

            @staticmethod
            def make(a: int, b: int) -> None: ...

            @classmethod
            def build(cls, c: int) -> None: ...

            @property
            def size(self) -> int: ...

            @size.setter
            def size(self, value: int) -> None: ...

            @functools.cached_property
            def cache(self) -> int: ...

            def _private(self) -> None: ...

            def __len__(self) -> int: ...

        board = Board()
        """,
    )
    assert names(found) == [
        "board.add",
        "board.build",
        "board.close",
        "board.inherited",
        "board.make",
        "board.overridden",
    ]
    add = found.tools["board.add"]
    assert (add.file, add.export, add.member) == ("board", "board", "add")
    assert add.qualified == "tools.board.board.add" and add.docstring == "Add one."
    assert [p.name for p in add.params] == ["title"]  # self is not a parameter
    assert found.tools["board.close"].is_async
    assert [p.name for p in found.tools["board.make"].params] == ["a", "b"]  # static: kept
    assert [p.name for p in found.tools["board.build"].params] == ["c"]  # cls dropped
    inherited = found.tools["board.inherited"]
    assert inherited.source.name == "_base.py" and [p.name for p in inherited.params] == ["x"]
    assert [p.name for p in found.tools["board.overridden"].params] == ["y"]


def test_simple_namespaces_export_functions_and_lambdas_not_constants(
    tools: Callable[..., Discovery],
) -> None:
    found = tools(
        _impl="""
        def shared(q: str) -> str:
            return q
        """,
        ns="""
        import types
        from types import SimpleNamespace as NS
        from os.path import join
        from ._impl import shared

        def add(a: int, b: int) -> int:
            return a + b

        math = NS(add=add, double=lambda x, k=2: x * k, pi=3.14, _hidden=add, join=join)
        other = types.SimpleNamespace(shared=shared, name="x", builtin=len)
        """,
    )
    assert names(found) == ["add", "math.add", "math.double", "other.shared"]
    double = found.tools["math.double"]
    assert [(p.name, p.value) for p in double.params] == [("x", NO_DEFAULT), ("k", 2)]
    assert double.docstring is None and not double.is_async
    assert found.tools["other.shared"].source.name == "_impl.py"


def test_classes_constants_and_other_objects_are_not_tools(
    tools: Callable[..., Discovery],
) -> None:
    found = tools(
        data="""
        import collections
        from dataclasses import dataclass

        @dataclass
        class Point:
            x: int
            def norm(self) -> int: ...

        ORIGIN = Point(0, 0)  # an instance of a project class: its methods are tools
        COUNTS = collections.Counter()
        NAMES = ["a"]
        TABLE = {"a": 1}
        LIMIT: int = 3
        """
    )
    assert names(found) == ["ORIGIN.norm"]


# -- private files, imports and __all__ -------------------------------------------------------


def test_private_files_export_nothing_but_siblings_import_them(
    tools: Callable[..., Discovery],
) -> None:
    found = tools(
        _helpers="""
        def slugify(text: str) -> str:
            return text

        class Store:
            def get(self) -> None: ...

        store = Store()
        """,
        kanban="""
        from ._helpers import slugify, store
        from . import _helpers

        def add(title: str) -> str:
            return slugify(title)
        """,
    )
    assert names(found) == ["add"]
    files = {f.module: f for f in found.files}
    assert files["_helpers"].private and files["_helpers"].exports == ()
    assert not files["kanban"].private and files["kanban"].exports == ("add",)
    assert found.runtime_names("_helpers") == []


def test_imported_names_are_not_exports_without_all(tools: Callable[..., Discovery]) -> None:
    found = tools(
        a="""
        def shared() -> None: ...
        """,
        b="""
        from os.path import join
        from .a import shared
        from . import a as other

        alias = other.shared  # still a's function: not b's

        def own() -> None: ...
        """,
    )
    assert names(found) == ["own", "shared"]
    assert found.tools["shared"].file == "a"


def test_all_reexports_a_sibling_function_followed_to_its_definition(
    tools: Callable[..., Discovery],
) -> None:
    found = tools(
        _impl='''
        from __future__ import annotations


        async def fetch(url: str, *, retries: int = 3) -> bytes:
            """Fetch a URL."""
            return b""

        def unlisted() -> None: ...
        ''',
        web="""
        from ._impl import fetch, unlisted
        from ._impl import fetch as get

        __all__ = ["fetch", "get", "fetch"]
        """,
    )
    assert names(found) == ["fetch", "get"]
    fetch = found.tools["fetch"]
    assert (fetch.file, fetch.export, fetch.source.name, fetch.line) == (
        "web",
        "fetch",
        "_impl.py",
        5,
    )
    assert fetch.is_async and fetch.docstring == "Fetch a URL."
    assert [(p.name, p.kind, p.value) for p in fetch.params] == [
        ("url", POSITIONAL_OR_KEYWORD, NO_DEFAULT),
        ("retries", KEYWORD_ONLY, 3),
    ]
    assert found.tools["get"].export == "get"
    assert found.runtime_names("web") == ["fetch", "get"]


def test_all_limits_exports_to_the_names_it_lists(tools: Callable[..., Discovery]) -> None:
    found = tools(
        m="""
        __all__ = ("listed", "_private_but_listed", "missing", "Const")
        __all__ += ["extra"]

        def listed() -> None: ...
        def unlisted() -> None: ...
        def _private_but_listed() -> None: ...
        def extra() -> None: ...
        Const = 1
        """
    )
    assert names(found) == ["_private_but_listed", "extra", "listed"]


def test_all_listing_a_name_from_outside_the_tools_folder_is_an_error(
    tools: Callable[..., Discovery],
) -> None:
    with pytest.raises(DeclarationError) as info:
        tools(
            m="""
            from os.path import join

            def mine() -> None: ...

            __all__ = ["mine", "join"]
            """
        )
    error = info.value
    assert error.file is not None and error.file.endswith("m.py")
    assert error.line == 2
    assert "'join'" in error.message and "outside the tools folder" in error.message
    assert error.to_data()["line"] == 2


def test_all_listing_a_module_is_not_an_error(tools: Callable[..., Discovery]) -> None:
    found = tools(
        m="""
        import json
        from . import _h

        def f() -> None: ...

        __all__ = ["f", "json", "_h"]
        """,
        _h="",
    )
    assert names(found) == ["f"]


@pytest.mark.parametrize(
    "value",
    ["['a'] + ['b']", "names()", "[1, 2]", "'abc'", "{[1]: 2}", "{{}}", "[*other]"],
)
def test_all_must_be_a_literal_list_of_strings(tools: Callable[..., Discovery], value: str) -> None:
    with pytest.raises(DeclarationError) as info:
        tools(m=f"def f() -> None: ...\n\n__all__ = {value}\n")
    assert info.value.line == 3
    assert "__all__ must be a literal list or tuple of strings" in info.value.message


# -- rebinding: the last binding wins, as at run time -------------------------------------------


def test_the_last_binding_of_a_name_decides(tools: Callable[..., Discovery]) -> None:
    found = tools(
        _h="""
        def f() -> None: ...
        """,
        m="""
        def f() -> None: ...
        from ._h import f  # now the sibling's: not an export

        def json() -> None: ...
        import json  # now a module

        def helper() -> None: ...
        del helper

        def g(x: int) -> None: ...
        alias = g
        same = lambda y, z=1: y  # noqa: E731

        first, second = g, 1

        def h() -> None: ...
        h, other = 1, 2
        k, *rest = [g, g]
        """,
    )
    assert names(found) == ["alias", "first", "g", "same"]
    assert [p.name for p in found.tools["alias"].params] == ["x"]
    assert [p.name for p in found.tools["same"].params] == ["y", "z"]
    assert found.tools["alias"].line == found.tools["g"].line


# -- names --------------------------------------------------------------------------------------


@pytest.mark.parametrize("export", ["print", "open", "len", "format", "tools", "ToolError"])
def test_an_export_shadowing_a_builtin_or_host_global_is_reached_by_path(
    tools: Callable[..., Discovery], export: str
) -> None:
    found = tools(m=f"def {export}(x: int) -> int:\n    return x\n\ndef fine() -> None: ...\n")
    assert names(found) == ["fine", f"tools.m.{export}"]
    spec = found.tools[f"tools.m.{export}"]
    assert (spec.export, spec.installed, spec.qualified) == (export, False, f"tools.m.{export}")
    assert found.tools["fine"].installed
    assert found.runtime_names("m") == sorted([export, "fine"])


def test_host_globals_cover_every_error_the_agent_sees() -> None:
    import host.errors

    assert set(host.errors.__all__) <= HOST_GLOBALS
    assert "tools" in HOST_GLOBALS


def test_an_object_export_shadowing_a_builtin_keeps_its_members(
    tools: Callable[..., Discovery],
) -> None:
    found = tools(
        m="""
        class Board:
            def add(self) -> None: ...

        list = Board()
        """,
        n="""
        class Other:
            def add(self) -> None: ...

        list = Other()
        """,
    )
    # Not installed as globals, so the two files do not clash.
    assert names(found) == ["tools.m.list.add", "tools.n.list.add"]
    spec = found.tools["tools.m.list.add"]
    assert (spec.installed, spec.path) == (False, ("m", "list", "add"))
    assert found.runtime_names("m") == ["list.add"]


def test_the_same_name_exported_by_two_files_is_an_error(
    tools: Callable[..., Discovery],
) -> None:
    with pytest.raises(DeclarationError) as info:
        tools(
            alpha="""
            def other() -> None: ...

            def send(to: str) -> None: ...
            """,
            beta="async def send(to: str) -> None: ...\n",
        )
    error = info.value
    assert "'send' is exported by two files" in error.message
    assert "alpha.py (line 4) and beta.py (line 1)" in error.message
    assert error.file is not None and error.file.endswith("beta.py") and error.line == 1


def test_an_object_and_a_function_with_one_name_clash(tools: Callable[..., Discovery]) -> None:
    with pytest.raises(DeclarationError, match="'kanban' is exported by two files"):
        tools(
            a="""
            class K:
                def add(self) -> None: ...

            kanban = K()
            """,
            b="def kanban() -> None: ...\n",
        )


def test_a_clash_through_a_reexport_names_where_it_is_defined(
    tools: Callable[..., Discovery],
) -> None:
    with pytest.raises(DeclarationError) as info:
        tools(
            _impl="\n\ndef f() -> None: ...\n",
            a='from ._impl import f\n__all__ = ["f"]\n',
            b='from ._impl import f\n__all__ = ["f"]\n',
        )
    assert "a.py (from _impl.py line 3) and b.py (from _impl.py line 3)" in info.value.message
    assert info.value.file is not None and info.value.file.endswith("_impl.py")


def test_a_syntax_error_names_the_file_and_line(tools: Callable[..., Discovery]) -> None:
    with pytest.raises(DeclarationError) as info:
        tools(ok="def ok() -> None: ...\n", broken="def ok() -> None: ...\n\ndef broken(:\n")
    error = info.value
    assert error.file is not None and error.file.endswith("broken.py")
    assert error.line == 3
    assert "syntax error" in error.message and f"{error.file}:3" in str(error)


def test_null_bytes_and_bad_encodings_are_declaration_errors(make_project: MakeProject) -> None:
    root = make_project({})
    (root / "tools" / "nul.py").write_bytes(b"def f():\x00 pass\n")
    with pytest.raises(DeclarationError) as info:
        discover(root / "tools")
    assert info.value.file is not None and info.value.file.endswith("nul.py")
    (root / "tools" / "nul.py").unlink()
    (root / "tools" / "latin.py").write_bytes(b"# \xe9\ndef f() -> None: ...\n")
    with pytest.raises(DeclarationError, match="cannot read tool file") as info:
        discover(root / "tools")
    assert info.value.file is not None and info.value.file.endswith("latin.py")


@pytest.mark.parametrize(
    ("filename", "why"),
    [
        ("my-tool.py", "not a Python identifier"),
        ("1st.py", "not a Python identifier"),
        ("two words.py", "not a Python identifier"),
        ("class.py", "keyword"),
        ("\ufb01le.py", "NFKC"),  # the "fi" ligature: code would read it as ``file``
    ],
)
def test_tool_file_names_must_be_writable_as_attributes(
    make_project: MakeProject, filename: str, why: str
) -> None:
    root = make_project({"fine": "def f() -> None: ...\n"})
    (root / "tools" / filename).write_text("def g() -> None: ...\n", encoding="utf-8")
    with pytest.raises(DeclarationError, match=why) as info:
        discover(root / "tools")
    assert info.value.file is not None and info.value.file.endswith(filename)


def test_dotfiles_directories_and_other_files_are_ignored(make_project: MakeProject) -> None:
    root = make_project({"fine": "def f() -> None: ...\n"})
    tools_dir = root / "tools"
    (tools_dir / ".#fine.py").write_text("broken(", encoding="utf-8")  # an editor lock file
    (tools_dir / "pkg.py").mkdir()
    (tools_dir / "notes.txt").write_text("def g(): ...\n", encoding="utf-8")
    (tools_dir / "sub").mkdir()
    (tools_dir / "sub" / "deep.py").write_text("def h() -> None: ...\n", encoding="utf-8")
    found = discover(tools_dir)
    assert [f.module for f in found.files] == ["fine"] and names(found) == ["f"]


def test_src_tools_and_an_empty_folder(make_project: MakeProject) -> None:
    root = make_project({"m": "def f() -> None: ...\n"}, subdir="src/tools")
    assert names(discover(root / "src" / "tools")) == ["f"]
    empty = make_project({}, subdir="empty")
    found = discover(empty / "empty")
    assert found.files == () and dict(found.tools) == {}


def test_discovery_runs_no_user_code(tools: Callable[..., Discovery], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    found = tools(
        m=f"""
        open({str(marker)!r}, "w").write("x")
        raise SystemExit(1)

        def f() -> None: ...
        """
    )
    assert names(found) == ["f"]
    assert not marker.exists()


def test_runtime_names_are_sorted_export_dot_member(tools: Callable[..., Discovery]) -> None:
    found = tools(
        m="""
        class B:
            def z(self) -> None: ...
            def a(self) -> None: ...

        def print() -> None: ...
        def b() -> None: ...
        obj = B()
        """
    )
    assert found.runtime_names("m") == ["b", "obj.a", "obj.z", "print"]
    assert found.runtime_names("nope") == []
    spec: ToolSpec = found.tools["tools.m.print"]
    assert spec.path == ("m", "print")


# -- cross-check: discovery agrees with the capsule's run-time rules --------------------------

TRICKY: dict[str, dict[str, str]] = {
    "functions_and_private_sibling": {
        "_helpers": "def slug(t: str) -> str:\n    return t\n",
        "m": """
            import functools
            from ._helpers import slug

            def plain(a: int) -> int: ...
            async def coro() -> None: ...

            @functools.lru_cache
            def cached(x: int) -> int: ...

            @functools.wraps(plain)
            def wrapped(a: int) -> int: ...

            def _private() -> None: ...
            """,
    },
    "objects_methods_and_inheritance": {
        "_base": """
            import functools

            class Base:
                def inherited(self) -> None: ...
                def shadowed(self) -> None: ...
                @functools.cached_property
                def lazy(self) -> int: ...
                kept: int
            """,
        "m": """
            from ._base import Base

            class Board(Base):
                def add(self) -> None: ...
                async def close(self) -> None: ...
                @staticmethod
                def make() -> None: ...
                @classmethod
                def build(cls) -> None: ...
                @property
                def size(self) -> int: ...
                shadowed = None
                short = lambda self: 1  # noqa: E731
                again = add
                class Inner: ...

            board = Board()
            print = Board()
            """,
    },
    "namespaces": {
        "_impl": "def helper(x: int) -> int:\n    return x\n",
        "m": """
            import types
            from os.path import join
            from types import SimpleNamespace
            from . import _impl
            from ._impl import helper

            def own() -> None: ...
            top = lambda: 1  # noqa: E731

            class C:
                def method(self) -> None: ...

            c = C()
            ns = SimpleNamespace(own=own, lam=lambda q: q, top=top, helper=helper,
                                 via=_impl.helper, const=3, _hidden=own, join=join,
                                 builtin=len, bound=c.method, klass=C)
            other = types.SimpleNamespace(own=own)
            """,
    },
    "imported_objects": {
        "_state": """
            class Store:
                def get(self) -> None: ...

            store = Store()
            """,
        "b_user": """
            from ._state import store
            from . import _state
            from .z_owner import board

            same = _state.store

            def read() -> None: ...
            """,
        "z_owner": """
            from ._state import Store

            class Board:
                def add(self) -> None: ...

            board = Board()
            mine = Store()
            """,
        "listed": """
            from ._state import store
            from ._helpers_all import fn

            __all__ = ["store", "fn"]
            """,
        "_helpers_all": "def fn() -> None: ...\n",
    },
    "rebinding": {
        "_h": "def f() -> None: ...\n",
        "m": """
            def f() -> None: ...
            from ._h import f

            def json() -> None: ...
            import json

            def gone() -> None: ...
            del gone

            def g() -> None: ...
            alias = g
            a, b = g, 2

            __all__ = ["g", "alias"]
            __all__ += ["a", "b", "json"]
            """,
    },
    "class_alias_and_module_attribute_class": {
        "_models": "class M:\n    def run(self) -> None: ...\n",
        "m": """
            from . import _models

            class B:
                def go(self) -> None: ...

            B2 = B
            b = B2()
            model = _models.M()
            """,
    },
}


_packages = itertools.count()


@pytest.fixture
def isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Undo the sys.path entries and modules an in-process load adds."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("_discovery_check_"):
            del sys.modules[name]


def runtime_exports(tools_dir: Path, found: Discovery) -> dict[str, list[str]]:
    package = f"_discovery_check_{next(_packages)}"
    _registry.install_package(str(tools_dir), package)
    out: dict[str, list[str]] = {}
    for file in found.files:
        if not file.private:
            module = _registry.import_file(file.module, package)
            out[file.module] = _registry.runtime_exports(module, package)
    return out


def write(make_project: MakeProject, files: dict[str, str]) -> Path:
    return make_project({k: textwrap.dedent(v) for k, v in files.items()}) / "tools"


@pytest.mark.usefixtures("isolated_imports")
@pytest.mark.parametrize("case", sorted(TRICKY))
def test_discovery_matches_the_capsule_runtime(make_project: MakeProject, case: str) -> None:
    tools_dir = write(make_project, TRICKY[case])
    found = discover(tools_dir)
    runtime = runtime_exports(tools_dir, found)
    static = {f.module: found.runtime_names(f.module) for f in found.files if not f.private}
    assert static == runtime
    assert any(static.values()), "the case should export something"


@pytest.mark.usefixtures("isolated_imports")
def test_the_cross_check_sees_what_each_case_is_about(make_project: MakeProject) -> None:
    """Pin the interesting answers, so a rule that drifts on both sides is still caught."""
    expected = {
        "functions_and_private_sibling": {"m": ["cached", "coro", "plain", "wrapped"]},
        "objects_methods_and_inheritance": {
            "m": [
                "board.add",
                "board.again",
                "board.build",
                "board.close",
                "board.inherited",
                "board.make",
                "board.short",
                "print.add",
                "print.again",
                "print.build",
                "print.close",
                "print.inherited",
                "print.make",
                "print.short",
            ]
        },
        "namespaces": {
            "m": [
                *("c.method", "ns.helper", "ns.lam", "ns.own", "ns.top", "ns.via"),
                *("other.own", "own", "top"),
            ]
        },
        "imported_objects": {
            "b_user": ["read"],
            "listed": ["fn", "store.get"],
            "z_owner": ["board.add", "mine.get"],
        },
        "rebinding": {"m": ["a", "alias", "g"]},
        "class_alias_and_module_attribute_class": {"m": ["b.go", "model.run"]},
    }
    assert sorted(expected) == sorted(TRICKY)
    for case, files in TRICKY.items():
        found = discover(write(make_project, files))
        got = {f.module: found.runtime_names(f.module) for f in found.files if not f.private}
        assert got == {k: sorted(v) for k, v in expected[case].items()}, case
        for path in found.tools_dir.glob("*.py"):  # make_project reuses one folder
            path.unlink()


@pytest.mark.usefixtures("isolated_imports")
@pytest.mark.parametrize(
    ("source", "static", "runtime"),
    [
        # A decorator that replaces the function with something else.
        ("def deco(f):\n    return 42\n\n@deco\ndef f() -> None: ...\n", ["deco", "f"], ["deco"]),
        # A definition discovery cannot see (inside a block).
        ("import sys\nif sys:\n    def f() -> None: ...\n", [], ["f"]),
        # Members added after construction.
        (
            "from types import SimpleNamespace\ndef f() -> None: ...\n"
            "ns = SimpleNamespace()\nns.f = f\n",
            ["f"],
            ["f", "ns.f"],
        ),
    ],
)
def test_the_load_check_catches_what_discovery_cannot_see(
    make_project: MakeProject, source: str, static: list[str], runtime: list[str]
) -> None:
    tools_dir = write(make_project, {"m": source})
    found = discover(tools_dir)
    assert found.runtime_names("m") == static
    assert runtime_exports(tools_dir, found) == {"m": runtime}


def test_a_spurious_ast_error_of_cpython_311_is_retried(
    tools: Callable[..., Discovery], monkeypatch: pytest.MonkeyPatch
) -> None:
    """python/cpython#106905: a parse racing another thread's fails with a SystemError."""
    import ast

    real = ast.parse
    failures = iter([True, True])

    def flaky(source: str, filename: str = "<unknown>", **kwargs: object) -> ast.Module:
        if next(failures, False):
            raise SystemError("AST constructor recursion depth mismatch (before=9, after=12)")
        return real(source, filename=filename)

    monkeypatch.setattr(ast, "parse", flaky)
    assert names(tools(m="def f() -> None: ...\n")) == ["f"]

    def broken(source: str, filename: str = "<unknown>", **kwargs: object) -> ast.Module:
        raise SystemError("AST constructor recursion depth mismatch (before=9, after=12)")

    monkeypatch.setattr(ast, "parse", broken)
    with pytest.raises(DeclarationError, match="cannot parse tool file") as info:
        tools(m="def f() -> None: ...\n")
    assert info.value.file is not None and info.value.file.endswith("m.py")


def test_dunder_exports_never_become_globals(tools: Callable[..., Discovery]) -> None:
    # Only reachable through __all__; installed, one would replace the agent scope's
    # own __builtins__ or __name__.
    found = tools(
        m="""
        def __builtins__() -> None: ...
        def __name__() -> None: ...
        def fine() -> None: ...

        __all__ = ["__builtins__", "__name__", "fine"]
        """
    )
    assert names(found) == ["fine", "tools.m.__builtins__", "tools.m.__name__"]
    assert not found.tools["tools.m.__builtins__"].installed
