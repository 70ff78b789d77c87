"""Methods of exported objects, and a namespace."""

from __future__ import annotations

import builtins
from types import SimpleNamespace
from typing import TypedDict, TypeVar

T = TypeVar("T")


class Entry(TypedDict):
    key: str
    value: int


class Store:
    def __init__(self) -> None:
        self._data: dict[str, int] = {}

    def get(self, key: str) -> Entry | None:
        """One entry, or None."""
        return None

    async def put(self, key: str, value: int) -> Entry:
        entry: Entry = {"key": key, "value": value}
        return entry

    def list(self) -> builtins.list[Entry]:
        return []

    @staticmethod
    def first(items: list[T]) -> T:
        return items[0]


store = Store()


def _double(x: int) -> int:
    return 2 * x


ops = SimpleNamespace(double=_double, negate=lambda x: -x)
