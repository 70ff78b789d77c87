// The official MCP TypeScript SDK client, as agent apps use it, driven by a plan.
//
//   node client.mjs PLAN_JSON
//
// PLAN: {"server": {"command": ..., "args": [...], "cwd": ...} | {"url": ..., "token"?: ...},
//        "elicitation": "none" | "decline" | "cancel" | "accept:CHOICE",
//        "calls": [{"name": ..., "arguments": {...}}, ...]}
//
// Prints one JSON object: the tools listed, Ajv strict-mode findings for every schema,
// and for each call what the client made of it: the result (isError, its text) or the
// exception the client threw. The test (tests/test_mcp_ts_client.py) judges it.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const plan = JSON.parse(process.argv[2]);
const elicitation = plan.elicitation ?? "none";
const capabilities = elicitation === "none" ? {} : { elicitation: {} };
const client = new Client({ name: "toolhost-ts-test", version: "1.0.0" }, { capabilities });
const asked = [];

if (elicitation !== "none") {
  client.setRequestHandler(ElicitRequestSchema, async (request) => {
    asked.push(request.params.message);
    if (elicitation === "decline" || elicitation === "cancel") {
      return { action: elicitation };
    }
    const choice = elicitation.split(":")[1];
    return { action: "accept", content: { decision: choice } };
  });
}

const transport = plan.server.url
  ? new StreamableHTTPClientTransport(new URL(plan.server.url), {
      requestInit: plan.server.token
        ? { headers: { Authorization: `Bearer ${plan.server.token}` } }
        : undefined,
    })
  : new StdioClientTransport({
      command: plan.server.command,
      args: plan.server.args,
      cwd: plan.server.cwd,
      env: plan.server.env,
      stderr: "pipe",
    });

const out = { tools: [], strict: [], calls: [], asked };
try {
  await client.connect(transport);
  const listed = await client.listTools();
  for (const tool of listed.tools) {
    out.tools.push(tool.name);
    for (const [which, schema] of [["input", tool.inputSchema], ["output", tool.outputSchema]]) {
      if (!schema) continue;
      const warnings = [];
      const ajv = new Ajv2020({
        strict: true,
        allErrors: true,
        logger: { log() {}, warn: (m) => warnings.push(String(m)), error: (m) => warnings.push(String(m)) },
      });
      addFormats(ajv);
      try {
        ajv.compile(schema);
      } catch (e) {
        warnings.push(`error: ${e.message}`);
      }
      if (warnings.length) out.strict.push({ tool: tool.name, schema: which, warnings });
    }
  }
  for (const call of plan.calls) {
    try {
      const result = await client.callTool({ name: call.name, arguments: call.arguments ?? {} });
      const text = (result.content ?? [])
        .filter((c) => c.type === "text")
        .map((c) => c.text)
        .join("\n");
      out.calls.push({
        name: call.name,
        threw: null,
        isError: result.isError ?? false,
        text,
        structured: result.structuredContent ?? null,
        meta: result._meta ?? null,
      });
    } catch (e) {
      out.calls.push({ name: call.name, threw: String(e && e.message ? e.message : e) });
    }
  }
} finally {
  await client.close();
}
process.stdout.write(JSON.stringify(out) + "\n");
