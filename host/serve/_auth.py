"""Who may use ``/mcp``: HTTP clients authenticate with a bearer token.

Each client has a name and a token of its own (``toolhost clients add NAME`` prints it
once). The project keeps only each token's SHA-256 digest, in ``.agent/clients.json``
(written by the host's user alone: a file others may write is refused, and so is every
token while it is). The file is read again when it changes, so a client added or revoked
while the server runs counts from its next request.

The check is the MCP SDK's: ``BearerAuthBackend`` over a ``TokenVerifier`` and
``RequireAuthMiddleware`` (401 with ``WWW-Authenticate: Bearer``). An app that runs an
OAuth 2.1 authorization server gives its own ``TokenVerifier`` instead (JWT or
introspection), with the resource's URL and its authorization servers: the server then
publishes its protected-resource metadata (RFC 9728) and accepts only tokens issued for
it. The client a session belongs to is the token's ``client_id``: the SDK answers a
session's requests only with the credential that opened it, and the per-client session cap
counts by it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final, cast

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from host._events import EventBus
from host.declare import Project
from host.errors import HostError

__all__ = [
    "CLIENTS_FILE",
    "Client",
    "ClientTokens",
    "ClientsFileError",
    "RefusalNotes",
    "SCOPE",
    "TOKEN_PREFIX",
    "client_of",
]

logger = logging.getLogger(__name__)

CLIENTS_FILE: Final = "clients.json"
"""The file in the project's ``.agent/`` folder that holds the clients' token digests."""
SCOPE: Final = "mcp"
"""The scope a client token grants: the MCP endpoint."""
TOKEN_PREFIX: Final = "thc_"
"""How every client token begins (so a secret scanner can find a leaked one)."""
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_DIGEST: Final = re.compile(r"[0-9a-f]{64}")
_MAX_FILE: Final = 1 << 20
"""Bytes of the clients file read at most (a few thousand clients)."""


class ClientsFileError(HostError):
    """The clients file cannot be trusted or read; no token counts until it is fixed."""

    kind = "clients_file"


@dataclass(frozen=True, slots=True)
class Client:
    """One HTTP client that may use ``/mcp``."""

    name: str
    digest: str
    """SHA-256 of its token, hex (the token itself is never kept)."""
    created: float
    expires: float | None = None
    """When its token stops counting (seconds since the epoch); None: never."""

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class ClientTokens:
    """The project's client tokens: a ``TokenVerifier`` for the MCP SDK's bearer check.

    Args:
        path: the clients file (``PROJECT/.agent/clients.json``).
        events: where refusals of a broken file are said (``clients_file_refused``).
    """

    def __init__(self, path: Path, events: EventBus | None = None) -> None:
        self.path = path
        self._events = events
        self._seen: tuple[int, ...] | None = None
        self._by_digest: dict[str, Client] = {}
        self._error: str | None = None

    @classmethod
    def of(cls, project: Project, events: EventBus | None = None) -> ClientTokens:
        """The client tokens of ``project`` (its ``.agent/clients.json``)."""
        return cls(project.state_dir / CLIENTS_FILE, events)

    # -- reading ------------------------------------------------------------------------

    def clients(self) -> list[Client]:
        """The clients, by name. Raises :class:`ClientsFileError` if the file is not
        sound (what to fix is in the message)."""
        return sorted(self._read().values(), key=lambda c: c.name)

    def _read(self) -> dict[str, Client]:
        """Name -> client, from the file as it is now (none if it does not exist)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ClientsFileError(f"{self.path} cannot be read: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            _check_owner(self.path, info)
            data = f.read(_MAX_FILE + 1)
        if len(data) > _MAX_FILE:
            raise ClientsFileError(f"{self.path} is over {_MAX_FILE} bytes: not a clients file")
        return _parse(self.path, data)

    def _refresh(self) -> None:
        """Read the file again if it changed since the last look (its inode, size, owner,
        mode and times: a chmod changes only the last two); a file that cannot be trusted
        refuses every token."""
        try:
            info = os.stat(self.path, follow_symlinks=False)
            seen = (
                info.st_ino,
                info.st_size,
                info.st_uid,
                info.st_mode,
                info.st_mtime_ns,
                info.st_ctime_ns,
            )
        except FileNotFoundError:
            seen = None
        except OSError as exc:
            self._fail(f"{self.path} cannot be read: {exc.strerror}")
            return
        if seen == self._seen and self._error is None:
            return
        try:
            clients = self._read() if seen is not None else {}
        except ClientsFileError as exc:
            self._fail(str(exc))
            return
        self._seen, self._error = seen, None
        self._by_digest = {c.digest: c for c in clients.values()}

    def _fail(self, reason: str) -> None:
        if reason != self._error:
            logger.error("no HTTP client can authenticate: %s", reason)
            if self._events is not None:
                self._events.emit("clients_file_refused", reason=reason)
        self._seen, self._error, self._by_digest = None, reason, {}

    async def verify_token(self, token: str) -> AccessToken | None:
        """The client this token is, if it is a current client's (the SDK's protocol)."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > 256:
            return None
        self._refresh()
        # A lookup by the digest of a 256-bit random token: timing tells nothing useful.
        client = self._by_digest.get(_digest(token))
        now = time.time()
        if client is None or client.expired(now):
            return None
        expires = int(client.expires) if client.expires is not None else None
        # The SDK keeps the AccessToken for the request: it holds the digest, not the token.
        return AccessToken(
            token=client.digest, client_id=client.name, scopes=[SCOPE], expires_at=expires
        )

    # -- writing (the command line) -----------------------------------------------------

    def add(self, name: str, *, expires: float | None = None) -> str:
        """Make a client (or give one a new token, the old one no longer counting);
        returns its token, which is not kept: show it once."""
        if not _NAME.fullmatch(name):
            raise HostError(
                f"{name!r} is not a client name: a letter or digit, then letters, digits, "
                "'_', '.' or '-' (64 at most)"
            )
        clients = self._read()
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        clients[name] = Client(name, _digest(token), time.time(), expires)
        self._write(clients)
        return token

    def revoke(self, name: str) -> bool:
        """Remove a client: its token no longer counts. False if there was none."""
        clients = self._read()
        if clients.pop(name, None) is None:
            return False
        self._write(clients)
        return True

    def _write(self, clients: dict[str, Client]) -> None:
        data = {
            "version": 1,
            "clients": {
                c.name: {"sha256": c.digest, "created": c.created, "expires": c.expires}
                for c in sorted(clients.values(), key=lambda c: c.name)
            },
        }
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=2)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise


def _check_owner(path: Path, info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise ClientsFileError(f"{path} is not a regular file")
    if info.st_uid != os.getuid():
        raise ClientsFileError(
            f"{path} belongs to another user: only the host's user may name its clients"
        )
    if info.st_mode & 0o022:
        raise ClientsFileError(
            f"{path} may be written by others (mode {stat.S_IMODE(info.st_mode):o}): "
            f"make it private (chmod 600 {path})"
        )


def _parse(path: Path, data: bytes) -> dict[str, Client]:
    def bad(what: str) -> ClientsFileError:
        return ClientsFileError(
            f"{path} is not a clients file ({what}); fix it, or remove it and add the "
            "clients again with 'toolhost clients add NAME'"
        )

    try:
        doc: object = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"not JSON: {exc}") from None
    top = cast("dict[str, object]", doc) if isinstance(doc, dict) else {}
    if top.get("version") != 1:
        raise bad("no version 1")
    entries = top.get("clients")
    if not isinstance(entries, dict):
        raise bad("no clients table")
    clients: dict[str, Client] = {}
    for name, item in cast("dict[object, object]", entries).items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise bad(f"a client name {name!r} is not valid")
        if not isinstance(item, dict):
            raise bad(f"client {name}: not a table")
        entry = cast("dict[str, object]", item)
        digest, created, expires = (
            entry.get("sha256"),
            entry.get("created", 0.0),
            entry.get("expires"),
        )
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise bad(f"client {name}: sha256 is not 64 hex digits")
        if not isinstance(created, int | float) or isinstance(created, bool):
            raise bad(f"client {name}: created is not seconds since the epoch")
        if expires is not None and (
            not isinstance(expires, int | float) or isinstance(expires, bool)
        ):
            raise bad(f"client {name}: expires is not seconds since the epoch")
        clients[name] = Client(
            name, digest, float(created), None if expires is None else float(expires)
        )
    return clients


def client_of(scope: Scope) -> str | None:
    """The authenticated client of a request (its token's ``client_id``), if any."""
    user = scope.get("user")
    if isinstance(user, AuthenticatedUser):
        return user.access_token.client_id
    return None


class RefusalNotes:
    """Says on the host's event bus that a request to ``/mcp`` was refused for its
    credential (``mcp_client_refused``: address and reason, never the token); wraps the
    SDK's ``RequireAuthMiddleware``."""

    def __init__(self, app: ASGIApp, events: EventBus | None = None) -> None:
        self._app = app
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or client_of(scope) is not None or self.events is None:
            await self._app(scope, receive, send)
            return
        events = self.events
        address = scope.get("client")
        said = str(address[0]) if address else "unknown"
        headers = dict(scope.get("headers", []))
        reason = "wrong or expired token" if b"authorization" in headers else "no token"

        async def noted(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] in (401, 403):
                events.emit("mcp_client_refused", address=said, reason=reason)
            await send(message)

        await self._app(scope, receive, noted)
