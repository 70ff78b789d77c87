"""One host replica for the multi-replica tests: ``python -m tests.pg_replica PROJECT``.

It opens a host on PROJECT (whose policy names the PostgreSQL store), prints
``{"ready": HOST_ID}``, then takes commands on stdin, one JSON object a line, and answers
each on stdout with the same ``id``:

* ``{"op": "call", "tool": T, "args": {...}}``: call T as the app (in a task of its own:
  the answer comes when the call ends, ``{"ok": result}`` or ``{"error": kind}``);
* ``{"op": "pending"}``: the pending approvals' ids, as this replica's inbox lists them;
* ``{"op": "answer", "pending": ID, "allow": B, "remember": R, "scope": S}``: answer one
  through this replica's store, as its inbox's API does (``{"status": ...}``);
* ``{"op": "tail", "count": N}``: the audit trail as this replica reads it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import anyio.abc

from host import Host
from host.audit import PendingAnswer
from host.errors import HostError


async def _serve(project: str) -> None:
    async with Host.open(project, approver="inbox") as host:
        out = anyio.Lock()

        async def say(data: dict[str, Any]) -> None:
            async with out:
                print(json.dumps(data), flush=True)

        async def call(number: int, tool: str, args: dict[str, Any]) -> None:
            try:
                result = await host.call(tool, **args)
            except HostError as exc:
                await say({"id": number, "error": exc.kind, "message": exc.message})
            else:
                await say({"id": number, "ok": result})

        async def command(tg: anyio.abc.TaskGroup, line: str) -> None:
            asked = json.loads(line)
            number, op = asked["id"], asked["op"]
            if op == "call":
                tg.start_soon(call, number, asked["tool"], asked.get("args", {}))
            elif op == "pending":
                rows = await host.store.pending()
                await say({"id": number, "pending": [r.id for r in rows if r.offered]})
            elif op == "answer":
                answer = PendingAnswer(
                    allow=asked["allow"],
                    remember=asked.get("remember", "once"),
                    scope=asked.get("scope", "call"),
                    approver=host.host_id,
                )
                result = await host.store.answer_pending(asked["pending"], answer)
                await say({"id": number, "status": result.status})
            elif op == "tail":
                records = await host.store.tail(asked.get("count", 100))
                await say(
                    {
                        "id": number,
                        "records": [
                            [r.call_id, r.host_id, r.outcome, r.approval, r.seq] for r in records
                        ],
                    }
                )

        await say({"ready": host.host_id})
        stdin = anyio.wrap_file(sys.stdin)
        async with anyio.create_task_group() as tg:
            async for line in stdin:
                if line.strip():
                    tg.start_soon(command, tg, line)
            tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(_serve, sys.argv[1])
