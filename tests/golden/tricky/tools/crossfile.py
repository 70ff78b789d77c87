"""Types defined in private sibling files, reached directly and indirectly."""

from __future__ import annotations

from ._common import Priority
from ._models import Label, Point, User, make_ticket


def ticket(title: str, priority: Priority = "normal"):
    """A ticket whose class this file never imports (pyright infers it)."""
    return make_ticket(title)


def labels(names: list[str]) -> list[Label]:
    return []


def origin() -> Point:
    return Point(0.0, 0.0)


async def user(name: str) -> User:
    return User(name=name)
