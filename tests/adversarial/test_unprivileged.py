"""The trust and state attacks again, as an unprivileged user (issue 12, "the standing suite").

Root's capabilities mask some leaks: root may read and write files whatever their owner
and mode, and signal any process. The attacks on the host's own state (the audit's journal and
database, the grants, the key, the locks, the caches) check ownership and modes, so when
the tests run as root this module runs them again as an unprivileged user created for the
session (``contain_helpers.accounts``: a ``useradd`` account, removed afterwards), in a
copy of the checkout that user can read, and requires them to pass. The containment
attacks on processes, signals and the files a tool may not touch (``test_c_*``) already
run as both accounts themselves. About a minute and a half: marked ``slow``.

When the tests do not run as root they already run unprivileged: this module is skipped,
saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from .contain_helpers import ROOT, Account, accounts, chown_tree

__all__ = ["accounts"]  # the session fixture, used here

FILES = ["tests/adversarial/test_h_audit.py", "tests/adversarial/test_caches.py"]
"""The attacks whose outcome depends on who owns what: the audit's journal, database,
grants, key and locks; the caches' owners and modes."""
KEEP = "not scope_entry or (asyncio and writable)"
"""Of the scope cache's tamperings (each builds a scope: seconds), the one that hinges on
modes; the rest do not depend on the user."""

COPIED = ("host", "capsule", "tests", "agent_src", "pyproject.toml")
IGNORED = ("__pycache__", "*.pyc", ".venv", ".hypothesis", "node_modules")


def _copy_checkout(checkout: Path) -> None:
    """What of this checkout the tests need, into ``checkout``."""
    ignore = shutil.ignore_patterns(*IGNORED)
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, checkout / name, ignore=ignore)
        elif source.exists():
            checkout.mkdir(exist_ok=True)
            shutil.copy2(source, checkout / name)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_state_and_trust_attacks_pass_as_an_unprivileged_user(
    accounts: dict[str, Account],
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the tests already run as an unprivileged user: nothing to add")
    user = accounts["user"]
    assert not user.root
    folder = Path(tempfile.mkdtemp(prefix="unprivileged-", dir=user.labs))
    try:
        checkout = folder / "checkout"
        _copy_checkout(checkout)
        folder.chmod(0o755)
        chown_tree(folder, user)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(user.home),
            "XDG_CACHE_HOME": str(user.home / ".cache"),
            "TMPDIR": str(folder),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        done = subprocess.run(
            [
                *(user.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0"),
                *("-m", "not slow and not wasm", "-k", KEEP, "-x", *FILES),
            ],
            cwd=checkout,
            env=env,
            user=user.uid,
            group=user.gid,
            extra_groups=[],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        tail = (done.stdout + done.stderr)[-6000:]
        assert done.returncode == 0, tail
        assert " passed" in done.stdout and " failed" not in done.stdout, tail
    finally:
        shutil.rmtree(folder, ignore_errors=True)


PRIVATE = (
    "tests/adversarial/test_c_state.py::test_a_tool_cannot_touch_the_hosts_state_tools_or_policy"
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hosts_run_as_the_user_from_a_checkout_in_a_private_folder() -> None:
    """A checkout in a folder only root may enter (root's home, a ``mktemp -d``): the
    unprivileged user's hosts get an interpreter and packages of their own that it can
    read (``contain_helpers._user_python``), and run where it can enter. Before, such a
    checkout failed every test run as the user (``No module named 'anyio'``)."""
    if os.geteuid() != 0:
        pytest.skip("the tests already run as an unprivileged user: nothing to add")
    folder = Path(tempfile.mkdtemp(prefix="private-checkout-"))
    try:
        assert folder.stat().st_mode & 0o777 == 0o700
        checkout = folder / "checkout"
        _copy_checkout(checkout)
        # The README's venv lives in the checkout: one in the private folder, whose
        # site-packages adds ours (root reads it; the user cannot even see the .pth).
        venv = folder / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
        ours = sysconfig.get_path("purelib")
        (site / "_ours.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        done = subprocess.run(
            [
                *(str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"),
                *("-x", "-n", "0"),
                *("-k", "user", PRIVATE),
            ],
            cwd=checkout,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=540,
            check=False,
        )
        tail = (done.stdout + done.stderr)[-6000:]
        assert done.returncode == 0, tail
        assert "1 passed" in done.stdout, tail
    finally:
        shutil.rmtree(folder, ignore_errors=True)
