"""Hosts run as root and as an unprivileged user, for the containment attacks.

A tool that attacks its host, its neighbours or the host's files behaves differently as
root (capabilities mask some leaks) and as an ordinary user, so each attack runs as both:
the host is a separate Python process (a script given by the test) started with the
account's uid and gid. The unprivileged account is created for the test session
(``useradd``) and removed after it; when the tests do not run as root, they already run
as an unprivileged user, which is then used (and the root runs are skipped, saying so).
When a user cannot be created as root, the tests fail: nothing is skipped silently.

Each test gets a folder owned by its account (:class:`Lab`), since the account may not be
able to read pytest's own temporary folders, with the projects and a home (the account's
caches) inside it. Processes are watched with psutil, from this (root) process.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import pwd
import secrets
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import psutil
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: host scripts run from it, so they import its ``host``."""

PRELUDE = '''
import json, os, sys
import anyio
from host import Host, HostError, CallError, CapsuleCrashed, ToolError, ToolUnavailable

def say(**data):
    print(json.dumps(data), flush=True)

async def ask():
    """The test's next word (one line on stdin)."""
    return (await anyio.to_thread.run_sync(sys.stdin.readline)).strip()

PROJECT = sys.argv[1]
ARGS = sys.argv[2:]
'''
"""What every host script starts with: ``say(...)`` reports to the test as one JSON line,
``await ask()`` waits for the test's next word, ``PROJECT`` is the project folder and
``ARGS`` the test's other arguments."""


@dataclass(frozen=True, slots=True)
class Account:
    """Who a host runs as."""

    name: str
    uid: int
    gid: int
    python: str
    """The interpreter that can run a host as this account (with this checkout's
    dependencies)."""
    workdir: Path
    """Where its hosts run: the checkout when the account can read it."""
    home: Path
    """Its home folder and caches, shared by the session's tests (warm caches)."""
    labs: Path
    """Where its tests' folders go (readable by it)."""

    @property
    def root(self) -> bool:
        return self.uid == 0

    def __repr__(self) -> str:
        return f"<Account {self.name} uid={self.uid}>"


class Who(TypedDict):
    user: int | None
    group: int | None
    extra_groups: list[int] | None


def as_user(uid: int, gid: int) -> Who:
    """``subprocess`` arguments that run a child as ``uid``/``gid`` with no other groups;
    unchanged when the tests already run as that user (changing groups needs root)."""
    if os.geteuid() != 0 and os.geteuid() == uid:
        return Who(user=None, group=None, extra_groups=None)
    return Who(user=uid, group=gid, extra_groups=[])


_PROBE = "import anyio, msgpack, pydantic, wasmtime, host, capsule"


def _user_python(base: Path, uid: int, gid: int) -> tuple[str, Path]:
    """An interpreter the user can run a host with, and the folder to run it in.

    Ours, from the checkout, when the user can read both (then the hosts import the
    checkout's ``host``). Else (a checkout or venv in a private folder: root's home, a
    ``mktemp -d``) a venv of its own in ``base`` that the user can read: the system's
    Python of the same version, with the checkout's packages and every distribution they
    and the tests need linked (or copied) in, so nothing of a private folder is needed.
    """
    probe = [sys.executable, "-I", "-c", _PROBE]
    try:
        done = subprocess.run(probe, **as_user(uid, gid), capture_output=True, cwd=ROOT)
    except PermissionError:
        pass  # its folder, or the checkout, is private
    else:
        if done.returncode == 0:
            return sys.executable, ROOT
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    system = next(
        (
            p
            for p in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}")
            if os.access(p, os.X_OK)
        ),
        None,
    )
    if system is None:
        pytest.fail(
            f"an unprivileged user cannot run {sys.executable} (its folder is private), and "
            f"there is no system python{version} to run the host with instead"
        )
    venv = base / "venv"
    subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    for dist in _distributions("toolhost", extras=("test", "data")):
        if canonicalize_name(dist.metadata["Name"]) == "toolhost":
            continue  # an editable install points into the checkout: its packages follow
        for file in dist.files or ():
            if file.parts[:1] == ("..",):
                continue  # scripts and data outside site-packages
            _link(Path(str(dist.locate_file(file))), site / file)
    for package in ("host", "capsule"):
        for source in (ROOT / package).rglob("*"):
            if source.is_file() and "__pycache__" not in source.parts:
                _link(source, site / source.relative_to(ROOT), copy=True)
    python = str(venv / "bin" / "python")
    done = subprocess.run(
        [python, "-I", "-c", _PROBE], **as_user(uid, gid), capture_output=True, cwd=base
    )
    if done.returncode != 0:
        pytest.fail(f"the unprivileged user cannot run a host: {done.stderr.decode()[-800:]}")
    return python, base


def _distributions(
    name: str, extras: Iterable[str] = ()
) -> Iterator[importlib.metadata.Distribution]:
    """``name``'s installed distribution and those it requires (with ``extras``), each once;
    requirements that are not installed are left out."""
    seen: dict[str, set[str]] = {}
    todo: list[tuple[str, set[str]]] = [(name, set(extras))]
    while todo:
        wanted, wanted_extras = todo.pop()
        try:
            dist = importlib.metadata.distribution(wanted)
        except importlib.metadata.PackageNotFoundError:
            continue
        key = canonicalize_name(dist.metadata["Name"])
        done = seen.get(key)
        if done is not None and wanted_extras <= done:
            continue
        if done is None:
            yield dist
        seen[key] = (done or set()) | wanted_extras
        for text in dist.requires or ():
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in {"", *wanted_extras}):
                todo.append((requirement.name, set(requirement.extras)))


def _link(source: Path, target: Path, *, copy: bool = False) -> None:
    """``target`` as a hard link to ``source`` (a copy across file systems, or asked)."""
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    if not copy:
        try:
            os.link(source, target)
            return
        except FileExistsError:
            return
        except OSError:
            pass
    shutil.copy2(source, target)
    target.chmod(0o644 | (source.stat().st_mode & 0o111))


def _create_user() -> tuple[str, int, int]:
    """A new user and group of its own; fails the tests (never skips) if it cannot."""
    name = "thc" + secrets.token_hex(4)
    command = ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group"]
    last = ""
    for _ in range(50):  # another process may hold the account files' lock for a moment
        done = subprocess.run([*command, name], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            entry = pwd.getpwnam(name)
            return name, entry.pw_uid, entry.pw_gid
        last = done.stderr.strip()
        if done.returncode not in (1, 10):  # 1: cannot update the files, 10: group files
            break
        time.sleep(0.1)
    pytest.fail(f"cannot create an unprivileged user for the containment tests: {last}")


def _remove_user(name: str, uid: int) -> None:
    for proc in psutil.process_iter(["uids"]):  # every process left of the test user
        with contextlib.suppress(psutil.Error):
            if proc.info["uids"] is not None and proc.info["uids"].real == uid:
                proc.kill()
    for _ in range(50):
        done = subprocess.run(["userdel", name], capture_output=True, check=False)
        if done.returncode in (0, 6):  # 6: already gone
            return
        time.sleep(0.1)


@pytest.fixture(scope="session")
def accounts() -> Iterator[dict[str, Account]]:
    base = Path(tempfile.mkdtemp(prefix="toolhost-adversarial-"))
    base.chmod(0o755)
    created: tuple[str, int, int] | None = None
    try:
        accounts: dict[str, Account] = {}
        if os.geteuid() == 0:
            accounts["root"] = Account(
                "root", 0, 0, sys.executable, ROOT, Path(os.environ.get("HOME", "/root")), base
            )
            created = _create_user()
            name, uid, gid = created
        else:
            entry = pwd.getpwuid(os.geteuid())
            name, uid, gid = entry.pw_name, entry.pw_uid, entry.pw_gid
        home = base / "home"
        home.mkdir(mode=0o700)
        os.chown(home, uid, gid)
        python, workdir = _user_python(base, uid, gid)
        accounts["user"] = Account(name, uid, gid, python, workdir, home, base)
        yield accounts
    finally:
        if created is not None:
            _remove_user(created[0], created[1])
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=["root", "user"])
def account(request: pytest.FixtureRequest, accounts: dict[str, Account]) -> Account:
    """Root, then an unprivileged user (created for the session when the tests run as
    root)."""
    found = accounts.get(request.param)
    if found is None:
        pytest.skip("the tests do not run as root: the host cannot run as root here")
    return found


def chown_tree(path: Path, account: Account) -> None:
    for folder, dirs, files in os.walk(path):
        os.chown(folder, account.uid, account.gid)
        for name in (*dirs, *files):
            os.chown(os.path.join(folder, name), account.uid, account.gid, follow_symlinks=False)


def toolhost(account: Account, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The command line ``toolhost ARGS``, run as ``account``."""
    return subprocess.run(
        [account.python, "-c", "from host.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=account.workdir,
        env=env,
        **as_user(account.uid, account.gid),
        stdin=subprocess.DEVNULL,
        timeout=110,
        check=False,
    )


class HostRun:
    """A host script running as an account: read its reports, answer it, kill it."""

    def __init__(self, process: subprocess.Popen[bytes], what: str) -> None:
        self.process = process
        self.what = what
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.process.pid

    def report(self, timeout: float = 90.0) -> dict[str, Any]:
        """The script's next ``say(...)``; fails with its stderr if it ends first."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.what}: no report within {timeout:g} s")
            ready, _, _ = select.select([self.process.stdout], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                raise AssertionError(f"{self.what} ended early:\n{self.stderr()}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def send(self, word: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(word.encode() + b"\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)

    def wait(self, timeout: float = 60.0) -> int:
        return self.process.wait(timeout)

    def close(self) -> None:
        """Kill it (if it runs) and close its pipes."""
        self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(30)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def stderr(self) -> str:
        if self.process.poll() is None:
            return "(still running)"
        assert self.process.stderr is not None
        return self.process.stderr.read().decode(errors="replace")[-4000:]


class Lab:
    """One test's folder, owned by its account: projects, and host scripts to run."""

    def __init__(self, account: Account, folder: Path) -> None:
        self.account = account
        self.folder = folder
        self.runs: list[HostRun] = []
        self.tokens: list[str] = []
        self.owned: list[psutil.Process] = []

    def own(self, *pids: int) -> None:
        """Processes of this test (a host, a keeper, a capsule): killed at its end if a
        failure left them running (``psutil`` knows them by pid and start time)."""
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                self.owned.append(psutil.Process(pid))

    def token(self, what: str) -> str:
        """A unique mark for processes a tool starts: any left at the end are killed."""
        made = f"toolhost-{what}-{secrets.token_hex(6)}"
        self.tokens.append(made)
        return made

    def project(
        self,
        tools: dict[str, str],
        policy: str | None = None,
        folders: Iterable[str] = (),
        name: str = "project",
    ) -> Path:
        """A project folder with these tool files, policy and (empty) folders."""
        root = self.folder / name
        (root / "tools").mkdir(parents=True)
        for file, source in tools.items():
            (root / "tools" / f"{file}.py").write_text(textwrap.dedent(source))
        if policy is not None:
            (root / "policy.toml").write_text(textwrap.dedent(policy))
        for folder in folders:
            (root / folder).mkdir(parents=True, exist_ok=True)
        chown_tree(root, self.account)
        return root

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(self.account.home),
        }
        if not self.account.root:
            env["XDG_CACHE_HOME"] = str(self.account.home / ".cache")
        else:  # root keeps its warm caches
            for name in ("XDG_CACHE_HOME", "TOOLHOST_CACHE", "TOOLHOST_CACHE_DIR"):
                if name in os.environ:
                    env[name] = os.environ[name]
        env.update(extra)
        return env

    def run(
        self, script: str, project: Path, *args: str, env: dict[str, str] | None = None
    ) -> HostRun:
        """Start ``PRELUDE + script`` as the account, with ``project`` as ``PROJECT`` and
        ``args`` as ``ARGS``."""
        code = PRELUDE + textwrap.dedent(script)
        process = subprocess.Popen(
            [self.account.python, "-c", code, str(project), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.account.workdir,
            env=env if env is not None else self.env(),
            **as_user(self.account.uid, self.account.gid),
            start_new_session=True,
        )
        run = HostRun(process, f"the host script as {self.account.name}")
        self.runs.append(run)
        return run


@pytest.fixture
def lab(account: Account) -> Iterator[Lab]:
    folder = Path(tempfile.mkdtemp(prefix="lab-", dir=account.labs))
    folder.chmod(0o755)
    os.chown(folder, account.uid, account.gid)
    made = Lab(account, folder)
    try:
        yield made
    finally:
        for run in made.runs:
            run.close()
        for proc in made.owned:  # left by a failure: never left running
            with contextlib.suppress(psutil.Error):
                if proc.is_running():
                    proc.kill()
        for token in made.tokens:  # escaped on a failure: never left running
            for pid in marked(token):
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).kill()
        shutil.rmtree(folder, ignore_errors=True)


# -- processes ----------------------------------------------------------------------------


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie is dead; a stopped process is alive)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def marked(token: str) -> list[int]:
    """Every live process whose command line holds ``token`` (a tool's lineage)."""
    found: list[int] = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(token in part for part in proc.info["cmdline"] or ()) and alive(proc.pid):
                found.append(proc.pid)
    return found


def describe(pids: Iterable[int]) -> str:
    out: list[str] = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            out.append(f"{pid} {proc.status()} ppid={proc.ppid()} {proc.cmdline()[:4]!r}")
        except psutil.NoSuchProcess:
            out.append(f"{pid} gone")
    return "; ".join(out) or "none"


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def wait_gone(pids: Iterable[int], token: str | None = None, timeout: float = 10.0) -> None:
    """Wait until none of ``pids`` (nor any process marked with ``token``) runs."""
    pids = list(pids)

    def left() -> list[int]:
        return [p for p in pids if alive(p)] + (marked(token) if token else [])

    try:
        wait_until(lambda: not left(), "the processes to end", timeout)
    except AssertionError:
        raise AssertionError(f"processes survived: {describe(left())}") from None


def parent_of(pid: int) -> int:
    return psutil.Process(pid).ppid()
