"""The generic peer: FastMCP's `from_openapi` serving the reference center's OpenAPI document.

Usage: python -m bench.peers.openapi_peer (bindings from AC_MCP_* like the host; unix only).
The peer cannot inject identity by itself, so `agent_id` stays a tool argument here: exactly the
weakness the host exists to remove. Measured for start-up, per-call latency and RSS only.
"""

import json
import os
import socket

import httpx2
from fastmcp import FastMCP

SOCKET = os.environ["AC_MCP_ADMIN_URL"].removeprefix("unix:")


def fetch_spec() -> dict:
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(SOCKET)
        conn.sendall(b"GET /openapi.json HTTP/1.0\r\nHost: localhost\r\n\r\n")
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return json.loads(data.split(b"\r\n\r\n", 1)[1])


client = httpx2.AsyncClient(
    transport=httpx2.AsyncHTTPTransport(uds=SOCKET),
    base_url="http://localhost",
    headers={"Authorization": f"Bearer {os.environ['AC_MCP_WORKER_TOKEN']}"},
)
server = FastMCP.from_openapi(fetch_spec(), client=client, name="openapi-peer")

if __name__ == "__main__":
    server.run(show_banner=False)
