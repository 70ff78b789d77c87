"""``typing.TypedDict`` (not typing_extensions) as a parameter, on Python 3.11."""

from typing import Literal, TypedDict

Mode = Literal["r", "w"]


class Options(TypedDict, total=False):
    mode: Mode
    size: int


def configure(options: Options, tags: tuple[str, ...] = (), data: bytes = b"") -> int:
    return len(options)
