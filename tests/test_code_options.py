"""``run_code``'s options end to end, on the Wasm sandbox and on the labelled fallback.

``modules``, ``globals``, ``execute``, ``memory_limit`` and ``filename``: each with good
values (what the code sees) and bad ones (a typed ``invalid_arguments`` error naming the
option, nothing run, the sandbox's variables kept). The check's own option is in
``test_code_check.py``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host import CodeResult, Host

from .test_wasm import wasm_prepared

pytestmark = [pytest.mark.anyio]
__all__ = ["wasm_prepared"]

TOOLS = {
    "calc": """
        def add(a: int, b: int) -> int:
            return a + b
    """
}


def policy(kind: str) -> str:
    return textwrap.dedent(
        f"""
        version = 1
        [defaults]
        agent = "allow"
        [limits]
        code_check = "off"
        [capsules]
        code = "{kind}"
        """
    )


@pytest.fixture(params=["wasm", "subprocess"])
def proj(request: pytest.FixtureRequest, make_project: Callable[..., Path]) -> Path:
    if request.param == "wasm":
        request.getfixturevalue("wasm_prepared")
    return make_project(tools=TOOLS, policy=policy(str(request.param)))


def ok(result: CodeResult) -> Any:
    assert result.ok, result.error
    return result.value


def refused(result: CodeResult, *words: str) -> str:
    assert not result.ok
    assert result.error is not None
    assert result.error.kind == "invalid_arguments", result.error
    for word in words:
        assert word in result.error.message, result.error.message
    return result.error.message


async def test_modules_are_importable_siblings(proj: Path) -> None:
    async with Host.open(proj) as host:
        helpers = "def slug(s):\n    return s.lower().replace(' ', '-')\n"
        source = "import helpers\nhelpers.slug('Hello World')"
        assert ok(await host.run_code(source, modules={"helpers.py": helpers})) == "hello-world"
        # Given again with new source: imported afresh.
        changed = "def slug(s):\n    return s.upper()\n"
        assert ok(await host.run_code(source, modules={"helpers.py": changed})) == "HELLO WORLD"
        # A module's own tool calls go through the host like the run's.
        fetch = "async def total(n):\n    return await add(n, n)\n"
        source = "from mathy import total\nawait total(21)"
        assert ok(await host.run_code(source, modules={"mathy.py": fetch})) == 42
        # Its error shows its own file in the traceback.
        broken = "def f():\n    return 1 // 0\n"
        result = await host.run_code("import broken\nbroken.f()", modules={"broken.py": broken})
        assert result.error is not None
        assert 'File "broken.py", line 2' in result.error.traceback


async def test_bad_modules_are_refused_before_anything_runs(proj: Path) -> None:
    async with Host.open(proj) as host:
        assert ok(await host.run_code("kept = 7\nkept")) == 7
        refused(await host.run_code("1", modules={"../evil.py": ""}), "../evil.py", "name.py")
        refused(await host.run_code("1", modules={"pkg/x.py": ""}), "no folders")
        refused(await host.run_code("1", modules={"x.txt": ""}), "name.py")
        refused(await host.run_code("1", modules={"json.py": ""}), "standard library")
        refused(await host.run_code("1", modules={"tools.py": ""}), "tools package")
        refused(await host.run_code("1", modules={"add.py": ""}), "tool global")
        refused(await host.run_code("1", modules={"class.py": ""}), "rename")
        refused(await host.run_code("1", modules={"m.py": 3}), "must be text")  # type: ignore[dict-item]
        refused(await host.run_code("1", modules=["m.py"]), "modules must map")  # type: ignore[arg-type]
        big = {"big.py": "x = 1\n" * 2_000_000}
        result = await host.run_code("1", modules=big)
        assert result.error is not None and result.error.limit == "max_argument_size"
        assert ok(await host.run_code("kept")) == 7  # nothing ran: the sandbox kept its state


async def test_globals_cross_as_data(proj: Path) -> None:
    async with Host.open(proj) as host:
        value = {"rows": [1, 2, 3], "name": "q", "raw": b"\x00\x01", "none": None}
        source = "[type(data).__name__, data['rows'][-1] + limit, data['raw']]"
        result = await host.run_code(source, globals={"data": value, "limit": 10})
        assert ok(result) == ["dict", 13, b"\x00\x01"]
        assert ok(await host.run_code("limit")) == 10  # bound like a variable of the run
        refused(await host.run_code("1", globals={"f": object()}), "plain data")
        refused(await host.run_code("1", globals={"x": (1, 2)}), "plain data")
        refused(await host.run_code("1", globals={"not a name": 1}), "not a Python name")
        refused(await host.run_code("1", globals={"__builtins__": {}}), "reserved")
        refused(await host.run_code("1", globals={"add": 1}), "is a tool")
        refused(await host.run_code("1", globals={"tools": 1}), "is a tool")
        refused(await host.run_code("1", globals=[("x", 1)]), "globals must map")  # type: ignore[arg-type]


async def test_execute_calls_a_function_of_the_code(proj: Path) -> None:
    async with Host.open(proj) as host:
        source = "def main(a, b=0, *, scale=1):\n    return (a + b) * scale\n"
        run = {"fn": "main", "args": [2, 3], "kwargs": {"scale": 10}}
        assert ok(await host.run_code(source, execute=run)) == 50
        source = "async def main(n):\n    return await add(n, 1)\n"
        result = await host.run_code(source, execute={"fn": "main", "args": [41]})
        assert ok(result) == 42
        assert [c.tool for c in result.calls] == ["add"]
        # Errors of the function, and a function the code does not define, are the run's.
        missing = await host.run_code("x = 1", execute={"fn": "nope"})
        assert missing.error is not None and missing.error.type == "NameError"
        assert "no function named 'nope'" in missing.error.message
        value = await host.run_code("main = 3", execute={"fn": "main"})
        assert value.error is not None and value.error.type == "TypeError"
        boom = await host.run_code(
            "def main():\n    raise ValueError('bad')\n", execute={"fn": "main"}
        )
        assert boom.error is not None and "ValueError: bad" in boom.error.traceback
        refused(await host.run_code("1", execute={"fn": "a.b"}), "fn must name")
        refused(await host.run_code("1", execute={"fn": "m", "args": "x"}), "args must be a list")
        refused(await host.run_code("1", execute={"fn": "m", "kwargs": [1]}), "kwargs must map")
        refused(await host.run_code("1", execute={"fn": "m", "args": [object()]}), "plain data")
        refused(await host.run_code("1", execute={"fn": "m", "other": 1}), "not other")
        refused(await host.run_code("1", execute="main"), "execute must be a map")  # type: ignore[arg-type]


async def test_filename_is_what_tracebacks_show(proj: Path) -> None:
    async with Host.open(proj) as host:
        source = "def f():\n    return 1 // 0\nf()"
        result = await host.run_code(source, filename="report.py")
        assert result.error is not None
        assert 'File "report.py", line 2, in f' in result.error.traceback
        assert "<run" not in result.error.traceback
        # The warning for a call never awaited finds its line in the named file too.
        result = await host.run_code("x = 1\nadd(1, 2)\n", filename="agent.py")
        assert any(w.startswith("line 2: add(...) was never awaited") for w in result.warnings)
        refused(await host.run_code("1", filename=""), "filename")
        refused(await host.run_code("1", filename="a\nb"), "printable")
        refused(await host.run_code("1", filename=3), "filename")  # type: ignore[arg-type]


async def test_memory_limit_lowers_never_raises(proj: Path) -> None:
    async with Host.open(proj) as host:
        assert ok(await host.run_code("kept = 1\nkept")) == 1
        # A lower cap: a sandbox of its own, and the variables are lost (it says so).
        small = await host.run_code("'kept' in globals()", memory_limit=64 * 1024**2)
        assert ok(small) is False
        assert any(
            "memory cap is 64 MiB and the sandbox's was 256 MiB" in w for w in small.warnings
        )
        grab = "b = bytearray(400 * 1024 * 1024)\nlen(b)"  # over even the fallback's share
        low = await host.run_code(grab, memory_limit="64MiB")
        assert low.error is not None and low.error.limit == "code_memory"
        assert "memory_limit allows (64 MiB" in low.error.message
        again = await host.run_code("x = 2", memory_limit="64MiB")
        assert again.ok
        # The next run without one gets code_memory back, in a sandbox of its own.
        back = await host.run_code("b = bytearray(32 * 1024 * 1024)\nlen(b)")
        assert ok(back) == 32 * 1024 * 1024
        assert any("memory cap is 256 MiB" in w for w in back.warnings)
        # Above code_memory: clamped, with a warning; the sandbox in place stays.
        high = await host.run_code("len(b)", memory_limit=8 * 1024**3)
        assert ok(high) == 32 * 1024 * 1024
        assert any("a run can lower it, never raise it" in w for w in high.warnings)
        refused(await host.run_code("1", memory_limit="1KiB"), "below the least")
        refused(await host.run_code("1", memory_limit="lots"), "memory_limit")
        refused(await host.run_code("1", memory_limit=-5), "memory_limit")
        refused(await host.run_code("1", memory_limit=True), "memory_limit")  # type: ignore[arg-type]
