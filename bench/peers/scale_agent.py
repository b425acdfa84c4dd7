"""The least a client does to get one answer from its center tools: bench/scale.py's agent.

Run as `python -I -S scale_agent.py <mcp-config>` (standard library only: it stands for a
client, and a thousand of them run at once). It reads the config's `agent-center` entry and
speaks MCP to it the way the entry says:
- a `command` entry (the pump): launched as the entry says, JSON-RPC one line per message over
  its stdio, as MCP's stdio transport frames them (mcphost/testing/standin_agent.py's framing);
- a `url` entry: MCP's streamable HTTP with `http.client`, one POST per message with the entry's
  `headers`, the `Mcp-Session-Id` the server hands out kept for the next; a reply is JSON or a
  server-sent event stream (its `data:` lines read until the answer to the request).

`initialize`, `notifications/initialized`, one `tools/call get_my_work` (no `tools/list`: the
least a client needs), then `./answer` (its working directory is the agent's workspace), written
whole by a rename: one JSON object `{"ok", "at" (time.time() of the answer), "error"?}`. It holds
the session open until SIGTERM, as an agent between turns does.
Must never: read anything but the config it is given and its own environment.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from typing import Any

PROTOCOL = "2025-06-18"
INITIALIZE = {
    "protocolVersion": PROTOCOL,
    "capabilities": {},
    "clientInfo": {"name": "scale-agent", "version": "1"},
}


class Stdio:
    """A `command` entry: its process's stdin and stdout, one JSON-RPC message a line."""

    def __init__(self, entry: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [entry["command"], *entry.get("args", [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, **entry.get("env", {})},
        )

    def send(self, message: dict[str, Any]) -> dict[str, Any] | None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()
        if "id" not in message:
            return None
        while line := self.proc.stdout.readline():
            reply = json.loads(line)
            if reply.get("id") == message["id"]:
                return dict(reply)
        raise ConnectionError(f"{self.proc.args[0]} closed its stdout")


class Http:
    """A `url` entry: MCP's streamable HTTP, one POST per message on one kept-alive connection."""

    def __init__(self, entry: dict[str, Any]) -> None:
        url = urllib.parse.urlsplit(entry["url"])
        if url.scheme != "http":
            raise ConnectionError(f"scale_agent speaks plain http only, not {entry['url']}")
        self.conn = http.client.HTTPConnection(url.hostname or "", url.port or 80, timeout=600)
        self.path = url.path or "/"
        self.headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **entry.get("headers", {}),
        }

    def send(self, message: dict[str, Any]) -> dict[str, Any] | None:
        self.conn.request("POST", self.path, json.dumps(message).encode(), self.headers)
        response = self.conn.getresponse()
        session = response.getheader("Mcp-Session-Id")
        if session:
            self.headers["Mcp-Session-Id"] = session
        self.headers["MCP-Protocol-Version"] = PROTOCOL
        if response.status >= 300:
            raise ConnectionError(f"HTTP {response.status}: {response.read()[:500]!r}")
        if "id" not in message:
            response.read()
            return None
        if "text/event-stream" not in (response.getheader("Content-Type") or ""):
            return dict(json.loads(response.read()))
        found: dict[str, Any] | None = None
        while line := response.readline():  # the stream ends after the answer
            if found is None and line.startswith(b"data:"):
                event = json.loads(line[5:])
                if event.get("id") == message["id"]:
                    found = dict(event)
        if found is None:
            raise ConnectionError("the event stream ended without the answer")
        return found


def answer(config: str) -> tuple[Stdio | Http, dict[str, Any]]:
    """Open the `agent-center` session and make one call: the session (to hold) and the record
    `./answer` holds."""
    with open(config, encoding="utf-8") as handle:
        entry = json.load(handle)["mcpServers"]["agent-center"]
    wire: Stdio | Http = Http(entry) if "url" in entry else Stdio(entry)
    opened = wire.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE})
    if opened is None or "error" in opened:
        raise ConnectionError(f"initialize: {json.dumps(opened)[:500]}")
    wire.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    params = {"name": "get_my_work", "arguments": {}}
    reply = wire.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params})
    ok = reply is not None and "result" in reply and not reply["result"].get("isError")
    record: dict[str, Any] = {"ok": ok, "at": time.time()}
    if not ok:
        record["error"] = json.dumps(reply)[:2000]
    return wire, record


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: scale_agent.py <mcp-config>", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        _held, record = answer(argv[0])  # held: the session stays open until SIGTERM
    except (ConnectionError, OSError, ValueError, KeyError) as exc:
        record = {"ok": False, "at": time.time(), "error": repr(exc)[-2000:]}
    with open("answer.tmp", "w", encoding="utf-8") as out:
        out.write(json.dumps(record))
    os.rename("answer.tmp", "answer")
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
