"""G04: every walker that reads decoded or bound values stops at a depth, as data.

msgpack decodes up to 1024 levels. What reads a value after that either has a cap of its
own at most that deep (``check_plain``, binding, the result converter and the guest codec
at ``MAX_DEPTH``; the redacted display at 6), or is given one here: these tests pass
values as deep as each stage lets through and expect a typed error or a result, never a
``RecursionError`` (the wire-level cases are in test_connection.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from capsule._convert import NotPlainData, to_plain
from capsule.protocol import MAX_DEPTH, BadFrame, as_map, check_plain, decode, encode
from host import Host, InvalidArguments
from host._display import summarize_arguments
from host.testing import in_process

TREE = """\
from typing import Union

Json = Union[None, int, list["Json"]]


def depth(value: Json) -> int:
    n = 0
    while isinstance(value, list):
        value = value[0] if value else None
        n += 1
    return n
"""


def nest(depth: int) -> Any:
    value: Any = None
    for _ in range(depth):
        value = [value]
    return value


def test_the_decoder_and_the_checker_stop_at_their_caps() -> None:
    deepest = decode(encode({"v": nest(1022)}))  # msgpack's own limit is 1024 levels
    with pytest.raises(BadFrame, match="nested deeper"):
        check_plain(deepest)
    with pytest.raises(BadFrame):
        decode(b"\x91" * 1025 + b"\xc0")


def test_names_in_an_envelope_must_be_strings() -> None:
    for field in ("k", "kind", "file"):
        with pytest.raises(BadFrame, match=f"'{field}' must be a string"):
            as_map(decode(encode({field: nest(1022)})))
        with pytest.raises(BadFrame):
            as_map({field: ["ok"]})
    assert as_map({"k": "ok", "value": nest(5)}) == {"k": "ok", "value": nest(5)}


def test_the_converter_refuses_what_is_deeper_than_the_wire_allows() -> None:
    with pytest.raises(NotPlainData, match="nested deeper"):
        to_plain(nest(MAX_DEPTH + 1))
    assert to_plain(nest(MAX_DEPTH)) == nest(MAX_DEPTH)


def test_the_audit_summary_is_bounded() -> None:
    text = summarize_arguments({"value": nest(MAX_DEPTH)})
    assert len(text) < 1000


@pytest.mark.anyio
async def test_a_recursive_type_with_a_deep_argument_is_invalid_arguments(
    make_project: Callable[..., Path],
) -> None:
    project = make_project({"tree": TREE})
    async with Host.open(project, capsule=in_process()) as host:
        assert await host.call("depth", nest(50)) == 50
        for depth in (300, MAX_DEPTH):  # binding lets MAX_DEPTH through; jsonschema recurses
            with pytest.raises(InvalidArguments, match="nested too deeply"):
                await host.call("depth", nest(depth))


def test_the_command_line_prints_a_result_as_deep_as_the_wire_allows() -> None:
    from host.cli._common import dumps as _dumps

    deepest = {"v": nest(MAX_DEPTH - 1), "b": b"\x00"}
    assert '{"$bytes": "AA=="}' in _dumps(deepest)
    assert _dumps(deepest, pretty=True).count("[") == MAX_DEPTH - 1
