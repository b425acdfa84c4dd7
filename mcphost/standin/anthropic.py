"""A loopback stand-in for the Anthropic Messages API that replays a fixed script of turns.

Owns: a real HTTP server (aiohttp, 127.0.0.1, its own thread and event loop) that answers what
Claude Code asks of its model API — `POST /v1/messages` streamed as server-sent events or as one
JSON body, `POST /v1/messages/count_tokens`, and anything else with an empty JSON object — and a
record of every model request (or of the last `keep`): the tools it offered and the tool
results it carried.

The script is a list of turns, served in order, one per model request; past the end, the last
turn repeats. A turn may wait until the request offers a tool (`ToolUse.once_offered`): a
condition on what the client sends, never a delay. Requests that offer no tools at all (side
requests: titles, quota probes) get a short text answer and do not count as turns. The
credential of every model request (its `Authorization` or `x-api-key` header) is kept in order
(`credentials`), so a test sees which sign-in a client used.

"Offered" means what the model could see: the request's `tools` array plus the tool names
Claude Code announces in text when its own tool search defers them (`offered_tools`).

Must never: reach the network (it binds loopback only) or decide anything from wall-clock time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web


@dataclass(frozen=True)
class ToolUse:
    """A turn in which the model calls `name` with `input` (stop_reason "tool_use").

    With `once_offered`, the turn waits until a request offers `name`: requests that do not
    are answered with the stand-in's `meanwhile` turn, and the script does not advance."""

    name: str
    input: dict[str, Any]
    once_offered: bool = False


@dataclass(frozen=True)
class Say:
    """A turn in which the model answers with text and ends (stop_reason "end_turn")."""

    text: str


Turn = ToolUse | Say


@dataclass
class Exchange:
    """One main-loop model request and the turn that answered it (`turn` is its index in the
    script, or None for a `meanwhile` answer)."""

    turn: int | None
    tools: list[str]
    offered: set[str]
    tool_results: list[dict[str, Any]]
    streamed: bool
    body: dict[str, Any] = field(repr=False)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool_result blocks sent since the model's last turn: tool_use_id, is_error, text
    (the text parts joined) and content (as sent).

    Claude Code may put other messages (a system notice of newly available tools) after them,
    so every message after the last assistant message counts."""
    messages = body.get("messages") or []
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    found = []
    for message in messages[last + 1 :]:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        found += [
            {
                "tool_use_id": block.get("tool_use_id"),
                "is_error": bool(block.get("is_error", False)),
                "text": _text_of(block.get("content")),
                "content": block.get("content"),
            }
            for block in content
            if isinstance(block, dict) and block.get("type") == "tool_result"
        ]
    return found


_TOOL_NAME = re.compile(r"\bmcp__[A-Za-z0-9_-]+")


def offered_tools(body: dict[str, Any]) -> set[str]:
    """Every tool the request offers the model: the `tools` array, plus the names Claude Code
    announces in text when its own tool search defers them ("The following deferred tools are
    now available via ToolSearch ..."). Tool calls and tool results are not offers."""
    names = {str(t.get("name")) for t in body.get("tools") or [] if isinstance(t, dict)}
    texts = [_text_of(body.get("system"))]
    for message in body.get("messages") or []:
        if message.get("role") == "assistant":
            continue
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [
                str(block.get("text", ""))
                for block in content
                if isinstance(block, dict) and block.get("type") == "text"
            ]
    for text in texts:
        names.update(_TOOL_NAME.findall(text))
    return names


class ModelStandIn:
    """Serve `script` on 127.0.0.1; `base_url` is what ANTHROPIC_BASE_URL should be.

    `meanwhile` answers requests while a `once_offered` turn waits, at most `max_waits` times
    (then the turn is served anyway, so a tool that never appears fails the test visibly)."""

    def __init__(
        self, script: Sequence[Turn], *, meanwhile: Turn | None = None, max_waits: int = 20
    ) -> None:
        if not script:
            raise ValueError("the script needs at least one turn")
        if meanwhile is None and any(isinstance(t, ToolUse) and t.once_offered for t in script):
            raise ValueError("a once_offered turn needs a meanwhile turn")
        self.script = list(script)
        self.meanwhile = meanwhile
        self.max_waits = max_waits
        self._next = 0
        self._waits = 0
        self.exchanges: list[Exchange] = []
        self.side_requests: list[dict[str, Any]] = []
        self.other_requests: list[tuple[str, str]] = []
        self.credentials: list[str] = []  # "Bearer ..." or "x-api-key ...", per model request
        self.keep: int | None = None  # how many of each record to keep (None: every one)
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- the HTTP surface -------------------------------------------------------------------
    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_route("*", "/{tail:.*}", self._anything)
        return app

    async def _anything(self, request: web.Request) -> web.Response:
        self._record(self.other_requests, (request.method, request.path_qs))
        return web.json_response({})

    async def _count_tokens(self, request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response({"input_tokens": max(1, len(body) // 4)})

    def _note_credential(self, request: web.Request) -> None:
        if "Authorization" in request.headers:
            self._record(self.credentials, request.headers["Authorization"])
        elif "x-api-key" in request.headers:
            self._record(self.credentials, f"x-api-key {request.headers['x-api-key']}")

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        self._note_credential(request)
        body = await request.json()
        streamed = bool(body.get("stream"))
        tools = [str(t.get("name")) for t in body.get("tools") or [] if isinstance(t, dict)]
        if not tools:
            self._record(self.side_requests, body)
            turn: Turn = Say("ok")
        else:
            offered = offered_tools(body)
            turn, served = self.choose(body, offered)
            self._record(
                self.exchanges,
                Exchange(
                    turn=served,
                    tools=tools,
                    offered=offered,
                    tool_results=tool_results(body),
                    streamed=streamed,
                    body=body,
                ),
            )
        message = self._message(turn, str(body.get("model", "stand-in")))
        if not streamed:
            return web.json_response(message)
        return await self._stream(request, message)

    def _record(self, records: list[Any], item: Any) -> None:
        """Keep `item` in `records`: all of them, or the last `keep` (a long-running stand-in)."""
        records.append(item)
        if self.keep is not None:
            del records[: -self.keep]

    def choose(self, body: dict[str, Any], offered: set[str]) -> tuple[Turn, int | None]:
        """The turn that answers a main-loop request, and its index in the script (None for
        `meanwhile`): the script's next turn, unless it waits for a tool not yet offered.
        A subclass may decide from the request instead (mcphost/standin/director.py)."""
        index = min(self._next, len(self.script) - 1)
        turn = self.script[index]
        waiting = isinstance(turn, ToolUse) and turn.once_offered and turn.name not in offered
        if waiting and self.meanwhile is not None and self._waits < self.max_waits:
            self._waits += 1
            return self.meanwhile, None
        self._next += 1
        return turn, index

    def _message(self, turn: Turn, model: str) -> dict[str, Any]:
        n = next(self._ids)
        if isinstance(turn, ToolUse):
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": f"toolu_standin_{n:04d}",
                "name": turn.name,
                "input": turn.input,
            }
            stop = "tool_use"
        else:
            block = {"type": "text", "text": turn.text}
            stop = "end_turn"
        return {
            "id": f"msg_standin_{n:04d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [block],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 10},
        }

    async def _stream(self, request: web.Request, message: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)

        async def send(event: str, data: dict[str, Any]) -> None:
            await response.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())

        block = message["content"][0]
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        }
        await send("message_start", {"type": "message_start", "message": start})
        if block["type"] == "tool_use":
            opening = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            opening = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        await send(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": opening},
        )
        await send(
            "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
        )
        await send("content_block_stop", {"type": "content_block_stop", "index": 0})
        await send(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": 10},
            },
        )
        await send("message_stop", {"type": "message_stop"})
        await response.write_eof()
        return response

    # -- lifecycle --------------------------------------------------------------------------
    @contextmanager
    def running(self, port: int = 0) -> Iterator[Self]:
        """Serve in a background thread until the block ends, on `port` (0: a free one)."""
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        async def start() -> None:
            self._runner = web.AppRunner(self._app(), access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", port)
            await site.start()
            self.port = int(self._runner.addresses[0][1])

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(start())
            except BaseException as exc:  # reported to the starting thread
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            assert self._runner is not None
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        thread = threading.Thread(target=serve, name="model-standin", daemon=True)
        thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        try:
            yield self
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
