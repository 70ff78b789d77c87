"""``/stats`` over real HTTP: ``host.stats()`` as JSON, only for whoever holds the inbox's
token (in a Bearer header); never open to anyone.

A real host behind uvicorn on a loopback port (``inbox_helpers``), a real HTTP client.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from host import HostStats

from .inbox_helpers import ServedHost, make_inbox_project, served_host

pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedHost]:
    project = make_inbox_project(tmp_path_factory.mktemp("stats-http") / "project")
    with served_host(project) as running:
        yield running


def token_of(served: ServedHost) -> str:
    return served.inbox_url.split("token=", 1)[1]


def test_stats_need_the_token(served: ServedHost) -> None:
    with httpx2.Client(base_url=served.base) as client:
        bare = client.get("/stats")
        assert bare.status_code == 401
        assert bare.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer" in bare.text
        assert "sessions" not in bare.text
        wrong = client.get("/stats", headers={"authorization": "Bearer not-the-token"})
        assert wrong.status_code == 403
        # Never in the URL, where logs keep it.
        in_url = client.get("/stats", params={"token": token_of(served)})
        assert in_url.status_code == 401
        # A DNS-rebinding page cannot pose as the server either.
        rebound = client.get(
            "/stats",
            headers={"authorization": f"Bearer {token_of(served)}", "host": "evil.example"},
        )
        assert rebound.status_code == 421
        assert client.post("/stats").status_code == 405


def test_stats_with_the_token_follow_calls(served: ServedHost) -> None:
    headers = {"authorization": f"Bearer {token_of(served)}"}
    with httpx2.Client(base_url=served.base, headers=headers) as client:
        response = client.get("/stats")
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        assert response.headers["cache-control"] == "no-store"
        before = HostStats.model_validate_json(response.text)
        assert before.sessions >= 1 and before.capsules.subprocess >= 1
        assert before.memory.bytes > 0
        assert served.call("add", 2, 3).result(timeout=60) == 5
        after = HostStats.model_validate_json(client.get("/stats").text)
        assert after.calls_total == before.calls_total + 1
        assert after.calls_per_second > 0
        assert "tok-51d0c8e2aa" not in response.text


def test_the_inbox_cookie_is_not_a_token(served: ServedHost) -> None:
    with httpx2.Client(base_url=served.base) as client:
        assert client.get("/inbox/", params={"token": token_of(served)}).status_code == 200
        assert client.cookies  # signed in to the inbox, whose cookie is its own
        for name, value in client.cookies.items():
            sent = client.get("/stats", headers={"cookie": f"{name}={value}"})
            assert sent.status_code == 401


def test_without_the_inbox_there_is_no_stats_route(tmp_path: Path) -> None:
    project = make_inbox_project(tmp_path / "project")
    with served_host(project, inbox=False) as running, httpx2.Client(base_url=running.base) as c:
        assert c.get("/stats").status_code == 404
