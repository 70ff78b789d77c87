"""An approver is never shown less than they approve without being told (E01-E03, I09;
issue 12.10).

The compact view cuts what would flood a screen: values nested more than 6 levels deep,
lists and dicts after 20 entries, long strings and bytes. Each cut is a warning listed
first and marked ``not everything is shown``; the terminal approver puts a banner above
the arguments, requires the typed ``yes`` that warnings require, and shows the full
canonical arguments (escaped, secrets replaced, paged) on ``f``. The tests drive the
terminal approver with real input through a running host; the canary is the marker file
the tool appends exactly what it received to.
"""

from __future__ import annotations

import io
import json
import os
import pty
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from rich.console import Console

from capsule.protocol import MAX_DEPTH
from host import Event, Host, NotApproved, TerminalApprover
from host._display import Redactor, render_arguments, render_full
from host.testing import in_process
from tests.test_approval import wait_for

TOOLS = {
    "ops": '''
        import json
        import os
        from pathlib import Path
        from typing import Any


        def apply(config: dict[str, Any]) -> str:
            """Appends exactly what it received to the marker file."""
            with Path(os.environ["OPS_MARKER"]).open("a", encoding="utf-8") as f:
                f.write(json.dumps(config, default=lambda b: b.decode()) + "\\n")
            return "applied"
        ''',
}
POLICY = """
    version = 1
    [defaults]
    app = "allow"
    [[rules]]
    id = "ask"
    tools = ["apply"]
    decision = "escalate"
    [env]
    pass = ["OPS_MARKER", "OPS_TOKEN"]
    secret = ["OPS_TOKEN"]
"""
NEEDLE = "rm -rf /srv/prod"
TOKEN = "sk-approval-9b1e44c0"


def deep(levels: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


HIDDEN = {  # everything an approver needs to see is past the compact view's cuts
    "safe": "looks harmless",
    "long": "x" * 500 + NEEDLE + "x" * 500,
    "deep": deep(9, NEEDLE),
    "wide": {f"k{i:02}": "ok" for i in range(20)} | {"k20": NEEDLE},
    "bytes": b"y" * 500 + NEEDLE.encode() + b"y" * 500,
    "bidi": "a\u202eb",
    "token": f"Bearer {TOKEN}",
}


class Ops:
    def __init__(self, root: Path, marker: Path) -> None:
        self.root = root
        self.marker = marker

    def ran(self) -> list[Any]:
        if not self.marker.exists():
            return []
        return [json.loads(line) for line in self.marker.read_text().splitlines()]

    @asynccontextmanager
    async def open(self, approver: Any, **kwargs: Any) -> AsyncIterator[Host]:
        kwargs.setdefault("capsule", in_process())
        async with Host.open(self.root, approver=approver, **kwargs) as host:
            yield host


@pytest.fixture
def ops(make_project: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ops:
    # In a folder of its own: a subprocess capsule may not create files directly in the
    # folders above the project (Landlock; README, "The capsule").
    marker = tmp_path / "out" / "ops.jsonl"
    marker.parent.mkdir()
    monkeypatch.setenv("OPS_MARKER", str(marker))
    monkeypatch.setenv("OPS_TOKEN", TOKEN)
    return Ops(make_project(TOOLS, policy=POLICY), marker)


def terminal(answers: str, **kwargs: Any) -> tuple[TerminalApprover, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, width=120, color_system=None)
    return TerminalApprover(console=console, stdin=io.StringIO(answers), **kwargs), out


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda b: b.decode()))


# -- the compact view says what it cut -----------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "cut"),
    [
        ({"v": deep(7, 1)}, "nested more than 6 levels deep is hidden"),
        ({"v": {f"k{i}": i for i in range(21)}}, "cut after 20 entries"),
        ({"v": list(range(21))}, "cut after 20 entries"),
        ({"v": "x" * 301}, "strings longer than 300 chars"),
        ({"v": b"x" * 301}, "bytes values over 300 bytes"),
    ],
    ids=["deep", "wide-dict", "long-list", "long-str", "long-bytes"],
)
def test_every_cut_is_a_warning_listed_first(arguments: dict[str, Any], cut: str) -> None:
    rendered = render_arguments({**arguments, "odd": "a\u200bb"})
    assert rendered.elided
    first = rendered.warnings[0]
    assert first.startswith("not everything is shown: ") and cut in first
    assert any("invisible" in w for w in rendered.warnings[1:])


def test_what_fits_is_not_flagged() -> None:
    fits = {"v": deep(6, 1), "d": {f"k{i}": i for i in range(20)}, "s": "x" * 300}
    rendered = render_arguments(fits)
    assert not rendered.elided and rendered.warnings == ()


def test_the_full_view_hides_nothing_and_forges_nothing() -> None:
    redactor = Redactor({"OPS_TOKEN": TOKEN})
    full = render_full(
        {**HIDDEN, "forged": "⟨secret OPS_TOKEN⟩", "esc": "\x1b[2J"}, redactor=redactor
    )
    assert full.count(NEEDLE) == 4  # deep, the 21st key, after a long run, inside bytes
    assert f'"k20": "{NEEDLE}",' in full
    assert 'long = "' + "x" * 500 + NEEDLE + "x" * 500 + '"\n' in full
    assert 'bidi = "a\\u{202E}b"' in full and 'esc = "\\x1b[2J"' in full
    assert 'token = "Bearer ⟨secret OPS_TOKEN⟩"' in full and TOKEN not in full
    assert 'forged = "\\u{27E8}secret OPS_TOKEN\\u{27E9}"' in full  # not a real marker


def test_the_full_view_reaches_the_wire_s_depth_without_recursion() -> None:
    full = render_full({"v": deep(MAX_DEPTH, NEEDLE)})
    lines = full.splitlines()
    assert len(lines) == 2 * MAX_DEPTH + 1
    assert lines[MAX_DEPTH] == "  " * MAX_DEPTH + f'"{NEEDLE}",'


# -- the terminal approver, driven through a running host ----------------------------------


@pytest.mark.anyio
async def test_a_single_y_does_not_allow_what_was_cut(ops: Ops) -> None:
    approver, out = terminal("y\ny\n")
    seen: list[Event] = []
    async with ops.open(approver) as host:
        host.on("policy_escalation", seen.append)
        with pytest.raises(NotApproved) as info:
            await host.call("apply", HIDDEN)
    assert "not confirmed" in str(info.value)
    assert ops.ran() == []  # nothing ran
    shown = out.getvalue()
    banner, arguments = shown.index("NOT EVERYTHING IS SHOWN"), shown.index("arguments, exactly")
    assert banner < arguments  # above the arguments, not after them
    for cut in ("nested more than 6 levels", "cut after 20 entries", "strings longer than"):
        assert cut in shown
    assert "Type yes to allow" in shown
    assert NEEDLE not in render_arguments(HIDDEN).text  # the compact view never shows it
    assert TOKEN not in shown
    assert seen[0].data["elided"] is True


@pytest.mark.anyio
async def test_f_shows_everything_then_yes_allows(ops: Ops) -> None:
    approver, out = terminal("f\n\ny\nyes\n")  # Enter: the second page of the full view
    async with ops.open(approver) as host:
        assert await host.call("apply", HIDDEN) == "applied"
    assert ops.ran() == [jsonable({**HIDDEN, "token": f"Bearer {TOKEN}"})]
    shown = out.getvalue()
    full = shown[shown.index("all the arguments of apply") :]
    assert full.count(NEEDLE) == 4 and "-- end of the arguments --" in full
    assert TOKEN not in shown and "⟨secret OPS_TOKEN⟩" in full


@pytest.mark.anyio
async def test_the_full_view_is_paged_and_can_be_left(ops: Ops) -> None:
    # Two pages of 10 lines: Enter for the second, q during the third, then deny.
    approver, out = terminal("f\n\nq\nn\n", page_lines=10, line_chars=80)
    async with ops.open(approver) as host:
        with pytest.raises(NotApproved):
            await host.call("apply", HIDDEN)
    assert ops.ran() == []
    shown = out.getvalue()
    assert shown.count("-- more: Enter for the next page, q to stop --") == 2
    assert "(the rest is not shown)" in shown and "-- end of the arguments --" not in shown
    assert "⟨…⟩ " in shown  # a line longer than 80 chars goes on in marked pieces
    assert shown.count("[f] show the arguments in full") == 2  # asked again after paging


@pytest.mark.anyio
async def test_nothing_cut_needs_no_confirmation(ops: Ops) -> None:
    approver, out = terminal("y\n")
    async with ops.open(approver) as host:
        assert await host.call("apply", {"safe": "short"}) == "applied"
    assert ops.ran() == [{"safe": "short"}]
    assert "NOT EVERYTHING IS SHOWN" not in out.getvalue()


@pytest.mark.anyio
@pytest.mark.subprocess
async def test_paging_on_a_real_terminal(ops: Ops) -> None:
    """The same keys through a pty and a real subprocess capsule: nothing runs before the
    typed yes, and what runs is what the full view showed."""
    controller, tty = pty.openpty()
    out = io.StringIO()

    def shown() -> str:
        return out.getvalue()

    async def answer(when: str, count: int, keys: bytes) -> None:
        await wait_for(lambda: shown().count(when) >= count, when)
        os.write(controller, keys)

    try:
        with open(tty, encoding="utf-8") as stdin:  # noqa: ASYNC230 - a pty, no disk I/O
            approver = TerminalApprover(
                console=Console(file=out, width=120, color_system=None),
                stdin=stdin,
                page_lines=40,  # two pages
            )
            async with ops.open(approver, capsule=None) as host, anyio.create_task_group() as tg:
                tg.start_soon(host.call, "apply", HIDDEN)
                await answer("answer: ", 1, b"f\n")
                await answer("-- more", 1, b"\n")
                await answer("-- end of the arguments --", 1, b"")
                await answer("answer: ", 2, b"y\n")
                await answer("Type yes to allow", 1, b"")
                assert ops.ran() == []  # not before the confirmation
                os.write(controller, b"yes\n")
    finally:
        os.close(controller)
    assert ops.ran() == [jsonable({**HIDDEN, "token": f"Bearer {TOKEN}"})]
    assert NEEDLE in shown() and TOKEN not in shown()
