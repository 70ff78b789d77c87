"""The approval inbox end to end in a real headless Chromium (Debian's, driven by
Playwright), over a real host: calls escalate, a person answers on the page, the calls
complete or fail as answered.

One browser for the module (Playwright's sync API: plain ``def`` tests; the host runs on
a loop of its own, see ``inbox_helpers``). Screenshots go to ``tests/artifacts/``
(ignored by git). A missing browser fails these tests; it never skips them.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import playwright.sync_api as playwright_sync  # in [test]: its absence is an error, not a skip
import pytest

from host import NotApproved
from host.audit import PendingApproval

from .inbox_helpers import (
    ARTIFACTS,
    CHROMIUM_ARGS,
    ServedHost,
    make_inbox_project,
    require_chromium,
    served_app,
    served_host,
    wait_until,
)

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

expect = playwright_sync.expect
expect.set_options(timeout=20_000)

ROOT = Path(__file__).resolve().parent.parent

# U+202E (right-to-left override), an ANSI "erase line", and markup with a handler.
TRICKY = "moon\u202e<img src=x onerror=window.__pwned=1>\x1b[2K"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = require_chromium()
    with playwright_sync.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def contexts(browser: Any) -> Iterator[list[Any]]:
    """Browser contexts (each its own cookie jar), closed after the test."""
    made: list[Any] = []
    yield made
    for context in made:
        context.close()


def new_context(browser: Any, made: list[Any]) -> Any:
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    context.set_default_timeout(20_000)
    made.append(context)
    return context


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_inbox_project(tmp_path_factory.mktemp("inbox") / "project")


@pytest.fixture(scope="module")
def served(project: Path) -> Iterator[ServedHost]:
    with served_host(project) as running:
        yield running


def open_inbox(context: Any, served: ServedHost) -> Any:
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on(
        "response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None
    )
    page.problems = problems
    assert page.goto(served.inbox_url).status == 200
    page.wait_for_url(f"{served.base}/inbox/")  # the token is gone from the address bar
    expect(page.locator("#status")).to_have_text("live")
    return page


def inject(
    served: ServedHost,
    pending_id: str,
    *,
    expires_in: float,
    offered: bool = True,
    chain: tuple[str, ...] = (),
) -> None:
    """A pending approval written straight to the store, as a host that waits would."""
    host = served.serve.host
    assert host is not None
    now = time.time()
    row = PendingApproval(
        id=pending_id,
        host_id=host.host_id,
        created=now,
        expires=now + expires_in,
        call_id=f"{host.host_id}.x{pending_id}",
        session="s-injected",
        caller="agent",
        tool="launch",
        rule="launches-need-ok",
        reason=None,
        args_sha256="0" * 64,
        rendered='target = "venus"',
        offered=offered,
        chain=chain,
    )
    served.run(host.store.add_pending, row)


def pending_row(served: ServedHost, pending_id: str) -> PendingApproval | None:
    host = served.serve.host
    assert host is not None
    return served.run(host.store.get_pending, pending_id)


def test_approve_a_call_in_the_browser(
    served: ServedHost, browser: Any, contexts: list[Any]
) -> None:
    first = open_inbox(new_context(browser, contexts), served)
    second = open_inbox(new_context(browser, contexts), served)  # another approver
    expect(first.locator("#empty")).to_be_visible()

    call = served.call("launch", TRICKY, note="tok-51d0c8e2aa")
    item = first.locator("li.request")
    expect(item).to_have_count(1)
    expect(second.locator("li.request")).to_have_count(1)
    expect(item.locator("h3.tool")).to_have_text("launch")
    expect(item.locator(".description")).to_have_text("Launch a rocket at a target.")
    expect(item.locator(".facts")).to_contain_text("launches-need-ok: Launching cannot be undone.")
    expect(item.locator(".facts")).to_contain_text("agent")
    # Escaped, as text: the override and the terminal escape are visible, the markup is
    # text, no image element exists, its handler never ran, and the secret is replaced.
    arguments = item.locator("pre.arguments")
    expect(arguments).to_contain_text(
        'target = "moon\\u{202E}<img src=x onerror=window.__pwned=1>\\x1b[2K"'
    )
    expect(arguments).to_contain_text('note = "⟨secret INBOX_SECRET⟩"')
    assert "tok-51d0c8e2aa" not in first.content()
    assert first.locator("img").count() == 0
    assert first.evaluate("() => window.__pwned") is None
    expect(item.locator(".warnings")).to_contain_text("bidirectional control characters")
    # An allow needs the warnings acknowledged first.
    approve = item.get_by_role("button", name="Approve once")
    expect(approve).to_be_disabled()
    ARTIFACTS.mkdir(exist_ok=True)
    first.screenshot(path=str(ARTIFACTS / "inbox-pending.png"), full_page=True)

    first.locator("#approver").fill("alice")
    item.locator("input[name=acknowledged]").check()
    approve.click()
    assert call.result(timeout=60) == f"launched {TRICKY}"
    # Both pages saw the request go, and say how it ended.
    expect(item).to_have_count(0)
    expect(first.locator("#closed li").first).to_contain_text("approved once by alice (inbox)")
    expect(second.locator("li.request")).to_have_count(0)
    expect(second.locator("#empty")).to_be_visible()
    expect(second.locator("#closed li").first).to_contain_text("approved once by alice (inbox)")
    # The audit trail on the page records who answered and where.
    row = second.locator("#audit tbody tr", has_text="once (inbox: alice)")
    expect(row).to_have_count(1)
    expect(row.locator(".outcome")).to_have_text("ok")
    second.screenshot(path=str(ARTIFACTS / "inbox-answered.png"), full_page=True)
    assert first.problems == [] and second.problems == []


def test_deny_with_a_comment_the_caller_receives(
    served: ServedHost, browser: Any, contexts: list[Any]
) -> None:
    page = open_inbox(new_context(browser, contexts), served)
    call = served.call("launch", "mars")
    item = page.locator("li.request", has_text='"mars"')
    expect(item).to_have_count(1)
    item.locator("textarea[name=comment]").fill('Not today: "budget" <b>x</b>\u202e')
    item.get_by_role("button", name="Deny").click()
    with pytest.raises(NotApproved) as caught:
        call.result(timeout=60)
    error = caught.value
    assert error.reason == "denied"
    assert error.comment == '"Not today: \\"budget\\" <b>x</b>\\u{202E}"'
    assert str(error).endswith(f"the approver's comment, quoted: {error.comment}")
    expect(item).to_have_count(0)
    assert page.problems == []
    # The page is protected by Trusted Types: a string assigned to innerHTML throws.
    outcome = page.evaluate(
        "() => { try { document.body.innerHTML = '<b>x</b>'; return 'allowed'; }"
        " catch (e) { return e.name; } }"
    )
    assert outcome == "TypeError"
    assert ["TrustedHTML" in problem for problem in page.problems] == [True]


def test_a_page_without_the_token_shows_nothing(
    served: ServedHost, browser: Any, contexts: list[Any]
) -> None:
    page = new_context(browser, contexts).new_page()
    response = page.goto(f"{served.base}/inbox/")
    assert response.status == 200  # the page itself holds no data
    expect(page.locator("#status")).to_have_text("not signed in: open the link toolhost printed")
    expect(page.locator("li.request")).to_have_count(0)
    assert page.goto(f"{served.base}/inbox/?token=guess").status == 403
    assert page.goto(f"{served.base}/inbox/events").status == 401
    csp = response.headers["content-security-policy"]
    assert "require-trusted-types-for 'script'" in csp and "unsafe-inline" not in csp


def test_the_cookie_a_page_on_another_port_collects_is_worth_nothing(
    served: ServedHost, browser: Any, contexts: list[Any]
) -> None:
    """Cookies do not tell ports apart: a page a tool serves on another port of the host
    gets the inbox's session cookie from the person's browser. Replayed by a program that
    sends every header the inbox's own page would, it reads and answers nothing: the
    page's key lives only in the inbox tab's storage. The person's tab goes on working,
    across a reload; another tab without the printed link is not signed in."""
    import httpx2
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    collected: list[str] = []

    async def collect(request: Request) -> HTMLResponse:
        collected.append(request.headers.get("cookie", ""))
        return HTMLResponse("<p>a harmless page</p>")

    context = new_context(browser, contexts)
    page = open_inbox(context, served)
    assert "token=" not in page.url
    inject(served, "replayed", expires_in=120)
    with served_app(Starlette(routes=[Route("/collect", collect)])) as other:
        context.new_page().goto(f"http://127.0.0.1:{other.port}/collect")
    guard = served.serve.inbox.guard  # type: ignore[union-attr]
    (cookie,) = collected
    assert f"__Host-{guard.cookie}=" in cookie  # the premise: the cookie was collected
    forged = {
        "cookie": cookie,
        "origin": served.base,
        "sec-fetch-site": "same-origin",
        "content-type": "application/json",
    }
    answer = {"decision": "approve_once", "acknowledged": True}
    with httpx2.Client(base_url=served.base) as replay:
        for path in ("/inbox/events", "/inbox/api/audit"):
            assert replay.get(path, headers=forged).status_code == 403, path
        approve = replay.post("/inbox/api/approvals/replayed", json=answer, headers=forged)
        assert approve.status_code == 403 and "page key" in approve.text
        assert 'name="csrf-token" content=""' in replay.get("/inbox/", headers=forged).text
    row = pending_row(served, "replayed")
    assert row is not None and row.answer is None
    page.reload()
    expect(page.locator("#status")).to_have_text("live")
    item = page.locator('li.request[data-id="replayed"]')
    item.get_by_role("button", name="Approve once").click()
    expect(item).to_have_count(0)
    row = pending_row(served, "replayed")
    assert row is None or row.answer is not None
    fresh = context.new_page()  # same cookie jar, no key in its storage
    fresh.goto(f"{served.base}/inbox/")
    expect(fresh.locator("#status")).to_have_text("not signed in: open the link toolhost printed")


def test_an_expired_request_says_so(served: ServedHost, browser: Any, contexts: list[Any]) -> None:
    """A request whose time ran out (its host has not yet removed it) shows as expired,
    and answering it is refused with the reason."""
    page = open_inbox(new_context(browser, contexts), served)
    inject(served, "expiring", expires_in=3)
    item = page.locator('li.request[data-id="expiring"]')
    expect(item).to_have_count(1)
    expect(item.locator(".left")).to_have_text("expired: the call is denied")
    item.get_by_role("button", name="Approve once").click()
    expect(item.locator(".msg")).to_have_text(
        "expired: nobody answered within 3 s, so the call was denied"
    )
    row = pending_row(served, "expiring")
    assert row is not None and row.answer is None
    served.run(served.serve.host.store.remove_pending, "expiring")  # type: ignore[union-attr]


def test_a_request_gets_its_buttons_when_its_host_waits_for_the_inbox(
    served: ServedHost, browser: Any, contexts: list[Any]
) -> None:
    """A request is listed from the moment its host writes it; the buttons come when the
    host's approver starts waiting for the inbox (it offers the request)."""
    page = open_inbox(new_context(browser, contexts), served)
    inject(served, "later", expires_in=120, offered=False, chain=("agent", "relay"))
    item = page.locator('li.request[data-id="later"]')
    expect(item.locator(".elsewhere")).to_contain_text("Asked on another channel")
    # A nested call says who asked for it: the caller at the top, each tool in between.
    expect(item.locator(".facts")).to_contain_text("agent → relay → launch")
    expect(item.get_by_role("button")).to_have_count(0)
    host = served.serve.host
    assert host is not None
    assert served.run(host.store.offer_pending, "later") is True
    expect(item.get_by_role("button", name="Approve once")).to_be_visible()
    expect(item.locator(".elsewhere")).to_have_count(0)
    served.run(host.store.remove_pending, "later")
    expect(item).to_have_count(0)


EVIL_PAGE = """<!doctype html><html><body>
<form id="f" method="post" enctype="text/plain" action="">
<input name='{"decision":"approve_once","x":"' value='"}'></form>
<p>a harmless page</p></body></html>"""


@pytest.mark.parametrize(
    ("evil_host", "stopped_by"),
    [
        # localhost and 127.0.0.1 are different sites: the Strict cookie stays home.
        ("localhost", "no session: open the inbox link with ?token= that toolhost printed"),
        # Another port of 127.0.0.1 is the same *site*: the cookie goes along, and only
        # Sec-Fetch-Site (and Origin, and the CSRF token) stop the request.
        ("127.0.0.1", "cross-site request (Sec-Fetch-Site)"),
    ],
)
def test_a_cross_site_post_is_refused(
    served: ServedHost, browser: Any, contexts: list[Any], evil_host: str, stopped_by: str
) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    async def evil(request: Request) -> HTMLResponse:
        del request
        return HTMLResponse(EVIL_PAGE)

    context = new_context(browser, contexts)
    open_inbox(context, served)  # this browser holds a session cookie
    pending_id = f"target-{evil_host}"
    inject(served, pending_id, expires_in=120)
    target = f"{served.base}/inbox/api/approvals/{pending_id}"
    guard = served.serve.inbox.guard  # type: ignore[union-attr]
    before = len(guard.refused)
    with served_app(Starlette(routes=[Route("/evil", evil)])) as other:
        page = context.new_page()
        page.goto(f"http://{evil_host}:{other.port}/evil")
        sent = page.evaluate(
            """async (url) => {
                try {
                    await fetch(url, {method: 'POST', mode: 'no-cors', credentials: 'include',
                        headers: {'Content-Type': 'text/plain'},
                        body: '{"decision":"approve_once"}'});
                    return 'sent';
                } catch (e) { return 'error: ' + e.message; }
            }""",
            target,
        )
        assert sent in ("sent", "error: Failed to fetch")
        page.evaluate("(url) => { document.getElementById('f').action = url; }", target)
        with page.expect_navigation():
            page.evaluate("document.getElementById('f').submit()")
    row = pending_row(served, pending_id)
    assert row is not None and row.answer is None
    reasons = [reason for path, reason in guard.refused[before:] if path.endswith(pending_id)]
    assert reasons == [stopped_by, stopped_by]
    served.run(served.serve.host.store.remove_pending, pending_id)  # type: ignore[union-attr]


HOST_SCRIPT = """
import sys, anyio
from host import Host

async def main():
    async with Host.open(sys.argv[1], approver="inbox") as host:
        print("waiting", host.host_id, flush=True)
        try:
            print("value", await host.call("fire"), flush=True)
        except Exception as exc:
            print("error", type(exc).__name__, exc, flush=True)

anyio.run(main)
"""


def test_a_call_of_another_host_process_is_approved_here(
    served: ServedHost, project: Path, browser: Any, contexts: list[Any]
) -> None:
    """Two host processes on one store: the call waits in a second process, and the
    first one's inbox answers it (the waiting host reads the store every half second)."""
    page = open_inbox(new_context(browser, contexts), served)
    other = subprocess.Popen(
        [sys.executable, "-c", HOST_SCRIPT, str(project)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None
        first_line = other.stdout.readline().split()
        assert first_line[:1] == ["waiting"], first_line
        other_host = first_line[1]
        item = page.locator("li.request", has_text=other_host)
        expect(item).to_have_count(1)
        expect(item.locator("h3.tool")).to_have_text("fire")
        # An inbox-only rule: allowing it for longer would not count, so only "once".
        expect(item.get_by_role("button", name="Always approve")).to_have_count(0)
        item.get_by_role("button", name="Approve once").click()
        out, err = other.communicate(timeout=60)
        assert out.strip() == "value fired", err
    finally:
        if other.poll() is None:
            other.kill()
            other.communicate()
    wait_until(lambda: page.locator("li.request", has_text=other_host).count() == 0)


def test_grants_and_the_audit_on_the_page(
    served: ServedHost, browser: Any, contexts: list[Any]
) -> None:
    page = open_inbox(new_context(browser, contexts), served)
    call = served.call("launch", "neptune")
    item = page.locator("li.request", has_text='"neptune"')
    item.get_by_role("button", name="Always approve").click()
    assert call.result(timeout=60) == "launched neptune"
    grant = page.locator("#grants tbody tr", has_text="neptune")
    expect(grant).to_have_count(1)
    expect(grant).to_contain_text("allow")
    grant.get_by_role("button", name="Revoke").click()
    expect(grant).to_have_count(0)
    expect(page.locator("#no-grants")).to_be_visible()
    denied = served.call("launch", "uranus")
    page.locator("li.request", has_text='"uranus"').get_by_role("button", name="Deny").click()
    with pytest.raises(NotApproved):
        denied.result(timeout=60)
    # The audit's filters: only denied launches.
    page.locator("#audit-filter input[name=tool]").fill("launch")
    page.locator("#audit-filter select[name=outcome]").select_option("denied")
    rows = page.locator("#audit tbody tr")
    expect(rows.first).to_contain_text("uranus")
    expect(rows.locator(".outcome", has_text="ok")).to_have_count(0)
    assert page.problems == []
