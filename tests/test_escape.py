"""Agent code tries to get out of the Wasm sandbox (SECURITY_CATALOGUE.md A, B, G, I).

Every test asserts on canaries, never on the mere fact that a payload raised:

* a secret in the host's environment (``CANARY_SECRET``, set by conftest for every test);
* a file outside any preopen, holding a random secret;
* a loopback TCP listener that counts the connections it accepts;
* a marker path that a successful escape would create;
* the names of host-side objects (mediator, supervisor, policy...) and host paths, which
  must appear nowhere the code can reach.

Each payload runs in its own ``try`` and reports what it saw as text; the test then
checks that no canary shows up in anything the code returned or printed.
"""

from __future__ import annotations

import os
import socket
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from host import CodeResult, Host

from .conftest import ROOT
from .test_wasm import RUNTIMES, prepared_for, runtime_policy, wasm_data_prepared, wasm_prepared

pytestmark = [pytest.mark.anyio, pytest.mark.wasm, pytest.mark.slow]
__all__ = ["wasm_data_prepared", "wasm_prepared"]

TOOLS = {
    "calc": """
        def add(a: int, b: int) -> int:
            return a + b


        def fail(message: str) -> None:
            raise RuntimeError(message)
    """,
}
POLICY = """
    version = 1
    [defaults]
    agent = "allow"
"""
HOST_NAMES = (
    "Mediator",
    "Supervisor",
    "Session",
    "PolicyConfig",
    "Connection",
    "SubprocessTransport",
    "EventBus",
    "CodeSandbox",
)


class Canaries:
    def __init__(self, tmp_path: Path) -> None:
        self.env = os.environ["CANARY_SECRET"]
        self.file_secret = "file-canary-" + os.urandom(8).hex()
        self.file = tmp_path / "outside" / "secret.txt"
        self.file.parent.mkdir()
        self.file.write_text(self.file_secret)
        self.marker = tmp_path / "pwned"
        self.project = tmp_path / "project"  # where make_project puts the project
        self.accepted = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._server.close()

    def check(self, *results: CodeResult) -> None:
        """No canary in anything the code returned, printed or raised."""
        for result in results:
            text = result.model_dump_json()
            assert self.env not in text, "the host's secret env var reached agent code"
            assert self.file_secret not in text, "a file outside the preopens was read"
            assert str(self.project) not in text, "the host's project path reached agent code"
        assert self.file.read_text() == self.file_secret, "a file outside was changed"
        assert not self.marker.exists(), "an escape created the marker path"
        assert self.accepted == 0, "agent code connected to the loopback listener"


@pytest.fixture
def canaries(tmp_path: Path) -> Iterator[Canaries]:
    found = Canaries(tmp_path)
    yield found
    found.close()


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    """The code runtime a test runs on, prepared (each escape is tried on both)."""
    prepared_for(request, request.param)
    return str(request.param)


@pytest.fixture
def proj(make_project: Callable[..., Path], runtime: str) -> Path:
    return make_project(tools=TOOLS, policy=POLICY + runtime_policy(runtime))


def attempts(*payloads: str) -> str:
    """Agent code that runs each payload in its own try and collects what it saw."""
    parts = ["seen = []"]
    for i, payload in enumerate(payloads):
        body = textwrap.indent(textwrap.dedent(payload).strip(), "    ")
        parts.append(
            f"try:\n{body}\n    seen.append(('{i}', 'ran'))\n"
            f"except BaseException as e:\n    seen.append(('{i}', 'refused', repr(e)[:300]))"
        )
    parts.append("repr(seen)")
    return "\n".join(parts)


async def test_host_environment_and_files_are_out_of_reach(proj: Path, canaries: Canaries) -> None:
    secret = str(canaries.file)
    code = attempts(
        "import os; seen.append(repr(dict(os.environ)))",
        "import sys; seen.append(repr(sys.argv))",
        "seen.append(open('/proc/self/environ', 'rb').read())",
        f"seen.append(open({secret!r}).read())",
        f"seen.append(open('/toolhost/../../..' + {secret!r}).read())",
        "seen.append(open('/etc/passwd').read())",
        "import os; seen.append(os.listdir('/'))",
        "import os; seen.append([w for w in os.walk('/toolhost/..')])",
        "import glob; seen.append(glob.glob('/**/secret.txt', recursive=True))",
        "import os; seen.append(os.listdir('/toolhost'))",
        "open('/toolhost/capsule/_guest.py', 'a').write('# tampered')",
        "import random; seen.append(repr(random._os.environ))",
        "import warnings; seen.append(repr(warnings.sys.modules['os'].environ))",
    )
    async with Host.open(proj) as host:
        result = await host.run_code(code)
        assert result.ok, result.error
        text = str(result.value)
        assert "'3', 'refused'" in text and "'4', 'refused'" in text  # the secret file
        assert "'10', 'refused'" in text  # the guest's own library is read-only
        assert "root:" not in text
        canaries.check(result)
        # The library is untouched on the host, too.
        again = await host.run_code("open('/toolhost/capsule/_guest.py').read()[-20:]")
        assert "# tampered" not in str(again.value)


async def test_no_network_and_no_processes(proj: Path, canaries: Canaries) -> None:
    port = canaries.port
    marker = str(canaries.marker)
    code = attempts(
        f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)",
        f"import socket; s = socket.socket(); s.connect(('127.0.0.1', {port}))",
        f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=2)",
        f"import http.client; http.client.HTTPConnection('127.0.0.1', {port}).request('GET', '/')",
        f"await asyncio.wait_for(asyncio.open_connection('127.0.0.1', {port}), 2)",
        "import socket; socket.getaddrinfo('localhost', 80)",
        f"import os; os.system('touch {marker}')",
        f"import subprocess; subprocess.run(['touch', {marker!r}])",
        "import os; os.fork()",
        f"import os; os.execv('/bin/touch', ['touch', {marker!r}])",
        f"import os; os.posix_spawn('/bin/touch', ['touch', {marker!r}], {{}})",
        f"""
        popen = [c for c in ().__class__.__base__.__subclasses__() if 'Popen' in repr(c)]
        popen[0](['sh', '-c', 'touch {marker}'])
        """,
        f"""
        cls = [c for c in {{}}.__class__.__base__.__subclasses__()
               if c.__name__ == 'catch_warnings'][0]
        cls()._module.__builtins__['__import__']('os').system('touch {marker}')
        """,
        f"""
        cls = [c for c in ().__class__.__base__.__subclasses__()
               if c.__name__ == 'BuiltinImporter'][0]
        cls().load_module('os').system('touch {marker}')
        """,
        f"import sys; sys._getframe().f_builtins['__import__']('os').system('touch {marker}')",
        f"import ctypes; ctypes.CDLL(None).system({('touch ' + marker).encode()!r})",
        "import threading; threading.Thread(target=print).start()",
        f"open({marker!r}, 'w').write('x')",
    )
    async with Host.open(proj) as host:
        result = await host.run_code(code)
        assert result.ok, result.error
        canaries.check(result)
        assert "'ran'" not in str(result.value).replace("('16', 'ran')", ""), result.value
        # The sandbox still works after all that.
        assert (await host.run_code("await add(1, 2)")).value == 3


async def test_no_host_object_is_reachable(proj: Path, canaries: Canaries) -> None:
    code = attempts(
        # A04: walk every frame reachable from an exception.
        """
        try:
            1 / 0
        except Exception as e:
            f = e.__traceback__.tb_frame
            while f is not None:
                seen.append(sorted(f.f_globals)); f = f.f_back
        """,
        # A05: generator and coroutine frames.
        "g = (x for x in [1]); seen.append(sorted(g.gi_frame.f_globals))",
        "c = add(1, 2); seen.append(repr(c)); seen.append(sorted(vars(type(c))))",
        # A06: the current frame's builtins and globals.
        "import sys; seen.append(sorted(sys._getframe().f_builtins))",
        # A07: format-string traversal through a tool proxy.
        "seen.append('{0.__init__.__globals__}'.format(add))",
        "seen.append('{0.__class__.__init__.__globals__[sys].modules}'.format(add))",
        "seen.append('{0.__init__.__globals__[sys].modules[os].environ}'.format(add))",
        "import string; seen.append(repr(string.Formatter().get_field('0.__init__', [add], {})))",
        # A08: proxy introspection.
        "seen.append(dir(add)); seen.append(repr(vars(type(add))))",
        "seen.append(repr(add.__reduce_ex__(2)))",
        "seen.append(repr(add.__globals__))",
        "seen.append(repr(add.__closure__))",
        "seen.append(repr(tools.calc.__dict__))",
        # A16: the whole heap.
        """
        import gc
        seen.append(sorted({type(o).__name__ for o in gc.get_objects()}))
        seen.append(len(gc.get_referrers(add)))
        """,
        # A14: modules reachable from modules.
        "import sys; seen.append(sorted(sys.modules))",
        # A11: what a host error carries.
        """
        try:
            await fail('bad')
        except ToolError as e:
            seen.append(repr(vars(e))); seen.append(repr(e.args))
            seen.append(repr(e.__cause__)); seen.append(repr(e.__context__))
            seen.append(repr(e.__traceback__.tb_frame.f_globals.get('__file__')))
        """,
    )
    async with Host.open(proj) as host:
        result = await host.run_code(code)
    assert result.ok, result.error
    canaries.check(result)
    text = str(result.value)
    for name in HOST_NAMES:
        assert f"'{name}'" not in text, f"{name} is reachable from agent code"
    # No host path (the project, the checkout, the tool file) reaches agent code.
    assert str(ROOT) not in text
    assert str(proj) not in text
    assert "anyio" not in text and "pydantic" not in text and "wasmtime" not in text


async def test_infinite_loops_and_memory_bombs_are_stopped(proj: Path, canaries: Canaries) -> None:
    import psutil

    me = psutil.Process()
    limits = {"code_timeout": "1s", "code_memory": "64MiB"}
    async with Host.open(proj, limits=limits) as host:
        await host.run_code("1")
        rss = me.memory_info().rss
        for code, limit in (
            ("while True:\n    pass", "code_timeout"),
            ("sum(range(10**12))", "code_timeout"),
            ("import re\nre.match(r'(a+)+$', 'a' * 64 + 'b')", "code_timeout"),
            ("import time\ntime.sleep(3600)", "code_timeout"),
            ("x = 'x' * (1 << 30)", "code_memory"),
            ("x = [0] * 10**8", "code_memory"),
            ("x = []\nwhile True:\n    x.append(bytearray(1 << 20))", "code_memory"),
            # wasm32 cannot even ask for these: an OverflowError, and nothing allocated.
            ("x = 'x' * (4 << 30)", None),
            ("x = [0] * 10**10", None),
        ):
            result = await host.run_code(code)
            assert result.error is not None, code
            if limit is None:
                assert result.error.type == "OverflowError", code
            else:
                assert (result.error.kind, result.error.limit) == ("limit_exceeded", limit), code
            canaries.check(result)
            # The host keeps serving, and the next run gets a fresh sandbox.
            assert await host.call("add", 1, 1) == 2
            assert (await host.run_code("await add(2, 2)")).value == 4
        # Guest memory is not the host's: its RSS stays near where it was.
        assert me.memory_info().rss - rss < 200 * 1024 * 1024


async def test_floods_and_storms_are_bounded(proj: Path, canaries: Canaries) -> None:
    limits = {"code_max_calls": 50, "code_max_output": "64KiB"}
    async with Host.open(proj, limits=limits) as host:
        storm = await host.run_code("while True:\n    await add(1, 1)")
        assert storm.error is not None and storm.error.limit == "code_max_calls"
        assert len(storm.calls) == 50
        flood = await host.run_code("while True:\n    print('x' * 4096)")
        assert flood.error is not None and flood.error.limit == "code_max_output"
        assert len(flood.stdout) <= 64 * 1024
        # Writes to the protocol's own fd are a broken frame: the sandbox is replaced.
        forged = await host.run_code("import os\nos.write(1, b'hello\\n' * 1000)\n1")
        assert not forged.ok and forged.error is not None
        assert forged.error.kind == "protocol_error"
        # A forged frame that names another tool is still just a request, authorised as one.
        forged_use = await host.run_code(
            "from capsule.protocol import frame\nimport os\n"
            "os.write(1, frame({'k': 'done', 'id': 999, 'ok': True, 'value': 'forged'}))\n1"
        )
        assert forged_use.error is not None and forged_use.error.kind == "protocol_error"
        assert (await host.run_code("await add(3, 4)")).value == 7
        canaries.check(storm, flood, forged, forged_use)


async def test_a_compromised_sandbox_gets_only_typed_errors(proj: Path, canaries: Canaries) -> None:
    """G01-G12 from inside: the code writes raw bytes to the protocol's fd. Every breach
    ends the run with a typed error and a fresh sandbox; nothing hangs, the host serves on."""
    prelude = "import os, struct\nfrom capsule.protocol import encode, frame\n"
    breaches = {
        "over the cap": "os.write(1, struct.pack('>I', 0xFFFFFFFF))",
        "array32 of 100M": "os.write(1, struct.pack('>I', 5) + bytes.fromhex('dd05f5e100'))",
        "deep nesting": (
            "b = b'\\x91' * 2000 + b'\\xc0'\nos.write(1, struct.pack('>I', len(b)) + b)"
        ),
        "ext type": "os.write(1, struct.pack('>I', 3) + bytes.fromhex('d40500'))",
        "trailing bytes": "os.write(1, struct.pack('>I', 2) + b'\\xc0\\xc0')",
        "not a map": "os.write(1, frame([1, 2, 3]))",
        "unknown kind": "os.write(1, frame({'k': 'load', 'dir': '/'}))",
        "bad use id": "os.write(1, frame({'k': 'use', 'id': 'x', 'run': 0, 'tool': 'add'}))",
        "bad use args": (
            "import sys\nrun = sys.modules['capsule._guest']._SANDBOX._run\n"
            "os.write(1, frame({'k': 'use', 'id': 1, 'run': run, 'tool': 'add', "
            "'args': {'a': 1}, 'kwargs': []}))\nawait asyncio.sleep(30)"
        ),
        "half a frame": "os.write(1, struct.pack('>I', 100) + b'\\x80')\nawait asyncio.sleep(30)",
    }
    limits = {"code_timeout": "2s"}
    async with Host.open(proj, limits=limits) as host:
        results: list[CodeResult] = []
        for name, breach in breaches.items():
            result = await host.run_code(prelude + breach)
            results.append(result)
            assert result.error is not None, name
            assert result.error.kind in ("protocol_error", "limit_exceeded"), (name, result.error)
            assert "were lost" in result.error.message, name
            assert (await host.run_code("await add(5, 5)")).value == 10, name
        # A use frame for a run that is over is forged: nothing runs, the sandbox is ended.
        stale = await host.run_code(
            prelude + "os.write(1, frame({'k': 'use', 'id': 7, 'run': 0, 'tool': 'add', "
            "'args': [1, 2], 'kwargs': {}}))\n'still here'"
        )
        assert stale.error is not None and stale.error.kind == "protocol_error"
        assert stale.calls == []
        assert (await host.run_code("await add(5, 5)")).value == 10
        canaries.check(*results, stale)
