"""Dice rolls with a structured result."""

from __future__ import annotations

import random
from dataclasses import dataclass

_rng = random.Random()


@dataclass(frozen=True)
class _Roll:
    """One roll: the dice thrown and their total. Private: callers only ever see its data."""

    dice: list[int]
    total: int
    sides: int


def roll(count: int = 1, sides: int = 6) -> _Roll:
    """Roll ``count`` dice with ``sides`` sides each.

    Args:
        count: how many dice, 1 to 100.
        sides: sides per die, 2 to 1000.
    """
    if not 1 <= count <= 100 or not 2 <= sides <= 1000:
        raise ValueError("roll between 1 and 100 dice of 2 to 1000 sides")
    dice = [_rng.randint(1, sides) for _ in range(count)]
    return _Roll(dice=dice, total=sum(dice), sides=sides)
