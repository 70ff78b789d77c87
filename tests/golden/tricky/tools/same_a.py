from typing import TypedDict


class Size(TypedDict):
    width: int
    height: int


def size_a() -> Size:
    return {"width": 1, "height": 2}
