"""The approval inbox over plain HTTP: who may use it, what it answers, and
``toolhost inbox`` answering a call that waits in another host process.

A real host behind uvicorn on a loopback port (``inbox_helpers``), a real HTTP client.
What a browser adds (cookies across sites, scripts, the page) is ``test_inbox_browser``.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from host.audit import PendingApproval

from .inbox_helpers import ServedHost, make_inbox_project, served_host, sign_in, wait_until

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_inbox_project(tmp_path_factory.mktemp("inbox-http") / "project")


@pytest.fixture(scope="module")
def served(project: Path) -> Iterator[ServedHost]:
    with served_host(project) as running:
        yield running


def signed_in(served: ServedHost) -> tuple[httpx2.Client, dict[str, str]]:
    """A client holding what the page holds (the session cookie and its key), and the
    headers the page's own POSTs carry."""
    client = httpx2.Client(base_url=served.base, follow_redirects=False)
    return client, sign_in(client, served.inbox_url)


def inject(served: ServedHost, pending_id: str, *, warnings: tuple[str, ...] = ()) -> None:
    host = served.serve.host
    assert host is not None
    now = time.time()
    served.run(
        host.store.add_pending,
        PendingApproval(
            id=pending_id,
            host_id=host.host_id,
            created=now,
            expires=now + 120,
            call_id=f"{host.host_id}.{pending_id}",
            session="s",
            caller="agent",
            tool="launch",
            rule="launches-need-ok",
            reason=None,
            args_sha256="0" * 64,
            rendered='target = "x"',
            warnings=warnings,
            offered=True,
        ),
    )


def remove(served: ServedHost, pending_id: str) -> None:
    host = served.serve.host
    assert host is not None
    served.run(host.store.remove_pending, pending_id)


def test_the_token_the_cookie_the_key_and_the_headers(served: ServedHost) -> None:
    with httpx2.Client(base_url=served.base, follow_redirects=False) as client:
        blank = client.get("/inbox/")  # the page holds no data: served, with no key
        assert blank.status_code == 200 and 'name="csrf-token" content=""' in blank.text
        assert "set-cookie" not in blank.headers
        assert client.get("/inbox/events").status_code == 401
        assert client.get("/inbox/api/audit").status_code == 401
        assert client.get("/inbox/", params={"token": "guess"}).status_code == 403
        refused = client.get("/inbox/", headers={"host": "evil.example"})
        assert refused.status_code == 421  # DNS rebinding: a foreign Host name
        token = served.inbox_url.split("token=", 1)[1]
        opened = client.get("/inbox/", params={"token": token})
        assert opened.status_code == 200 and token not in opened.text
        key = re.search(r'name="csrf-token" content="([^"]+)"', opened.text)
        assert key is not None and len(key.group(1)) >= 40
        cookie = opened.headers["set-cookie"]
        assert cookie.startswith("__Host-toolhost_inbox_")  # loopback: a secure origin
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" in cookie
        assert "Path=/;" in cookie and "Domain" not in cookie and token not in cookie
        assert opened.headers["cache-control"] == "no-store"  # the key is kept nowhere else
        # The cookie alone (what a page on another port of this host receives) reads
        # nothing; with the page's key it reads.
        client.headers["cookie"] = cookie.split(";", 1)[0]
        same = {"sec-fetch-site": "same-origin"}
        for path in ("/inbox/events", "/inbox/api/audit"):
            assert client.get(path, headers=same).status_code == 403
            forged = {**same, "x-csrf-token": "k" * len(key.group(1))}
            assert client.get(path, headers=forged).status_code == 403
        audit = client.get("/inbox/api/audit", headers={**same, "x-csrf-token": key.group(1)})
        assert audit.status_code == 200
        page = client.get("/inbox/")
        assert page.status_code == 200 and key.group(1) not in page.text
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp
        assert "require-trusted-types-for 'script'" in csp and "unsafe-inline" not in csp
        assert page.headers["referrer-policy"] == "no-referrer"
        assert page.headers["x-frame-options"] == "DENY"
        assert "<script>" not in page.text  # no inline script at all


def test_only_the_pages_own_posts_change_anything(served: ServedHost) -> None:
    inject(served, "csrf-target", warnings=("bidirectional control characters",))
    client, good = signed_in(served)
    url = "/inbox/api/approvals/csrf-target"
    body = {"decision": "approve_once", "acknowledged": True}
    try:
        for changed, status in [
            ({"origin": "http://evil.example"}, 403),
            ({"origin": "http://127.0.0.1:1"}, 403),  # another port: another origin
            ({"sec-fetch-site": "same-site"}, 403),
            ({"x-csrf-token": "guess"}, 403),
        ]:
            assert client.post(url, json=body, headers={**good, **changed}).status_code == status
        form = client.post(url, data={"decision": "approve_once"}, headers=good)
        assert form.status_code == 415  # what an HTML form can send is refused
        bad = client.post(url, json={"decision": "yes please"}, headers=good)
        assert bad.status_code == 400
        huge = client.post(url, json={"decision": "deny", "comment": "x" * 20_000}, headers=good)
        assert huge.status_code == 413
        unread = client.post(url, json={"decision": "approve_once"}, headers=good)
        assert unread.status_code == 400 and "warnings" in unread.json()["message"]
        assert [r.tool for r in served.run(served.serve.host.store.pending)] == ["launch"]  # type: ignore[union-attr]

        answered = client.post(url, json={**body, "approver": "bob"}, headers=good)
        assert answered.status_code == 200
        assert answered.json() == {"status": "answered", "message": "approved once by bob (inbox)"}
        again = client.post(url, json={"decision": "deny"}, headers=good)
        assert again.status_code == 409
        assert again.json()["message"] == "already answered: approved once by bob (inbox)"
        gone = client.post("/inbox/api/approvals/never", json={"decision": "deny"}, headers=good)
        assert gone.status_code == 409 and gone.json()["status"] == "gone"
    finally:
        client.close()
        remove(served, "csrf-target")


def _events_until(client: httpx2.Client, predicate: Any) -> dict[str, Any]:
    """Read the event stream until a snapshot satisfies ``predicate``."""
    with client.stream("GET", "/inbox/events", headers={"sec-fetch-site": "same-origin"}) as s:
        assert s.status_code == 200
        assert s.headers["content-type"].startswith("text/event-stream")
        for line in s.iter_lines():
            if line.startswith("data: "):
                data = json.loads(line[6:])
                if predicate(data):
                    return data
    raise AssertionError("the stream ended")


def _follow(client: httpx2.Client, lines: list[str]) -> None:
    """Read the event stream until the server ends it."""
    with client.stream("GET", "/inbox/events") as stream:
        for line in stream.iter_lines():
            lines.append(line)


def test_grants_revoke_and_the_audit(served: ServedHost) -> None:
    client, good = signed_in(served)
    try:
        call = served.call("launch", "saturn")
        snapshot = _events_until(client, lambda d: any(p["offered"] for p in d["pending"]))
        (item,) = [p for p in snapshot["pending"] if '"saturn"' in p["arguments"]]
        assert item["description"] == "Launch a rocket at a target."
        answer = client.post(
            f"/inbox/api/approvals/{item['id']}", json={"decision": "approve_always"}, headers=good
        )
        assert answer.status_code == 200
        assert call.result(timeout=60) == "launched saturn"
        snapshot = _events_until(client, lambda d: bool(d["grants"]))
        (grant,) = snapshot["grants"]
        assert (grant["tool"], grant["allow"], grant["scope"]) == ("launch", True, "call")
        # Remembered: the same call runs at once now.
        assert served.call("launch", "saturn").result(timeout=60) == "launched saturn"
        revoked = client.post(f"/inbox/api/grants/{grant['id']}/revoke", json={}, headers=good)
        assert revoked.status_code == 200
        again = client.post(f"/inbox/api/grants/{grant['id']}/revoke", json={}, headers=good)
        assert again.status_code == 409
        _events_until(client, lambda d: not d["grants"])

        def audit(**filters: str) -> list[dict[str, Any]]:
            found = client.get("/inbox/api/audit", params=filters)
            assert found.status_code == 200
            return found.json()["records"]

        wait_until(lambda: len(audit(tool="launch", outcome="ok")) >= 2)
        approvals = [r["approval"] for r in audit(tool="launch", outcome="ok")]
        # Newest first: the remembered call, then the answer that made the grant.
        assert approvals[:2] == [f"grant {grant['id']}", f"always (grant {grant['id']}) (inbox)"]
        assert audit(tool="launch", caller="app") == []
        assert all(r["outcome"] == "ok" for r in audit(outcome="ok"))
    finally:
        client.close()


@pytest.mark.slow
def test_toolhost_inbox_answers_a_host_in_another_process(tmp_path: Path) -> None:
    project = make_inbox_project(tmp_path / "project")
    toolhost = [sys.executable, "-c", "from host.cli import main; main()"]
    host = subprocess.Popen(  # a host that waits for the inbox: toolhost call --approver inbox
        [*toolhost, "call", "launch", "pluto", "--approver", "inbox", "--project", str(project)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    inbox = subprocess.Popen(
        [
            *toolhost,
            "inbox",
            "--port",
            "0",
            "--project",
            str(project),
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert inbox.stderr is not None
        url = ""
        while "approval inbox at " not in url:
            url = inbox.stderr.readline()
            assert url, "toolhost inbox ended without a URL"
        url = url.split("approval inbox at ", 1)[1].strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/inbox/\?token=[\w-]+", url), url
        base = url.split("/inbox/", 1)[0]
        with httpx2.Client(base_url=base, follow_redirects=False) as client:
            good = sign_in(client, url)
            snapshot = _events_until(client, lambda d: any(p["offered"] for p in d["pending"]))
            (item,) = snapshot["pending"]
            answer = client.post(
                f"/inbox/api/approvals/{item['id']}",
                json={"decision": "approve_once", "approver": "carol"},
                headers=good,
            )
            assert answer.json()["message"] == "approved once by carol (inbox)"
            out, err = host.communicate(timeout=60)
            assert out.strip() == "launched pluto", err
            assert "escalations wait for an answer in the approval inbox" in err
            # Stopping with a page open: its event stream ends first, so the server
            # need not cancel it at its graceful-shutdown timeout (with a traceback).
            lines: list[str] = []
            reader = threading.Thread(target=_follow, args=(client, lines), daemon=True)
            reader.start()
            wait_until(lambda: any(line.startswith("data: ") for line in lines))
            inbox.send_signal(signal.SIGINT)
            assert inbox.wait(timeout=30) == 130
            reader.join(timeout=30)
        assert "Traceback" not in inbox.stderr.read()
    finally:
        for process in (host, inbox):
            if process.poll() is None:
                process.kill()
            process.communicate()
