"""OpenTelemetry spans for tool calls and ``run_code`` (docs/events.md, "Events and traces").

Optional: only ``opentelemetry-api`` is imported, and only when a host is opened with a
tracer provider (``Host.open(tracer_provider=...)``) or one was set globally
(``opentelemetry.trace.set_tracer_provider``) before it opened. Without either, the
host holds no ``Tracing`` and the call path does not touch OpenTelemetry at all.

A call that runs gets one span ``execute_tool {tool}`` following the GenAI semantic
conventions (``gen_ai.operation.name = execute_tool``, ``gen_ai.tool.name``,
``gen_ai.tool.call.id``, ``error.type`` on failure), nested under the ``run_code`` span
of the run that made it. Arguments and results are recorded (redacted) only with
``content=True``. A call refused before it runs gets a span event on the current span
(``policy_decision``, ``policy_denied``), never an execution span.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

__all__ = ["Tracing"]

_SCOPE = "toolhost"


def _json(value: Any, redact: Callable[[str], str], limit: int = 4000) -> str:
    text = redact(json.dumps(value, ensure_ascii=False, default=repr))
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Tracing:
    """Spans for one host."""

    def __init__(
        self, provider: TracerProvider, *, redact: Callable[[str], str], content: bool = False
    ) -> None:
        from opentelemetry import trace

        self._trace = trace
        self._tracer: Tracer = provider.get_tracer(_SCOPE)
        self._redact = redact
        self.content = content
        """Whether arguments and results are recorded (redacted) on the spans."""

    @classmethod
    def open(
        cls,
        provider: TracerProvider | None,
        *,
        redact: Callable[[str], str],
        content: bool = False,
    ) -> Tracing | None:
        """Tracing with ``provider``, or the global one if an app set it; else ``None``."""
        if provider is None:
            try:
                from opentelemetry import trace
            except ImportError:  # the extra is not installed: no tracing, no import cost
                return None
            provider = trace.get_tracer_provider()
            if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
                return None  # nobody configured OpenTelemetry
        return cls(provider, redact=redact, content=content)

    @contextmanager
    def tool_span(
        self,
        tool: str,
        call_id: str,
        caller: str | None,
        session: str,
        arguments: Mapping[str, Any],
    ) -> Generator[Span]:
        """The span of one call that runs; an exception ends it with ``error.type``."""
        attributes: dict[str, str] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
            "toolhost.caller": caller or "",
            "toolhost.session": session,
        }
        if self.content:
            attributes["gen_ai.tool.call.arguments"] = _json(dict(arguments), self._redact)
        with self._tracer.start_as_current_span(
            f"execute_tool {tool}",
            kind=self._trace.SpanKind.INTERNAL,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except BaseException as exc:
                kind = getattr(exc, "kind", None)
                span.set_attribute(
                    "error.type", kind if isinstance(kind, str) else type(exc).__qualname__
                )
                span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
                raise

    def result(self, span: Span, value: Any) -> None:
        if self.content:
            span.set_attribute("gen_ai.tool.call.result", _json(value, self._redact))

    @contextmanager
    def run_code(self, session: str) -> Generator[Span]:
        with self._tracer.start_as_current_span(
            "run_code",
            kind=self._trace.SpanKind.INTERNAL,
            attributes={"toolhost.session": session},
        ) as span:
            yield span

    def event(self, name: str, attributes: Mapping[str, str | None]) -> None:
        """A span event on the current span (a decision, a refusal), if one records."""
        span = self._trace.get_current_span()
        if span.is_recording():
            span.add_event(name, {k: v for k, v in attributes.items() if v is not None})
