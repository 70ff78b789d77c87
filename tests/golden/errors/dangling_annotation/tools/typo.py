from typing import TypedDict


class Reply(TypedDict):
    body: Bodyy  # noqa: F821 - the typo is the point


def reply() -> Reply:
    raise NotImplementedError
