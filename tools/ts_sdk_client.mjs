// The TypeScript SDK's stdio client drives a real mcphost process; prints one JSON report.
// usage: node ts_sdk_client.mjs <python> <args...>   (the server's environment is inherited)
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [command, ...args] = process.argv.slice(2);
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "inherit" });
const client = new Client({ name: "mcphost-ts-interop", version: "1.0.0" });
const notes = [];
client.fallbackNotificationHandler = async (n) => { notes.push(n.method); };
await client.connect(transport);
const listed = await client.listTools();
const progress = [];
const issue = await client.callTool(
  { name: "get_issue", arguments: { issue_id: "i-1" } },
  undefined,
  { onprogress: (p) => progress.push(p) },
);
const search = await client.callTool({ name: "search_tools", arguments: { query: "subscribe" } });
let invalid;
try {
  invalid = await client.callTool({ name: "get_issue", arguments: { agent_id: "x" } });
} catch (err) {
  invalid = { thrown: String(err) };
}
const report = {
  server: client.getServerVersion(),
  capabilities: client.getServerCapabilities(),
  tools: listed.tools.map((t) => t.name),
  issue,
  search,
  invalid,
  notes,
};
await client.close();
console.log(JSON.stringify(report));
