"""Weak spots of the declarations are said, never silent (README, "Declarations").

A set crosses the boundary as a list (as an argument) or not at all (in a result), so
wherever one is declared it carries a ``# toolhost:`` comment; an Enum member written as a
default shows the value it crosses as; a bare ``list`` needs no import of ``Any``; and a
tool file that raises at import before its definitions fails alone, like any other file
that fails to load, instead of refusing the whole host.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from host import Host, ToolUnavailable
from host.declare._cache import load_or_build_scope
from host.declare._discovery import discover
from host.declare._scope import Scope

SETS = {
    "shapes": """
        import enum
        from dataclasses import dataclass
        from typing import TypedDict


        class Colour(enum.Enum):
            RED = "red"
            BLUE = "blue"


        class Level(enum.IntEnum):
            LOW = enum.auto()
            HIGH = enum.auto()


        class Info(TypedDict):
            name: str
            tags: set[str]


        @dataclass
        class Box:
            items: frozenset[int]


        def info() -> Info:
            return {"name": "x", "tags": set()}


        def box() -> Box:
            return Box(frozenset())


        def count(tags: set[str]) -> int:
            return len(tags)


        def tags():
            return {"a", "b"}


        def paint(colour: Colour = Colour.RED, level: Level = Level.HIGH) -> str:
            return colour.value


        def names() -> list:
            return []
        """,
}


def _scope(make_project: Callable[..., Path], tools: dict[str, str], cache: Path) -> Scope:
    root = make_project(tools)
    return load_or_build_scope(discover(root / "tools"), directory=cache)


def test_every_set_is_said_where_it_is_declared(
    make_project: Callable[..., Path], tmp_path: Path
) -> None:
    scope = _scope(make_project, SETS, tmp_path / "cache")
    said = (
        "a set is not plain data: declared as a list (a tool receives a list; a result "
        "holding a set fails with NotSerializable)"
    )
    types = {t.name: t for t in scope.types}
    assert types["Info"].notes == (f"tags: {said}",)
    assert types["Box"].notes == (f"items: {said}",)
    assert scope.tool("count").notes == (f"parameter tags: {said}",)
    assert scope.tool("tags").notes == (
        "returns: a set is not plain data: calls returning one fail with NotSerializable",
    )
    model = scope.render_model()
    assert f"# toolhost: tags: {said}\nclass Info(TypedDict):\n    name: str\n" in model
    assert f"# toolhost: parameter tags: {said}\nasync def count(tags: list[str]) -> int:" in (
        model
    )


def test_an_enum_member_default_shows_its_value(
    make_project: Callable[..., Path], tmp_path: Path
) -> None:
    scope = _scope(make_project, SETS, tmp_path / "cache")
    paint = scope.tool("paint")
    assert [(p.name, p.type, p.default) for p in paint.params] == [
        ("colour", "Colour", "'red'"),
        ("level", "Level", "2"),
    ]
    assert "async def paint(colour: Colour = 'red', level: Level = 2) -> str:" in (
        scope.render_model()
    )
    schema = scope.schemas()["paint"]["input"]["properties"]
    assert (schema["colour"]["default"], schema["level"]["default"]) == ("red", 2)


def test_a_bare_list_needs_no_import_of_any(
    make_project: Callable[..., Path], tmp_path: Path
) -> None:
    scope = _scope(make_project, SETS, tmp_path / "cache")
    assert scope.tool("names").returns == "list[Any]"


RAISES_AT_IMPORT = {
    "broken": """
        raise RuntimeError("set NOTES_DIR first")


        def wipe_notes() -> int:
            return 0
        """,
    "fine": """
        def ok() -> int:
            return 1
        """,
}


def test_an_export_pyright_cannot_reach_is_declared_and_said(
    make_project: Callable[..., Path], tmp_path: Path
) -> None:
    scope = _scope(make_project, RAISES_AT_IMPORT, tmp_path / "cache")
    wipe = scope.tool("wipe_notes")
    assert wipe.returns == "int"
    assert wipe.notes == (
        "pyright cannot reach this export: code above it in broken.py always raises or exits "
        "when the file is imported, so the file will fail to load; declared from the source "
        "annotations",
    )


@pytest.mark.anyio
@pytest.mark.subprocess
async def test_a_file_that_raises_at_import_fails_alone(
    make_project: Callable[..., Path],
) -> None:
    root = make_project(RAISES_AT_IMPORT)
    async with Host.open(root) as host:
        assert await host.call("ok") == 1
        (failed,) = [e for e in host.events.recent if e.kind == "tool_file_failed"]
        assert failed.data["file"] == "broken"
        assert "RuntimeError: set NOTES_DIR first" in failed.data["reason"]
        with pytest.raises(ToolUnavailable) as caught:
            await host.call("wipe_notes")
        assert "set NOTES_DIR first" in str(caught.value)
