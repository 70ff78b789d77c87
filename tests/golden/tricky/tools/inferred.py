"""Returns that only pyright knows: nothing here annotates its return type."""

from __future__ import annotations

import datetime


def stats(values: list[float]):
    """Summary statistics.

    Args:
        values: the numbers, at least one.

    Returns:
        count and mean.
    """
    return {"count": len(values), "mean": sum(values) / len(values)}


async def mixed(flag: bool = False):
    """An async dict literal with mixed value types."""
    return {"flag": flag, "name": "x", "n": 2}


def pairs(n: int = 2):
    return [(i, str(i)) for i in range(n)]


def when():
    """A datetime crosses as an ISO 8601 string."""
    return datetime.datetime.now(datetime.UTC)


def shapes(a: int, /, b: str = "b", *args: int, key: bool, ratio: float = 2.0, **extra: str):
    """Every kind of parameter.

    Parameters
    ----------
    a : int
        positional only.
    b : str
        either way.
    key : bool
        keyword only.
    """
    return None


def sphinx(path: str, retries: int = 3, limit=10, when=datetime.datetime.now()) -> bytes:  # noqa: B008
    """Fetch a file.

    :param path: where it is.
    :param int retries: how often to retry.
    :returns: its bytes.
    """
    return b""
