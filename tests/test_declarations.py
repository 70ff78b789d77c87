"""Declarations by type analysis: golden renderings over tricky fixtures and the example.

``tests/golden/tricky/tools`` holds the hard cases (inferred returns, dataclass and
pydantic returns, methods of exported objects, aliases, cross-file types, weak spots, a
hidden context parameter); ``tests/golden/*/expected/`` holds what must come out. Run
with ``TOOLHOST_UPDATE_GOLDEN=1`` to rewrite the expected files after a deliberate change,
then read the diff.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from host.cli import main
from host.declare import _pyright
from host.declare._cache import load_or_build_scope
from host.declare._discovery import discover
from host.declare._render import HEADER
from host.declare._scope import Scope

from .conftest import AGENT_SRC

GOLDEN = Path(__file__).parent / "golden"
TRICKY = GOLDEN / "tricky"
UPDATE = os.environ.get("TOOLHOST_UPDATE_GOLDEN") == "1"
SHARED_CACHE = Path(__file__).parent.parent / ".pytest_cache" / "toolhost-cache"


@pytest.fixture(scope="module")
def cache() -> Iterator[Path]:
    """The tests' shared scope cache: each fixture project is built by pyright once (the
    cache is content-addressed, so an entry can never be stale)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TOOLHOST_CACHE", str(SHARED_CACHE))
        yield SHARED_CACHE


@pytest.fixture(scope="module")
def tricky(cache: Path) -> Scope:
    return load_or_build_scope(discover(TRICKY / "tools"))


@pytest.fixture(scope="module")
def example(cache: Path) -> Scope:
    return load_or_build_scope(discover(AGENT_SRC / "tools"))


def golden(path: Path, text: str) -> None:
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"differs from {path}"


def _schemas(scope: Scope) -> str:
    return json.dumps(scope.schemas(), indent=2, sort_keys=True) + "\n"


# -- golden ------------------------------------------------------------------------------


def test_tricky_model_block(tricky: Scope) -> None:
    golden(TRICKY / "expected" / "model.txt", tricky.render_model())


def test_tricky_pyi(tricky: Scope) -> None:
    golden(TRICKY / "expected" / "tool_globals.pyi.txt", tricky.render_pyi())


def test_tricky_schemas(tricky: Scope) -> None:
    golden(TRICKY / "expected" / "schemas.json", _schemas(tricky))


def test_example_model_block(example: Scope) -> None:
    golden(GOLDEN / "agent_src" / "expected" / "model.txt", example.render_model())


def test_example_schemas(example: Scope) -> None:
    golden(GOLDEN / "agent_src" / "expected" / "schemas.json", _schemas(example))


# -- what the golden files show, said as assertions ---------------------------------------


def test_model_block_header_and_every_tool_async(tricky: Scope, example: Scope) -> None:
    for scope in (tricky, example):
        text = scope.render_model()
        assert tuple(text.splitlines()[:2]) == HEADER
        tree = ast.parse(text)
        defs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        assert len(defs) == len(scope.tools)
        assert all(isinstance(d, ast.AsyncFunctionDef) for d in defs)


def test_inferred_returns(tricky: Scope) -> None:
    assert tricky.tool("stats").returns == "dict[str, int | float]"  # a dict literal
    assert tricky.tool("mixed").returns == "dict[str, bool | str | int]"  # async, unwrapped
    assert tricky.tool("pairs").returns == "list[tuple[int, str]]"
    assert tricky.tool("when").returns == "str"  # a datetime crosses as ISO 8601 text
    assert tricky.tool("ticket").returns == "Ticket"  # a class the file never imports


def test_returned_classes_are_declared_by_their_data_shape(tricky: Scope, example: Scope) -> None:
    roll = example.type("_Roll")  # a private dataclass
    assert (roll.kind, [f.name for f in roll.fields]) == ("dataclass", ["dice", "total", "sides"])
    assert "class _Roll(TypedDict):" in example.render_model()
    user = tricky.type("User")  # pydantic: private attributes are not data
    assert (user.kind, [f.name for f in user.fields]) == ("pydantic", ["name", "tags"])
    assert tricky.type("Point").kind == "namedtuple"
    assert tricky.type("Color").value == "Literal['red', 'green']"  # an Enum crosses as values


def test_aliases_keep_their_names(tricky: Scope, example: Scope) -> None:
    assert tricky.tool("ticket").params[1].type == "Priority"
    assert example.tool("kanban.list").params[0].type == "Status | None"
    assert example.type("Status").value == "Literal['open', 'closed']"


def test_cross_file_types_once_in_dependency_order(tricky: Scope) -> None:
    names = [t.name for t in tricky.types]
    assert len(names) == len(set(names))  # Size is in two files, identical: merged
    assert names.index("Color") < names.index("Label") < names.index("Ticket")
    assert tricky.type("Label").source == "_models.py"
    assert tricky.type("Size").source == "same_a.py"


def test_methods_of_exported_objects(tricky: Scope, example: Scope) -> None:
    assert [t.name for t in example.tools if t.member] == [
        "kanban.add",
        "kanban.close",
        "kanban.list",
    ]
    assert example.tool("kanban.list").returns == "list[Task]"  # builtins.list in the source
    first = tricky.tool("store.first")
    assert (first.params[0].type, first.returns) == ("list[T]", "T")
    assert tricky.type("T").kind == "typevar"
    assert tricky.tool("ops.double").returns == "int"  # a SimpleNamespace member, probed directly


def test_defaults_and_docstrings_from_the_source(tricky: Scope) -> None:
    shapes = {p.name: p for p in tricky.tool("shapes").params}
    assert shapes["ratio"].default == "2.0"  # pyright prints 2
    assert [p.kind for p in tricky.tool("shapes").params] == [0, 1, 2, 3, 3, 4]
    sphinx = {p.name: p for p in tricky.tool("sphinx").params}
    assert (sphinx["limit"].type, sphinx["limit"].default) == ("int", "10")  # from the default
    assert sphinx["when"].default == "..."  # not a literal: not repeated
    assert tricky.tool("stats").docstring is not None
    assert tricky.tool("stats").docstring in tricky.render_model().replace("\n    ", "\n")


def test_docstring_descriptions_in_schemas(tricky: Scope) -> None:
    schemas = tricky.schemas()
    stats = schemas["stats"]
    assert stats["input"]["properties"]["values"]["description"] == "the numbers, at least one."
    assert stats["output"]["description"] == "count and mean."
    assert schemas["shapes"]["input"]["properties"]["key"]["description"] == "keyword only."
    assert (
        schemas["sphinx"]["input"]["properties"]["retries"]["description"] == "how often to retry."
    )


def test_weak_spots_are_said_not_guessed(tricky: Scope) -> None:
    def notes(name: str) -> str:
        return " ".join(tricky.tool(name).notes)

    assert "overloaded: pyright knows 2 signatures" in notes("parse")
    assert "_lru_cache_wrapper" in notes("cached")
    assert tricky.tool("cached").params[0].type == "int"  # from the source annotation
    assert "differs from the source" in notes("wrapped")  # functools.wraps hid them
    assert tricky.tool("wrapped").returns == "int"
    assert "pyright cannot infer" in notes("fact")
    assert "not plain data" in notes("handle")
    assert "a set is not plain data" in notes("tags")
    assert "# toolhost: overloaded" in tricky.render_model()
    schemas = tricky.schemas()
    assert schemas["fact"]["output"] is None and schemas["stats"]["output"] is not None


def test_hidden_context_parameter(tricky: Scope) -> None:
    whoami = tricky.tool("whoami")
    assert [p.name for p in whoami.params] == ["greeting"]
    assert "ctx" not in tricky.schemas()["whoami"]["input"]["properties"]
    assert "ToolContext" not in tricky.render_model() + tricky.render_pyi()
    spec = discover(TRICKY / "tools").tools["whoami"]
    assert (spec.context, [p.name for p in spec.params]) == ("ctx", ["greeting"])


def test_manifest(tricky: Scope) -> None:
    manifest = tricky.manifest()
    json.dumps(manifest)  # plain JSON
    assert manifest["header"] == list(HEADER) and manifest["pyright"] == _pyright.version()
    tool = next(t for t in manifest["tools"] if t["name"] == "shapes")
    assert tool["declaration"].startswith("async def shapes(a: int, /, b: str = 'b', *args: int")
    assert [p["kind"] for p in tool["params"]][:2] == ["positional_only", "positional_or_keyword"]
    assert tool["input_schema"]["required"] == ["a", "key"]
    assert {t["name"] for t in manifest["types"]} >= {"Ticket", "Label", "Color"}


# -- the .pyi type-checks, and gives editors the tools as globals -------------------------

USE_EXAMPLE = """
from tool_globals import *

async def example() -> None:
    total: int = await add(2, 3)
    task = await kanban.add("write docs")
    status: Status = task["status"]
    dice: list[int] = (await roll(2, 6))["dice"]
    text: str = await tools.time.format("2026-11-30T13:40:00+00:00")
    print(total, status, dice, text)
"""

USE_TRICKY = """
from tricky import *

async def example() -> None:
    stats_: dict[str, int | float] = await tools.inferred.stats([1.0])
    ticket_: Ticket = await ticket("x", "high")
    entry: Entry | None = await store.get("k")
    size: Size = await size_b()
    print(stats_, ticket_, entry, size)
"""


def test_pyi_passes_a_pyright_check(example: Scope, tricky: Scope) -> None:
    diagnostics = _pyright.run(
        {
            "tool_globals.pyi": example.render_pyi(),
            "use_example.py": USE_EXAMPLE,
            "tricky.pyi": tricky.render_pyi(),
            "use_tricky.py": USE_TRICKY,
        },
        settings={"typeCheckingMode": "standard"},
        extra_paths=[AGENT_SRC.parent],
    )
    assert [str(d) for d in diagnostics if d.severity == "error"] == []


# -- the command line --------------------------------------------------------------------


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    return int(info.value.code or 0), capsys.readouterr().out


def test_cli_scope_formats(example: Scope, capsys: pytest.CaptureFixture[str]) -> None:
    project = str(AGENT_SRC)
    assert _run(capsys, "scope", "--project", project) == (0, example.render_model())
    assert _run(capsys, "scope", "--project", project, "--format", "pyi")[1] == example.render_pyi()
    status, out = _run(capsys, "scope", "--project", project, "--format", "schema")
    assert status == 0 and json.loads(out) == example.schemas()
    status, out = _run(capsys, "scope", "--project", project, "--format", "manifest", "--json")
    data = json.loads(out)
    assert (status, data["ok"], data["format"]) == (0, True, "manifest")
    assert data["scope"]["tools"][0]["name"] == example.tools[0].name


def test_cli_scope_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "scope", "--project", "/nonexistent/toolhost")[0] == 2
    with pytest.raises(SystemExit) as info:
        main(["scope", "--format", "xml"])
    assert info.value.code == 2


def test_cli_prepare_writes_agent_files(
    example: Scope, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = tmp_path / "project"
    (project / "tools").mkdir(parents=True)
    for source in (AGENT_SRC / "tools").glob("*.py"):
        (project / "tools" / source.name).write_bytes(source.read_bytes())
    status, out = _run(capsys, "prepare", "--project", str(project), "--json")
    written = json.loads(out)["written"]
    assert status == 0 and [Path(p).name for p in written] == ["tool_globals.pyi", "manifest.json"]
    agent = project / ".agent"
    assert (agent / "tool_globals.pyi").read_text() == example.render_pyi()
    manifest = json.loads((agent / "manifest.json").read_text())
    assert [t["name"] for t in manifest["tools"]] == [t.name for t in example.tools]
    assert sorted(p.name for p in agent.iterdir()) == ["manifest.json", "tool_globals.pyi"]
