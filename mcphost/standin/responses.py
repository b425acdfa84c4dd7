"""A loopback stand-in for the OpenAI Responses API, as Codex asks it (its base URL is
Codex's `openai_base_url` setting, e.g. `-c openai_base_url=...`).

Owns: a real HTTP server (aiohttp, 127.0.0.1; the thread, loop and lifecycle of
`anthropic.ModelStandIn`, reused) that answers `POST /v1/responses` with server-sent events
(`response.created`, `response.output_item.done`, `response.completed`) and anything else with
an empty JSON object; the script those answers follow; and a record of every request
(`responses`: the bodies; `credentials`: their `Authorization` headers; `other_requests`:
method and path).

The script is a list of turns served in order, one per `POST /v1/responses`; past its end the
last turn repeats. A `Say` turn is one assistant message. A `Code` turn is one call of Codex's
`exec` tool (Codex 0.171's "code mode": a custom tool whose input is JavaScript that calls the
nested tools — `tools.exec_command`, `tools.apply_patch`, the MCP servers' tools — itself); the
tool's output comes back in the next request (`tool_outputs`). The default script is one
`Say(text)`.

Must never: reach the network (it binds loopback only) or decide anything from wall-clock time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from mcphost.standin.anthropic import ModelStandIn, Say

USAGE = {
    "input_tokens": 10,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 1,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 11,
}


@dataclass(frozen=True)
class Code:
    """A turn in which the model calls Codex's `exec` tool with JavaScript `source`."""

    source: str


@dataclass(frozen=True)
class Call:
    """A turn in which the model calls the function tool `name` (in `namespace`, as Codex
    groups an MCP server's tools: `mcp__<server>`) with `arguments`."""

    name: str
    arguments: dict[str, Any]
    namespace: str | None = None


@dataclass(frozen=True)
class Patch:
    """A turn in which the model calls Codex's freeform `apply_patch` tool with `patch`."""

    patch: str


CodexTurn = Say | Code | Call | Patch


def tool_outputs(body: dict[str, Any]) -> list[str]:
    """The outputs of tool calls a Responses request carries, as text (`output` as sent, or
    its text parts joined)."""
    found = []
    for item in body.get("input", []):
        if isinstance(item, dict) and str(item.get("type", "")).endswith("_call_output"):
            output = item.get("output")
            if isinstance(output, list):
                output = "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
            found.append(str(output))
    return found


class ResponsesStandIn(ModelStandIn):
    """Serve `script` (default: `text` as every answer); `base_url` is Codex's base URL."""

    def __init__(self, text: str = "ok", script: Sequence[CodexTurn] = ()) -> None:
        super().__init__([Say(text)])
        self.text = text
        self.turns: list[CodexTurn] = list(script) or [Say(text)]
        self.responses: list[dict[str, Any]] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/responses", self._no_websocket)
        app.router.add_route("*", "/{tail:.*}", self._anything)
        return app

    async def _no_websocket(self, request: web.Request) -> web.Response:
        """Codex first asks for the Responses API over a WebSocket (`GET /v1/responses`,
        `Upgrade: websocket`); 426 Upgrade Required makes it use HTTPS at once, where any
        other answer costs five reconnects (seconds) and an agent message saying it fell back."""
        self._record(self.other_requests, (request.method, request.path_qs))
        return web.Response(status=426, text="websocket transport not offered")

    def _item(self, turn: CodexTurn, n: int) -> dict[str, Any]:
        if isinstance(turn, Code | Patch):
            name, text = (
                ("exec", turn.source) if isinstance(turn, Code) else ("apply_patch", turn.patch)
            )
            return {
                "type": "custom_tool_call",
                "id": f"ctc_standin_{n:04d}",
                "call_id": f"call_standin_{n:04d}",
                "name": name,
                "input": text,
                "status": "completed",
            }
        if isinstance(turn, Call):
            item: dict[str, Any] = {
                "type": "function_call",
                "id": f"fc_standin_{n:04d}",
                "call_id": f"call_standin_{n:04d}",
                "name": turn.name,
                "arguments": json.dumps(turn.arguments),
                "status": "completed",
            }
            if turn.namespace is not None:
                item["namespace"] = turn.namespace
            return item
        return {
            "type": "message",
            "id": f"msg_standin_{n:04d}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": turn.text, "annotations": []}],
        }

    def next_turn(self, body: dict[str, Any]) -> CodexTurn:
        """The turn that answers `body`: the script's next (a subclass may decide from the
        request instead: mcphost/standin/director.py)."""
        return self.turns[min(len(self.responses), len(self.turns) - 1)]

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        self._note_credential(request)
        body = await request.json()
        turn = self.next_turn(body)
        self._record(self.responses, body)
        n = next(self._ids)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)

        async def send(event: str, data: dict[str, Any]) -> None:
            await response.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())

        rid = f"resp_standin_{n:04d}"
        await send("response.created", {"type": "response.created", "response": {"id": rid}})
        await send(
            "response.output_item.done",
            {"type": "response.output_item.done", "output_index": 0, "item": self._item(turn, n)},
        )
        await send(
            "response.completed",
            {"type": "response.completed", "response": {"id": rid, "usage": USAGE}},
        )
        await response.write_eof()
        return response
