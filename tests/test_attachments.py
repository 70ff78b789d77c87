"""Results with files on real capsules of both kinds: a ``Result`` or an ``Attachment``
crosses as bytes, within ``[limits] max_attachment_size`` (checked by the capsule, and by
the host, which kills a capsule that sends more), is kept in the session's file area with
its metadata in the store, and reaches every caller: ``Attachment`` objects for the app,
the value (or a file's metadata) for agent code with the files in the run's result, the
command line's ``--json`` as metadata and a path, MCP as image or resource content.
"""

from __future__ import annotations

import base64
import json
import struct
import subprocess
import textwrap
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest

from capsule.context import Attachment, Result
from host import CapsuleCrashed, Event, Host, LimitExceeded, ToolError
from host.testing import in_process

from .mcp_helpers import connect, served
from .test_policy_cli import TOOLHOST
from .test_wasm import wasm_prepared

pytestmark = [pytest.mark.anyio, pytest.mark.subprocess]
__all__ = ["wasm_prepared"]


def _png(side: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * side for _ in range(side))
    head = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", head)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _read(path: str | Path | None) -> bytes:
    assert path is not None
    return Path(path).read_bytes()


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


TOOLS = {
    "files": f'''
        from capsule.context import Attachment, Result, ToolContext

        PNG = {_png(2)!r}


        def many(count: int, size: int) -> Result[int]:
            """Files of ``size`` bytes each, and their count as the value."""
            return Result(
                count,
                attachments=[
                    Attachment(f"part {{i}}.bin", "application/octet-stream", bytes([i]) * size)
                    for i in range(count)
                ],
            )


        async def picture() -> Attachment:
            return Attachment("../../etc/pic.png", "image/png", PNG, width=2, height=2)


        def sound() -> Result[str]:
            """A short recording and a transcript."""
            return Result("hi", attachments=[Attachment("hi.wav", "audio/wav", b"RIFF....WAVE")])


        def clashing() -> Result[str]:
            same = Attachment("a.txt", "text/plain", b"one")
            return Result("two", attachments=[same, Attachment("a.txt", "text/plain", b"two")])


        def broken() -> Result[None]:
            file = Attachment("x.txt", "text/plain", b"x")
            file.data = "not bytes"
            return Result(None, attachments=[file])


        async def cheat(size: int, ctx: ToolContext) -> Attachment:
            ctx._channel._max_attachment = 1 << 40  # the capsule's own check, bypassed
            return Attachment("big.bin", "application/octet-stream", b"x" * size)


        async def relay_picture(ctx: ToolContext) -> Result[str]:
            got = await ctx.call("picture")
            return Result("relayed", attachments=[got])
    ''',
}
POLICY = """
    version = 1
    [defaults]
    agent = "allow"
    tool = "allow"
"""
WASM = """
    [capsules]
    default = "wasm"
"""


@pytest.fixture(
    params=["subprocess", pytest.param("wasm", marks=[pytest.mark.wasm, pytest.mark.slow])]
)
def project(request: pytest.FixtureRequest, make_project: Callable[..., Path]) -> Path:
    if request.param == "wasm":
        request.getfixturevalue("wasm_prepared")
    return make_project(tools=TOOLS, policy=POLICY + (WASM if request.param == "wasm" else ""))


async def test_files_reach_the_app_and_the_store(project: Path) -> None:
    async with Host.open(project) as host:
        seen: list[Event] = []
        host.on("policy_decision", seen.append)
        got = await host.call("many", 3, 1000)
        assert isinstance(got, Result) and got.value == 3
        assert [a.name for a in got.attachments] == ["part 0.bin", "part 1.bin", "part 2.bin"]
        assert [a.data for a in got.attachments] == [bytes([i]) * 1000 for i in range(3)]
        call_id = seen[-1].data["call_id"]
        stored = await host.store.files(call_id)  # pyright: ignore[reportAttributeAccessIssue]
        assert [f.name for f in stored] == ["part_0.bin", "part_1.bin", "part_2.bin"]
        for attachment, kept in zip(got.attachments, stored, strict=True):
            assert attachment.path == kept.path
            path = Path(kept.path)
            assert _read(path) == attachment.data
            assert path.parent == project / ".agent" / "files" / host.default_session.id / call_id
            assert _mode(path) == 0o600
            assert kept.sha256 == attachment.sha256 and kept.size == 1000
        # An attachment alone; a name made safe; two names made unique.
        picture = await host.call("picture")
        assert isinstance(picture, Attachment)
        assert (picture.mime_type, picture.width, picture.height) == ("image/png", 2, 2)
        assert picture.path is not None and Path(picture.path).name == "pic.png"
        assert _read(picture.path) == _png(2)
        clash = await host.call("clashing")
        assert [Path(a.path or "").name for a in clash.attachments] == ["a.txt", "a-2.txt"]
        assert [_read(a.path) for a in clash.attachments] == [b"one", b"two"]
        # A file changed after it was made into something else is the tool's error.
        with pytest.raises(ToolError) as caught:
            await host.call("broken")
        assert caught.value.type_name == "TypeError"
        # A tool's nested call gets the files too, and may pass them on.
        relayed = await host.call("relay_picture")
        assert relayed.value == "relayed" and relayed.attachments[0].data == _png(2)


async def test_agent_code_gets_values_and_the_run_gets_the_files(project: Path) -> None:
    async with Host.open(project) as host:
        out = await host.run_code("n = await many(2, 10)\np = await picture()\n[n, p]")
        assert out.ok, out.error
        count, info = out.value
        assert count == 2
        assert info == {
            "name": "../../etc/pic.png",
            "mime_type": "image/png",
            "size": len(_png(2)),
            "width": 2,
            "height": 2,
            "sha256": Attachment("p", "image/png", _png(2)).sha256,
        }
        assert [a.name for a in out.attachments] == [
            "part 0.bin",
            "part 1.bin",
            "../../etc/pic.png",
        ]
        assert out.attachments[2].data == _png(2)
        assert [_read(a.path) for a in out.attachments] == [a.data for a in out.attachments]
        assert str(project) not in json.dumps(out.value)  # no host path reaches the code


async def test_the_size_limit(project: Path) -> None:
    async with Host.open(project, limits={"max_attachment_size": 1000}) as host:
        assert (await host.call("many", 2, 500)).value == 2  # exactly at the limit
        with pytest.raises(LimitExceeded) as caught:
            await host.call("many", 2, 501)
        assert caught.value.limit == "max_attachment_size"
        assert "1002 bytes" in str(caught.value)
        # A capsule that sends more anyway broke the wire rules: it is killed.
        seen: list[Event] = []
        host.on("protocol_error", seen.append)
        with pytest.raises(CapsuleCrashed) as crashed:
            await host.call("cheat", 5000)
        assert "broke the wire protocol" in crashed.value.reason
        assert "over the limit of 1000" in seen[0].data["error"]
        assert (await host.call("many", 1, 10)).value == 1  # a fresh capsule
        records = await host.store.tail(10)
    assert [r.outcome for r in records if r.tool == "cheat"] == ["unknown"]


async def test_the_twin_carries_files(make_project: Callable[..., Path]) -> None:
    project = make_project(tools=TOOLS, policy=POLICY)
    async with Host.open(
        project, capsule=in_process(), limits={"max_attachment_size": 100}
    ) as host:
        got = await host.call("many", 2, 50)
        assert [a.data for a in got.attachments] == [b"\x00" * 50, b"\x01" * 50]
        assert [_read(a.path) for a in got.attachments] == [a.data for a in got.attachments]
        with pytest.raises(LimitExceeded):
            await host.call("many", 3, 50)


def test_the_command_line_shows_metadata_and_paths(make_project: Callable[..., Path]) -> None:
    project = make_project(tools=TOOLS, policy=POLICY)
    done = subprocess.run(
        [*TOOLHOST, "call", "picture", "--json", "--project", str(project)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["ok"] and out["value"] is None
    (file,) = out["attachments"]
    assert file["mime_type"] == "image/png" and file["width"] == 2
    assert Path(file["path"]).read_bytes() == _png(2)
    done = subprocess.run(
        [*TOOLHOST, "call", "many", "1", "3", "--project", str(project)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "1"
    assert lines[1].startswith("attachment: part 0.bin (application/octet-stream, 3 bytes) at ")
    code = textwrap.dedent("await many(1, 2)")
    done = subprocess.run(
        [*TOOLHOST, "exec", "-c", code, "--json", "--project", str(project)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = json.loads(done.stdout)
    assert out["value"] == 1 and out["attachments"][0]["size"] == 2


async def test_mcp_gets_image_audio_and_resource_content(make_project: Callable[..., Path]) -> None:
    project = make_project(tools=TOOLS, policy=POLICY)
    async with served(project) as server, connect(server) as client:
        result = await client.call_tool("picture", {})
        assert not result.is_error
        text, image = result.content
        assert isinstance(text, types.TextContent) and isinstance(image, types.ImageContent)
        assert base64.b64decode(image.data) == _png(2) and image.mime_type == "image/png"
        assert result.structured_content is not None
        assert result.structured_content["mime_type"] == "image/png"
        result = await client.call_tool("many", {"count": 1, "size": 4})
        assert result.structured_content == {"result": 1}
        resource = result.content[1]
        assert isinstance(resource, types.EmbeddedResource)
        blob: Any = resource.resource
        assert isinstance(blob, types.BlobResourceContents)
        assert base64.b64decode(blob.blob) == b"\x00" * 4
        assert str(blob.uri) == "toolhost-file:part_0.bin"
        result = await client.call_tool("sound", {})
        text, audio = result.content
        assert isinstance(audio, types.AudioContent), audio  # audio/* as audio content
        assert audio.mime_type == "audio/wav" and base64.b64decode(audio.data) == b"RIFF....WAVE"
