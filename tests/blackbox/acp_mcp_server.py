"""A tiny stdio MCP server for the ACP adapter tests (`python acp_mcp_server.py RECORD`), so a
test sees a call reach the server an ACP client named in `session/new`. Two tools, each
appending its call to RECORD: `note` (no annotations) and `peek` (annotated read-only, which
Codex runs without asking).

Owns: the server process (the MCP SDK 2.x `MCPServer`, stdio transport) and the record file's
format: one JSON object a line, `{"tool": "note" | "peek", "text": ..., "pid": ...}`.

Must never: write anything but JSON-RPC to stdout, or reach the network.
"""

from __future__ import annotations

import json
import os
import sys

from mcp.server import MCPServer
from mcp.types import ToolAnnotations

SERVER_NAME = "notes"


def serve(record: str) -> None:
    server = MCPServer(SERVER_NAME, log_level="WARNING")

    def called(tool: str, text: str) -> None:
        with open(record, "a", encoding="utf-8") as out:
            out.write(json.dumps({"tool": tool, "text": text, "pid": os.getpid()}) + "\n")

    @server.tool(name="note", description="Write a note down. Returns 'noted: <text>'.")
    def note(text: str) -> str:
        called("note", text)
        return f"noted: {text}"

    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(
        name="peek", description="Look at a note. Returns 'peeked: <text>'.", annotations=read_only
    )
    def peek(text: str) -> str:
        called("peek", text)
        return f"peeked: {text}"

    server.run("stdio")


if __name__ == "__main__":
    serve(sys.argv[1])
