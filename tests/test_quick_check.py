"""The quick checks of agent code (``host/check/_quick.py``, issue 25): each rule finds
what it is for, and a corpus of valid agent code, as models write it in the REPL, gets
no diagnostic at all (a check that rejects valid code is worse than none).

Pure: the syntax tree against the tools' signatures, read from real tool files by the
host's discovery. No pyright, no sandbox.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from host.check._quick import quick_check, signatures, stub_names
from host.declare import HELPERS_PYI, discover

TOOLS = """
def add(a: int, b: int) -> int:
    return a + b


async def search(query: str, *, limit: int = 10, tags: list[str] | None = None) -> list[str]:
    return []


def log(*lines: str, **fields: str) -> None:
    pass


def close(ticket: str, /, reason: str = "done") -> bool:
    return True
"""

STUB = (
    """
from host.errors import ToolError, NotApproved
async def add(a: int, b: int) -> int: ...
async def search(query: str, *, limit: int = 10, tags: list[str] | None = None) -> list[str]: ...
async def log(*lines: str, **fields: str) -> None: ...
async def close(ticket: str, /, reason: str = "done") -> bool: ...
class tools: ...
"""
    + HELPERS_PYI
)  # as the checker's stub: the declarations and code mode's helpers


@pytest.fixture(scope="module")
def sigs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("quick") / "tools"
    folder.mkdir()
    (folder / "desk.py").write_text(TOOLS, encoding="utf-8")
    return signatures(discover(folder).tools.values())  # type: ignore[return-value]


def found(source: str, sigs: dict[str, object], known: tuple[str, ...] = ()) -> list[tuple]:
    diagnostics = quick_check(
        textwrap.dedent(source),
        sigs,  # type: ignore[arg-type]
        known=known,
        stub=stub_names(STUB),
    )
    return [(d.line, d.column, d.kind) for d in diagnostics]


def test_the_signatures_come_from_the_tool_files(sigs: dict[str, object]) -> None:
    assert {"add", "search", "log", "close"} <= set(sigs)
    assert {"tools.desk.add", "tools.desk.search"} <= set(sigs)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("add(1, 2)\n", [(1, 1, "not_awaited")]),
        ("tools.desk.add(1, 2)\n", [(1, 1, "not_awaited")]),
        ("x = add(1, 2)\nx + 1\n", [(1, 5, "not_awaited")]),
        ("total = add(1, 2)\nprint(f'{total}')\n", [(1, 9, "not_awaited")]),
        ("r = search('a')\nr[0]\n", [(1, 5, "not_awaited")]),
        ("await nosuch(1)\n", [(1, 7, "unknown_name")]),
        ("await add(1, 2, 3)\n", [(1, 7, "call")]),
        ("await add(1)\n", [(1, 7, "call")]),
        ("await add(a=1, c=2)\n", [(1, 7, "call")]),
        ("await search('q', 5)\n", [(1, 7, "call")]),
        ("await search('q', top=5)\n", [(1, 7, "call")]),
        ("await close(ticket='t')\n", [(1, 7, "call")]),
        ("await tools.desk.add(1, 2, 3)\n", [(1, 7, "call")]),
    ],
)
def test_each_rule_finds_what_it_is_for(
    source: str, expected: list[tuple], sigs: dict[str, object]
) -> None:
    assert found(source, sigs) == expected


VALID = [
    # top-level await, a bare last expression
    "await add(1, 2)\n",
    "x = await add(1, 2)\nx + 1\n",
    # names bound by earlier runs (known), and the run's globals
    "await add(previous, 1)\n",
    "result = await helper(3)\n",
    # coroutines handed on, not awaited where they are made
    "import asyncio\nresults = await asyncio.gather(add(1, 2), add(3, 4))\n",
    "import asyncio\nresults = await asyncio.gather(*(add(i, i) for i in range(3)))\n",
    "import asyncio\ntask = asyncio.create_task(add(1, 2))\nawait task\n",
    "pending = add(1, 2)\nvalue = await pending\n",
    "coro = add(1, 2)\ntasks = [coro]\n",
    "coro = add(1, 2)\n",  # awaited by a later run, perhaps: not this run's to judge
    "import asyncio\ndone = await asyncio.wait_for(add(1, 2), timeout=5)\n",
    # helpers, comprehensions, lambdas, classes
    "async def both(a, b):\n    return await add(a, b)\n\nawait both(1, 2)\n",
    "[await add(i, 1) for i in range(3)]\n",
    "sq = lambda n: n * n\nsq(await add(1, 1))\n",
    "class Box:\n    def size(self):\n        return 1\n\nBox().size()\n",
    "def later():\n    return helper2()\n\ndef helper2():\n    return 1\n\nlater()\n",
    # the tools' own forms: keywords, defaults, splats
    "await search('q', limit=5, tags=['a'])\n",
    "await close('t', 'why')\n",
    "await close('t', reason='why')\n",
    "await log('a', 'b', 'c', level='info')\n",
    "args = (1, 2)\nawait add(*args)\n",
    "kw = {'a': 1, 'b': 2}\nawait add(**kw)\n",
    # a tool name rebound: no longer the tool
    "def add(a, b, c):\n    return a + b + c\n\nadd(1, 2, 3)\n",
    # errors, matches, walrus, with, for, imports, builtins
    "try:\n    await add(1, 2)\nexcept ToolError as exc:\n    print(exc)\n",
    "match await add(1, 2):\n    case 3:\n        ok = True\n    case other:\n        ok = False\n",
    "if (n := await add(1, 2)) > 2:\n    print(n)\n",
    "import json\njson.dumps(await search('x'))\n",
    "from math import sqrt as root\nroot(await add(2, 2))\n",
    "for i in range(3):\n    print(await add(i, i))\n",
    "sorted(await search('x'), key=len)\n",
    # what the syntax tree cannot see
    "globals()['dyn'] = print\ndyn('hi')\n",
    "from os.path import *\njoin('a', 'b')\n",
    # not Python: for the run to say
    "await add(1,\n",
]


@pytest.mark.parametrize("source", VALID)
def test_valid_agent_code_gets_no_diagnostic(source: str, sigs: dict[str, object]) -> None:
    assert found(source, sigs, known=("previous", "helper")) == []


def test_the_corpus_of_agent_snippets_has_no_false_positive(sigs: dict[str, object]) -> None:
    """The corpus the issue asks for (tests/quick_check_corpus.py): realistic runs of an
    agent's REPL; the figure is the count of diagnostics, which must be none."""
    from tests.quick_check_corpus import CORPUS, KNOWN

    flagged = {
        name: found(source, sigs, known=KNOWN)
        for name, source in CORPUS.items()
        if found(source, sigs, known=KNOWN)
    }
    assert flagged == {}, flagged
    assert len(CORPUS) >= 30


def test_the_stub_names_are_what_agent_code_may_use() -> None:
    names = stub_names(STUB)
    assert {"add", "search", "ToolError", "NotApproved", "tools"} <= names
    assert stub_names("def broken(:\n") == set()


def test_a_project_path(tmp_path: Path) -> None:
    folder = tmp_path / "tools"
    folder.mkdir()
    (folder / "math.py").write_text("def print(x: int) -> int:\n    return x\n")
    sigs = signatures(discover(folder).tools.values())
    # a tool that shadows a builtin is reached only as tools.FILE.EXPORT
    assert "print" not in sigs and "tools.math.print" in sigs
    assert found("print('hello')\n", sigs) == []  # the builtin, not the tool
    assert found("tools.math.print(1)\n", sigs) == [(1, 1, "not_awaited")]
