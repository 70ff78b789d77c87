from typing import TypedDict


class Size(TypedDict):
    """The same shape as in same_a.py: the two copies merge."""

    width: int
    height: int


def size_b() -> Size:
    return {"width": 1, "height": 2}
