"""A loopback stand-in for the OpenAI Responses API, as Codex asks it (`OPENAI_BASE_URL`).

Owns: a real HTTP server (aiohttp, 127.0.0.1; the thread, loop and lifecycle of
`model_standin.ModelStandIn`, reused) that answers `POST /v1/responses` with one short
assistant message streamed as server-sent events (`response.created`, `response.output_item
.done`, `response.completed`) and anything else with an empty JSON object; and a record of
every request (`responses`: the bodies; `other_requests`: method and path).

Must never: reach the network (it binds loopback only) or decide anything from wall-clock time.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tests.blackbox.model_standin import ModelStandIn, Say


class ResponsesStandIn(ModelStandIn):
    """Serve `text` as every model answer; `base_url` is what OPENAI_BASE_URL should be."""

    def __init__(self, text: str = "ok") -> None:
        super().__init__([Say(text)])
        self.text = text
        self.responses: list[dict[str, Any]] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_route("*", "/{tail:.*}", self._anything)
        return app

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.responses.append(body)
        n = next(self._ids)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)

        async def send(event: str, data: dict[str, Any]) -> None:
            await response.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())

        rid = f"resp_standin_{n:04d}"
        item = {
            "type": "message",
            "id": f"msg_standin_{n:04d}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": self.text, "annotations": []}],
        }
        await send("response.created", {"type": "response.created", "response": {"id": rid}})
        await send(
            "response.output_item.done",
            {"type": "response.output_item.done", "output_index": 0, "item": item},
        )
        usage = {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 1,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 11,
        }
        await send(
            "response.completed",
            {"type": "response.completed", "response": {"id": rid, "usage": usage}},
        )
        await response.write_eof()
        return response
