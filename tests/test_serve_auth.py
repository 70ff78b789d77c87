"""Who may use ``/mcp`` (issue 24: HTTP serving accepted any client, and each
``initialize`` started a capsule).

Against the app ``toolhost serve --transport http`` runs, behind uvicorn, with raw HTTP
requests: no token, a wrong one, the inbox's, an expired one and a revoked one open no
session and start no capsule; a session answers only the client that opened it; a clients
file anyone else may write counts for nobody; without authentication only loopback is
served; an app's own OAuth tokens count only when issued for this server. The command
line makes, lists and revokes clients, and refuses to serve with no way in.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.server.auth.provider import AccessToken

from host import Event
from host.cli import main as cli_main
from host.serve import CLIENTS_FILE, ClientTokens, ServeApp, asgi_app

from .inbox_helpers import Served, served_app
from .mcp_helpers import make_mcp_project
from .test_serve_sessions import HEADERS, RawSession, _rpc

pytestmark = pytest.mark.subprocess


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_mcp_project(tmp_path / "project")


@pytest.fixture
def tokens(project: Path) -> ClientTokens:
    return ClientTokens(project / ".agent" / CLIENTS_FILE)


@contextmanager
def _serve(project: Path, **options: Any) -> Iterator[tuple[Served, ServeApp, httpx2.Client]]:
    app = asgi_app(project, **options)
    serve: ServeApp = app.state.toolhost
    with served_app(app) as served, httpx2.Client(base_url=served.base, timeout=60) as client:
        yield served, serve, client


def _capsules(serve: ServeApp) -> int:
    assert serve.mcp is not None
    return len(serve.mcp.sessions)


def _opens(client: httpx2.Client, token: str | None) -> httpx2.Response:
    return RawSession(client, token).open()


def test_no_session_without_a_current_clients_token(project: Path, tokens: ClientTokens) -> None:
    token = tokens.add("alpha")
    expired = tokens.add("old", expires=time.time() - 1)
    with _serve(project) as (served, serve, client):
        assert serve.host is not None
        seen: list[Event] = []
        serve.host.on("mcp_client_refused", seen.append)
        inbox_token = serve.inbox_url(served.base).split("token=", 1)[1]
        refused = {
            "none": client.post("/mcp", headers=HEADERS, json={}),
            "wrong": _opens(client, "thc_" + "A" * 43),
            "unprefixed": _opens(client, token.removeprefix("thc_")),
            "the inbox's": _opens(client, inbox_token),
            "expired": _opens(client, expired),
            "basic": client.post(
                "/mcp", headers={**HEADERS, "authorization": f"Basic {token}"}, json={}
            ),
        }
        for what, response in refused.items():
            assert response.status_code == 401, (what, response.text)
            challenge = response.headers["www-authenticate"]
            assert challenge.startswith("Bearer ") and 'error="invalid_token"' in challenge
        assert _capsules(serve) == 0  # nothing started for any of them
        session = RawSession(client, token)
        assert session.open().status_code == 200
        assert _rpc(session.call("count", {}))["result"]["structuredContent"] == {"result": 1}
        assert _capsules(serve) == 1
    reasons = [e.data["reason"] for e in seen]
    assert reasons.count("no token") == 1 and reasons.count("wrong or expired token") == 5
    shown = json.dumps([e.data for e in seen])
    assert token not in shown and expired not in shown and "127.0.0.1" in shown


def test_a_session_answers_only_the_client_that_opened_it(
    project: Path, tokens: ClientTokens
) -> None:
    alpha, beta = tokens.add("alpha"), tokens.add("beta")
    with _serve(project) as (_served, _app, client):
        session = RawSession(client, alpha)
        assert session.open().status_code == 200
        stolen = RawSession(client, beta)
        stolen.id = session.id  # beta learns alpha's session id
        assert stolen.call("count", {}).status_code == 404
        assert _rpc(session.call("count", {}))["result"]["structuredContent"] == {"result": 1}


def test_a_revoked_or_replaced_token_stops_counting_at_once(
    project: Path, tokens: ClientTokens
) -> None:
    first = tokens.add("alpha")
    with _serve(project) as (_served, _app, client):
        session = RawSession(client, first)
        assert session.open().status_code == 200
        second = tokens.add("alpha")  # a new token for alpha: the first no longer counts
        assert session.call("count", {}).status_code == 401
        assert _opens(client, second).status_code == 200
        assert tokens.revoke("alpha") and not tokens.revoke("alpha")
        assert _opens(client, second).status_code == 401


def test_a_clients_file_that_cannot_be_trusted_counts_for_nobody(
    project: Path, tokens: ClientTokens
) -> None:
    token = tokens.add("alpha")
    path = tokens.path
    assert path.stat().st_mode & 0o777 == 0o600
    with _serve(project) as (_served, serve, client):
        assert serve.host is not None
        seen: list[Event] = []
        serve.host.on("clients_file_refused", seen.append)
        assert _opens(client, token).status_code == 200
        path.chmod(0o666)  # anyone could add a client of their own
        assert _opens(client, token).status_code == 401
        path.chmod(0o600)
        assert _opens(client, token).status_code == 200
        text = path.read_text()
        path.write_text(text[:-5])  # cut: not JSON
        assert _opens(client, token).status_code == 401
        path.unlink()
        (path.parent / "elsewhere.json").write_text(text)
        path.symlink_to(path.parent / "elsewhere.json")  # a link is not followed
        assert _opens(client, token).status_code == 401
        path.unlink()
        path.write_text(text)
        path.chmod(0o600)
        assert _opens(client, token).status_code == 200
    reasons = [e.data["reason"] for e in seen]
    assert len(reasons) == 3, reasons
    assert "may be written by others" in reasons[0] and "chmod 600" in reasons[0]
    assert "not JSON" in reasons[1] and "cannot be read" in reasons[2]
    assert token not in json.dumps(reasons)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_without_authentication_only_loopback_is_served(project: Path) -> None:
    app = asgi_app(project, auth="none")  # its lifespan is not run: MCP itself is not up
    for address, status in (("203.0.113.7", 403), ("10.0.0.2", 403), ("127.0.0.1", 503)):
        transport = httpx2.ASGITransport(app, client=(address, 4000))
        async with httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1") as web:
            response = await web.post("/mcp", headers=HEADERS, json={})
        assert response.status_code == status, (address, response.text)
        if status == 403:
            assert "loopback clients only" in response.text


class _Issuer:
    """An OAuth authorization server's tokens, as an app's verifier would check them."""

    def __init__(self, resource: str) -> None:
        self.tokens = {
            "jwt-for-us": AccessToken(
                token="jwt-for-us", client_id="claude", scopes=["tools"], resource=resource
            ),
            "jwt-for-another": AccessToken(
                token="jwt-for-another",
                client_id="claude",
                scopes=["tools"],
                resource="https://other.example/mcp",
            ),
            "jwt-no-scope": AccessToken(
                token="jwt-no-scope", client_id="claude", scopes=[], resource=resource
            ),
        }

    async def verify_token(self, token: str) -> AccessToken | None:
        return self.tokens.get(token)


def test_an_oauth_resource_server_takes_only_tokens_issued_for_it(
    project: Path, tokens: ClientTokens
) -> None:
    resource = "https://tools.example/mcp"
    client_token = tokens.add("alpha")  # the project's own tokens do not count here
    options: dict[str, Any] = {
        "auth": _Issuer(resource),
        "resource_url": resource,
        "authorization_servers": ["https://auth.example"],
        "required_scopes": ["tools"],
    }
    with _serve(project, **options) as (_served, _app, client):
        metadata = client.get("/.well-known/oauth-protected-resource/mcp")
        assert metadata.status_code == 200
        assert metadata.json()["resource"] == resource
        assert metadata.json()["authorization_servers"] == ["https://auth.example/"]
        bare = client.post("/mcp", headers=HEADERS, json={})
        assert bare.status_code == 401
        assert "resource_metadata=" in bare.headers["www-authenticate"]
        assert _opens(client, "jwt-for-another").status_code == 401  # its audience differs
        assert _opens(client, client_token).status_code == 401
        assert _opens(client, "jwt-no-scope").status_code == 403
        assert _opens(client, "jwt-for-us").status_code == 200


def test_oauth_settings_need_a_verifier(project: Path) -> None:
    from host.errors import HostError

    with pytest.raises(HostError, match="TokenVerifier"):
        ServeApp(project, resource_url="https://x.example/mcp", authorization_servers=["https://a"])
    with pytest.raises(HostError, match="authorization_servers"):
        ServeApp(project, auth=_Issuer("x"), resource_url="https://x.example/mcp")
    with pytest.raises(HostError, match="'tokens', 'none'"):
        ServeApp(project, auth="open")  # type: ignore[arg-type]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        cli_main(list(argv))
    out = capsys.readouterr()
    return int(exited.value.code or 0), out.out, out.err


def test_the_command_line_makes_lists_and_revokes_clients(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ("--project", str(project))
    code, _, err = _cli(capsys, "serve", "--transport", "http", *where)
    assert code == 2 and "no HTTP client can authenticate" in err and "--auth none" in err
    code, out, err = _cli(capsys, "clients", "add", "ci", *where)
    token = out.strip()
    assert code == 0 and token.startswith("thc_") and len(token) > 40 and token not in err
    path = project / ".agent" / CLIENTS_FILE
    assert path.stat().st_mode & 0o777 == 0o600 and token not in path.read_text()
    code, out, _ = _cli(capsys, "clients", "add", "nightly", "--expires", "7", "--json", *where)
    added = json.loads(out)
    assert code == 0 and added["client"] == "nightly" and added["expires"] is not None
    code, out, _ = _cli(capsys, "clients", "list", *where)
    assert code == 0 and out.startswith("ci: since ") and "nightly: since" in out
    assert token not in out and added["token"] not in out
    code, _, err = _cli(capsys, "clients", "add", "no spaces", *where)
    assert code == 1 and "not a client name" in err
    code, _, err = _cli(capsys, "clients", "revoke", "ci", *where)
    assert code == 0 and "no longer counts" in err
    code, _, err = _cli(capsys, "clients", "revoke", "ci", *where)
    assert code == 1 and "no client 'ci'" in err
    code, out, _ = _cli(capsys, "clients", "list", "--json", *where)
    assert [c["name"] for c in json.loads(out)["clients"]] == ["nightly"]
    # Serving without authentication is for loopback only.
    code, _, err = _cli(
        capsys, "serve", "--transport", "http", "--auth", "none", "--host", "0.0.0.0", *where
    )
    assert code == 2 and "loopback only" in err
    os.chmod(path, 0o644)  # readable by others is fine: it holds digests
    code, out, _ = _cli(capsys, "clients", "list", *where)
    assert code == 0 and "nightly" in out


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_verifier_itself_refuses_expired_and_unknown_tokens(
    tokens: ClientTokens,
) -> None:
    """Not only the SDK's middleware (which also checks ``expires_at``): an app that uses
    ``ClientTokens`` as its verifier elsewhere gets no client for an expired token."""
    current = tokens.add("alpha", expires=time.time() + 60)
    expired = tokens.add("old", expires=time.time() - 1)
    found = await tokens.verify_token(current)
    assert found is not None and found.client_id == "alpha" and found.scopes == ["mcp"]
    assert current not in found.model_dump_json()  # the digest is kept, not the token
    assert await tokens.verify_token(expired) is None
    assert await tokens.verify_token(current[:-1] + "x") is None
    assert await tokens.verify_token("thc_" + "x" * 300) is None
