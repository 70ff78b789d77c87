"""The inbox's guard, check by check, so that breaking any one of them fails a test.

A mutation audit changed single conditions of ``host/serve/_inbox_guard.py`` and the
tests went on passing: a POST with no ``Origin`` let through, the token compared on its
first 8 characters, the page's reads (its event stream, the audit) taken from another
site. Each test here pins one such condition, with requests built as Starlette receives
them; ``test_inbox_http`` shows the same over real HTTP.
"""

from __future__ import annotations

import pytest
from starlette.requests import Request

from host.serve._inbox_guard import Guard, Refused

BASE = "http://127.0.0.1:8000"


def _request(method: str, guard: Guard, sid: str | None, **headers: str) -> Request:
    sent = {"host": "127.0.0.1:8000", **headers}
    if sid is not None:  # loopback is a secure origin: the cookie is the __Host- one
        sent["cookie"] = f"__Host-{guard.cookie}={sid}"
    scope = {
        "type": "http",
        "method": method,
        "scheme": "http",
        "server": ("127.0.0.1", 8000),
        "path": "/inbox/api/approvals/x",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in sent.items()],
    }
    return Request(scope)


@pytest.fixture
def guard() -> Guard:
    return Guard("the-token-of-this-inbox-0123456789")


def _good(guard: Guard) -> tuple[str, dict[str, str]]:
    sid, session = guard.open_session()
    return sid, {
        "origin": BASE,
        "sec-fetch-site": "same-origin",
        "content-type": "application/json",
        "x-csrf-token": session.csrf,
    }


def test_a_good_change_passes(guard: Guard) -> None:
    sid, headers = _good(guard)
    guard.check_change(_request("POST", guard, sid, **headers))


@pytest.mark.parametrize(
    ("drop", "status", "reason"),
    [
        ("origin", 403, "Origin"),  # a POST with no Origin header is refused
        ("x-csrf-token", 403, "page key"),
        ("content-type", 415, "JSON"),
    ],
)
def test_a_change_missing_a_header_is_refused(
    guard: Guard, drop: str, status: int, reason: str
) -> None:
    sid, headers = _good(guard)
    del headers[drop]
    with pytest.raises(Refused) as info:
        guard.check_change(_request("POST", guard, sid, **headers))
    assert info.value.status == status and reason in info.value.reason


@pytest.mark.parametrize(
    "origin",
    ["null", "", "http://evil.example", "http://127.0.0.1:1", "https://127.0.0.1:8000", BASE + "/"],
)
def test_a_change_from_any_other_origin_is_refused(guard: Guard, origin: str) -> None:
    sid, headers = _good(guard)
    with pytest.raises(Refused) as info:
        guard.check_change(_request("POST", guard, sid, **{**headers, "origin": origin}))
    assert info.value.status == 403


@pytest.mark.parametrize("site", ["cross-site", "same-site", "none"])
def test_changes_and_reads_from_another_site_are_refused(guard: Guard, site: str) -> None:
    sid, headers = _good(guard)
    with pytest.raises(Refused):
        guard.check_change(_request("POST", guard, sid, **{**headers, "sec-fetch-site": site}))
    read = {"sec-fetch-site": site, "x-csrf-token": headers["x-csrf-token"]}  # key and all
    with pytest.raises(Refused) as info:  # the event stream and the audit
        guard.check_read(_request("GET", guard, sid, **read))
    assert info.value.status == 403 and "cross-site" in info.value.reason


def test_a_read_needs_the_session(guard: Guard) -> None:
    sid, headers = _good(guard)
    read = {"sec-fetch-site": "same-origin", "x-csrf-token": headers["x-csrf-token"]}
    guard.check_read(_request("GET", guard, sid, **read))
    for other in (None, "forged-session-id"):
        with pytest.raises(Refused) as info:
            guard.check_read(_request("GET", guard, other, **read))
        assert info.value.status == 401


def test_the_cookie_without_the_pages_key_reads_and_changes_nothing(guard: Guard) -> None:
    """Cookies do not tell ports apart: a page on another port of the host gets the
    session cookie. Without the key, which only the inbox's own origin holds, it is
    worth nothing: not for a read (the event stream, the audit), not for a change."""
    sid, headers = _good(guard)
    _, other = guard.open_session()
    for key in (None, "", other.csrf, headers["x-csrf-token"][:8], "guess"):
        read = {"sec-fetch-site": "same-origin"}
        change = dict(headers)
        if key is None:
            del change["x-csrf-token"]
        else:
            read["x-csrf-token"] = change["x-csrf-token"] = key
        with pytest.raises(Refused) as info:
            guard.check_read(_request("GET", guard, sid, **read))
        assert info.value.status == 403 and "page key" in info.value.reason
        with pytest.raises(Refused):
            guard.check_change(_request("POST", guard, sid, **change))


@pytest.mark.parametrize(
    ("host", "scheme", "name", "secure"),
    [
        ("127.0.0.1:8000", "http", "__Host-", True),
        ("localhost:8000", "http", "__Host-", True),
        ("[::1]:8000", "http", "__Host-", True),
        ("inbox.example:443", "https", "__Host-", True),
        ("10.0.0.5:8000", "http", "", False),  # plain HTTP elsewhere: no Secure cookie
    ],
)
def test_the_cookie_is_a_host_cookie_where_the_origin_is_secure(
    host: str, scheme: str, name: str, secure: bool
) -> None:
    from starlette.responses import Response

    guard = Guard("t" * 32, allowed_hosts=["inbox.example", "10.0.0.5"])
    scope = {
        "type": "http",
        "method": "GET",
        "scheme": scheme,
        "server": ("127.0.0.1", 8000),
        "path": "/inbox/",
        "query_string": b"",
        "headers": [(b"host", host.encode())],
    }
    response = Response()
    sid, _ = guard.open_session()
    guard.set_cookie(response, sid, Request(scope), "/inbox")
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{name}{guard.cookie}={sid};")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert ("Secure" in cookie) is secure
    assert ("Path=/;" in cookie) is secure and ("Path=/inbox" in cookie) is not secure


def test_the_token_matches_only_whole(guard: Guard) -> None:
    token = guard.token
    assert guard.token_matches(token)
    for wrong in (
        token[:8],
        token[:8] + "x" * (len(token) - 8),  # right first 8 characters only
        token[:-1] + ("a" if token[-1] != "a" else "b"),  # all but the last
        token + "x",
        "",
        token.upper() if token.upper() != token else token.lower(),
    ):
        assert not guard.token_matches(wrong), wrong


def test_a_csrf_token_of_another_session_is_refused(guard: Guard) -> None:
    sid, headers = _good(guard)
    _, other = guard.open_session()
    with pytest.raises(Refused):
        guard.check_change(_request("POST", guard, sid, **{**headers, "x-csrf-token": other.csrf}))
    with pytest.raises(Refused):
        guard.check_change(
            _request("POST", guard, sid, **{**headers, "x-csrf-token": headers["x-csrf-token"][:8]})
        )
