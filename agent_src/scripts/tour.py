"""A tour of the example tools: run it with ``toolhost run agent_src/scripts/tour.py``.

Every tool is a global here and every call is awaited, exactly as in agent code. Each
call passes the policy in ``agent_src/policy.toml`` (this script's caller is ``script``).
"""

print("now:", await now())
print("formatted:", await tools.time.format("2026-11-30T13:40:00+00:00"))
print("2 + 3 =", await add(2, 3))

r = await roll(3, sides=6)
print(f"rolled {r['dice']} for a total of {r['total']}")

await kanban.add("write the docs")
task = await kanban.add("ship the release")
await kanban.close(task["id"])
print("open tasks:", [t["title"] for t in await kanban.list("open")])

# A tool that uses its context (tools/report.py): it lists the board through a nested
# call its __uses__ declares, reports progress, counts its charts in the session's
# key-value store, and returns the chart as a PNG file beside the counts.
chart = await board_chart()
counts, png = chart.value, chart.attachments[0]
print(f"chart: {counts['open']} open, {counts['closed']} closed (chart {counts['charts']})")
print(f"  {png.name}: {png.mime_type}, {png.width}x{png.height}, kept at {png.path}")

# hooks/redact_emails.py (trusted code the host loads) reshapes results: an email address
# in a task never reaches this script or the audit (`toolhost hooks` lists the hooks).
task = await kanban.add("reply to ana@example.com")
print("a hook rewrote the result:", task["title"])
await kanban.close(task["id"])

# Rule "many-dice" escalates: at a terminal you are asked; without one, nobody can
# answer, so the call is not approved and does not run.
try:
    r = await roll(60)
    print(f"escalated and approved: 60 dice for a total of {r['total']}")
except NotApproved as exc:
    print("escalated and not approved:", exc.reason, f"({exc.detail})")

# Rule "too-many" denies: the call never reaches the tool.
try:
    await roll(500)
except PolicyDenied as exc:
    print(f"denied by rule {exc.rule}: {exc.reason}")

try:
    await kanban.close("no-such-task")
except ToolError as exc:
    print("a tool error crosses as data:", exc.type_name, exc.error_message)
