"""The event-loop stdio transport of ``toolhost serve`` (``host/serve/_stdio.py``).

A child process serves an echo over ``stdio_streams`` on asyncio and on trio; the test
writes to its stdin as a client would (whole lines, lines in pieces, several in one
write, garbage, a line over the limit) and reads its stdout. The MCP path itself
(``toolhost serve`` with the official client) is in ``test_serve_transports.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from .conftest import ROOT

ECHO = textwrap.dedent(
    """
    import sys

    import anyio
    import mcp.types as types
    from mcp.shared.message import SessionMessage

    from host.serve import _stdio


    async def main() -> None:
        _stdio.MAX_LINE = 1000
        async with _stdio.stdio_streams() as (read, write):
            print("stray output", flush=True)  # must not reach the wire
            async for item in read:
                if isinstance(item, Exception):
                    kind = {"kind": type(item).__name__}
                    note = {"jsonrpc": "2.0", "method": "bad", "params": kind}
                    item = SessionMessage(types.jsonrpc_message_adapter.validate_python(note))
                await write.send(item)
        print("stdout is back", flush=True)


    anyio.run(main, backend=sys.argv[1])
    """
)


def note(n: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": "n", "params": {"n": n}}).encode() + b"\n"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_lines_in_any_pieces_garbage_and_overlong_lines(backend: str) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", ECHO, backend],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=str(ROOT),
    )
    assert child.stdin is not None
    one, two = note(1), note(2)
    child.stdin.write(one[:10])  # a line in two writes
    child.stdin.flush()
    time.sleep(0.2)
    child.stdin.write(one[10:] + two + b"\n  \n")  # the rest, another whole, blank lines
    child.stdin.write(b"this is not json\n")
    child.stdin.write(b'{"jsonrpc": "2.0", "params": "' + b"x" * 5000 + b'"}\n')  # over 1000
    child.stdin.write(b"\xff\xfe\n")  # not UTF-8
    # The last line, then end of input: the server's read stream ends.
    out, err = child.communicate(input=note(3), timeout=60)
    assert child.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[-1] == "stdout is back"
    messages = [json.loads(line) for line in lines[:-1]]
    # Each bad line: a JSON-RPC error (id null) to the client, the exception to the server
    # (the two reach the wire in either order).
    errors = [m["error"]["code"] for m in messages if "error" in m]
    echoed = [m["params"].get("n", m["params"].get("kind")) for m in messages if "params" in m]
    assert errors == [-32700, -32600, -32700], messages
    assert echoed == [1, 2, "ValidationError", "LineTooLong", "ValidationError", 3], messages
    assert all(m["id"] is None for m in messages if "error" in m)
    assert b"stray output" in err  # descriptor 1 pointed at stderr while serving


def test_a_client_that_goes_away_ends_the_server() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", ECHO, "asyncio"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=str(ROOT),
    )
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(note(1))
    child.stdin.flush()
    assert json.loads(child.stdout.readline())["params"] == {"n": 1}
    child.stdout.close()  # the client stops reading: writes break
    child.stdin.write(note(2))
    child.stdin.close()
    assert child.wait(timeout=60) in (0, 1)  # "stdout is back" may find the pipe broken
    assert child.stderr is not None
    child.stderr.close()
