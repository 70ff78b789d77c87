"""Clock tools: what time it is, and formatting a time for people."""

from __future__ import annotations

import datetime


async def now(tz: str = "UTC") -> str:
    """The current time as an ISO 8601 string.

    Args:
        tz: "UTC" or "local".
    """
    if tz == "local":
        return datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    if tz != "UTC":
        raise ValueError(f"unknown time zone {tz!r}: use 'UTC' or 'local'")
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def format(iso: str, style: str = "long") -> str:
    """Format an ISO 8601 time for people.

    Its name shadows the builtin ``format``, so agent code reaches it as
    ``tools.time.format``.

    Args:
        iso: a time such as "2026-11-30T13:40:00+00:00".
        style: "long" ("Monday 30 November 2026, 13:40") or "short" ("30 Nov 13:40").
    """
    moment = datetime.datetime.fromisoformat(iso)
    if style == "short":
        return moment.strftime("%d %b %H:%M")
    return moment.strftime("%A %d %B %Y, %H:%M")
