"""The console budget of one capsule, in whole lines (``_ConsoleGate``, on a fake clock).

What a capsule prints passes one token bucket per capsule (1 MiB burst, then 256 KiB/s).
What is over the budget is dropped in whole lines, so what is shown is never a fragment of
a line nor the newline of a dropped one, and each run of dropped output is said once, with
its size (README, "The capsule").
"""

from __future__ import annotations

import pytest

from host._events import Event, EventBus
from host.capsules import _subprocess
from host.capsules._subprocess import _CONSOLE_BURST, _ConsoleGate


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(_subprocess, "time", fake)
    return fake


class _Bus(EventBus):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Event] = []
        self.subscribe(self.seen.append)

    def shown(self) -> str:
        return "".join(e.data["data"] for e in self.seen if e.kind == "console")

    def dropped(self) -> list[int]:
        return [e.data["dropped_bytes"] for e in self.seen if e.kind == "console_dropped"]


def _print(gate: _ConsoleGate, text: str, stream: str = "stdout") -> None:
    """As an unbuffered ``print`` writes: the text, then the newline, separately."""
    gate.emit("console", "s", stream=stream, data=text)
    gate.emit("console", "s", stream=stream, data="\n")


def test_a_flood_shows_whole_lines_only_and_says_what_it_dropped_once(clock: _Clock) -> None:
    bus = _Bus()
    gate = _ConsoleGate(bus)
    line = "x" * 99  # 100 bytes with its newline
    total = 0
    for i in range(20_000):  # 2 MB at once: twice the burst
        _print(gate, f"{i:06d}" + line[6:])
        total += 100
    gate.flush()  # the call returned
    shown = bus.shown()
    assert shown.splitlines() == [f"{i:06d}" + line[6:] for i in range(len(shown) // 100)]
    assert bus.dropped() == [total - len(shown)]  # one run, said once
    assert len(shown) == _CONSOLE_BURST // 100 * 100


def test_output_resumes_with_a_second_of_budget_at_a_line_start(clock: _Clock) -> None:
    bus = _Bus()
    gate = _ConsoleGate(bus)
    gate.emit("console", "s", stream="stderr", data="a" * (_CONSOLE_BURST - 1) + "\n")
    gate.emit("console", "s", stream="stderr", data="b" * 10)  # over: dropped, mid-line
    clock.now += 0.5
    _print(gate, "c" * 20, stream="stderr")  # the rest of that line: dropped with it
    gate.emit("console", "s", stream="stderr", data="d" * 20 + "\n")  # half a second's
    clock.now += 1.0  # budget is not enough to resume; a second's is
    gate.emit("console", "s", stream="stderr", data="e" * 10)
    gate.emit("console", "s", stream="stderr", data="\nshown\n")
    # The note comes where the gap was, before the output shown after it.
    assert [e.kind for e in bus.seen] == ["console", "console_dropped", "console", "console"]
    assert bus.dropped() == [10 + 21 + 21]
    assert bus.seen[1].data["total_bytes"] == 52
    assert bus.shown() == "a" * (_CONSOLE_BURST - 1) + "\n" + "e" * 10 + "\nshown\n"


def test_a_line_being_shown_is_finished_when_the_budget_runs_out(clock: _Clock) -> None:
    bus = _Bus()
    gate = _ConsoleGate(bus)
    gate.emit("console", "s", stream="stdout", data="y" * (_CONSOLE_BURST - 10))
    gate.emit("console", "s", stream="stdout", data="head of a line")  # fits: shown open
    gate.emit("console", "s", stream="stdout", data=" and its tail\nnext line\n")
    gate.flush()
    assert bus.shown().endswith("head of a line and its tail\n")
    assert bus.dropped() == [len("next line\n")]


def test_a_line_too_long_to_finish_is_ended_where_it_was_cut(clock: _Clock) -> None:
    bus = _Bus()
    gate = _ConsoleGate(bus)
    gate.emit("console", "s", stream="stdout", data="z" * _CONSOLE_BURST)  # open
    gate.emit("console", "s", stream="stdout", data="z" * 100_000)  # no newline in sight
    gate.emit("console", "s", stream="stdout", data="zz\nafter\n")
    gate.flush()
    assert bus.shown() == "z" * _CONSOLE_BURST + "\n"
    assert bus.dropped() == [100_000 + len("zz\nafter\n")]


def test_streams_keep_their_own_lines(clock: _Clock) -> None:
    bus = _Bus()
    gate = _ConsoleGate(bus)
    gate.emit("console", "s", stream="stdout", data="o" * (_CONSOLE_BURST - 5))
    gate.emit("console", "s", stream="stderr", data="e" * 100)  # over: dropped
    gate.emit("console", "s", stream="stdout", data="ut\n")  # finishes stdout's line
    gate.flush()
    shown = [e.data for e in bus.seen if e.kind == "console"]
    assert [d["stream"] for d in shown] == ["stdout", "stdout"]
    assert bus.dropped() == [100]


def test_without_a_flood_nothing_is_dropped_or_said(clock: _Clock) -> None:
    bus = _Bus()
    gate = _ConsoleGate(bus)
    for _ in range(3):
        gate.emit("console", "s", stream="stdout", data="partial, no newline")
        clock.now += 1
    gate.flush()
    assert bus.shown() == "partial, no newline" * 3
    assert bus.dropped() == []
