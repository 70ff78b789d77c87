"""Shared parts of the inbox tests: a project, a served host in a thread, the browser.

The host and its ASGI app run on an asyncio loop of their own (an anyio blocking portal
in a thread, uvicorn serving in that loop), so plain ``def`` tests can drive a real
Chromium with Playwright's sync API meanwhile: Playwright's sync API cannot run inside
an event loop, and while it is alive no other loop may run on the main thread.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import textwrap
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio.from_thread
import pytest

from host.serve import ServeApp

CHROMIUM = os.environ.get("TOOLHOST_CHROMIUM", "/usr/bin/chromium")
# Playwright adds --headless, --no-sandbox and a fresh profile itself; the rest keeps
# Chromium off the network it could not reach anyway.
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"

POLICY = """\
version = 1

[defaults]
agent = "deny"
escalation_timeout = "60s"

[[rules]]
id = "launches-need-ok"
tools = ["launch"]
decision = "escalate"
reason = "Launching cannot be undone."

[[rules]]
id = "inbox-only"
tools = ["fire"]
decision = "escalate"
approvers = ["inbox"]
reason = "Only someone away from the agent's screen may fire."

[[rules]]
id = "harmless"
tools = ["add"]
decision = "allow"

[env]
set = {INBOX_SECRET = "tok-51d0c8e2aa"}
secret = ["INBOX_SECRET"]
"""

TOOLS = {
    "desk": '''
        def launch(target: str, note: str = "") -> str:
            """Launch a rocket at a target.

            It cannot be called back once launched.
            """
            return f"launched {target}"


        def fire() -> str:
            """Fire the cannon."""
            return "fired"


        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b
    '''
}


def make_inbox_project(root: Path) -> Path:
    (root / "tools").mkdir(parents=True)
    for name, source in TOOLS.items():
        (root / "tools" / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    (root / "policy.toml").write_text(POLICY, encoding="utf-8")
    return root


def sign_in(client: Any, url: str) -> dict[str, str]:
    """Open the printed link as the inbox's page does; returns the headers the page's own
    requests carry (origin, same-origin, its key), which the client now sends by default
    with the session cookie. The cookie is set by hand: an HTTP client keeps a ``Secure``
    cookie for https only, where a browser keeps it for loopback too."""
    response = client.get(url)
    assert response.status_code == 200, response.text
    found = re.search(r'name="csrf-token" content="([^"]+)"', response.text)
    assert found is not None, "no key in the page"
    name, _, rest = response.headers["set-cookie"].partition("=")
    base = url.split("/inbox/", 1)[0]
    good = {"origin": base, "sec-fetch-site": "same-origin", "x-csrf-token": found.group(1)}
    client.headers["cookie"] = f"{name}={rest.split(';', 1)[0]}"
    client.headers["x-csrf-token"] = good["x-csrf-token"]
    return good


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait (polling) until ``predicate()`` holds, or fail."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("the condition did not hold in time")
        time.sleep(0.02)


def require_chromium() -> str:
    """The browser's path; a missing browser fails loudly (never a silent skip)."""
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.fail(
            f"no Chromium at {CHROMIUM}: the inbox's browser tests need Debian's chromium "
            "(apt-get install -y --no-install-recommends chromium fonts-dejavu-core; "
            ".ci/run does it), or TOOLHOST_CHROMIUM=/path/to/chromium",
            pytrace=False,
        )
    return CHROMIUM


def _bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class Served:
    """An ASGI app served by uvicorn on an asyncio loop in a thread (a blocking portal)."""

    def __init__(self, app: Any, portal: anyio.from_thread.BlockingPortal) -> None:
        import uvicorn

        self.app = app
        self.portal = portal
        self.sock = _bound_socket()
        self.port: int = self.sock.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, log_level="warning", lifespan="on", timeout_graceful_shutdown=3
        )
        self.server = uvicorn.Server(config)
        self._done: Future[None] | None = None

    def start(self) -> Served:
        self._done = self.portal.start_task_soon(self.server.serve, [self.sock])
        wait_until(lambda: self.server.started or self._done is None or self._done.done(), 60)
        if not self.server.started:
            assert self._done is not None
            self._done.result()  # raises what stopped it
            raise RuntimeError("uvicorn did not start")
        return self

    def stop(self, close_streams: Callable[[], None] | None = None) -> None:
        if close_streams is not None:
            self.portal.call(_call_sync, close_streams)
        self.server.should_exit = True
        if self._done is not None:
            self._done.result(timeout=30)
        self.sock.close()


async def _call_sync(fn: Callable[[], None]) -> None:
    fn()


class ServedHost(Served):
    """``ServeApp`` over a project (MCP and the inbox), the host opened by its lifespan."""

    def __init__(self, serve: ServeApp, portal: anyio.from_thread.BlockingPortal) -> None:
        super().__init__(serve.starlette(), portal)
        self.serve = serve

    @property
    def inbox_url(self) -> str:
        return self.serve.inbox_url(self.base)

    def call(self, tool: str, *args: Any, **kwargs: Any) -> Future[Any]:
        """Call a tool as the agent in the default session; returns at once."""
        host = self.serve.host
        assert host is not None
        session = host.default_session
        return self.portal.start_task_soon(session.call_as, "agent", tool, args, kwargs)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run an async function on the host's loop and wait for it."""
        return self.portal.call(fn, *args)


@contextmanager
def served_host(project: Path, **options: Any) -> Iterator[ServedHost]:
    with ExitStack() as stack:
        portal = stack.enter_context(anyio.from_thread.start_blocking_portal("asyncio"))
        served = ServedHost(ServeApp(project, **options), portal).start()
        try:
            yield served
        finally:
            served.stop(served.serve.close_streams)


@contextmanager
def served_app(app: Any) -> Iterator[Served]:
    with anyio.from_thread.start_blocking_portal("asyncio") as portal:
        served = Served(app, portal).start()
        try:
            yield served
        finally:
            served.stop()
