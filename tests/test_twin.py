"""The layers above the transport, through the in-process twin (``host.testing``).

``Host.open(project, capsule=in_process())`` runs the real discovery, binding, mediator
and sessions, and the capsule's own export rules, argument splitting and conversion, in
this process: every test here takes milliseconds.
"""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from capsule._convert import to_plain
from host import (
    Host,
    InvalidArguments,
    LimitExceeded,
    NotSerializable,
    ToolError,
    ToolTimeout,
    UnknownTool,
)
from host.testing import InProcessTransport, in_process

pytestmark = pytest.mark.anyio

MakeProject = Callable[..., Path]

TOOLS = {
    "counter": '''
        """Module state that lives for the session."""

        _count = 0


        def bump(by: int = 1) -> int:
            """Add to the counter."""
            global _count
            _count += by
            return _count


        async def peek() -> int:
            return _count
        ''',
    "board": """
        from ._store import Store


        class Board:
            def __init__(self) -> None:
                self.items: list[str] = []

            def add(self, title: str) -> list[str]:
                self.items.append(title)
                return self.items

            async def count(self) -> int:
                return len(self.items)

            @staticmethod
            def shout(text: str) -> str:
                return text.upper()


        board = Board()
        store = Store()
        """,
    "_store": """
        class Store:
            def get(self, key: str) -> str:
                return key
        """,
    "shadow": """
        def print(text: str) -> str:
            return "printed " + text


        def open(path: str) -> str:
            return "opened " + path


        def tools() -> str:
            return "tools"
        """,
    "bad": """
        import sys


        def fail(message: str) -> None:
            raise ValueError(message)


        def returns_set() -> object:
            return {"items": [1, {2, 3}]}


        def returns_generator() -> object:
            return (i for i in range(3))


        def big(size: int) -> str:
            return "x" * size


        async def slow(seconds: float) -> str:
            import anyio

            await anyio.sleep(seconds)
            return "done"


        def own_timeout() -> None:
            raise TimeoutError("the upstream service was slow")


        def leave() -> None:
            sys.exit(3)


        def echo(value: object) -> object:
            return value
        """,
    "math": """
        def add(a: int, b: int) -> int:
            return a + b
        """,
}


@pytest.fixture
def project(make_project: MakeProject) -> Path:
    return make_project({name: textwrap.dedent(src) for name, src in TOOLS.items()})


@pytest.fixture
async def host(project: Path) -> AsyncIterator[Host]:
    async with Host.open(project, capsule=in_process()) as h:
        yield h


def calls_made(h: Host) -> int:
    transport = h.default_session.supervisor.transport
    assert isinstance(transport, InProcessTransport)
    return transport.calls


# -- calls ----------------------------------------------------------------------------------


async def test_calls_by_name_and_by_path(host: Host) -> None:
    assert await host.call("add", 2, 3) == 5
    assert await host.call("add", b=3, a=2) == 5
    assert await host.tools.math.add(2, b=3) == 5
    assert await host.call("tools.math.add", 4, 5) == 9
    assert await host.call("bump") == 1
    assert await host.call("peek") == 1
    assert await host.tools.counter.bump(by=10) == 11


async def test_object_exports_are_reached_as_export_dot_member(host: Host) -> None:
    assert await host.call("board.add", "a") == ["a"]
    assert await host.tools.board.board.add("b") == ["a", "b"]
    assert await host.call("tools.board.board.add", "c") == ["a", "b", "c"]
    assert await host.call("board.count") == 3
    assert await host.call("board.shout", "hey") == "HEY"
    assert await host.call("store.get", "k") == "k"


async def test_shadowed_builtins_are_reached_only_by_their_qualified_names(host: Host) -> None:
    assert await host.call("tools.shadow.print", "x") == "printed x"
    assert await host.tools.shadow.print("y") == "printed y"
    assert await host.tools.shadow.open("p") == "opened p"
    assert await host.call("tools.shadow.tools") == "tools"
    for bare in ("print", "open", "tools"):
        with pytest.raises(UnknownTool):
            await host.call(bare, "x")
    scope = host.default_session.globals_for("agent")
    assert "print" not in scope and "open" not in scope
    assert scope["add"] is not None and scope["tools"] is not None


async def test_sessions_keep_their_own_module_state(host: Host) -> None:
    assert await host.call("bump") == 1
    assert await host.call("bump") == 2
    await host.call("board.add", "mine")
    async with host.session() as other:
        assert await other.call("bump") == 1
        assert await other.call("board.count") == 0
        assert await other.tools.counter.bump(by=5) == 6
        async with host.session() as third:
            assert await third.call("peek") == 0
    assert await host.call("bump") == 3
    assert await host.call("board.count") == 1


# -- errors ---------------------------------------------------------------------------------


async def test_a_tool_exception_is_a_tool_error(host: Host) -> None:
    with pytest.raises(ToolError) as info:
        await host.call("fail", "nope")
    error = info.value
    assert (error.tool, error.type_name, error.error_message) == ("fail", "ValueError", "nope")
    assert "bad.py" in error.traceback and "raise ValueError(message)" in error.traceback
    assert error.to_data()["type"] == "ValueError"
    assert await host.call("add", 1, 1) == 2  # the next call works


async def test_results_that_are_not_plain_data_are_not_serializable(host: Host) -> None:
    with pytest.raises(NotSerializable) as info:
        await host.call("returns_set")
    assert (info.value.type_name, info.value.path) == ("set", "result['items'][1]")
    with pytest.raises(NotSerializable) as info:
        await host.call("returns_generator")
    assert (info.value.type_name, info.value.path) == ("generator", "result")


async def test_a_result_over_the_frame_cap_is_limit_exceeded(project: Path) -> None:
    async with Host.open(project, capsule=in_process(), limits={"max_frame": 1000}) as h:
        assert await h.call("big", 100) == "x" * 100
        with pytest.raises(LimitExceeded) as info:
            await h.call("big", 5000)
        assert info.value.limit == "max_frame"


async def test_a_slow_async_tool_times_out(project: Path) -> None:
    async with Host.open(project, capsule=in_process(), limits={"call_timeout": 0.2}) as h:
        with pytest.raises(ToolTimeout) as info:
            await h.call("slow", 30)
        assert info.value.timeout == 0.2


async def test_a_tool_raising_timeout_error_is_a_tool_error(host: Host) -> None:
    with pytest.raises(ToolError) as info:
        await host.call("own_timeout")
    assert info.value.type_name == "TimeoutError"


async def test_sys_exit_in_a_tool_is_a_tool_error(project: Path) -> None:
    async with Host.open(project, capsule=in_process()) as h:
        with pytest.raises(ToolError) as info:
            await h.call("leave")
        assert info.value.type_name == "SystemExit"


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "parameter"),
    [
        ("add", (1,), {}, "b"),
        ("add", (1, 2, 3), {}, None),
        ("add", (1,), {"a": 2}, "a"),
        ("add", (1, 2), {"c": 3}, "c"),
        ("echo", ({1, 2},), {}, "value"),
        ("echo", ([object()],), {}, "value"),
        ("echo", ({"k": 2**64},), {}, "value"),
        ("echo", ({1: "int key"},), {}, "value"),
    ],
)
async def test_invalid_arguments_never_reach_the_tool(
    host: Host, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], parameter: str | None
) -> None:
    before = calls_made(host)
    with pytest.raises(InvalidArguments) as info:
        await host.call(name, *args, **kwargs)
    assert info.value.parameter == parameter and info.value.tool == name
    assert calls_made(host) == before


async def test_argument_values_cross_as_plain_data(host: Host) -> None:
    value = {"t": (1, 2), "b": b"\x00", "n": None, "f": -0.5, "deep": [[["x"]]]}
    assert await host.call("echo", value) == to_plain(value)


@pytest.mark.parametrize(
    "name",
    [
        "Add",
        "ADD",
        "add ",
        " add",
        "add\n",
        "\u0430dd",  # Cyrillic a
        "\uff41\uff44\uff44",  # fullwidth "add": NFKC would make it "add"
        "add\u200b",  # a zero-width space
        "\u200badd",
        "ad\u00addd",  # a soft hyphen
        "math.add",  # FILE.EXPORT is not a tool name
        "tools.math.Add",
        "tools.math",
        "tools.",
        "tools",
        "board",
        "board.",
        "board.add.x",
        "board._private",
        "tools.board.board",
        "kanban.add",
        "",
        "*",
        "add*",
    ],
)
async def test_tool_names_are_matched_exactly(host: Host, name: str) -> None:
    before = calls_made(host)
    with pytest.raises(UnknownTool) as info:
        await host.call(name, 1, 2)
    assert info.value.name == name
    assert calls_made(host) == before


async def test_a_name_that_is_not_a_string_is_unknown(host: Host) -> None:
    for name in (None, 1, b"add", ["add"]):
        with pytest.raises(UnknownTool):
            await host.call(name, 1, 2)  # type: ignore[arg-type]


async def test_attribute_paths_are_exact_too(host: Host) -> None:
    with pytest.raises(AttributeError):
        host.tools.math.Add  # noqa: B018
    with pytest.raises(AttributeError):
        host.tools.Math  # noqa: B018
    with pytest.raises(AttributeError):
        host.tools.board.board.items  # noqa: B018 - data, not a tool
    assert sorted(dir(host.tools)) == ["bad", "board", "counter", "math", "shadow"]
    assert sorted(dir(host.tools.board.board)) == ["add", "count", "shout"]


# -- binding and the capsule's argument split agree with Python -------------------------------

SIGNATURES = """
_D = "default"


def s1(a, b=2, *args, c, d=4, **kw):
    return {"a": a, "b": b, "args": list(args), "c": c, "d": d, "kw": kw}


def s2(a, /, b, *, c=3):
    return {"a": a, "b": b, "c": c}


def s3(a=_D, b=1, /, c=_D, *rest, **kw):
    return {"a": a, "b": b, "c": c, "rest": list(rest), "kw": kw}


def s4(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


def s5(x, y=(1, 2), z={3}, /, w=[1]):
    return {"x": x, "y": y, "z": repr(z), "w": w}


def s6(p, /, **kw):
    return {"p": p, "kw": kw}
"""


async def test_every_call_reaches_the_tool_as_python_would_pass_it(
    make_project: MakeProject,
) -> None:
    """Bind + encode + split, compared with calling the function directly, call by call."""
    root = make_project({"sigs": SIGNATURES})
    direct: dict[str, Any] = {}
    exec(compile(SIGNATURES, "sigs.py", "exec"), direct)  # the same functions, unmediated
    pool = ["a", "b", "c", "d", "p", "w", "x", "kw", "args", "zz"]
    checked = 0
    async with Host.open(root, capsule=in_process()) as h:
        for name in ("s1", "s2", "s3", "s4", "s5", "s6"):
            for positional in range(5):
                args = tuple(100 + i for i in range(positional))
                for size in range(3):
                    for keys in itertools.combinations(pool, size):
                        kwargs = {k: 200 + pool.index(k) for k in keys}
                        try:
                            expected: Any = to_plain(direct[name](*args, **kwargs))
                        except TypeError:
                            expected = TypeError
                        try:
                            got: Any = await h.call(name, *args, **kwargs)
                        except InvalidArguments:
                            got = TypeError
                        assert got == expected, (name, args, kwargs)
                        checked += 1
    assert checked > 1000


async def test_a_positional_only_default_after_a_gap_stays_the_tools_own(
    make_project: MakeProject,
) -> None:
    root = make_project({"sigs": SIGNATURES})
    async with Host.open(root, capsule=in_process()) as h:
        assert await h.call("s3") == {"a": "default", "b": 1, "c": "default", "rest": [], "kw": {}}
        assert (await h.call("s3", 5))["b"] == 1
        assert (await h.call("s5", 1))["y"] == [1, 2]


async def test_the_twin_works_under_either_backend(anyio_backend: str, host: Host) -> None:
    results = await gather(host, [("add", (i, i)) for i in range(20)])
    assert results == [2 * i for i in range(20)]
    assert anyio_backend in ("asyncio", "trio")


async def gather(h: Host, calls: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
    results: list[Any] = [None] * len(calls)

    async def one(i: int, name: str, args: tuple[Any, ...]) -> None:
        results[i] = await h.call(name, *args)

    async with anyio.create_task_group() as tg:
        for i, (name, args) in enumerate(calls):
            tg.start_soon(one, i, name, args)
    return results
