"""OpenTelemetry spans per tool call (GenAI conventions), nested under ``run_code``, with
the SDK's in-memory exporter, on real subprocess capsules."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from host import Host, ToolError

pytestmark = pytest.mark.anyio

SECRET = "otel-" + "c4n4ry-v4lue"

TOOLS = {
    "work": """
        def echo(text: str) -> str:
            return text


        def boom() -> str:
            raise ValueError("boom")


        def forbidden() -> None:
            pass
    """,
}

POLICY = f"""
    version = 1
    [defaults]
    agent = "allow"

    [[rules]]
    id = "never"
    tools = ["forbidden"]
    decision = "deny"

    [env]
    set = {{ TOKEN = "{SECRET}" }}
    secret = ["TOKEN"]
"""


def provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracer_provider, exporter


async def test_a_span_per_call_with_the_genai_attributes(
    make_project: Callable[..., Path],
) -> None:
    tracer_provider, exporter = provider()
    project = make_project(TOOLS, POLICY)
    async with Host.open(project, tracer_provider=tracer_provider) as host:
        assert await host.call("echo", "hi") == "hi"
        with pytest.raises(ToolError):
            await host.call("boom")
        host_id = host.host_id
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["execute_tool echo", "execute_tool boom"]
    ok, failed = spans
    attributes = dict(ok.attributes or {})
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["gen_ai.tool.name"] == "echo"
    assert str(attributes["gen_ai.tool.call.id"]).startswith(host_id + ".")
    assert "gen_ai.tool.call.arguments" not in attributes  # content is off by default
    assert "error.type" not in attributes
    assert dict(failed.attributes or {})["error.type"] == "tool_error"
    assert failed.status.status_code is StatusCode.ERROR


async def test_calls_nest_under_run_code_and_a_denied_call_gets_only_an_event(
    make_project: Callable[..., Path],
) -> None:
    tracer_provider, exporter = provider()
    project = make_project(TOOLS, POLICY)
    async with Host.open(project, tracer_provider=tracer_provider) as host:
        result = await host.run_code(
            "x = await echo('a')\ntry:\n    await forbidden()\nexcept Exception:\n    pass\nx"
        )
        assert result.ok and result.value == "a"
    spans = exporter.get_finished_spans()
    names = [s.name for s in spans]
    assert names == ["execute_tool echo", "run_code"]  # no span for the denied call
    tool, run = spans
    assert tool.parent is not None and tool.parent.span_id == run.context.span_id
    events = [(e.name, dict(e.attributes or {})) for e in run.events]
    denied = [a for name, a in events if name == "policy_denied"]
    assert denied and denied[0]["gen_ai.tool.name"] == "forbidden"
    decisions = [a["decision"] for name, a in events if name == "policy_decision"]
    assert decisions == ["allow", "deny"]


async def test_content_is_recorded_only_when_asked_and_redacted(
    make_project: Callable[..., Path],
) -> None:
    tracer_provider, exporter = provider()
    project = make_project(TOOLS, POLICY)
    async with Host.open(project, tracer_provider=tracer_provider, trace_content=True) as host:
        assert await host.call("echo", f"key={SECRET}") == f"key={SECRET}"
    (span,) = exporter.get_finished_spans()
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.tool.call.arguments"] == '{"text": "key=⟨secret TOKEN⟩"}'
    assert attributes["gen_ai.tool.call.result"] == '"key=⟨secret TOKEN⟩"'
    assert SECRET not in repr(span.to_json())


async def test_no_provider_means_no_tracing(make_project: Callable[..., Path]) -> None:
    project = make_project(TOOLS, POLICY)
    async with Host.open(project) as host:
        assert host.mediator.tracing is None  # no global provider was set
        assert await host.call("echo", "x") == "x"


def test_importing_the_host_imports_no_opentelemetry() -> None:
    code = (
        "import sys, host, host.cli; print(sorted(m for m in sys.modules if 'opentelemetry' in m))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
