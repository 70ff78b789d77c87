"""Durations and sizes as the policy file writes them: ``"60s"``, ``"256MiB"``."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

__all__ = ["Duration", "Size", "parse_duration", "parse_size"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZES = {
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
}


def parse_duration(value: Any) -> float:
    """``"60s"``, ``"500ms"``, ``"2m"``, ``"1h"`` or a number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '60s'")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    else:
        raise ValueError(f"{value!r} is not a duration (write '60s', '500ms', '2m' or '1h')")
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return seconds


def parse_size(value: Any) -> int:
    """``"256MiB"``, ``"1MiB"``, ``"64KiB"`` or a number of bytes -> bytes."""
    if isinstance(value, bool):
        raise ValueError("a size is a number of bytes or a string like '256MiB'")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        size = int(float(m.group(1)) * _SIZES[m.group(2) or "B"])
    else:
        raise ValueError(f"{value!r} is not a size (write '256MiB', '1MiB' or a byte count)")
    if size <= 0:
        raise ValueError("a size must be positive")
    return size


Duration = Annotated[float, BeforeValidator(parse_duration)]
Size = Annotated[int, BeforeValidator(parse_size)]
