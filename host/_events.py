"""The event stream: what happened to capsules and calls, for apps, logs and the CLI.

Events are small frozen records. Listeners are plain callables run in the order they
subscribed; a listener that raises is logged and skipped, never breaking the call path.
The bus keeps the last events in a bounded buffer for inspection (``Host.events.recent``).

Every event passes the bus's :class:`~host._display.Redactor` before anyone sees it: the
values of ``[env] secret`` variables are replaced by ``⟨secret NAME⟩`` in every field, at
any depth. Console output written in pieces is also redacted where it is read (a secret
split across two writes is joined there first; see ``StreamRedactor``).

Kinds emitted by the core: ``capsule_started``, ``capsule_crashed``, ``capsule_unavailable``,
``tool_file_failed``, ``console``, ``console_dropped``, ``tool_call_started``,
``tool_call_done``, ``hook_failed``, ``hook_timed_out``, ``landlock_unavailable`` (once at
start, where subprocess capsules cannot be confined), ``zygote_unavailable`` (a capsule
started without the zygote, and why), ``session_released`` (an idle session's capsules
were stopped: ``[limits] session_idle``); the policy's, among them
``policy_decision``, ``policy_denied``, ``policy_warning`` and ``policy_missing``; the tool
contexts' (``progress``, ``tool_event``, ``tool_log``, ``tool_events_dropped``,
``context_refused``).
docs/events.md, "Events and traces", lists them with their fields.

Three ways to follow them: ``bus.subscribe(fn)`` (``host.on``), plain callables run in
the emitting task; ``bus()`` (``host.events()``), an async iterator with a bounded buffer
of its own; and ``SessionLog``, one JSON line per event of a session in
``.agent/sessions/ID.jsonl``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._display import Redactor

__all__ = ["Event", "EventBus", "EventStream", "SessionLog"]

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
        self._by_kind: dict[str, list[Listener]] = {}
        """Listeners of some kinds only (``subscribe(fn, kinds)``)."""
        self._iterators: set[EventStream] = set()
        self.recent: deque[Event] = deque(maxlen=keep)
        self.redactor = redactor if redactor is not None else Redactor()
        """What every event's fields pass before they are kept or handed out (the host's
        secrets; an event of a session whose tools set secrets passes that session's)."""
        self._sessions: dict[str, Redactor] = {}
        """The redactors of the sessions whose tools set secrets (``add_secret``)."""

    def __call__(self, *kinds: str, buffer: int = 1000) -> EventStream:
        """An async iterator over the events emitted from now on (of ``kinds``, or all).

        Each stream has its own buffer of ``buffer`` events. A consumer that falls behind
        never slows the host: the events that find its buffer full are dropped, and the
        next event it reads is ``events_dropped`` with their count (``dropped``). The
        stream ends when the host closes; ``aclose()`` (or ``async with``) ends it sooner.
        """
        stream = EventStream(self, frozenset(kinds), buffer)
        self._iterators.add(stream)
        return stream

    def close(self) -> None:
        """End every open stream (the host is closing)."""
        for stream in tuple(self._iterators):
            stream.end()

    def wants(self, kind: str) -> bool:
        """Whether a listener or stream would see an event of ``kind`` now (a session log
        is a listener). Events every call would make are skipped when nobody wants them."""
        if self._listeners or kind in self._by_kind:
            return True
        return any(not s.kinds or kind in s.kinds for s in self._iterators)

    def subscribe(
        self, listener: Listener, kinds: Iterable[str] | None = None
    ) -> Callable[[], None]:
        """Call ``listener`` for every event (or only those of ``kinds``); returns a
        function that unsubscribes."""
        if kinds is None:
            self._listeners.append(listener)
        else:
            for kind in kinds:
                self._by_kind.setdefault(kind, []).append(listener)

        def unsubscribe() -> None:
            if kinds is None:
                if listener in self._listeners:
                    self._listeners.remove(listener)
                return
            for kind in kinds:
                found = self._by_kind.get(kind, [])
                if listener in found:
                    found.remove(listener)
                if not found:
                    self._by_kind.pop(kind, None)

        return unsubscribe

    def redactor_for(self, session: str | None) -> Redactor:
        """What replaces secrets in anything about ``session``: the host's secrets and
        those its tools set (never another session's)."""
        if session is not None and self._sessions:
            own = self._sessions.get(session)
            if own is not None:
                return own
        return self.redactor

    def add_secret(self, session: str, name: str, value: str, *, limit: int) -> bool:
        """Replace ``value`` in what concerns ``session`` from now on, until
        :meth:`forget_session`. False, and nothing added, if the session's tools already
        set ``limit`` secret values."""
        own = self._sessions.get(session)
        if own is None:
            own = self._sessions[session] = self.redactor.copy()
        if len(own) - len(self.redactor) >= limit and not own.finds(name, value):
            return False
        own.add(name, value, by_tool=True)
        return True

    def forget_session(self, session: str) -> None:
        """The session closed: drop the secrets its tools set."""
        self._sessions.pop(session, None)

    def emit(self, kind: str, session: str | None = None, **data: Any) -> Event:
        redactor = self.redactor_for(session)
        if redactor:
            data = redactor.value(data)
        event = Event(kind, session, data)
        self.recent.append(event)
        if kind != "console":
            logger.debug("%r", event)
        listeners = self._listeners
        if kind in self._by_kind:
            listeners = [*listeners, *self._by_kind[kind]]
        for listener in tuple(listeners):
            try:
                listener(event)
            except Exception:
                logger.exception("event listener %r failed on %r", listener, event)
        if self._iterators:
            for stream in tuple(self._iterators):
                stream.put(event)
        return event


class EventStream:
    """Events as an async iterator (``host.events()``); see ``EventBus.__call__``."""

    def __init__(self, bus: EventBus, kinds: frozenset[str], buffer: int) -> None:
        self._bus = bus
        self.kinds = kinds
        """The kinds this stream takes (empty: all)."""
        pair = anyio.create_memory_object_stream[Event](max_buffer_size=max(1, buffer))
        self._send: MemoryObjectSendStream[Event] = pair[0]
        self._receive: MemoryObjectReceiveStream[Event] = pair[1]
        self.dropped = 0
        """Events dropped so far because the buffer was full."""
        self._unreported = 0

    def put(self, event: Event) -> None:
        if self.kinds and event.kind not in self.kinds:
            return
        try:
            self._send.send_nowait(event)
        except anyio.WouldBlock:
            self.dropped += 1
            self._unreported += 1
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.end()

    def end(self) -> None:
        self._bus._iterators.discard(self)  # pyright: ignore[reportPrivateUsage]
        self._send.close()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        if self._unreported:
            count, self._unreported = self._unreported, 0
            return Event("events_dropped", None, {"dropped": count})
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._receive.close()
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self.end()
        self._receive.close()

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _plain(value: Any) -> Any:
    """What ``json`` cannot encode, as its ``repr``."""
    return repr(value)


_ENCODE = json.JSONEncoder(ensure_ascii=False, default=_plain).encode


class SessionLog:
    """One session's events as JSON lines in ``PATH`` (``.agent/sessions/ID.jsonl``).

    Each line is ``{"time", "kind", "session", "data"}`` as JSON, passed through
    ``redact`` before it is written (the host's replaces each secret as it appears
    inside a JSON string; ``None`` when there are no secrets). Lines are buffered and
    flushed when the session closes (and every ``flush_every`` events), so a host that is
    killed may lose the last few lines.
    """

    def __init__(
        self,
        bus: EventBus,
        session: str,
        path: Path,
        redact: Callable[[str], str] | None,
        *,
        flush_every: int = 64,
    ) -> None:
        self.path = path
        self._session = session
        self._redact = redact
        self._flush_every = flush_every
        self._pending = 0
        self._file: IO[str] | None = None
        self._unsubscribe = bus.subscribe(self._write)

    def _open(self) -> IO[str]:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return os.fdopen(fd, "a", encoding="utf-8")

    def _write(self, event: Event) -> None:
        if event.session != self._session:
            return
        if self._file is None:
            self._file = self._open()
        line = _ENCODE(
            {"time": event.time, "kind": event.kind, "session": event.session, "data": event.data}
        )
        if self._redact is not None:
            line = self._redact(line)
        self._file.write(line + "\n")
        self._pending += 1
        if self._pending >= self._flush_every:
            self._pending = 0
            self._file.flush()

    def close(self) -> None:
        self._unsubscribe()
        if self._file is not None:
            self._file.close()
            self._file = None
