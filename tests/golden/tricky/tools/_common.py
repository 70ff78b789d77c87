"""Private: types shared by several tool files (exports nothing)."""

from __future__ import annotations

from enum import Enum
from typing import Literal

Priority = Literal["low", "normal", "high"]


class Color(Enum):
    RED = "red"
    GREEN = "green"
