"""The event stream: what happened to capsules and calls, for apps, logs and the CLI.

Events are small frozen records. Listeners are plain callables run in the order they
subscribed; a listener that raises is logged and skipped, never breaking the call path.
The bus keeps the last events in a bounded buffer for inspection (``Host.events.recent``).

Every event passes the bus's :class:`~host._display.Redactor` before anyone sees it: the
values of ``[env] secret`` variables are replaced by ``⟨secret NAME⟩`` in every field, at
any depth. Console output written in pieces is also redacted where it is read (a secret
split across two writes is joined there first; see ``StreamRedactor``).

Kinds emitted by the core: ``capsule_started``, ``capsule_crashed``, ``capsule_unavailable``,
``tool_file_failed``, ``console``, ``console_dropped``, ``call_started``, ``call_done``; the
policy's, among them ``policy_warning`` and ``policy_missing``; the tool contexts'
(``progress``, ``tool_event``, ``tool_events_dropped``, ``context_refused``). README,
"Events", lists them all with their fields.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._display import Redactor

__all__ = ["Event", "EventBus"]

logger = logging.getLogger("toolhost")


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened."""

    kind: str
    session: str | None
    data: Mapping[str, Any] = field(default_factory=dict[str, Any])
    time: float = field(default_factory=time.time)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.data.items())
        return f"<Event {self.kind} session={self.session} {inner}>"


Listener = Callable[[Event], None]


class EventBus:
    """Fan events out to listeners; remember the most recent ones."""

    def __init__(self, keep: int = 1000, *, redactor: Redactor | None = None) -> None:
        self._listeners: list[Listener] = []
        self.recent: deque[Event] = deque(maxlen=keep)
        self.redactor = redactor if redactor is not None else Redactor()
        """What every event's fields pass before they are kept or handed out."""

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` for every event; returns a function that unsubscribes."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def emit(self, kind: str, session: str | None = None, **data: Any) -> Event:
        if self.redactor:
            data = self.redactor.value(data)
        event = Event(kind, session, data)
        self.recent.append(event)
        if kind != "console":
            logger.debug("%r", event)
        for listener in tuple(self._listeners):
            try:
                listener(event)
            except Exception:
                logger.exception("event listener %r failed on %r", listener, event)
        return event
