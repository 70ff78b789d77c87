"""Private: data shapes returned by tools in other files."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, NotRequired, TypedDict

from pydantic import BaseModel

from ._common import Color, Priority


class Label(TypedDict):
    """A coloured label."""

    name: str
    color: Color
    note: NotRequired[str]


@dataclass
class Ticket:
    """A ticket: a dataclass, so the agent receives its fields as a dict."""

    id: int
    title: str
    priority: Priority
    labels: list[Label] = field(default_factory=list[Label])


class Point(NamedTuple):
    x: float
    y: float


class User(BaseModel):
    name: str
    tags: list[str] = []
    _secret: str = "hidden"


def make_ticket(title: str) -> Ticket:
    return Ticket(1, title, "normal")
