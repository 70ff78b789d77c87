"""The host's side of tool contexts: every request a ``ToolContext`` makes, answered here.

A capsule sends a context request naming only the call it belongs to; the connection has
already checked that the call is in flight on that capsule and was sent with a context
(``capsules._transport``). Here the request is answered from the host's own record of
that call (the mediator's :class:`~host._mediator.CallFrame`: tool, session, caller,
chain), never from anything the capsule says:

* ``env``/``env_type``: names the policy's ``[env]`` passes or sets, and names set for the
  session with ``set_env``; anything else is refused naming the policy key to add;
* ``set_env``: a session-scoped value (kept in memory, never written anywhere); a secret
  one is redacted everywhere the host shows text, from then on;
* ``get``/``set``: the session's durable key-value store (the store's ``kv`` table),
  within ``[limits] max_value_size`` and ``max_session_store``;
* ``call``: a nested call through the full mediator, caller ``tool``, with the frame as
  its parent;
* ``emit``/``progress``/``log``: ``tool_event``, ``progress`` and ``tool_log`` events (the
  event bus replaces secrets in them, as in every event), at most :data:`EVENT_BURST` at once and
  :data:`EVENT_RATE` a second per session (the rest are dropped and counted).
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Mapping
from typing import Any, Final, cast

from capsule import protocol as p

from ._events import EventBus
from ._mediator import CallFrame, Mediator
from .audit import StoreFull, StoreUnavailable
from .capsules import ContextFailure, Supervisor
from .errors import HostError, InvalidArguments

__all__ = ["SessionContext", "EVENT_BURST", "EVENT_RATE", "MAX_KEY", "MAX_ENV_VALUE"]

EVENT_BURST: Final = 100
"""Context events (``emit``, ``progress``) a session may send at once..."""
EVENT_RATE: Final = 20.0
"""...and then per second; the rest are dropped and counted (``tool_events_dropped``)."""
MAX_KEY: Final = 256
"""Longest key of the key-value store, in characters."""
MAX_ENV_VALUE: Final = 64 * 1024
"""Longest value ``set_env`` takes, in characters."""
MAX_SESSION_ENV: Final = 256
MAX_SESSION_SECRETS: Final = 512
"""Secret values a session's tools may set, over all its names (each is scanned for in
everything the session shows, so they are bounded); the host's own secrets not counted."""
"""Most names ``set_env`` may set in one session."""
_MAX_EVENT: Final = 64 * 1024
_MAX_MESSAGE: Final = 1000
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}", re.ASCII)
_EVENT_NAME: Final = re.compile(r"[A-Za-z][\w.-]{0,63}", re.ASCII)


def _text_arg(args: Mapping[str, Any], key: str, limit: int) -> str:
    value = args.get(key)
    if type(value) is not str or len(value) > limit:
        raise ContextFailure("context_error", f"{key} is a str of at most {limit} characters")
    return value


class SessionContext:
    """The :class:`~host.capsules.ContextHandler` of one session."""

    def __init__(
        self,
        mediator: Mediator,
        events: EventBus,
        session: str,
    ) -> None:
        self._mediator = mediator
        self._events = events
        self.session = session
        self.supervisor: Supervisor | None = None
        """The session's supervisor, for nested calls (set once it exists)."""
        self._env: dict[str, tuple[str, bool]] = {}
        """Names set for this session: name -> (value, secret)."""
        self._tokens = float(EVENT_BURST)
        self._stamp = time.monotonic()
        self._dropped = 0

    def __repr__(self) -> str:  # names only, never values
        return f"<SessionContext {self.session} env={sorted(self._env)}>"

    def _frame(self, call: int, op: str) -> CallFrame:
        frame = self._mediator.frame(call)
        if frame is None or frame.session != self.session:
            raise ContextFailure(
                "context_closed", f"ctx.{op}: the call this context belongs to is over"
            )
        return frame

    async def request(self, call: int, op: str, args: dict[str, Any]) -> Any:
        frame = self._frame(call, op)
        if op == "env" or op == "env_type":
            value, secret = self._lookup(_text_arg(args, "name", 256))
            return value if op == "env" else ("secret" if secret else "text")
        if op == "set_env":
            return self._set_env(args)
        if op == "get":
            return await self._get(_text_arg(args, "key", MAX_KEY))
        if op == "set":
            return await self._set(_text_arg(args, "key", MAX_KEY), args.get("value"))
        if op == "call":
            return await self._call(frame, args)
        raise ContextFailure("context_error", f"unknown context request {op!r}")

    # -- environment -------------------------------------------------------------------

    def _lookup(self, name: str) -> tuple[str, bool]:
        env = self._mediator.config.env
        secret = name in env.secret
        if name in env.set:
            return env.set[name], secret
        if name in env.pass_:
            value = os.environ.get(name)
            if value is None:
                raise ContextFailure(
                    "env_not_allowed",
                    f"{name} is passed by the policy's [env] pass, but the host's "
                    "environment does not have it: set it where the host starts",
                )
            return value, secret
        own = self._env.get(name)
        if own is not None:
            return own
        raise ContextFailure(
            "env_not_allowed",
            f"{name} is not given to tools: add it to the policy's [env] pass = [...] (to "
            f'pass the host\'s variable) or [env] set = {{ {name} = "..." }}, and to '
            "[env] secret if its value must never be shown; or set it for this session "
            "with ctx.set_env",
        )

    def _set_env(self, args: Mapping[str, Any]) -> None:
        name = _text_arg(args, "name", 128)
        value = _text_arg(args, "value", MAX_ENV_VALUE)
        secret = args.get("secret", True)
        if not _ENV_NAME.fullmatch(name) or type(secret) is not bool:
            raise ContextFailure(
                "context_error",
                f"ctx.set_env: {name!r} is not a variable name (a letter or _, then letters, "
                "digits or _), or secret is not a bool",
            )
        env = self._mediator.config.env
        if name in env.pass_ or name in env.set:
            raise ContextFailure(
                "context_error",
                f"ctx.set_env: {name} is given by the policy's [env]: a tool cannot change it",
            )
        if name not in self._env and len(self._env) >= MAX_SESSION_ENV:
            raise ContextFailure(
                "context_limit", f"ctx.set_env: a session may set at most {MAX_SESSION_ENV} names"
            )
        if secret or self._env.get(name, ("", False))[1]:
            secret = True  # a secret stays secret: a tool cannot unmask one it set
            # A value set before stays hidden (output may still hold it): the values are
            # what is bounded, not the names.
            if not self._mediator.add_secret(self.session, name, value, limit=MAX_SESSION_SECRETS):
                raise ContextFailure(
                    "context_limit",
                    f"ctx.set_env: a session may hold at most {MAX_SESSION_SECRETS} secret "
                    "values (each value a secret name ever had counts)",
                )
        self._env[name] = (value, secret)

    # -- the key-value store -----------------------------------------------------------

    async def _get(self, key: str) -> Any:
        try:
            data = await self._mediator.store.get_value(self.session, key)
        except StoreUnavailable as exc:
            raise ContextFailure(
                "context_error", f"the session store cannot be read: {exc}"
            ) from None
        return None if data is None else p.decode(data)

    async def _set(self, key: str, value: Any) -> None:
        limits = self._mediator.config.limits
        data = None if value is None else p.encode(value)
        if data is not None and len(data) > limits.max_value_size:
            raise ContextFailure(
                "context_limit",
                f"ctx.set_value({key!r}): the value takes {len(data)} bytes encoded, over the "
                f"limit of {limits.max_value_size} ([limits] max_value_size)",
            )
        try:
            await self._mediator.store.set_value(
                self.session, key, data, max_total=limits.max_session_store
            )
        except StoreFull as exc:
            raise ContextFailure("context_limit", f"ctx.set_value({key!r}): {exc}") from None
        except StoreUnavailable as exc:
            raise ContextFailure(
                "context_error", f"the session store cannot be written: {exc}"
            ) from None

    # -- nested calls ------------------------------------------------------------------

    async def _call(self, frame: CallFrame, args: Mapping[str, Any]) -> Any:
        name, positional, named = args.get("name"), args.get("args"), args.get("kwargs")
        if type(name) is not str or not isinstance(positional, list) or not isinstance(named, dict):
            raise InvalidArguments(
                str(name)[:200], "ctx.call takes a tool name, then its arguments"
            )
        supervisor = self.supervisor
        if supervisor is None:  # pragma: no cover - set before the first call
            raise HostError("the session has no capsule yet")
        return await self._mediator.call(
            supervisor,
            self.session,
            name,
            tuple(cast("list[Any]", positional)),
            cast("dict[str, Any]", named),
            "tool",
            parent=frame,
        )

    # -- events ------------------------------------------------------------------------

    def event(self, call: int, op: str, args: dict[str, Any]) -> None:
        frame = self._mediator.frame(call)
        if frame is None or frame.session != self.session:
            return  # the call just ended: an event has nobody to tell
        if not self._take():
            return
        if op == "emit":
            name, data = args.get("event"), args.get("data")
            if type(name) is not str or not _EVENT_NAME.fullmatch(name):
                return
            if len(p.encode(data)) > _MAX_EVENT:
                return
            self._events.emit(
                "tool_event",
                self.session,
                call_id=frame.call_id,
                tool=frame.tool,
                event=name,
                data=data,  # the event bus replaces secrets in every event, at any depth
            )
        elif op == "log":
            message, level = args.get("message"), args.get("level")
            if type(message) is not str or level not in p.LOG_LEVELS:
                return
            self._events.emit(
                "tool_log",
                self.session,
                call_id=frame.call_id,
                tool=frame.tool,
                level=level,
                message=message[:_MAX_MESSAGE],  # the event bus replaces secrets
            )
        elif op == "progress":
            message, fraction = args.get("message"), args.get("fraction")
            if type(message) is not str:
                return
            if fraction is not None and (
                type(fraction) not in (int, float)
                or not math.isfinite(fraction)
                or not 0 <= fraction <= 1
            ):
                fraction = None
            self._events.emit(
                "progress",
                self.session,
                call_id=frame.call_id,
                tool=frame.tool,
                message=message[:_MAX_MESSAGE],
                fraction=fraction,
            )

    def _take(self) -> bool:
        """One event from the session's budget, or False (and counted) when it is spent."""
        now = time.monotonic()
        self._tokens = min(EVENT_BURST, self._tokens + (now - self._stamp) * EVENT_RATE)
        self._stamp = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        self._dropped += 1
        if self._dropped == 1 or self._dropped % 100 == 0:
            self._events.emit("tool_events_dropped", self.session, dropped=self._dropped)
        return False

    async def refused(self, call: int, op: str, reason: str) -> None:
        await self._mediator.refuse_context(self.session, op, reason)
