"""A naive bridge: a few lines of `MCPServer` code doing the same POST the host does.

Usage: python -m bench.peers.naive_bridge  (reads AC_MCP_ADMIN_URL=unix:..., AC_MCP_AGENT_ID,
AC_MCP_WORKER_TOKEN like the host; unix targets only).
"""

import os

import aiohttp
from mcp.server import MCPServer

SOCKET = os.environ["AC_MCP_ADMIN_URL"].removeprefix("unix:")
AGENT = os.environ["AC_MCP_AGENT_ID"]
HEADERS = {"Authorization": f"Bearer {os.environ['AC_MCP_WORKER_TOKEN']}"}
server = MCPServer("naive-bridge", version="1")
_session: aiohttp.ClientSession | None = None


@server.tool(structured_output=False)
async def get_task(task_id: str) -> str:
    """Read a task."""
    global _session
    if _session is None:
        _session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=SOCKET), headers=HEADERS
        )
    async with _session.post(
        "http://localhost/admin/agent-tools/get_task", json={"agent_id": AGENT, "task_id": task_id}
    ) as response:
        return await response.text()


if __name__ == "__main__":
    server.run()
