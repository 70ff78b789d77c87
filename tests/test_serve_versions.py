"""``toolhost serve`` speaks the MCP version each client negotiated.

A raw JSON-RPC client over stdio (no SDK in between, so the bytes on the wire are what
is checked) negotiates a protocol version and answers an escalation. Elicitation came in
2025-06-18 as a form with an ``enum`` of choices and no ``mode``; 2025-11-25 added
``mode`` and titled choices (``oneOf`` of ``const``). Each client gets its own form.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .mcp_helpers import make_mcp_project

pytestmark = pytest.mark.subprocess


class RawClient:
    """Newline-delimited JSON-RPC over a ``toolhost serve`` child's stdio."""

    def __init__(self, project: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from host.cli import main; main()", "serve"],
            cwd=project,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip():
                self.inbox.put(json.loads(line))

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        self.process.stdin.flush()

    def next(self, predicate: Any) -> dict[str, Any]:
        """The next message ``predicate`` accepts (notifications on the way are skipped)."""
        while True:
            message = self.inbox.get(timeout=60)
            if predicate(message):
                return message

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_mcp_project(tmp_path / "project")


@pytest.fixture
def client(project: Path) -> Iterator[RawClient]:
    made = RawClient(project)
    try:
        yield made
    finally:
        made.close()


def _escalate(client: RawClient, version: str, capabilities: dict[str, Any]) -> dict[str, Any]:
    """Negotiate ``version``, call the escalated ``note``: the elicitation request."""
    client.send(
        {
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": version,
                "capabilities": capabilities,
                "clientInfo": {"name": "raw", "version": "1"},
            },
        }
    )
    init = client.next(lambda m: m.get("id") == 1)
    assert init["result"]["protocolVersion"] == version, init
    client.send({"method": "notifications/initialized"})
    client.send(
        {"id": 2, "method": "tools/call", "params": {"name": "note", "arguments": {"text": "x"}}}
    )
    return client.next(lambda m: m.get("method") == "elicitation/create")


def _answer(client: RawClient, request: dict[str, Any], decision: str) -> dict[str, Any]:
    client.send(
        {
            "id": request["id"],
            "result": {"action": "accept", "content": {"decision": decision}},
        }
    )
    return client.next(lambda m: m.get("id") == 2)


def test_a_2025_06_18_client_gets_an_enum_and_no_mode(client: RawClient) -> None:
    request = _escalate(client, "2025-06-18", {"elicitation": {}})
    params = request["params"]
    assert "mode" not in params, params
    decision = params["requestedSchema"]["properties"]["decision"]
    assert decision["type"] == "string" and "oneOf" not in decision, decision
    assert decision["enum"] == ["approve_once", "approve_session", "approve_always", "deny"]
    assert decision["enumNames"][0] == "Approve once"
    result = _answer(client, request, "approve_once")
    assert result["result"].get("isError") is not True, result
    assert result["result"]["structuredContent"] == {"text": "x", "length": 1}


def test_a_2025_11_25_client_gets_titled_choices_in_form_mode(client: RawClient) -> None:
    request = _escalate(client, "2025-11-25", {"elicitation": {"form": {}}})
    params = request["params"]
    assert params["mode"] == "form", params
    decision = params["requestedSchema"]["properties"]["decision"]
    assert "enum" not in decision
    assert decision["oneOf"][0] == {"const": "approve_once", "title": "Approve once"}
    result = _answer(client, request, "deny")
    assert result["result"]["isError"] is True, result
    assert result["result"]["content"][0]["text"].startswith("not_approved: "), result
