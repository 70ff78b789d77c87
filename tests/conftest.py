"""Shared fixtures: every async test runs under both asyncio and trio unless it opts out."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .pg_helpers import PgServer

ROOT = Path(__file__).resolve().parent.parent
AGENT_SRC = ROOT / "agent_src"


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def make_project(tmp_path: Path) -> Callable[..., Path]:
    """Write a project: ``make_project(tools={"name": "source"}, policy="toml")``.

    It is ``tmp_path / "project"``: tools in a subprocess capsule cannot create files
    directly in ``tmp_path`` (nor in the project folder), which Landlock denies above the
    project's protected folders; give them a folder made before the host starts.
    """

    def make(tools: dict[str, str], policy: str | None = None, subdir: str = "tools") -> Path:
        root = tmp_path / "project"
        tools_dir = root / subdir
        tools_dir.mkdir(parents=True, exist_ok=True)
        for name, source in tools.items():
            (tools_dir / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        if policy is not None:
            (root / "policy.toml").write_text(textwrap.dedent(policy), encoding="utf-8")
        return root

    return make


@pytest.fixture(autouse=True)
def _canary_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A secret in the host's environment that no capsule may ever see."""
    monkeypatch.setenv("CANARY_SECRET", "canary-" + os.urandom(8).hex())


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One throw-away PostgreSQL server for the whole run, started on first use; tests
    that stop it start their own (``PgServer()``)."""
    server = PgServer()
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A fresh database on the session's server, dropped after the test."""
    name = pg_server.create_database()
    try:
        yield pg_server.url(name)
    finally:
        pg_server.drop_database(name)
