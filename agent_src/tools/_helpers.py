"""Private helpers shared by the tool files. Files starting with ``_`` export nothing."""

from __future__ import annotations

import re


def slugify(text: str) -> str:
    """Lower-case ``text`` and join its words with dashes: ``"Write docs!"`` -> ``"write-docs"``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
