"""``run_code`` end to end: agent code in a real Wasm sandbox, tools through the mediator.

Each test opens a host over a small project whose policy lets the agent call its tools,
and runs several snippets in one sandbox, since booting one takes a moment.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from host import CodeResult, Host

from .conftest import ROOT
from .test_wasm import RUNTIMES, prepared_for, runtime_policy, wasm_data_prepared, wasm_prepared

pytestmark = [pytest.mark.anyio, pytest.mark.wasm]
__all__ = ["wasm_data_prepared", "wasm_prepared"]  # the session fixtures, reused here

TOOLS = {
    "calc": """
        import asyncio

        _count = 0
        _active = 0
        _peak = 0


        def add(a: int, b: int) -> int:
            '''Add two integers.'''
            return a + b


        def count() -> int:
            '''How many times this was called.'''
            global _count
            _count += 1
            return _count


        async def slow(seconds: float) -> float:
            '''Sleep, then return the seconds slept.'''
            await asyncio.sleep(seconds)
            return seconds


        async def probe(seconds: float) -> int:
            '''The most calls of probe in flight at once, so far.'''
            global _active, _peak
            _active += 1
            _peak = max(_peak, _active)
            await asyncio.sleep(seconds)
            _active -= 1
            return _peak


        def boom(message: str) -> None:
            '''Always raises.'''
            raise ValueError(message)
    """,
    "board": """
        class Board:
            def __init__(self) -> None:
                self._items: list[str] = []

            def add(self, item: str) -> int:
                self._items.append(item)
                return len(self._items)


        board = Board()
    """,
}

ALLOW_AGENT = """
    version = 1
    [defaults]
    agent = "allow"
"""


def project(make_project: Callable[..., Path], policy: str = ALLOW_AGENT) -> Path:
    return make_project(tools=TOOLS, policy=policy)


def ok(result: CodeResult) -> Any:
    assert result.ok, result.error
    return result.value


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    """The code runtime a test runs on, prepared (each test runs on both)."""
    prepared_for(request, request.param)
    return str(request.param)


@pytest.fixture
def proj(make_project: Callable[..., Path], runtime: str) -> Path:
    return project(make_project, ALLOW_AGENT + runtime_policy(runtime))


async def test_values_persistence_and_reset(proj: Path) -> None:
    async with Host.open(proj) as host:
        first = await host.run_code("x = await add(2, 3)\nprint('x is', x)\nx * 2")
        assert ok(first) == 10
        assert first.stdout == "x is 5\n"
        assert [(c.tool, c.decision, c.ok) for c in first.calls] == [("add", "allow", True)]
        assert first.sandbox == "wasm"
        # Variables, imports and functions persist between runs.
        assert ok(await host.run_code("import json\ndef twice(v):\n    return v * 2\nx + 1")) == 6
        assert ok(await host.run_code("json.dumps({'x': twice(x)})")) == '{"x": 10}'
        assert ok(await host.run_code("y = 1")) is None  # no last expression: no value
        # Tools by their explicit path, and an object export's method.
        assert ok(await host.run_code("await tools.calc.add(1, 2)")) == 3
        assert (
            ok(await host.run_code("await board.add('a') + await tools.board.board.add('b')")) == 3
        )
        code = host.default_session.code
        await host.reset_code()
        # The replacement boots in the background at once; the next run uses it.
        with anyio.fail_after(60):
            while code.starts < 2:  # noqa: ASYNC110 - polling a counter, no event exists
                await anyio.sleep(0.05)
        after = await host.run_code("x")
        assert code.starts == 2
        assert not after.ok and after.error is not None
        assert after.error.type == "NameError" and after.error.kind == "exception"
        # Another session has a sandbox of its own.
        async with host.session() as other:
            assert ok(await other.run_code("'x' in globals()")) is False


async def test_errors_show_the_agents_own_traceback_only(proj: Path) -> None:
    async with Host.open(proj) as host:
        await host.run_code("def inner(n):\n    return 10 // n\n")
        result = await host.run_code("a = 1\ninner(0)")
        assert not result.ok and result.error is not None
        error = result.error
        assert (error.kind, error.type) == ("exception", "ZeroDivisionError")
        assert '"<run 2>", line 2' in error.traceback
        assert '"<run 1>", line 2, in inner' in error.traceback
        for leak in ("capsule", "toolhost", str(ROOT), "_guest", "asyncio"):
            assert leak not in error.traceback, leak
        syntax = await host.run_code("def (:")
        assert syntax.error is not None and syntax.error.type == "SyntaxError"
        # A value that is not plain data comes back as its repr, with a warning.
        odd = await host.run_code("{1, 2}")
        assert odd.ok and odd.value == "{1, 2}"
        assert any("not plain data" in w for w in odd.warnings)


async def test_host_errors_are_catchable_by_name(proj: Path) -> None:
    code = textwrap.dedent(
        """
        caught = []
        try:
            await boom("no luck")
        except ToolError as e:
            caught.append((type(e).__name__, e.type_name, e.error_message, e.tool))
        try:
            await add(1)
        except InvalidArguments as e:
            caught.append((type(e).__name__, e.parameter))
        try:
            await add({1, 2}, 3)
        except InvalidArguments as e:
            caught.append((type(e).__name__, "local"))
        proxy = add
        proxy._tool = "no_such_tool"  # tampering only changes what is asked for
        try:
            await proxy(1, 2)
        except UnknownTool as e:
            caught.append((type(e).__name__, e.name))
        assert issubclass(PolicyDenied, CallError) and issubclass(CallError, HostError)
        caught
        """
    )
    async with Host.open(proj) as host:
        result = await host.run_code(code)
    assert ok(result) == [
        ["ToolError", "ValueError", "no luck", "boom"],
        ["InvalidArguments", "b"],
        ["InvalidArguments", "local"],
        ["UnknownTool", "no_such_tool"],
    ]
    assert [(c.tool, c.ok, c.error) for c in result.calls] == [
        ("boom", False, "tool_error"),
        ("add", False, "invalid_arguments"),
        ("no_such_tool", False, "unknown_tool"),
    ]


async def test_gather_runs_tool_calls_concurrently(proj: Path) -> None:
    async with Host.open(proj) as host:
        result = await host.run_code("max(await asyncio.gather(*[probe(0.3) for _ in range(4)]))")
    assert ok(result) == 4  # all four were in flight at once, host-side
    assert len(result.calls) == 4


async def test_runs_move_to_asyncio_when_they_need_it(proj: Path) -> None:
    """Runs that only await tool calls are driven without an event loop; a run moves to
    asyncio's loop mid-flight when it needs one, even when it does not name asyncio."""
    async with Host.open(proj) as host:
        assert ok(await host.run_code("[await add(i, 1) for i in range(3)]")) == [1, 2, 3]
        # A helper using asyncio, defined in one run, is called by a later run that does
        # not say "asyncio": its gather still runs the calls at once.
        await host.run_code(
            "import asyncio as aio\nasync def fan(n):\n"
            "    return max(await aio.gather(*[probe(0.3) for _ in range(n)]))\n"
        )
        start = anyio.current_time()
        assert ok(await host.run_code("x = await add(1, 1)\n[x, await fan(3)]")) == [2, 3]
        assert anyio.current_time() - start < 0.85  # concurrent: not 3 x 0.3 s
        # A task started before a plain await runs while that call waits.
        code = "t = asyncio.create_task(slow(0.3))\n[await slow(0.3), await t, await add(2, 2)]"
        start = anyio.current_time()
        assert ok(await host.run_code(code)) == [0.3, 0.3, 4]
        assert anyio.current_time() - start < 0.55
        # Errors raised where the call was awaited, in either mode, are catchable.
        code = (
            "async def safe(m):\n"
            "    try:\n"
            "        return await boom(m)\n"
            "    except ToolError as e:\n"
            "        return e.type_name\n"
            "[await safe('a'), *(await asyncio.gather(safe('b'), add(1, 2)))]"
        )
        assert ok(await host.run_code(code)) == ["ValueError", "ValueError", 3]
        # A task the run left behind is cancelled, never run after the run ends.
        left = await host.run_code("t = asyncio.create_task(count())\n'started'")
        assert ok(left) == "started"
        assert ok(await host.run_code("await count()")) == 1


async def test_calls_on_the_loop_leave_timers_and_timeouts_working(proj: Path) -> None:
    """Once a run is on asyncio's loop, a call with nothing else pending is made in place
    (no future); a call made while a timer or another call is pending still waits on the
    loop, so the timer fires meanwhile and ``wait_for`` still times it out. Asserted on
    order and outcomes, never on wall time (the machine may be loaded)."""
    async with Host.open(proj) as host:
        code = (
            "await asyncio.sleep(0)\n"  # on the loop from here on
            "seen = []\n"
            "async def tick():\n"
            "    await asyncio.sleep(0.05)\n"
            "    seen.append('tick')\n"
            "t = asyncio.create_task(tick())\n"
            "await asyncio.sleep(0)\n"  # tick now waits on its timer
            "await slow(0.4)\n"
            "during = list(seen)\n"  # the timer fired while the call waited
            "try:\n"
            "    await asyncio.wait_for(slow(60.0), 0.1)\n"
            "    timed = 'no'\n"
            "except TimeoutError:\n"
            "    timed = 'timeout'\n"
            "[during, timed, [await add(i, 1) for i in range(3)]]"
        )
        result = await host.run_code(code)
        assert ok(result) == [["tick"], "timeout", [1, 2, 3]]
        # wait_for did not wait for the call: it was cancelled, long before its 60 s (a
        # call that ran to its end would be ok, and wait_for would have returned its value).
        assert [(c.tool, c.ok, c.error) for c in result.calls[:2]] == [
            ("slow", True, None),
            ("slow", False, "cancelled"),
        ]
        code = (
            "await asyncio.sleep(0)\n"
            "async def safe(m):\n"
            "    try:\n"
            "        return await boom(m)\n"
            "    except ToolError as e:\n"
            "        return e.type_name\n"
            "[await safe('x'), await add(2, 2)]"
        )
        assert ok(await host.run_code(code)) == ["ValueError", 4]


async def test_asyncio_reached_without_its_name_right_after_boot(proj: Path) -> None:
    """Code that reaches asyncio without naming it, in a sandbox just booted (before the
    idle warm-up imported asyncio), still finds its event loop running."""
    codes = (
        "aio = __import__('asyncio')\nt = aio.create_task(add(1, 2))\nawait t",
        "import importlib\nloop = importlib.import_module('asyncio').get_running_loop()\n"
        "await loop.create_task(add(1, 2))",
    )
    async with Host.open(proj) as host:
        for code in codes:
            await host.reset_code()  # the run below goes to a sandbox booted just now
            result = await host.run_code(code)
            assert result.ok, result.error
            assert result.value == 3
            # And once the loop exists, a run naming asyncio finds the same loop.
            assert ok(await host.run_code("await asyncio.gather(add(1, 1), add(2, 2))")) == [2, 4]


async def test_the_guest_starts_without_the_runtimes_zip(proj: Path, runtime: str) -> None:
    """What the guest imports while starting comes from the library's copy of it, not
    the runtime's standard library zip (whose directory is slow to read); the rest of the
    standard library is still there."""
    if runtime != "default":
        pytest.skip("the data runtime starts from its snapshot: tests/test_data_runtime.py")
    async with Host.open(proj) as host:
        code = "import encodings, __future__\n[encodings.__file__, __future__.__file__]"
        files = ok(await host.run_code(code))
        assert all(f.startswith("/toolhost/stdlib/") for f in files), files
        # Not -I (PYTHONPATH must count), but no site, no user site, no unsafe path, and
        # an environment of the host's making only.
        code = (
            "import sys, os\n"
            "f = sys.flags\n"
            "[f.no_site, f.no_user_site, f.safe_path, 'site' in sys.modules, sorted(os.environ)]"
        )
        assert ok(await host.run_code(code)) == [
            1,
            1,
            True,
            False,
            ["MSGPACK_PUREPYTHON", "PYTHONPATH"],
        ]
        code = "import json, encodings.latin_1\n[json.__file__, 'é'.encode('latin-1')]"
        assert ok(await host.run_code(code)) == [
            "/usr/local/lib/python312.zip/json/__init__.pyc",
            b"\xe9",
        ]


async def test_a_call_never_awaited_never_runs(proj: Path) -> None:
    async with Host.open(proj) as host:
        result = await host.run_code("a = 1\npending = count()\n'done'")
        assert ok(result) == "done"
        assert result.calls == []
        assert len(result.warnings) == 1
        assert "count" in result.warnings[0] and "line 2" in result.warnings[0]
        assert "never awaited" in result.warnings[0]
        assert ok(await host.run_code("await count()")) == 1  # the first one never ran


@pytest.mark.slow
async def test_waiting_on_tools_does_not_count_against_the_time_limit(proj: Path) -> None:
    async with Host.open(proj, limits={"code_timeout": "1s"}) as host:
        assert ok(await host.run_code("x = 7\nawait slow(1.5)")) == 1.5
        result = await host.run_code("while True:\n    pass")
        assert not result.ok and result.error is not None
        assert (result.error.kind, result.error.limit) == ("limit_exceeded", "code_timeout")
        assert "were lost" in result.error.message
        fresh = await host.run_code("'x' in globals()")
        assert ok(fresh) is False  # a fresh sandbox


async def test_call_and_output_limits(proj: Path) -> None:
    limits = {"code_max_calls": 3, "code_max_output": 100}
    async with Host.open(proj, limits=limits) as host:
        assert ok(await host.run_code("[await add(i, 1) for i in range(3)]")) == [1, 2, 3]
        many = await host.run_code("for i in range(10):\n    await add(i, 1)")
        assert many.error is not None and many.error.limit == "code_max_calls"
        assert len(many.calls) == 3
        assert ok(await host.run_code("print('a' * 50)")) is None
        loud = await host.run_code("try:\n    print('a' * 500)\nexcept Exception:\n    pass")
        assert loud.error is not None and loud.error.limit == "code_max_output"
        assert len(loud.stdout) <= 100
        assert ok(await host.run_code("1 + 1")) == 2


@pytest.mark.slow
async def test_memory_limit(proj: Path) -> None:
    async with Host.open(proj, limits={"code_memory": "64MiB"}) as host:
        await host.run_code("keep = 1")
        bomb = await host.run_code("blob = bytearray(512 * 1024 * 1024)")
        assert bomb.error is not None
        assert (bomb.error.kind, bomb.error.limit) == ("limit_exceeded", "code_memory")
        assert bomb.error.message.startswith(
            "limit code_memory exceeded: the code needed more memory than code_memory allows "
            "(64 MiB; raise [limits] code_memory to allow more); "
        )
        assert "were lost" in bomb.error.message
        assert ok(await host.run_code("'keep' in globals()")) is False
        assert ok(await host.run_code("len(bytearray(8 * 1024 * 1024))")) == 8 * 1024 * 1024


async def test_policy_denied_is_catchable(
    make_project: Callable[..., Path], wasm_prepared: Any
) -> None:
    del wasm_prepared
    policy = ALLOW_AGENT + textwrap.dedent(
        """
        [[rules]]
        id = "no-boom"
        tools = ["boom"]
        decision = "deny"
        reason = "boom is off limits"
        """
    )
    code = textwrap.dedent(
        """
        try:
            await boom("x")
            outcome = "ran"
        except PolicyDenied as e:
            outcome = ("denied", e.rule, e.tool)
        outcome
        """
    )
    async with Host.open(project(make_project, policy)) as host:
        result = await host.run_code(code)
        assert ok(result) == ["denied", "no-boom", "boom"]
        assert [(c.tool, c.decision, c.ok) for c in result.calls] == [("boom", "deny", False)]


@pytest.mark.slow
@pytest.mark.parametrize("answer", [True, False])
async def test_escalation_inside_code_waits_in_place(
    make_project: Callable[..., Path], wasm_prepared: Any, answer: bool
) -> None:
    del wasm_prepared
    policy = ALLOW_AGENT + textwrap.dedent(
        """
        [[rules]]
        id = "count-needs-ok"
        tools = ["count"]
        callers = ["agent"]
        decision = "escalate"
        """
    )
    asked: list[str] = []

    async def approver(request: Any) -> bool:
        asked.append(request.tool)
        await anyio.sleep(1.5)  # longer than code_timeout: waiting does not count
        return answer

    code = textwrap.dedent(
        """
        try:
            outcome = await count()
        except NotApproved as e:
            outcome = "not approved"
        outcome
        """
    )
    async with Host.open(
        project(make_project, policy), approver=approver, limits={"code_timeout": "1s"}
    ) as host:
        result = await host.run_code(code)
        assert asked == ["count"]  # asked once: no replay
        assert ok(result) == (1 if answer else "not approved")
        assert [(c.tool, c.decision, c.ok) for c in result.calls] == [("count", "escalate", answer)]
        # The approved call ran exactly once; a denied one never ran.
        assert await host.call("count") == (2 if answer else 1)


@pytest.mark.slow
async def test_awkward_values_and_deep_recursion(proj: Path) -> None:
    async with Host.open(proj) as host:
        assert ok(await host.run_code("2 ** 64 - 1")) == 2**64 - 1
        huge = await host.run_code("10 ** 5000")
        assert huge.ok and huge.value == "<unrepresentable: ValueError>"
        assert ok(await host.run_code("b'\\x00\\xff'")) == b"\x00\xff"
        assert ok(await host.run_code("(1, [2.5, None], {'k': True})")) == [
            1,
            [2.5, None],
            {"k": True},
        ]
        recursion = await host.run_code("def f(n):\n    return f(n + 1)\nf(0)")
        assert recursion.error is not None and recursion.error.type == "RecursionError"
        deeper = await host.run_code(
            "import sys\nsys.setrecursionlimit(10**6)\ndef g(n):\n    return g(n + 1)\ng(0)"
        )
        assert not deeper.ok  # a RecursionError, or a stack-exhaustion trap: never the host
        if deeper.error is not None and deeper.error.type == "RecursionError":
            # 10**6 frames: the traceback shows the ends of the stack and counts the rest
            # (reading every frame's source took the guest 10-30 s)
            assert deeper.error.traceback is not None
            assert "more frames of the same run ..." in deeper.error.traceback
            assert deeper.error.traceback.count("line 4, in g") <= 2 * 4
        # recursion through C code exhausts the guest's own stack: a trap, then a new sandbox
        trap = await host.run_code(
            "import sys\nsys.setrecursionlimit(10**6)\n"
            "def h(n):\n    return list(map(h, [n + 1]))\nh(0)"
        )
        assert trap.error is not None and trap.error.kind in ("capsule_crashed", "exception")
        assert ok(await host.run_code("await add(1, 1)")) == 2
