"""The approval inbox: a web page where people answer escalated calls.

:class:`Inbox` is an ASGI app (Starlette) over a store: the pending approvals, live
(server-sent events), each with its tool and description, its arguments exactly as the
tool will receive them (escaped: invisible, bidirectional and control characters shown
as visible escapes), the rule and reason, caller, session, age and time left; buttons to
approve once, for the session, always, or deny with a comment for the caller; the
remembered grants with revoke; the recent audit trail with filters.

It answers through the store (``Store.answer_pending``: the first answer wins, exactly
once), so the host that waits may be this process (``toolhost serve --transport http``,
``ServeApp``) or another one on the same store (``toolhost inbox``). Its routes are
relative: mount it at ``/inbox`` (``ServeApp`` does; :func:`inbox_app` serves it alone).
Who may use it is ``_inbox_guard``'s business; what it shows, ``_inbox_feed``'s.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, Final, Literal

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.responses import StreamingResponse as _Streaming
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from host.audit import AnswerResult, PendingAnswer, Store, StoreUnavailable

from ._inbox_feed import Feed, answer_text, audit_view
from ._inbox_guard import Guard, Refused, SecurityHeaders

__all__ = ["Inbox", "inbox_app"]

_STATIC: Final = resources.files("host.serve") / "static"
_PAGE: Final = (_STATIC / "inbox.html").read_text(encoding="utf-8")

_DECISIONS: Final[dict[str, tuple[bool, Literal["once", "session", "always"]]]] = {
    "approve_once": (True, "once"),
    "approve_session": (True, "session"),
    "approve_always": (True, "always"),
    "deny": (False, "once"),
}
MAX_COMMENT: Final = 2000
MAX_NAME: Final = 80
_AUDIT_WINDOW: Final = 500
_MAX_BODY: Final = 16 * 1024
_OUTCOMES: Final = frozenset(["started", "ok", "denied", "failed", "unknown"])

Handler = Callable[[Request], Awaitable[Response]]


def _json_error(status: int, message: str, kind: str = "refused") -> JSONResponse:
    return JSONResponse({"status": kind, "message": message}, status_code=status)


class Inbox:
    """The inbox's ASGI app over a store; mount it at ``/inbox``.

    Use it running (``async with inbox.running():``) so that open pages are kept fresh
    and their streams end when it stops.

    Args:
        store: the state database (the host's ``host.store``, or one opened with
            ``SQLiteStore.attach()`` in a process that makes no calls).
        redact: replaces secrets in every string shown (the host's
            ``host.mediator.redact``).
        token: the secret of the printed URL (random when not given).
        allowed_hosts: ``Host`` names accepted besides loopback.
        guard: the token and browser sessions to use (instead of ``token`` and
            ``allowed_hosts``): an app that makes a new ``Inbox`` each time it starts
            keeps its printed URL this way.
        poll: seconds between reads of the store while a page is open.
        ping: seconds between keep-alive comments on an idle event stream.
    """

    def __init__(
        self,
        store: Store,
        *,
        redact: Callable[[str], str] | None = None,
        token: str | None = None,
        allowed_hosts: list[str] | None = None,
        guard: Guard | None = None,
        poll: float = 0.5,
        ping: float = 15.0,
    ) -> None:
        self.store = store
        self.redact: Callable[[str], str] = redact or (lambda text: text)
        self.guard = guard or Guard(token, allowed_hosts)
        self.feed = Feed(store, self.redact, poll=poll)
        self.ping = ping
        self.app = Starlette(
            routes=[
                Route("/", self._guarded(self._page), methods=["GET"]),
                Route("/events", self._guarded(self._events), methods=["GET"]),
                Route("/api/audit", self._guarded(self._audit), methods=["GET"]),
                Route("/api/approvals/{id}", self._guarded(self._answer), methods=["POST"]),
                Route("/api/grants/{id:int}/revoke", self._guarded(self._revoke), methods=["POST"]),
                Mount("/static", StaticFiles(directory=str(_STATIC)), name="static"),
            ],
            middleware=[Middleware(SecurityHeaders)],
        )

    def __repr__(self) -> str:
        return f"<Inbox {self.feed!r} {self.guard!r}>"

    @property
    def token(self) -> str:
        return self.guard.token

    def url(self, base: str) -> str:
        """The URL to print: ``base`` (``http://127.0.0.1:PORT``) plus the path and token."""
        return f"{base.rstrip('/')}/inbox/?token={self.guard.token}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    @asynccontextmanager
    async def running(self) -> AsyncGenerator[Inbox]:
        """Keep open pages fresh; on exit, end their streams."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.feed.run)
            try:
                yield self
            finally:
                self.close()
                tg.cancel_scope.cancel()

    def close(self) -> None:
        """End every event stream (an ASGI server waits for open streams when stopping)."""
        self.feed.close()

    # -- requests -------------------------------------------------------------------------

    def _guarded(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            try:
                self.guard.check_host(request)
                return await handler(request)
            except Refused as refused:
                return refused.response()

        return guarded

    async def _page(self, request: Request) -> Response:
        """The page. Given the token: a new browser session, its cookie, and its key in
        the page (which moves it to the tab's storage). Without: the page and no key (it
        holds no data: a tab that has the key reloads from here)."""
        given = request.query_params.get("token")
        if given is None:
            return HTMLResponse(_PAGE.replace("__CSRF__", ""))
        if not self.guard.token_matches(given):
            raise Refused(403, "wrong token: open the link toolhost printed")
        sid, session = self.guard.open_session()
        response = HTMLResponse(_PAGE.replace("__CSRF__", session.csrf))
        self.guard.set_cookie(response, sid, request, _mount_path(request))
        return response

    async def _events(self, request: Request) -> Response:
        self.guard.check_read(request)

        async def frames() -> AsyncIterator[bytes]:
            yield b"retry: 2000\n\n"
            async for snapshot in self.feed.snapshots(self.ping):
                if snapshot is None:
                    yield b": ping\n\n"
                else:
                    version, data = snapshot
                    yield f"event: snapshot\nid: {version}\ndata: {data}\n\n".encode()

        return _Streaming(
            frames(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def _audit(self, request: Request) -> Response:
        self.guard.check_read(request)
        params = request.query_params
        tool = params.get("tool", "").strip().lower()[:200]
        caller = params.get("caller", "")
        outcome = params.get("outcome", "")
        try:
            limit = max(1, min(int(params.get("limit", "100")), _AUDIT_WINDOW))
        except ValueError:
            limit = 100
        try:
            records = await self.store.tail(_AUDIT_WINDOW)
        except StoreUnavailable:
            return _json_error(503, "the audit trail cannot be read now", "unavailable")
        chosen = [
            r
            for r in records
            if (not tool or tool in r.tool.lower())
            and (not caller or r.caller == caller)
            and (outcome not in _OUTCOMES or r.outcome == outcome)
        ]
        rows = [audit_view(r, self.redact) for r in reversed(chosen[-limit:])]
        return JSONResponse({"records": rows, "window": _AUDIT_WINDOW})

    async def _answer(self, request: Request) -> Response:
        self.guard.check_change(request)
        pending_id = request.path_params["id"]
        body = await _json_body(request)
        decision = body.get("decision")
        comment = body.get("comment") or None
        name = body.get("approver") or None
        if decision not in _DECISIONS:
            return _json_error(
                400, "decision is approve_once, approve_session, approve_always or deny"
            )
        if comment is not None and (not isinstance(comment, str) or len(comment) > MAX_COMMENT):
            return _json_error(400, f"comment is text of at most {MAX_COMMENT} characters")
        if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME):
            return _json_error(400, f"approver is a name of at most {MAX_NAME} characters")
        allow, remember = _DECISIONS[decision]
        try:
            row = await self.store.get_pending(pending_id)
            if allow and row is not None and row.warnings and body.get("acknowledged") is not True:
                return _json_error(
                    400, "the arguments carry warnings: read them and tick the box first"
                )
            answer = PendingAnswer(allow, remember, comment=comment, approver=name, channel="inbox")
            result = await self.store.answer_pending(pending_id, answer)
        except StoreUnavailable:
            return _json_error(
                503, "the state database cannot be written now: nothing was answered", "unavailable"
            )
        if result.status == "answered":
            self.feed.answered_here(pending_id, answer)
        await self.feed.refresh()
        return self._answered(pending_id, result)

    def _answered(self, pending_id: str, result: AnswerResult) -> Response:
        row = result.pending
        if result.status == "answered" and row is not None and row.answer is not None:
            return JSONResponse(
                {"status": "answered", "message": answer_text(row.answer, self.redact)}
            )
        if result.status == "answered_before" and row is not None and row.answer is not None:
            message = f"already answered: {answer_text(row.answer, self.redact)}"
        elif result.status == "expired" and row is not None:
            waited = max(row.expires - row.created, 0.0)
            message = f"expired: nobody answered within {waited:.0f} s, so the call was denied"
        elif result.status == "not_offered":
            message = (
                "this request is asked on another channel (a terminal, or the MCP client's "
                "user): this inbox cannot answer it"
            )
        else:
            message = self.feed.closed_how(pending_id) or (
                "this request is no longer pending: it was answered elsewhere, it expired, "
                "or its call or host ended"
            )
        return _json_error(409, message, result.status)

    async def _revoke(self, request: Request) -> Response:
        self.guard.check_change(request)
        await _json_body(request)
        grant_id: int = request.path_params["id"]
        try:
            revoked = await self.store.revoke_grant(grant_id)
        except StoreUnavailable:
            return _json_error(503, "the state database cannot be written now", "unavailable")
        await self.feed.refresh()
        if not revoked:
            return _json_error(409, f"grant {grant_id} is not live (revoked already?)", "gone")
        return JSONResponse({"status": "revoked", "message": f"grant {grant_id} revoked"})


async def _json_body(request: Request) -> dict[str, Any]:
    declared = request.headers.get("content-length", "0")
    if not declared.isdigit() or int(declared) > _MAX_BODY:
        raise Refused(413, "the request body is too large")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > _MAX_BODY:
            raise Refused(413, "the request body is too large")
    try:
        body: object = json.loads(raw or b"{}")
    except ValueError:
        raise Refused(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise Refused(400, "the body is a JSON object")
    return body  # pyright: ignore[reportUnknownVariableType]


def _mount_path(request: Request) -> str:
    """Where the inbox is mounted (the cookie's path): ``/inbox``."""
    root = str(request.scope.get("root_path", "")).rstrip("/")
    return root or "/"


def inbox_app(inbox: Inbox) -> Starlette:
    """The inbox alone (``toolhost inbox``): at ``/inbox/``, with ``/`` sent there."""

    async def home(request: Request) -> Response:
        del request
        return RedirectResponse("/inbox/", status_code=307)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncGenerator[None]:
        del app
        async with inbox.running():
            yield

    async def no_icon(request: Request) -> Response:
        del request
        return Response(status_code=204)

    return Starlette(
        routes=[Route("/", home), Route("/favicon.ico", no_icon), Mount("/inbox", app=inbox)],
        lifespan=lifespan,
    )
