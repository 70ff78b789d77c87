"""Tool output on the command line's stderr: two streams, in whole lines (``_Console``).

The capsule's stdout and stderr reach the command line separately, in chunks that may end
inside a line. Written as they come they would cut each other's lines; the command line
holds one stream back while the other has a line open, and never prints a blank line for
a newline it already wrote (README, "Command line").
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from host.cli._common import _Console, note


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    _Console.open, _Console.cut, _Console.waiting = None, None, {}
    yield
    _Console.open, _Console.cut, _Console.waiting = None, None, {}


def test_a_stream_waits_while_the_other_has_a_line_open(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _Console.write("stdout", "out one")  # print() writes the text ...
    _Console.write("stderr", "err one\nerr two\n")  # ... the other stream comes between
    _Console.write("stdout", "\n")  # ... then the newline
    _Console.write("stderr", "err three")
    _Console.finish()
    assert capsys.readouterr().err == "out one\nerr one\nerr two\nerr three\n"


def test_a_line_cut_by_a_note_gets_no_blank_line_after_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _Console.write("stdout", "out one")
    note("3.2 MiB of tool output dropped here")
    _Console.write("stdout", "\n")  # its own newline, late: already written
    _Console.write("stdout", "out two\n")
    assert capsys.readouterr().err == (
        "out one\ntoolhost: 3.2 MiB of tool output dropped here\nout two\n"
    )


def test_too_much_waiting_ends_the_open_line_without_a_blank_line_after(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flood = "e" * 79 + "\n"
    _Console.write("stdout", "out one")
    for _ in range((2 << 20) // 80):  # 2 MiB of stderr behind a line that does not end
        _Console.write("stderr", flood)
    _Console.write("stdout", "\n")
    _Console.write("stdout", "out two\n")
    _Console.finish()
    lines = capsys.readouterr().err.split("\n")
    assert "" not in lines[:-1]
    assert lines[0] == "out one" and lines[-2] == "out two"
    assert set(lines[1:-2]) == {flood[:-1]}
