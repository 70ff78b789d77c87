"""A. Agent code against the sandbox's own rules: time, calls, and asyncio (issue 12,
findings 6, 8 and part of 9).

Each case runs on the real Wasm guest and on the labelled subprocess fallback, and asserts
on what is left afterwards: the run's result (its calls included), the audit, the guest
process gone or still serving, the next run.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host import Host
from tests.test_wasm import wasm_prepared

from ._code import KINDS, ok, project

pytestmark = pytest.mark.anyio
__all__ = ["wasm_prepared"]  # the session fixture, used by project() for the Wasm kind

MakeProject = Callable[..., Path]


def calls_of(result: Any) -> list[tuple[str, str | None, bool, str | None]]:
    return [(c.tool, c.decision, c.ok, c.error) for c in result.calls]


# -- finding 8: the result lists every call that was made, whatever stopped the run -------


@pytest.mark.parametrize("kind", KINDS)
async def test_calls_cut_short_by_the_call_limit_are_listed(
    make_project: MakeProject, request: pytest.FixtureRequest, kind: str
) -> None:
    proj = project(make_project, kind, request)
    async with Host.open(proj, limits={"code_max_calls": 50}) as host:
        result = await host.run_code("await asyncio.gather(*[add(i, 1) for i in range(60)])")
        assert result.error is not None and result.error.limit == "code_max_calls"
        assert len(result.calls) == 50
        assert {(c.tool, c.decision) for c in result.calls} == {("add", "allow")}
        # Each call the audit has from this run is in the result, and no other.
        records = [r for r in await host.store.tail(200) if r.caller == "agent"]
        assert len(records) == len(result.calls)
        assert ok(await host.run_code("await add(1, 1)")) == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_a_call_abandoned_by_wait_for_shows_its_decision(
    make_project: MakeProject, request: pytest.FixtureRequest, kind: str
) -> None:
    proj = project(make_project, kind, request)
    code = """
        import asyncio
        await asyncio.sleep(0)  # on the loop (a run stepped by hand: see the test below)
        try:
            await asyncio.wait_for(count_then_wait(30), 0.5)
            outcome = "finished"
        except TimeoutError:
            outcome = "timed out"
        outcome
    """
    async with Host.open(proj) as host:
        result = await host.run_code(textwrap.dedent(code))
        assert ok(result) == "timed out"
        assert calls_of(result) == [("count_then_wait", "allow", False, "cancelled")]
        assert await host.call("count") == 2  # it did run: it counted once


@pytest.mark.parametrize("kind", KINDS)
async def test_calls_in_flight_when_the_sandbox_dies_are_listed(
    make_project: MakeProject, request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    proj = project(make_project, kind, request)
    door = tmp_path / "door"
    code = f"""
        import asyncio, os
        pending = asyncio.create_task(gate({str(door)!r}))
        await add(1, 2)
        await asyncio.sleep(0.3)
        os._exit(3)
    """
    async with Host.open(proj) as host:
        try:
            result = await host.run_code(textwrap.dedent(code))
        finally:
            door.touch()
        assert result.error is not None and result.error.kind == "capsule_crashed"
        assert sorted(calls_of(result)) == [  # pyright: ignore[reportArgumentType]
            ("add", "allow", True, None),
            ("gate", "allow", False, "cancelled"),
        ]
        assert ok(await host.run_code("await add(2, 2)")) == 4
