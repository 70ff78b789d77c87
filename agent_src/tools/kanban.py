"""A tiny kanban board whose state lives in the capsule for the whole session."""

from __future__ import annotations

import builtins
from typing import Literal, TypedDict

from ._helpers import slugify

Status = Literal["open", "closed"]


class Task(TypedDict):
    id: str
    title: str
    status: Status


class Kanban:
    """The board. Its public methods are the tools ``kanban.list``, ``.add`` and ``.close``."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}

    def list(self, status: Status | None = None) -> builtins.list[Task]:
        """Tasks on the board, oldest first, optionally only those with ``status``."""
        return [t for t in self._tasks.values() if status is None or t["status"] == status]

    def add(self, title: str) -> Task:
        """Add an open task; its id is derived from the title."""
        base = slugify(title) or "task"
        task_id, n = base, 2
        while task_id in self._tasks:
            task_id, n = f"{base}-{n}", n + 1
        task: Task = {"id": task_id, "title": title, "status": "open"}
        self._tasks[task_id] = task
        return task

    async def close(self, task_id: str) -> Task:
        """Close the task ``task_id``."""
        task = self._tasks.get(task_id)
        if task is None:
            raise KeyError(f"no task {task_id!r}")
        task["status"] = "closed"
        return task


kanban = Kanban()
