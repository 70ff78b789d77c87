"""Which store a host opens: SQLite in the project's state folder, or PostgreSQL.

The PostgreSQL store's module (and psycopg) is imported only when a ``postgresql://`` URL
asks for it: a host on SQLite needs neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from ._journaled import Durability
from ._records import StoreUnavailable
from ._sqlite import SQLiteStore

if TYPE_CHECKING:
    from ._pg import PgStore

__all__ = ["check_store", "migrate_store", "store_for"]


def store_for(
    url: str | None,
    state_dir: Path,
    *,
    durability: Durability = "process",
    stale_after: float = 30.0,
) -> SQLiteStore | PgStore:
    """The store at ``url`` (``postgresql://...``), or SQLite at ``state_dir/state.db``
    when None. A PostgreSQL store keeps this host's journal, lock and files under
    ``state_dir/postgres``. Raises :class:`StoreUnavailable` when it cannot be used."""
    if url is None:
        return SQLiteStore(state_dir / "state.db", durability=durability)
    if not url.startswith(("postgresql://", "postgres://")):
        raise StoreUnavailable("a store URL must start with postgresql://")
    store_class: type[PgStore] = _pg().PgStore
    return store_class(
        url, folder=state_dir / "postgres", durability=durability, stale_after=stale_after
    )


def _pg() -> Any:
    try:
        from . import _pg
    except ImportError as exc:
        raise StoreUnavailable(
            f"a postgresql:// store needs psycopg and psycopg-pool ({exc.name} is missing): "
            "pip install 'toolhost[postgres]'"
        ) from None
    return _pg


async def migrate_store(url: str) -> list[int]:
    """Bring the PostgreSQL store's schema up to date (``toolhost store migrate``);
    returns the versions applied. Raises :class:`StoreUnavailable`."""
    return await anyio.to_thread.run_sync(_pg().migrate_url, url)


async def check_store(url: str, stale_after: float = 30.0) -> dict[str, Any]:
    """The PostgreSQL store's state (``toolhost store check``): ``schema`` and
    ``expected`` versions, ``hosts``, counts. Raises :class:`StoreUnavailable`."""
    return await anyio.to_thread.run_sync(_pg().check_url, url, stale_after)
