"""Who may use the approval inbox: the token, the cookie, and cross-site requests.

* **Token -> two halves of a session.** The inbox prints a URL with a random token.
  Opening it opens a browser session and answers the page with both halves: an
  ``HttpOnly; SameSite=Strict`` cookie (``__Host-`` prefixed, ``Secure``, ``Path=/``
  where the origin is secure: https, or loopback, which browsers treat as such), and the
  page's key in the page itself. The page keeps the key in its tab's
  ``sessionStorage`` and takes the token out of the address bar: after this first
  exchange no credential is in a URL.
* **The cookie alone is worth nothing.** Cookies do not tell ports apart: a page served
  on another port of the same host (a tool's, say) receives the inbox's cookie from the
  browser, and a program that is not a browser can replay it with any header. So every
  read of data (the event stream, the audit) and every change needs the page's key too,
  in ``X-CSRF-Token``: it lives only in storage of the inbox's own origin (scheme, host
  and port), which no other origin can read, and the browser sends it nowhere by itself.
  The page (HTML and script, no data) is served to anyone.
* **Every request** needs a ``Host`` header naming loopback (or an address the operator
  allowed): a DNS-rebinding page cannot pose as the inbox.
* **Every read and change** must come from the inbox's own page: ``Sec-Fetch-Site``
  ``same-origin`` (not ``same-site``: another port of 127.0.0.1 is the same *site*); a
  change also needs an ``Origin`` equal to the inbox's, port included, and a JSON body
  (an HTML form cannot send one).
* **Headers** on every response: a strict Content-Security-Policy (scripts and styles
  from the inbox only, no inline code, Trusted Types required, so assigning a string to
  ``innerHTML`` throws), no framing, no referrer (the token never leaks), no caching.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CSP", "Guard", "Refused", "SecurityHeaders", "WebSession"]

CSP: Final = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    ]
)

_HEADERS: Final[list[tuple[bytes, bytes]]] = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]

_MAX_SESSIONS: Final = 64
_SESSION_LIFE: Final = 24 * 3600.0


class SecurityHeaders:
    """Adds the inbox's headers to every response (pure ASGI: streams stay unbuffered)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                have = {name.lower() for name, _ in headers}
                headers.extend((k, v) for k, v in _HEADERS if k not in have)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


@dataclass(slots=True)
class WebSession:
    """One browser tab that exchanged the token: the key its page holds."""

    csrf: str
    """The page's key (its anti-forgery token), sent as ``X-CSRF-Token``."""
    created: float


class Refused(Exception):
    """A request the guard turns away: its status and a plain reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason

    def response(self) -> Response:
        return PlainTextResponse(self.reason, status_code=self.status)


def _loopback_host(name: str) -> bool:
    return name in ("127.0.0.1", "localhost", "[::1]")


def _host_name(request: Request) -> str:
    host = request.headers.get("host", "")
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return name.lower()


class Guard:
    """The token, the browser sessions it opened, and the checks of each request.

    Args:
        token: the secret in the printed URL (random when not given).
        allowed_hosts: ``Host`` header names accepted besides loopback ones (for an inbox
            served on another address; the port is not compared).
    """

    def __init__(self, token: str | None = None, allowed_hosts: list[str] | None = None) -> None:
        self.token = token or secrets.token_urlsafe(24)
        self.cookie = f"toolhost_inbox_{secrets.token_hex(4)}"
        """Per inbox: two inboxes on one machine never overwrite each other's cookie
        (cookies do not separate ports). On a secure origin it is sent as
        ``__Host-`` + this name (:meth:`cookie_name`)."""
        self._hosts = {h.lower() for h in allowed_hosts or []}
        self._sessions: OrderedDict[str, WebSession] = OrderedDict()
        self.refused: list[tuple[str, str]] = []
        """The last refusals (path, reason), newest last: what stopped a request."""

    def __repr__(self) -> str:  # never the token
        return f"<inbox guard sessions={len(self._sessions)}>"

    def _refuse(self, request: Request, status: int, reason: str) -> Refused:
        self.refused.append((request.url.path, reason))
        del self.refused[:-50]
        return Refused(status, reason)

    def check_host(self, request: Request) -> None:
        name = _host_name(request)
        if not (_loopback_host(name) or name in self._hosts):
            host = request.headers.get("host", "")
            raise self._refuse(request, 421, f"this inbox does not answer for host {host!r}")

    @staticmethod
    def secure_origin(request: Request) -> bool:
        """Whether the browser sees the inbox's origin as secure (https, or loopback),
        so a ``Secure``, ``__Host-`` cookie is kept."""
        return request.url.scheme == "https" or _loopback_host(_host_name(request))

    def cookie_name(self, request: Request) -> str:
        """The session cookie's name for this request's origin."""
        return f"__Host-{self.cookie}" if self.secure_origin(request) else self.cookie

    def token_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.token.encode())

    def open_session(self) -> tuple[str, WebSession]:
        now = time.time()
        while self._sessions and (
            len(self._sessions) >= _MAX_SESSIONS
            or next(iter(self._sessions.values())).created < now - _SESSION_LIFE
        ):
            self._sessions.popitem(last=False)
        sid = secrets.token_urlsafe(32)
        session = WebSession(csrf=secrets.token_urlsafe(32), created=now)
        self._sessions[sid] = session
        return sid, session

    def set_cookie(self, response: Response, sid: str, request: Request, path: str) -> None:
        """Set the session cookie: ``__Host-``, ``Secure`` and ``Path=/`` on a secure
        origin (what the prefix demands), else only under the inbox's ``path``."""
        secure = self.secure_origin(request)
        response.set_cookie(
            self.cookie_name(request),
            sid,
            httponly=True,
            samesite="strict",
            secure=secure,
            path="/" if secure else path,
        )

    def session(self, request: Request) -> WebSession:
        """The request's browser session; refuses without one (401)."""
        sid = request.cookies.get(self.cookie_name(request))
        session = self._sessions.get(sid) if sid else None
        if session is None or session.created < time.time() - _SESSION_LIFE:
            raise self._refuse(
                request, 401, "no session: open the inbox link with ?token= that toolhost printed"
            )
        return session

    def check_read(self, request: Request) -> WebSession:
        """A read by the inbox's page (events, the audit): session, same origin, and the
        page's key (the cookie alone may have been collected on another port)."""
        session = self.session(request)
        if request.headers.get("sec-fetch-site", "same-origin") != "same-origin":
            raise self._refuse(request, 403, "cross-site request")
        self._check_key(request, session)
        return session

    def _check_key(self, request: Request, session: WebSession) -> None:
        given = request.headers.get("x-csrf-token", "")
        if not hmac.compare_digest(given.encode(), session.csrf.encode()):
            raise self._refuse(
                request, 403, "no page key: open the inbox link toolhost printed in this tab"
            )

    def check_change(self, request: Request) -> WebSession:
        """A change (a POST): session, same origin, exact Origin, JSON, CSRF token."""
        session = self.session(request)
        if request.headers.get("sec-fetch-site", "same-origin") != "same-origin":
            raise self._refuse(request, 403, "cross-site request (Sec-Fetch-Site)")
        origin = request.headers.get("origin")
        expected = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if origin != expected:
            raise self._refuse(request, 403, "cross-site request (Origin)")
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind != "application/json":
            raise self._refuse(request, 415, "the inbox takes JSON only")
        self._check_key(request, session)
        return session
