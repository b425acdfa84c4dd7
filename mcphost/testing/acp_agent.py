"""A stand-in ACP agent for tests: `python -m mcphost.testing.acp_agent [flags]` (stdlib only).

Speaks ACP as an agent over stdio, newline-delimited JSON-RPC 2.0: stdout carries nothing but
JSON-RPC, diagnostics go to stderr. Methods: `initialize` (advertises `loadSession` unless
`--no-load`, `promptCapabilities` unless `--no-prompt`), `session/new`, `session/load` (replays
the session's history as `session/update` before its reply), `session/prompt`, and the
`session/cancel` notification. `--history PATH` keeps the history in a JSON-lines file, so a
respawned process can load a session an earlier one made; `--fail METHOD` answers that method
with a JSON-RPC error (repeatable).

A hostile agent for the bounds of SECURITY.md X10: `--flood requests` or `--flood updates`
completes the handshake (`initialize`, `session/new` or `session/load`), then never reads its
stdin again and writes `--flood-count` (150,000) frames of ~280 bytes as fast as its stdout
takes them: `session/request_permission` requests (each answered by the client, which the agent
never reads) or `session/update` notifications. It exits once its stdout fails (the client
killed it).

A prompt's text scripts its turn, line by line:
- `ACP-ASK: <title>`: a `tool_call`, then `session/request_permission` with the options `allow`
  (allow_once) and `reject` (reject_once); once answered, a `tool_call_update` (completed when
  allowed, failed otherwise) and an agent chunk `selected:<id>` or `cancelled`;
- `ACP-DIE`: exit at once, mid-turn; `ACP-DIE: <title>`: ask as above, then exit unanswered;
- `ACP-QUIT: <title>`: ask as above, then end the turn `cancelled` at once, unanswered (an
  agent that gives up its turn while a permission request is pending; the late answer is
  ignored);
- `ACP-SLOW`: wait for `session/cancel` (the turn ends `cancelled`) or SIGUSR1 (it goes on;
  one sent before the turn reached the line counts);
- `ACP-MCP: <tool> <json arguments>`: call that tool on the first stdio MCP server given in
  `session/new`/`session/load` (spawned with its args and env; MCP initialize, then
  `tools/call`) and report `mcp:<result text>` (or `mcp-error:<why>`) in an agent chunk;
- `ACP-UPDATE: <json>`: send that object as a `session/update`'s `update`, as it is;
- any other lines: one agent chunk `echo: <them>`, then a thought chunk.
The turn ends `end_turn`, or `cancelled` once a `session/cancel` arrived.

Owns: nothing but its own process, and the MCP servers it spawns for `ACP-MCP` (reaped).
Must never: import the ACP SDK or anything of mcphost (it stays importable and fast), or write
anything but JSON-RPC to stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

OPTIONS = [
    {"optionId": "allow", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
]
MCP_PROTOCOL = "2025-06-18"


def log(text: str) -> None:
    print(f"acp_agent[{os.getpid()}]: {text}", file=sys.stderr, flush=True)


class Turn:
    """One running `session/prompt`: its request id, and whether `session/cancel` came."""

    def __init__(self, request_id: Any, session_id: str) -> None:
        self.request_id = request_id
        self.session_id = session_id
        self.cancelled = threading.Event()


class Agent:
    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        self.write_lock = threading.Lock()
        self.ids = itertools.count(1)
        self.answers: dict[int, dict[str, Any]] = {}
        self.answered = threading.Condition()
        self.sessions: dict[str, list[dict[str, Any]]] = {}  # session id -> its mcpServers
        self.memory: list[dict[str, Any]] = []  # the history when there is no --history file
        self.turn: Turn | None = None
        self.calls = itertools.count(1)
        self.signals = 0  # SIGUSR1s received; each lets one ACP-SLOW go on, even a later one
        self.used = 0
        self.poked = threading.Event()  # set by SIGUSR1 and session/cancel
        self.flood_session: str | None = None  # --flood: set once the handshake is done

    # -- the wire -----------------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode()
        with self.write_lock:
            try:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            except OSError:
                os._exit(0)  # the client is gone

    def update(self, session_id: str, update: dict[str, Any], keep: bool = True) -> None:
        if keep:
            self.remember(session_id, update)
        self.send(
            {"method": "session/update", "params": {"sessionId": session_id, "update": update}}
        )

    def ask(self, method: str, params: dict[str, Any]) -> int:
        request_id = next(self.ids)
        self.send({"id": request_id, "method": method, "params": params})
        return request_id

    def answer_of(self, request_id: int) -> dict[str, Any]:
        with self.answered:
            self.answered.wait_for(lambda: request_id in self.answers)
            return self.answers.pop(request_id)

    # -- history ------------------------------------------------------------------------------

    def remember(self, session_id: str, update: dict[str, Any] | None) -> None:
        record = {"sessionId": session_id, "update": update}
        if self.options.history is None:
            self.memory.append(record)
            return
        with Path(self.options.history).open("a", encoding="utf-8") as history:
            history.write(json.dumps(record) + "\n")

    def history(self) -> list[dict[str, Any]]:
        path = self.options.history
        if path is None:
            return list(self.memory)
        if not Path(path).exists():
            return []
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    # -- requests from the client -------------------------------------------------------------

    def handle(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method is None:  # an answer to one of our requests
            with self.answered:
                self.answers[message.get("id")] = message  # type: ignore[index]
                self.answered.notify_all()
            return
        params = message.get("params") or {}
        if "id" not in message:
            if method == "session/cancel" and self.turn is not None:
                self.turn.cancelled.set()
                self.poked.set()
            return
        request_id = message["id"]
        if method in self.options.fail:
            self.send({"id": request_id, "error": {"code": -32603, "message": f"{method} fails"}})
        elif method == "initialize":
            self.send({"id": request_id, "result": self.initialized()})
        elif method == "session/new":
            session_id = "sess-" + uuid.uuid4().hex[:12]
            self.sessions[session_id] = params.get("mcpServers") or []
            self.remember(session_id, None)
            self.send({"id": request_id, "result": {"sessionId": session_id}})
            self.flood_session = session_id
        elif method == "session/load":
            self.load(request_id, params)
        elif method == "session/prompt":
            self.prompt(request_id, params)
        else:
            self.send({"id": request_id, "error": {"code": -32601, "message": f"no {method}"}})

    def initialized(self) -> dict[str, Any]:
        capabilities: dict[str, Any] = {"loadSession": not self.options.no_load}
        if not self.options.no_prompt:
            capabilities["promptCapabilities"] = {"image": False, "audio": False}
        return {
            "protocolVersion": 1,
            "agentCapabilities": capabilities,
            "agentInfo": {"name": "mcphost-acp-standin", "version": "0"},
            "authMethods": [],
        }

    def load(self, request_id: Any, params: dict[str, Any]) -> None:
        session_id = params.get("sessionId")
        records = [record for record in self.history() if record["sessionId"] == session_id]
        if not isinstance(session_id, str) or not records:
            error = {"code": -32002, "message": f"session {session_id!r} not found"}
            self.send({"id": request_id, "error": error})
            return
        self.sessions[session_id] = params.get("mcpServers") or []
        for record in records:
            if record["update"] is not None:
                self.update(session_id, record["update"], keep=False)
        self.send({"id": request_id, "result": {}})
        self.flood_session = session_id

    def flood(self, session_id: str) -> None:
        """`--flood`: never read stdin again; write frames until stdout fails."""
        padding = "x" * 120
        for n in range(self.options.flood_count):
            if self.options.flood == "requests":
                tool_call = {"toolCallId": f"call-{n}", "title": padding, "kind": "edit"}
                self.ask(
                    "session/request_permission",
                    {"sessionId": session_id, "toolCall": tool_call, "options": OPTIONS[:1]},
                )
            else:
                chunk = {"sessionUpdate": "agent_message_chunk", "content": _text(padding)}
                self.update(session_id, chunk, keep=False)
        log(f"flooded {self.options.flood_count} {self.options.flood}")

    def prompt(self, request_id: Any, params: dict[str, Any]) -> None:
        session_id = params.get("sessionId")
        if session_id not in self.sessions or self.turn is not None:
            why = "unknown session" if session_id not in self.sessions else "a turn is running"
            self.send({"id": request_id, "error": {"code": -32602, "message": why}})
            return
        text = "".join(
            block.get("text", "") for block in params.get("prompt") or [] if isinstance(block, dict)
        )
        self.remember(session_id, {"sessionUpdate": "user_message_chunk", "content": _text(text)})
        self.turn = Turn(request_id, session_id)
        threading.Thread(target=self.run, args=(self.turn, text), daemon=True).start()

    # -- a turn -------------------------------------------------------------------------------

    def run(self, turn: Turn, text: str) -> None:
        plain: list[str] = []
        for line in text.splitlines():
            if turn.cancelled.is_set():
                break
            directive, _, rest = line.partition(":")
            rest = rest.strip()
            if line == "ACP-DIE":
                log("dying mid-turn")
                os._exit(3)
            elif directive in ("ACP-ASK", "ACP-DIE", "ACP-QUIT"):
                self.permission(turn, rest, then=directive)
            elif line == "ACP-SLOW":
                self.slow(turn)
            elif directive == "ACP-UPDATE":
                self.update(turn.session_id, json.loads(rest))
            elif directive == "ACP-MCP":
                self.chunk(turn, "agent_message_chunk", self.call_mcp(turn.session_id, rest))
            else:
                plain.append(line)
        if plain and not turn.cancelled.is_set():
            self.chunk(turn, "agent_message_chunk", "echo: " + "\n".join(plain))
            self.chunk(turn, "agent_thought_chunk", f"thought about {len(plain)} line(s)")
        stop = "cancelled" if turn.cancelled.is_set() else "end_turn"
        self.turn = None
        self.send({"id": turn.request_id, "result": {"stopReason": stop}})

    def slow(self, turn: Turn) -> None:
        """Wait for a SIGUSR1 not yet used (it may have come first) or for session/cancel."""
        while not turn.cancelled.is_set():
            if self.signals > self.used:
                self.used += 1
                return
            self.poked.wait()
            self.poked.clear()  # the loop checks again: nothing set meanwhile is lost

    def chunk(self, turn: Turn, kind: str, text: str) -> None:
        self.update(turn.session_id, {"sessionUpdate": kind, "content": _text(text)})

    def permission(self, turn: Turn, title: str, then: str) -> None:
        """Ask; `then` the directive: ACP-ASK waits for the answer, ACP-DIE exits, ACP-QUIT
        ends the turn cancelled."""
        call = {"toolCallId": f"call-{next(self.calls)}", "title": title, "kind": "execute"}
        self.update(turn.session_id, {"sessionUpdate": "tool_call", "status": "pending", **call})
        params = {"sessionId": turn.session_id, "toolCall": call, "options": OPTIONS}
        request_id = self.ask("session/request_permission", params)
        if then == "ACP-DIE":
            log("dying with a permission request unanswered")
            os._exit(3)
        if then == "ACP-QUIT":
            log("giving up the turn with a permission request unanswered")
            turn.cancelled.set()
            return
        outcome = (self.answer_of(request_id).get("result") or {}).get("outcome") or {}
        selected = outcome.get("optionId") if outcome.get("outcome") == "selected" else None
        status = "completed" if selected == "allow" else "failed"
        update = {"sessionUpdate": "tool_call_update", "toolCallId": call["toolCallId"]}
        self.update(turn.session_id, {**update, "status": status})
        said = f"selected:{selected}" if selected is not None else "cancelled"
        self.chunk(turn, "agent_message_chunk", said)

    def call_mcp(self, session_id: str, rest: str) -> str:
        tool, _, arguments = rest.partition(" ")
        servers = [s for s in self.sessions.get(session_id, []) if "command" in s]
        if not servers:
            return "mcp-error:no stdio MCP server was given in session/new or session/load"
        try:
            return "mcp:" + call_tool(servers[0], tool, json.loads(arguments or "{}"))
        except Exception as exc:  # reported to the client, whatever went wrong
            return f"mcp-error:{exc}"


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def call_tool(server: dict[str, Any], tool: str, arguments: dict[str, Any]) -> str:
    """One `tools/call` on a stdio MCP server spawned for it, then closed; the result's text."""
    env = dict(os.environ)
    env.update({item["name"]: item["value"] for item in server.get("env") or []})
    argv = [server["command"], *(server.get("args") or [])]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env) as proc:
        assert proc.stdin is not None and proc.stdout is not None

        def rpc(request_id: int | None, method: str, params: dict[str, Any]) -> dict[str, Any]:
            message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
            if request_id is not None:
                message["id"] = request_id
            proc.stdin.write((json.dumps(message) + "\n").encode())  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
            while request_id is not None:
                line = proc.stdout.readline()  # type: ignore[union-attr]
                if not line:
                    raise RuntimeError(
                        f"the MCP server closed its stdout before answering {method}"
                    )
                reply = json.loads(line)
                if reply.get("id") == request_id and "method" not in reply:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error'].get('message')}")
                    return reply.get("result") or {}
            return {}

        try:
            info = {"name": "mcphost-acp-standin", "version": "0"}
            rpc(
                1,
                "initialize",
                {"protocolVersion": MCP_PROTOCOL, "capabilities": {}, "clientInfo": info},
            )
            rpc(None, "notifications/initialized", {})
            result = rpc(2, "tools/call", {"name": tool, "arguments": arguments})
        finally:
            proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    texts = [
        item.get("text", "") for item in result.get("content") or [] if item.get("type") == "text"
    ]
    return "\n".join(texts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mcphost.testing.acp_agent")
    parser.add_argument("--no-load", action="store_true", help="do not advertise loadSession")
    parser.add_argument("--no-prompt", action="store_true", help="omit promptCapabilities")
    parser.add_argument("--history", help="a JSON-lines file holding the sessions' history")
    parser.add_argument("--fail", action="append", default=[], help="answer METHOD with an error")
    parser.add_argument(
        "--flood", choices=("requests", "updates"), help="after the handshake: stop reading, flood"
    )
    parser.add_argument("--flood-count", type=int, default=150_000, help="frames to flood")
    agent = Agent(parser.parse_args(argv))

    def poke(signum: int, frame: Any) -> None:
        agent.signals += 1
        agent.poked.set()

    signal.signal(signal.SIGUSR1, poke)
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError:
            log(f"not JSON: {line[:80]!r}")
            continue
        if isinstance(message, dict):
            agent.handle(message)
        if agent.options.flood and agent.flood_session is not None:
            agent.flood(agent.flood_session)
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
