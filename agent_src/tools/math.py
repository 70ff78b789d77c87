"""Arithmetic, as plain synchronous functions (they run on worker threads)."""

from __future__ import annotations


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def mean(values: list[float]) -> float:
    """The arithmetic mean of a non-empty list of numbers."""
    if not values:
        raise ValueError("mean() of an empty list")
    return sum(values) / len(values)
