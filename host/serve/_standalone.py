"""``toolhost inbox``: the approval inbox alone, over a project's store.

The process makes no calls and starts no capsule: it opens the project's state database
(``attach``: SQLite or PostgreSQL), lists what the hosts using it wait for, and answers
through it.
A host whose approver is the inbox (``Host.open(approver="inbox")``, ``toolhost serve
--transport http``) sees the answer at its next read of the store (every half second by
default). Secrets are replaced by the same rule as in the host: the values of the
policy's ``[env] secret`` variables, read from ``[env] set`` or this process's
environment.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from starlette.applications import Starlette

from host._display import Redactor
from host.audit import StoreUnavailable, store_for
from host.declare import resolve_project
from host.errors import HostError
from host.policy import PolicyConfig, load_policy

from ._http import run_http
from ._inbox import Inbox, inbox_app

__all__ = ["secrets_of", "serve_inbox"]


def secrets_of(config: PolicyConfig) -> Redactor:
    """The redactor for a policy's ``[env] secret`` variables, as the host builds it."""
    env = config.env
    return Redactor(
        {
            name: value
            for name in env.secret
            if (value := env.set.get(name, os.environ.get(name, "")))
        }
    )


async def serve_inbox(
    project: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    allowed_hosts: list[str] | None = None,
    on_ready: Callable[[str, Inbox], None] | None = None,
) -> None:
    """Serve the inbox of ``project``'s store until interrupted (uvicorn, asyncio).

    ``on_ready(url, inbox)`` is called with the inbox's URL (token included) once the
    server accepts connections.
    """
    resolved = resolve_project(Path(project))
    config = load_policy(resolved.policy_files, root=resolved.root)
    try:
        store = store_for(config.store.resolve(os.environ), resolved.state_dir)
    except (StoreUnavailable, ValueError) as exc:
        raise HostError(f"the inbox cannot open the store: {exc}") from None
    await store.attach()
    try:
        inbox = Inbox(
            store,
            redact=secrets_of(config).text,
            token=token,
            allowed_hosts=allowed_hosts,
        )
        app: Starlette = inbox_app(inbox)

        def ready(base: str) -> None:
            if on_ready is not None:
                on_ready(inbox.url(base), inbox)

        await run_http(app, host=host, port=port, on_ready=ready, on_exit=inbox.close)
    finally:
        await store.aclose()
