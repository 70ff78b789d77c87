"""Where pyright's answer is weak: the declaration must say so."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, overload


@overload
def parse(value: int) -> int: ...
@overload
def parse(value: str) -> str: ...
def parse(value: int | str) -> int | str:
    """Parse a value."""
    return value


@functools.cache
def cached(n: int) -> int:
    return n


def _logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


@_logged
def wrapped(x: int) -> int:
    return x


def fact(n: int):
    """Recursive, unannotated: pyright cannot infer all of it."""
    return 1 if n <= 1 else n * fact(n - 1)


class Handle:
    pass


def handle():
    return Handle()


def tags():
    return {"a", "b"}
