"""Secrets never leave the host raw (SECURITY_CATALOGUE.md F08; issue 12.2 and 11).

With ``[env] secret = ["TOKEN"]`` (its value passed from the host's environment) or a
secret given by ``[env] set``, tools print it (in one write, in two, on stdout and
stderr, at import), raise it (in the message, in a chained traceback), and return it
(nested, as a dict key, as bytes). The canary is the secret's value itself: it must
appear in no event, no error any caller can read (``str``, ``to_data()``, the
traceback), no audit record, no result for agent code, and nothing the command line
prints; the app and scripts still get results as they are, as ``[env] redact_results``
says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from host import Event, Host, ToolError, ToolUnavailable
from host._display import Redactor, StreamRedactor
from host.capsules._subprocess import _ConsoleGate  # pyright: ignore[reportPrivateUsage]
from tests.test_approval import wait_for
from tests.test_wasm import wasm_prepared

pytestmark = pytest.mark.anyio
__all__ = ["wasm_prepared"]

MARK = "⟨secret TOKEN⟩"
KEY_MARK = "⟨secret API_KEY⟩"

TOOLS = {
    "leaky": '''
        import os
        import sys
        import time
        from pathlib import Path


        def _token() -> str:
            return os.environ["TOKEN"]


        def echo() -> str:
            """Prints the token (passed) and the key (set), on stdout and on stderr."""
            print("token is", _token())
            print("err token", _token(), "key", os.environ["API_KEY"], file=sys.stderr, flush=True)
            return "printed"


        def split(stream: str, go: str) -> str:
            """Writes the token in two pieces: the second once the host showed the first."""
            out = sys.stdout if stream == "stdout" else sys.stderr
            token = _token()
            out.write("first half " + token[:7])
            out.flush()
            deadline = time.monotonic() + 30
            while not Path(go).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            out.write(token[7:] + " second half\\n")
            out.flush()
            return "split"


        def almost() -> str:
            """Writes the start of the token and nothing more: held back, never lost."""
            sys.stdout.write("tail " + _token()[:4])
            sys.stdout.flush()
            return "almost"


        def fail() -> None:
            """Raises with the token in its message, from an error that shows it too."""
            try:
                int(_token())
            except ValueError:
                raise RuntimeError(
                    "the service refused " + _token() + " for " + os.environ["API_KEY"]
                ) from None


        def _lookup(name: str) -> str:
            raise KeyError(name)


        def chained() -> None:
            """Raises a KeyError naming the token, two frames down."""
            _lookup(_token())


        def give() -> dict[str, object]:
            """Returns the token deep inside, as a key, as bytes."""
            token = _token()
            return {
                "token": token,
                "nested": [[{"deep": f"Bearer {token}"}]],
                token: "as a key",
                "raw": token.encode(),
                "key": os.environ["API_KEY"],
            }


        def halves() -> list[str]:
            """The token in two pieces, which no redaction of this result can see."""
            token = _token()
            return [token[:10], token[10:]]


        def plain() -> list[object]:
            return [1, "two", {"three": 3.0}]
        ''',
}

BROKEN_AT_IMPORT = """
    import os


    def never() -> None:
        pass


    print("loading with", os.environ["TOKEN"])
    raise RuntimeError("cannot load with " + os.environ["TOKEN"])
"""


def policy(redact_results: str | None = None) -> str:
    mode = f'redact_results = "{redact_results}"\n' if redact_results else ""
    return (
        textwrap.dedent(
            """
        version = 1
        [defaults]
        agent = "allow"
        [env]
        pass = ["TOKEN"]
        set = { API_KEY = "set-by-policy-0d7c5a91f3" }
        secret = ["TOKEN", "API_KEY"]
        """
        )
        + mode
    )


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    value = "sk-" + os.urandom(12).hex()
    monkeypatch.setenv("TOKEN", value)
    return value


KEY = "set-by-policy-0d7c5a91f3"


@pytest.fixture
def proj(make_project: Callable[..., Path], token: str) -> Path:
    del token
    return make_project(TOOLS, policy=policy())


class Seen:
    """Everything the app can observe: events (a listener on all of them) and more text."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.texts: list[str] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def add(self, value: Any) -> None:
        self.texts.append(value if isinstance(value, str) else repr(value))

    def console(self, stream: str) -> str:
        return "".join(
            str(e.data.get("data"))
            for e in self.events
            if e.kind == "console" and e.data.get("stream") == stream
        )

    def check(self, *secrets: str) -> None:
        blob = "\n".join([*(repr(e) for e in self.events), *self.texts])
        for secret in secrets:
            assert secret not in blob, "a secret left the host raw"
            for start in range(0, len(secret) - 8, 4):  # no long piece of it either
                assert secret[start : start + 9] not in blob, "a piece of a secret leaked"


@contextmanager
def watching(host: Host) -> Iterator[Seen]:
    seen = Seen()
    unsubscribe = host.events.subscribe(seen)
    try:
        yield seen
    finally:
        unsubscribe()
        seen.texts.extend(repr(e) for e in host.events.recent)


# -- console output ------------------------------------------------------------------------


@pytest.mark.subprocess
async def test_printed_secrets_never_reach_an_event(proj: Path, token: str) -> None:
    async with Host.open(proj) as host:
        with watching(host) as seen:
            assert await host.call("echo") == "printed"
            # print() writes its parts one by one: the token may come in a write of its own.
            await wait_for(lambda: f"token is {MARK}\n" in seen.console("stdout"), "stdout")
            await wait_for(
                lambda: f"err token {MARK} key {KEY_MARK}\n" in seen.console("stderr"), "stderr"
            )
    seen.check(token, KEY)


@pytest.mark.subprocess
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
async def test_a_secret_written_in_two_pieces_is_still_replaced(
    proj: Path, token: str, tmp_path: Path, stream: str
) -> None:
    go = tmp_path / "go"
    async with Host.open(proj) as host:
        with watching(host) as seen:

            def first_half_shown(event: Event) -> None:
                if "first half" in str(event.data.get("data")):
                    go.touch()  # the tool writes the second piece only now

            host.on("console", first_half_shown)
            assert await host.call("split", stream, str(go)) == "split"
            await wait_for(lambda: "second half" in seen.console(stream), "the second piece")
    assert go.exists()
    pieces = [
        str(e.data["data"])
        for e in seen.events
        if e.kind == "console" and e.data.get("stream") == stream
    ]
    assert pieces[0] == "first half "  # shown at once: the rest waited for more text
    assert f"first half {MARK} second half\n" in seen.console(stream)
    seen.check(token)


@pytest.mark.subprocess
async def test_text_held_back_is_shown_when_the_capsule_ends(proj: Path, token: str) -> None:
    seen = Seen()
    async with Host.open(proj) as host:
        host.events.subscribe(seen)  # kept while the host closes its capsules
        assert await host.call("almost") == "almost"
        await wait_for(lambda: "tail " in seen.console("stdout"), "the text before")
        assert seen.console("stdout").endswith("tail ")  # the token's start waits
    assert seen.console("stdout").endswith("tail " + token[:4])  # never lost, never raw
    seen.check(token)


@pytest.mark.subprocess
async def test_a_secret_printed_or_raised_at_import(
    make_project: Callable[..., Path], token: str
) -> None:
    proj = make_project({**TOOLS, "broken": BROKEN_AT_IMPORT}, policy=policy())
    async with Host.open(proj) as host:
        with watching(host) as seen:
            with pytest.raises(ToolUnavailable) as info:
                await host.call("never")
            seen.add(str(info.value))
            seen.add(json.dumps(info.value.to_data()))
            seen.add(host.default_session.failed_files)
            assert MARK in str(info.value)
        seen.add(await host.store.tail(10))
    seen.check(token)


def test_the_console_gate_redacts_each_stream_as_one_text() -> None:
    from host._events import EventBus

    bus = EventBus(redactor=Redactor({"TOKEN": "sk-abcdef123"}))
    got: list[tuple[str, str]] = []
    bus.subscribe(lambda e: got.append((str(e.data["stream"]), str(e.data["data"]))))
    gate = _ConsoleGate(bus)
    for stream, text in [
        ("stdout", "a sk-ab"),
        ("stderr", "b sk-abcdef"),  # the other stream's pieces never join this one
        ("stdout", "cdef12"),
        ("stdout", "3 done\n"),
        ("stderr", "1 no: sk-"),
        ("stderr", "zzz\n"),
    ]:
        gate.emit("console", "s", stream=stream, data=text)
    gate.emit("console", "s", stream="stdout", data="end sk-abc")
    gate.end("s", "stdout")
    gate.end("s", "stderr")
    out = {s: "".join(t for k, t in got if k == s) for s in ("stdout", "stderr")}
    assert out["stdout"] == "a ⟨secret TOKEN⟩ done\nend sk-abc"
    assert out["stderr"] == "b sk-abcdef1 no: sk-zzz\n"
    assert all("sk-abcdef123" not in t for _, t in got)


def test_a_stream_holds_back_only_what_could_begin_a_secret() -> None:
    stream = StreamRedactor(Redactor({"A": "xyab", "B": "abzz"}))
    assert stream.feed("..xy") == ".."
    assert stream.feed("ab!") == "⟨secret A⟩!"  # joined across the two writes
    assert stream.feed("..ab") == ".."
    assert stream.held == 2
    assert stream.feed("zz") == "⟨secret B⟩"
    assert stream.feed("plain\n") == "plain\n"
    assert stream.flush() == ""
    # A marker already in the text stays as it is: redacting twice changes nothing.
    once = Redactor({"T": "secret"}).text("a secret b")
    assert Redactor({"T": "secret"}).text(once) == once == "a ⟨secret T⟩ b"


# -- errors --------------------------------------------------------------------------------


@pytest.mark.subprocess
async def test_a_secret_in_an_error_reaches_no_caller(proj: Path, token: str) -> None:
    async with Host.open(proj) as host:
        with watching(host) as seen:
            for name in ("fail", "chained"):
                for caller in ("app", "agent", "script"):
                    with pytest.raises(ToolError) as info:
                        await host.default_session.call_as(caller, name, (), {})
                    error = info.value
                    seen.add(str(error))
                    seen.add(repr(error))
                    seen.add(error.args)
                    seen.add(json.dumps(error.to_data()))
                    seen.add(error.traceback)
                    seen.add(error.error_message)
                    if name == "fail":
                        assert f"refused {MARK} for {KEY_MARK}" in str(error)
                        assert f"RuntimeError: the service refused {MARK}" in error.traceback
                    else:
                        assert f"KeyError: '{MARK}'" in error.traceback
            records = await host.store.tail(20)
            seen.add(records)
            assert any(MARK in (r.error or "") for r in records)
    seen.check(token, KEY)


# -- results -------------------------------------------------------------------------------


def expected_given(token: str, *, redacted: bool) -> dict[str, Any]:
    t, k = (MARK, KEY_MARK) if redacted else (token, KEY)
    return {
        "token": t,
        "nested": [[{"deep": f"Bearer {t}"}]],
        t: "as a key",
        "raw": t.encode(),
        "key": k,
    }


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("mode", "redacted_for"),
    [(None, {"agent"}), ("all", {"agent", "app", "script"}), ("none", set[str]())],
    ids=["default", "all", "none"],
)
async def test_results_for_agents_have_secrets_replaced(
    make_project: Callable[..., Path], token: str, mode: str | None, redacted_for: set[str]
) -> None:
    proj = make_project(TOOLS, policy=policy(mode))
    async with Host.open(proj) as host:
        for caller in ("agent", "app", "script"):
            value = await host.default_session.call_as(caller, "give", (), {})
            redacted = caller in redacted_for
            assert value == expected_given(token, redacted=redacted), caller
            plain = await host.default_session.call_as(caller, "plain", (), {})
            assert plain == [1, "two", {"three": 3.0}]


@pytest.mark.subprocess
async def test_redaction_follows_a_policy_reload(
    make_project: Callable[..., Path], token: str
) -> None:
    proj = make_project(TOOLS, policy=policy())
    async with Host.open(proj) as host:
        assert await host.call("give") == expected_given(token, redacted=False)
        (proj / "policy.toml").write_text(policy("all"))
        assert await host.call("give") == expected_given(token, redacted=True)


def test_a_deep_result_is_redacted_without_recursion() -> None:
    from capsule.protocol import MAX_DEPTH

    redactor = Redactor({"T": "sk-deep-1"})
    value: Any = "sk-deep-1"
    for _ in range(MAX_DEPTH):
        value = [value]
    out = redactor.value(value)
    for _ in range(MAX_DEPTH):
        out = out[0]
    assert out == "⟨secret T⟩"
    clean = [[1, 2], {"a": "b"}]
    assert redactor.value(clean) is clean  # nothing to replace: nothing copied
    assert redactor.value({"sk-deep-1": 1, "⟨secret T⟩": 2}) == {
        "⟨secret T⟩": 1,
        "⟨secret T⟩#2": 2,
    }


# -- agent code ----------------------------------------------------------------------------


@pytest.mark.wasm
@pytest.mark.subprocess
async def test_agent_code_never_holds_a_secret(proj: Path, token: str, wasm_prepared: Any) -> None:
    del wasm_prepared
    code = textwrap.dedent(
        """
        got = await give()
        print("got", got["token"], got["raw"])
        try:
            await fail()
        except ToolError as e:
            caught = [str(e), e.error_message, repr(e.args)]
        try:
            await chained()
        except ToolError as e:
            caught.append(str(e))
        await echo()
        # In hex too: what the code holds, out of reach of any redaction of its result.
        {"value": got, "caught": caught, "hex": repr([got, caught]).encode().hex()}
        """
    )
    async with Host.open(proj) as host:
        with watching(host) as seen:
            result = await host.run_code(code)
            assert result.ok, result.error
            assert result.value["value"] == expected_given(token, redacted=True)
            assert f"refused {MARK}" in result.value["caught"][0]
            assert result.stdout == f"got {MARK} {MARK.encode()!r}\n"
            seen.add(result.model_dump_json())
            seen.add(bytes.fromhex(result.value["hex"]).decode())
            failed = await host.run_code("x = await give()\nraise ValueError(x['token'])")
            assert failed.error is not None and MARK in failed.error.message
            seen.add(failed.model_dump_json())
            await wait_for(lambda: f"token is {MARK}\n" in seen.console("stdout"), "the echo")
    seen.check(token, KEY)


@pytest.mark.wasm
@pytest.mark.subprocess
@pytest.mark.parametrize("mode", ["agent", "none"])
async def test_a_secret_put_together_in_agent_code_is_replaced_in_its_result(
    make_project: Callable[..., Path], token: str, wasm_prepared: Any, mode: str
) -> None:
    del wasm_prepared
    code = "t = ''.join(await halves())\nprint(t)\nt"
    async with Host.open(make_project(TOOLS, policy=policy(mode))) as host:
        result = await host.run_code(code)
        failed = await host.run_code("raise RuntimeError('it was ' + t)")
    assert failed.error is not None and failed.error.message == f"it was {MARK}"  # always
    if mode == "none":  # the policy lets agent code see secrets: its result says them
        assert (result.value, result.stdout) == (token, token + "\n")
    else:
        assert (result.value, result.stdout) == (MARK, MARK + "\n")


@pytest.mark.subprocess
async def test_an_mcp_client_gets_results_and_errors_redacted(proj: Path, token: str) -> None:
    from tests.mcp_helpers import connect, served

    async with served(proj) as server, connect(server) as client:
        given = await client.call_tool("give", {})
        failed = await client.call_tool("fail", {})
        echoed = await client.call_tool("echo", {})
        code = await client.call_tool("run_code", {"code": "(await give())['nested']"})
    results = [r.model_dump(mode="json") for r in (given, failed, echoed, code)]
    sent = json.dumps(results, ensure_ascii=False)
    assert token not in sent and KEY not in sent
    assert given.structured_content is not None
    assert given.structured_content["token"] == MARK
    assert failed.is_error and MARK in sent


# -- the command line ----------------------------------------------------------------------

_SCRIPT = Path(sys.executable).with_name("toolhost")
TOOLHOST = (
    [str(_SCRIPT)]
    if _SCRIPT.exists()
    else [sys.executable, "-c", "from host.cli import main; main()"]
)


def toolhost(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TOOLHOST, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
        check=False,
    )


@pytest.mark.subprocess
@pytest.mark.wasm
@pytest.mark.slow
def test_the_command_line_prints_no_secret(proj: Path, token: str, wasm_prepared: Any) -> None:
    del wasm_prepared
    runs = [
        toolhost("call", "echo", cwd=proj),
        toolhost("call", "fail", cwd=proj),
        toolhost("call", "--json", "fail", cwd=proj),
        toolhost("call", "--json", "chained", cwd=proj),
        toolhost("exec", "--json", "-c", "await echo()\nawait give()", cwd=proj),
        toolhost("exec", "-c", "print((await give())['token'])\nawait fail()", cwd=proj),
        toolhost("audit", "--tail", "20", cwd=proj),
    ]
    for done in runs:
        assert token not in done.stdout + done.stderr, done.args
        assert KEY not in done.stdout + done.stderr, done.args
    assert f"token is {MARK}" in runs[0].stderr
    assert MARK in json.loads(runs[2].stdout)["error"]["message"]
    assert json.loads(runs[4].stdout)["value"]["token"] == MARK
    assert runs[5].stdout.startswith(MARK)
    # The app (toolhost call) gets a result as it is: that is what it asked for.
    assert json.loads(toolhost("call", "--json", "give", cwd=proj).stdout)["value"]["token"] == (
        token
    )


async def test_a_secret_in_a_chained_host_error_is_replaced(proj: Path, token: str) -> None:
    """An error that leaves the gate is redacted with every host error it was raised from
    or during (``raise ... from``, and the implicit context), down the chain."""
    from host.errors import CapsuleCrashed, LimitExceeded

    async with Host.open(proj) as host:
        deepest = LimitExceeded("call_depth", f"limit hit near {token}", tool="echo")
        inner = ToolError("fail", type_name="RuntimeError", error_message=f"refused {token}")
        inner.__context__ = deepest  # raised while handling it
        outer = CapsuleCrashed("echo", reason=f"crashed holding {KEY}", may_have_executed=True)
        outer.__cause__ = inner  # raise ... from
        host.mediator._redact_error(outer, host.mediator.redactor)  # pyright: ignore[reportPrivateUsage]
        for error in (outer, inner, deepest):
            shown = f"{error} {error!r} {error.args} {json.dumps(error.to_data())}"
            assert token not in shown and KEY not in shown, shown
        assert MARK in str(inner) and MARK in inner.error_message and MARK in str(deepest)
        assert KEY_MARK in str(outer)
