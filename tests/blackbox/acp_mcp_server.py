"""A tiny stdio MCP server for the ACP adapter tests: one tool, `note`, that appends its call to
a file (`python acp_mcp_server.py RECORD`), so a test sees a call reach the server an ACP
client named in `session/new`.

Owns: the server process (the MCP SDK 2.x `MCPServer`, stdio transport) and the record file's
format: one JSON object a line, `{"tool": "note", "text": ..., "pid": ...}`.

Must never: write anything but JSON-RPC to stdout, or reach the network.
"""

from __future__ import annotations

import json
import os
import sys

from mcp.server import MCPServer

TOOL = "note"
SERVER_NAME = "notes"


def serve(record: str) -> None:
    server = MCPServer(SERVER_NAME, log_level="WARNING")

    @server.tool(name=TOOL, description="Write a note down. Returns 'noted: <text>'.")
    def note(text: str) -> str:
        with open(record, "a", encoding="utf-8") as out:
            out.write(json.dumps({"tool": TOOL, "text": text, "pid": os.getpid()}) + "\n")
        return f"noted: {text}"

    server.run("stdio")


if __name__ == "__main__":
    serve(sys.argv[1])
