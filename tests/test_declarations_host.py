"""The declarations inside the host: the cache behind ``Host.open``, and argument
validation against the input schemas before policy sees a call."""

from __future__ import annotations

import ast
import json
import logging
import sys
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pydantic
import pytest

from capsule import _registry
from host import DeclarationError, Host, InvalidArguments
from host.capsules import _wasm_cache
from host.declare import _pyright
from host.declare._cache import _CODE, load, load_or_build_scope, scope_key  # pyright: ignore[reportPrivateUsage]
from host.declare._discovery import discover
from host.declare._schema import _Validator, input_schema  # pyright: ignore[reportPrivateUsage]
from host.declare._scope import Scope
from host.testing import in_process

from .conftest import AGENT_SRC

GOLDEN = Path(__file__).parent / "golden"
SHARED_CACHE = Path(__file__).parent.parent / ".pytest_cache" / "toolhost-cache"
"""Scopes for tests that do not count pyright runs: content-addressed, so never stale."""

CALC = '''
from typing import Literal, TypedDict

Unit = Literal["m", "km"]


class Options(TypedDict, total=False):
    """``typing.TypedDict``: pydantic refuses it on Python 3.11, the host does not."""

    unit: Unit
    digits: int


def add(a: int, b: int) -> int:
    return a + b


def scale(values: list[float], options: Options, blob: bytes = b"") -> list[float]:
    return values
'''


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Sequence[Path]]:
    """Every pyright run, counted; a private scope cache for the test."""
    monkeypatch.setenv("TOOLHOST_CACHE", str(tmp_path / "cache"))
    seen: list[Sequence[Path]] = []
    real = _pyright.start

    def counting(*args: Any, **kwargs: Any) -> _pyright.Run:
        seen.append(kwargs.get("include", ()))
        return real(*args, **kwargs)

    monkeypatch.setattr(_pyright, "start", counting)
    return seen


@pytest.mark.anyio
async def test_a_second_start_with_unchanged_tools_runs_no_pyright(
    make_project: Callable[..., Path], runs: list[Sequence[Path]]
) -> None:
    project = make_project({"calc": CALC})
    async with Host.open(project, capsule=in_process()) as host:
        assert "async def add(a: int, b: int) -> int: ..." in host.scope.render_model()
        assert await host.call("add", 2, 3) == 5
    assert len(runs) == 1
    async with Host.open(project, capsule=in_process()) as host:
        assert host.scope.tool("add").returns == "int"
    assert len(runs) == 1
    calc = project / "tools" / "calc.py"
    calc.write_text(calc.read_text() + "\n\ndef sub(a: int, b: int) -> int:\n    return a - b\n")
    async with Host.open(project, capsule=in_process()) as host:  # an edit: a new key
        assert host.scope.tool("sub").returns == "int"
    assert len(runs) == 2


def test_one_variable_names_the_cache_with_a_folder_per_use(
    make_project: Callable[..., Path],
    runs: list[Sequence[Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    discovery = discover(make_project({"calc": CALC}) / "tools")
    built = load_or_build_scope(discovery)  # TOOLHOST_CACHE is tmp_path/cache (``runs``)
    assert (tmp_path / "cache" / "scopes" / f"{built.key}.json").is_file()
    assert _wasm_cache.cache_root() == tmp_path / "cache"  # compiled Wasm goes in cache/wasm
    # The old name of the scopes folder alone still works, with a note, when the new
    # one is not set; when it is, the new one wins.
    monkeypatch.setenv("TOOLHOST_CACHE_DIR", str(tmp_path / "old"))
    assert load_or_build_scope(discovery) == built
    assert not (tmp_path / "old").exists()
    monkeypatch.delenv("TOOLHOST_CACHE")
    with caplog.at_level(logging.WARNING, logger="toolhost"):
        assert load_or_build_scope(discovery) == built
    assert (tmp_path / "old" / f"{built.key}.json").is_file()
    assert "TOOLHOST_CACHE_DIR is deprecated: set TOOLHOST_CACHE" in caplog.text


def test_a_corrupt_cache_entry_is_a_miss(
    make_project: Callable[..., Path], runs: list[Sequence[Path]], tmp_path: Path
) -> None:
    discovery = discover(make_project({"calc": CALC}) / "tools")
    first = load_or_build_scope(discovery)
    cache = tmp_path / "cache" / "scopes"
    entry = cache / f"{scope_key(discovery)}.json"
    mac, _, body = entry.read_bytes().partition(b"\n")  # a MAC line, then the JSON
    assert json.loads(body)["key"] == first.key and len(mac) == 64
    assert load(first.key, cache) == first
    wrong_key = json.dumps({**first.to_data(), "key": "x"}).encode()
    for garbage in (b"", b"{not json", b'{"tools": 3}', b"[]", wrong_key, body):
        entry.write_bytes(garbage)
        assert load(first.key, cache) is None
    assert load_or_build_scope(discovery) == first  # rebuilt, and written again
    assert load(first.key, cache) == first and len(runs) == 2
    assert sorted(p.name for p in cache.iterdir()) == [entry.name]  # no temporary files


def test_the_cache_key_hashes_every_module_a_scope_is_built_by() -> None:
    """Discovery and the builder, with every sibling they import: a module missing from
    ``_CODE`` could change a scope without changing its key. ``_scope`` is not followed:
    its renderings are recomputed from a cached model, never stored."""
    declare = Path(load.__code__.co_filename).parent

    def siblings(name: str) -> set[str]:
        found: set[str] = set()
        for node in ast.walk(ast.parse((declare / name).read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                modules = [node.module] if node.module else [a.name for a in node.names]
                found.update(f"{m}.py" for m in modules)
        return found

    reached: set[str] = set()
    todo = ["_discovery.py", "_build.py"]
    while todo:
        name = todo.pop()
        if name not in reached and name != "_scope.py":
            reached.add(name)
            todo.extend(siblings(name))
    assert sorted(reached - set(_CODE)) == []  # missing from the key
    assert sorted(set(_CODE) - reached) == []  # stale: a file that is gone hashes as b""


@pytest.mark.anyio
async def test_a_failed_declaration_stops_the_host_and_is_not_cached(
    make_project: Callable[..., Path], runs: list[Sequence[Path]], tmp_path: Path
) -> None:
    project = make_project({"ok": "def ok() -> int:\n    return 1\n", "bad": "return 5\n"})
    with pytest.raises(DeclarationError, match="pyright cannot analyse"):
        async with Host.open(project, capsule=in_process()):
            pass  # pragma: no cover
    assert len(runs) == 1
    scopes = tmp_path / "cache" / "scopes"
    assert not scopes.exists() or list(scopes.iterdir()) == []


@pytest.mark.anyio
async def test_arguments_are_validated_before_policy(
    make_project: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLHOST_CACHE", str(SHARED_CACHE))
    project = make_project({"calc": CALC})
    async with Host.open(project, capsule=in_process()) as host:
        decided: list[str] = []
        decide = host.mediator.decide

        def spy(spec: Any, *args: Any, **kwargs: Any) -> Any:
            decided.append(spec.name)
            return decide(spec, *args, **kwargs)

        monkeypatch.setattr(host.mediator, "decide", spy)
        cases: list[tuple[str, tuple[Any, ...], dict[str, Any], str, str]] = [
            ("add", ("2", 3), {}, "a", "a: '2' is not of type 'integer'"),
            ("add", (2, True), {}, "b", "b: True is not of type 'integer'"),
            ("scale", ([1.0], {"unit": "mi"}), {}, "options", "options['unit']: 'mi' is not one"),
            ("scale", ([1.0], {}), {"blob": "text"}, "blob", "blob: 'text' is not bytes"),
            ("scale", ([1.0, "x"], {}), {}, "values", "values[1]: 'x' is not of type 'number'"),
        ]
        for tool, args, kwargs, parameter, problem in cases:
            with pytest.raises(InvalidArguments) as info:
                await host.call(tool, *args, **kwargs)
            assert info.value.parameter == parameter
            assert info.value.problem.startswith(problem), info.value.problem
        assert decided == []  # policy never saw them
        assert await host.call("add", 2, 3) == 5
        # typing.TypedDict, an int where a float is declared, bytes: all valid
        options = {"unit": "km", "digits": 2}
        assert await host.call("scale", [1.0, 2], options, blob=b"\x00") == [1.0, 2]
        assert decided == ["add", "scale"]


def test_typing_typeddict_needs_no_pydantic(make_project: Callable[..., Path]) -> None:
    """On 3.11 pydantic refuses ``typing.TypedDict``; schemas from the scope do not care."""
    package = f"_declarations_calc_{id(make_project)}"
    _registry.install_package(str(make_project({"calc": CALC}) / "tools"), package)
    module = _registry.import_file("calc", package)
    if sys.version_info < (3, 12):
        with pytest.raises(pydantic.PydanticUserError, match=r"typing_extensions\.TypedDict"):
            pydantic.TypeAdapter(module.Options)


# -- the schemas agree with pyright where pydantic can tell -------------------------------

SAMPLES: list[Any] = [
    None, True, False, 0, 7, -1, 2.5, "", "low", "r", "red", "UTC",
    [], [1, 2], ["a"], [1.5, 2], [[1, "a"]], {}, {"x": 1}, {"name": "n", "color": "red"},
    {"name": "n", "color": "blue"}, {"mode": "r", "size": 3}, {"mode": "x"},
    {"key": "k", "value": 1}, {"width": 1, "height": 2}, {"width": 1},
]  # fmt: skip


def _imported(tools_dir: Path, package: str) -> Iterator[tuple[str, Callable[..., Any]]]:
    _registry.install_package(str(tools_dir), package)
    for spec in discover(tools_dir).tools.values():
        target = _registry.resolve(
            _registry.import_file(spec.file, package), spec.name, list(spec.path[1:]), []
        )
        yield spec.name, target.fn


@pytest.fixture(scope="module")
def scopes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Scope]]:
    del tmp_path_factory
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TOOLHOST_CACHE", str(SHARED_CACHE))
        yield {
            "example": load_or_build_scope(discover(AGENT_SRC / "tools")),
            "tricky": load_or_build_scope(discover(GOLDEN / "tricky" / "tools")),
        }


@pytest.mark.parametrize("project", ["example", "tricky"])
def test_schemas_agree_with_pydantic_on_annotated_parameters(
    project: str, scopes: dict[str, Scope]
) -> None:
    scope = scopes[project]
    tools_dir = AGENT_SRC / "tools" if project == "example" else GOLDEN / "tricky" / "tools"
    compared = 0
    for name, fn in _imported(tools_dir, f"_declarations_{project}"):
        tool = scope.tool(name)
        if tool.notes:
            continue  # weak spots are declared as such, not compared
        hints = typing.get_type_hints(fn)
        schema = input_schema(scope, tool)
        for param in tool.params:
            if param.kind in (2, 4) or param.name not in hints or param.type in ("str", "bytes"):
                continue  # str: datetime-like values cross as text; bytes: not JSON
            try:
                adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(hints[param.name])
            except pydantic.PydanticUserError:
                continue  # typing.TypedDict on 3.11: see the test above
            ours = _Validator(
                {"$defs": schema.get("$defs", {}), **schema["properties"][param.name]}
            )
            for value in SAMPLES:
                try:
                    adapter.validate_json(json.dumps(value), strict=True)
                    theirs = True
                except pydantic.ValidationError:
                    theirs = False
                assert ours.is_valid(value) == theirs, (name, param.name, param.type, value)
                compared += 1
    assert compared > 100
