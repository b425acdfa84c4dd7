"""A stand-in coding agent for supervisor tests and benchmarks: it does what a real client does
with its MCP config, and nothing else.

Run as `python3 standin_agent.py <mcp-config> [--only SERVER] [--linger] [--call TOOL]
[--relay-call TOOL [--relay-args JSON]] [--hold | --echo NAME]`:
- reads the `mcpServers` of the config it was given (the file the supervisor generated), or
  only the one `--only` names;
- launches every server exactly as the config says (command, args, env over its own
  environment) and speaks MCP to it over stdio, or, for an HTTP entry (`url`), speaks MCP's
  streamable HTTP to that address (a POST per message, the session id sent back): `initialize`, `notifications/initialized`,
  `tools/list`, then one `tools/call` (`get_my_work` on the center tools, `help` on the relay
  tools; `--call` picks another center tool, `--relay-call` another relay tool, with the
  arguments `--relay-args` gives as a JSON object);
- appends one JSON line per server to `./calls.jsonl` (its working directory is the agent's
  workspace): `{"server", "agent_pid", "ok", "tools", "result" | "error"}`, then writes
  `./ready`;
- `--linger` first forks a process that leaves the agent's session (`setsid`), opens its own
  center session, writes `./lingerer.pid`, and waits for the stream to end, then writes
  `./lingerer.closed` (how a test sees the supervisor close an older generation's sessions);
- `--hold` keeps the sessions open until SIGTERM (the default: exit 0 after the calls);
- `--echo NAME` holds them too, and is a small interactive agent for a terminal (a tmux pane):
  it prints what its calls did and a prompt `NAME> `, then answers each line of its stdin
  with `[NAME] got: <line>` (so text typed or pasted into it visibly arrives); a line
  `/send TARGET MESSAGE` instead calls the relay tool `send` on its held `agentmux` session
  (what a model would do), records it in `./calls.jsonl` and prints the outcome.

Standard library only (it stands for a client, not for this project), JSON-RPC by hand over
the pump's stdio: one line per message, as MCP's stdio transport frames them (over HTTP:
`http.client`, one POST per message).
Must never: read anything but the config it is given and its own environment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

PROTOCOL = "2025-06-18"


class Session:
    """One MCP server launched from a config entry, spoken to line by line."""

    def __init__(self, entry: dict[str, Any]) -> None:
        env = {**os.environ, **entry.get("env", {})}
        self.proc = subprocess.Popen(
            [entry["command"], *entry.get("args", [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.next_id = 0

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
            if not line:
                raise ConnectionError(self.stderr())
            message = json.loads(line)
            if message.get("id") == self.next_id:
                return dict(message)

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        self.proc.wait()
        return self.proc.stderr.read().decode("utf-8", "replace")[-2000:]

    def open(self) -> list[str]:
        reply = self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "standin-agent", "version": "1"},
            },
        )
        if "error" in reply:
            raise ConnectionError(json.dumps(reply["error"]))
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        listed = self.request("tools/list", {})
        return [tool["name"] for tool in listed["result"]["tools"]]


class HttpSession(Session):
    """One HTTP entry (`url`: a supervisor's loopback listener), spoken to as a streamable-HTTP
    client speaks: one POST per message, the `Mcp-Session-Id` the server gave sent back, a reply
    read as JSON or from its server-sent events."""

    def __init__(self, entry: dict[str, Any]) -> None:
        from urllib.parse import urlsplit

        url = urlsplit(entry["url"])
        self.host, self.port, self.path = url.hostname or "", url.port or 80, url.path
        self.sid: str | None = None
        self.conn: Any = None
        self.next_id = 0

    def post(self, message: dict[str, Any]) -> tuple[int, str, bytes]:
        import http.client

        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": PROTOCOL,
        }
        if self.sid:
            headers["Mcp-Session-Id"] = self.sid
        self.conn.request("POST", self.path, json.dumps(message).encode(), headers)
        reply = self.conn.getresponse()
        self.sid = reply.getheader("mcp-session-id") or self.sid
        return reply.status, reply.getheader("content-type") or "", reply.read()

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        status, kind, body = self.post(message)
        if status != 200:
            raise ConnectionError(f"HTTP {status}: {body.decode('utf-8', 'replace')[:2000]}")
        if kind.startswith("application/json"):
            return dict(json.loads(body))
        for line in body.decode("utf-8", "replace").splitlines():  # server-sent events
            if line.startswith("data:") and line[5:].strip():
                event = json.loads(line[5:])
                if event.get("id") == self.next_id:
                    return dict(event)
        raise ConnectionError("the reply held no answer")

    def send(self, message: dict[str, Any]) -> None:
        self.post(message)

    def stderr(self) -> str:
        return ""


def connect(entry: dict[str, Any]) -> Session:
    """The session an entry of the config asks for: a process over stdio, or HTTP."""
    return HttpSession(entry) if "url" in entry else Session(entry)


def record(line: dict[str, Any]) -> None:
    with open("calls.jsonl", "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def linger(entry: dict[str, Any]) -> None:
    """Fork a process outside the agent's session that holds one center session open."""
    if os.fork() != 0:
        return
    os.setsid()
    try:
        session = Session(entry)
        session.open()
        with open("lingerer.pid", "w") as out:
            out.write(str(os.getpid()))
        assert session.proc.stdout is not None
        while session.proc.stdout.readline():  # the stream ends when the supervisor closes it
            pass
        with open("lingerer.closed", "w") as out:
            out.write("closed")
    finally:
        os._exit(0)


def relay_send(name: str, session: Session | None, line: str) -> None:
    """`/send TARGET MESSAGE`: the relay tool `send` on the held agentmux session."""
    _, target, message = [*line.split(None, 2), "", ""][:3]
    call: dict[str, Any] = {"server": "agentmux", "agent_pid": os.getpid(), "tool": "send"}
    try:
        if session is None:
            raise ConnectionError("no agentmux server in this agent's MCP config")
        arguments = {"targets": [target], "message": message}
        reply = session.request("tools/call", {"name": "send", "arguments": arguments})
        call["ok"] = "result" in reply and not reply["result"].get("isError")
        call["result" if "result" in reply else "error"] = reply.get("result", reply.get("error"))
    except (ConnectionError, OSError, ValueError) as exc:
        call["ok"], call["error"] = False, str(exc)[-2000:]
    record(call)
    outcome = "ok" if call["ok"] else "FAILED: " + json.dumps(call.get("error"))[:200]
    sys.stdout.write(f"[{name}] send to {target}: {outcome}\n")


def echo(name: str, sessions: dict[str, Session]) -> None:
    """Say what the calls did, then answer each input line until stdin ends."""
    with open("calls.jsonl", encoding="utf-8") as handle:
        lines = [json.loads(text) for text in handle if text.strip()]
    for call in (line for line in lines if line.get("agent_pid") == os.getpid()):
        state = "ok" if call.get("ok") else "FAILED: " + str(call.get("error", ""))[:200]
        print(f"[{name}] pid {call['agent_pid']}: {call['server']} {state}")
    if sys.stdin.isatty():  # show each line once, as the agent answers it, not as typed too
        import termios

        mode = termios.tcgetattr(sys.stdin)
        mode[3] &= ~termios.ECHO
        termios.tcsetattr(sys.stdin, termios.TCSANOW, mode)
    print(f"[{name}] holding its MCP sessions; type a line.")
    sys.stdout.write(f"{name}> ")
    sys.stdout.flush()
    for text in sys.stdin:
        if text.startswith("/send "):
            relay_send(name, sessions.get("agentmux"), text.rstrip())
        else:
            sys.stdout.write(f"[{name}] got: {text.rstrip()}\n")
        sys.stdout.write(f"{name}> ")
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(
            "usage: standin_agent.py <mcp-config> [--only SERVER] [--linger] [--call TOOL] "
            "[--relay-call TOOL [--relay-args JSON]] [--hold | --echo NAME]",
            file=sys.stderr,
        )
        return 2
    with open(argv[0], encoding="utf-8") as handle:
        servers = json.load(handle)["mcpServers"]
    if "--only" in argv:
        only = argv[argv.index("--only") + 1]
        servers = {name: entry for name, entry in servers.items() if name == only}
    tool = argv[argv.index("--call") + 1] if "--call" in argv else "get_my_work"
    relay_tool = argv[argv.index("--relay-call") + 1] if "--relay-call" in argv else "help"
    relay_args = json.loads(argv[argv.index("--relay-args") + 1]) if "--relay-args" in argv else {}
    if "--linger" in argv and "agent-center" in servers:
        linger(servers["agent-center"])
    sessions: dict[str, Session] = {}
    for name, entry in servers.items():
        line: dict[str, Any] = {"server": name, "agent_pid": os.getpid()}
        try:
            session = connect(entry)
            sessions[name] = session
            line["tools"] = session.open()
            call, arguments = (tool, {}) if name == "agent-center" else (relay_tool, relay_args)
            reply = session.request("tools/call", {"name": call, "arguments": arguments})
            line["ok"] = "result" in reply and not reply["result"].get("isError")
            line["result" if "result" in reply else "error"] = reply.get(
                "result", reply.get("error")
            )
        except (ConnectionError, OSError, ValueError, KeyError) as exc:
            line["ok"] = False
            line["error"] = str(exc)[-2000:]
        record(line)
    with open("ready", "w") as out:
        out.write(str(os.getpid()))
    if "--hold" in argv or "--echo" in argv:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        if "--echo" in argv:
            echo(argv[argv.index("--echo") + 1], sessions)
        while True:
            signal.pause()
    return 0


if __name__ == "__main__":
    # run as a script, its own directory comes first on sys.path, where mcphost/testing/http.py
    # would stand for the standard library's `http` (the HTTP entries' client)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.exit(main(sys.argv[1:]))
