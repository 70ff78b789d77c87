"""What users install: the wheel and the sdist that ``python -m build`` makes.

The wheel's file list is held against the source tree, so a sub-package or a data file
can never be left out again. The smoke test installs the wheel, not editable, into a new
virtual environment in a folder outside the checkout, and runs the installed ``toolhost``
from there: ``--version``, a tool call, ``exec`` (code mode), ``serve`` over stdio with
the official MCP client, and ``inbox`` serving its page.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.cookiejar
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import urllib.parse
import urllib.request
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("host", "capsule")
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.pyc", "build", "dist", "*.egg-info", ".agent",
    ".pytest_cache", ".ruff_cache", "artifacts", "site", "node_modules",
)  # fmt: skip


def _version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return str(tomllib.load(file)["project"]["version"])


def package_files() -> set[str]:
    """Every file of the packages in the source tree, as a wheel names it."""
    files: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            relative = path.relative_to(ROOT)
            if path.is_file() and "__pycache__" not in relative.parts and path.suffix != ".pyc":
                files.add(relative.as_posix())
    return files


@dataclass(frozen=True)
class Dists:
    wheel: Path
    sdist: Path
    log: str


@contextlib.contextmanager
def _once(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[Path, bool]]:
    """A folder shared by the test run's workers (pytest-xdist), under a lock: yields it
    and whether it is still to be made. What the first worker makes the others reuse."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    folder = base / f"shared-{name}"
    lock = base / f"shared-{name}.lock"
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        made = folder / ".made"
        yield folder, not made.exists()
        folder.mkdir(exist_ok=True)
        made.touch()


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """``python -m build`` on a copy of the checkout (the build writes beside its source,
    and tests in parallel must not share that): the sdist, then the wheel built from it.
    Built once per test run, whichever worker asks first."""
    with _once(tmp_path_factory, "dists") as (out, to_make):
        if to_make:
            _build(tmp_path_factory, out)
        (wheel,) = out.glob("*.whl")
        (sdist,) = out.glob("*.tar.gz")
        return Dists(wheel=wheel, sdist=sdist, log=(out / "build.log").read_text())


def _build(tmp_path_factory: pytest.TempPathFactory, out: Path) -> None:
    source = tmp_path_factory.mktemp("source") / "toolhost"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (out / "build.log").write_text(done.stdout + done.stderr)


def test_the_build_has_no_warnings(dists: Dists) -> None:
    """setuptools prints its warnings between ``!!`` lines (a deprecated setting, a
    folder of modules that no package setting takes in)."""
    assert "!!" not in dists.log, dists.log


def test_the_wheel_holds_every_file_of_the_packages_and_nothing_else(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as wheel:
        names = set(wheel.namelist())
    info = f"toolhost-{_version()}.dist-info/"
    shipped = {name for name in names if not name.startswith(info)}
    expected = package_files()
    assert not expected - shipped, f"left out of the wheel: {sorted(expected - shipped)}"
    assert not shipped - expected, f"in the wheel but not the source: {sorted(shipped - expected)}"
    # the data files the host reads at run time are among them
    for data in ("host/py.typed", "capsule/py.typed", "host/serve/static/inbox.html"):
        assert data in shipped
    with zipfile.ZipFile(dists.wheel) as wheel:
        entry_points = wheel.read(info + "entry_points.txt").decode()
        metadata = wheel.read(info + "METADATA").decode()
    assert "toolhost = host.cli:main" in entry_points
    assert f"Version: {_version()}" in metadata
    assert "License-Expression: MIT" in metadata


def test_the_sdist_holds_the_packages_and_what_builds_them(dists: Dists) -> None:
    prefix = f"toolhost-{_version()}/"
    with tarfile.open(dists.sdist) as sdist:
        names = {name.removeprefix(prefix) for name in sdist.getnames()}
    expected = package_files() | {"pyproject.toml", "README.md", "CHANGELOG.md"}
    assert not expected - names, f"left out of the sdist: {sorted(expected - names)}"


# -- the installed wheel, outside the checkout ----------------------------------------------


@dataclass(frozen=True)
class Installed:
    bin: Path
    project: Path
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "toolhost"), *args],
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.fixture(scope="module")
def installed(dists: Dists, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel installed (not editable) into a new venv outside the checkout, with a
    project made by the installed ``toolhost init``; once per test run."""
    with _once(tmp_path_factory, "installed") as (place, to_make):
        assert not place.resolve().is_relative_to(ROOT)
        bin_dir = place / "venv" / "bin"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["TOOLHOST_CACHE"] = str(place / "cache")  # nothing shared with the checkout's
        if to_make:
            _install(dists, place, env)
        return Installed(bin=bin_dir, project=place / "project", env=env)


def _install(dists: Dists, place: Path, env: dict[str, str]) -> None:
    venv.create(place / "venv", with_pip=True)
    bin_dir = place / "venv" / "bin"
    done = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", str(dists.wheel)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    made = subprocess.run(
        [str(bin_dir / "toolhost"), "init", "project"],
        cwd=place,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_installed_wheel_runs_outside_the_checkout(installed: Installed) -> None:
    where = subprocess.run(
        [str(installed.bin / "python"), "-c", "import host, capsule; print(host.__file__)"],
        cwd=installed.project,
        env=installed.env,
        capture_output=True,
        text=True,
    )
    assert where.returncode == 0, where.stderr
    assert "site-packages" in where.stdout and not Path(where.stdout.strip()).is_relative_to(ROOT)

    version = installed.run("--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith(f"toolhost {_version()} ")

    call = installed.run("call", "add", "buy milk", "--json")
    assert json.loads(call.stdout) == {"ok": True, "value": {"id": 1, "text": "buy milk"}}
    denied = installed.run("call", "add", "password: x", "--json")
    assert denied.returncode == 1
    assert json.loads(denied.stdout)["error"]["rule"] == "no-passwords", denied.stdout

    code = installed.project / "run.py"
    code.write_text('await add("ada@example.com")\nprint(await find("ada"))\n', encoding="utf-8")
    ran = installed.run("exec", str(code), "--json", "--check", "refuse")
    out = json.loads(ran.stdout)
    assert out["ok"] is True, ran.stdout + ran.stderr
    assert out["stdout"] == "[{'id': 1, 'text': '<email>'}]\n"  # the project's hook ran
    # the checker (pyright) ships and runs: refuse pays for the full check
    assert (out["check"]["status"], out["check"]["level"]) == ("clean", "full")
    lint = installed.run("policy", "lint")
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_no_project_says_how_to_get_one(installed: Installed, tmp_path: Path) -> None:
    """An installed wheel has no bundled example: without a project the CLI says what
    to do instead of naming a folder that does not exist."""
    done = subprocess.run(
        [str(installed.bin / "toolhost"), "call", "add", "x"],
        cwd=tmp_path,
        env=installed.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "toolhost init" in done.stderr and "--project" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_installed_wheel_serves_mcp_over_stdio(installed: Installed) -> None:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=str(installed.bin / "toolhost"),
        args=["serve"],
        cwd=str(installed.project),
        env=installed.env,
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        names = [tool.name for tool in (await client.list_tools()).tools]
        assert {"add", "find", "remove", "word_count", "run_code"} <= set(names)
        result = await client.call_tool("word_count", {"text": "over MCP"})
        assert not result.is_error
        assert result.structured_content == {"result": 2}
        denied = await client.call_tool("add", {"text": "a passwd"})
        assert denied.is_error


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_installed_wheel_serves_the_inbox_page(installed: Installed) -> None:
    inbox = subprocess.Popen(
        [str(installed.bin / "toolhost"), "inbox", "--port", "0"],
        cwd=installed.project,
        env=installed.env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert inbox.stderr is not None
        line = ""
        while "approval inbox at " not in line:
            line = inbox.stderr.readline()
            assert line, "toolhost inbox ended without a URL"
        url = line.split("approval inbox at ", 1)[1].strip()
        base = url.split("/inbox/", 1)[0]
        opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )
        with opener.open(url, timeout=30) as response:  # the token for a cookie and a key
            assert response.status == 200
            page = response.read().decode()
            cookie = response.headers["set-cookie"].split(";", 1)[0]
        key = re.search(r'name="csrf-token" content="([^"]+)"', page)
        assert key is not None, page[:2000]
        audit = urllib.request.Request(  # what the page reads, with its cookie and key
            base + "/inbox/api/audit", headers={"cookie": cookie, "x-csrf-token": key.group(1)}
        )
        with opener.open(audit, timeout=30) as response:
            assert response.status == 200 and "records" in json.loads(response.read())
        assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', page)
        assert len(assets) >= 2, page[:2000]
        for asset in assets:  # the static files ship in the wheel and are served from it
            with opener.open(urllib.parse.urljoin(base + "/inbox/", asset), timeout=30) as r:
                assert r.status == 200 and len(r.read()) > 100, asset
    finally:
        inbox.terminate()
        inbox.wait(timeout=30)
        if inbox.stderr is not None:
            inbox.stderr.close()
