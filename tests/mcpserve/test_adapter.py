"""The SDK server behind the adapter (mcphost/mcpserve/adapter.py), without a process.

`serve_streams` is driven over in-memory SDK streams with raw JSON-RPC messages (the same
`serve_streams` a supervisor hands Unix-socket streams).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from mcphost.mcpserve.adapter import serve_streams
from mcphost.surface import CallContext, RpcError, ToolResult, ToolSpec


class Slow:
    name = "slow"
    version = "1"
    instructions = None
    list_changed = True

    def __init__(self) -> None:
        self.cancelled: list[Any] = []
        self.started: list[Any] = []

    def list_tools(self) -> Sequence[ToolSpec]:
        return [
            ToolSpec("wait", "waits", {"type": "object"}),
            ToolSpec("shape", "structured", {"type": "object"}, output_schema={"type": "object"}),
        ]

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], ctx: CallContext
    ) -> ToolResult:
        self.started.append(ctx.request_id)
        if name == "boom":
            raise RuntimeError("secret detail")
        if name == "rpc":
            raise RpcError(-32602, "bad", {"code": "validation_x", "message": "m", "details": None})
        if name == "shape":
            await ctx.progress(1, 2, "half")
            await ctx.tools_changed()
            return ToolResult(text="{}", structured={"k": 1})
        try:
            await asyncio.sleep(arguments.get("seconds", 0))
        except asyncio.CancelledError:
            self.cancelled.append(ctx.request_id)
            raise
        return ToolResult(text="done")

    async def aclose(self) -> None:
        pass


class Session:
    """Raw JSON-RPC to `serve_streams` over in-memory SDK streams."""

    def __init__(self, surface: Slow) -> None:
        import anyio
        from mcp.shared.message import SessionMessage

        self.surface = surface
        self.to_server, self.server_in = anyio.create_memory_object_stream[
            SessionMessage | Exception
        ](16)
        self.server_out, self.from_server = anyio.create_memory_object_stream[SessionMessage](16)
        self.received: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        import mcp_types
        from mcp.shared.message import SessionMessage

        parsed = mcp_types.jsonrpc_message_adapter.validate_python(message, by_name=False)
        await self.to_server.send(SessionMessage(parsed))

    async def until(self, done: Any) -> list[dict[str, Any]]:
        while not done(self.received):
            item = await self.from_server.receive()
            self.received.append(
                json.loads(item.message.model_dump_json(by_alias=True, exclude_unset=True))
            )
        return self.received


def answered(*ids: Any) -> Any:
    return lambda got: set(ids) <= {m.get("id") for m in got if "method" not in m}


@pytest.mark.anyio
async def test_dispatch_cancellation_progress_and_errors() -> None:
    import anyio

    surface = Slow()
    s = Session(surface)
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_streams, surface, s.server_in, s.server_out)
        init = {"protocolVersion": "2025-06-18", "capabilities": {}}
        init["clientInfo"] = {"name": "t", "version": "1"}
        await s.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init})
        await s.until(answered(0))
        await s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = {"jsonrpc": "2.0", "method": "tools/call"}
        await s.send({**call, "id": 1, "params": {"name": "wait", "arguments": {"seconds": 30}}})
        await s.send({**call, "id": 2, "params": {"name": "wait", "arguments": {}}})
        await s.send({**call, "id": 3, "params": {"name": "boom"}})
        await s.send({**call, "id": 4, "params": {"name": "rpc"}})
        progress = {"progressToken": "p-1"}
        await s.send({**call, "id": 6, "params": {"name": "shape", "_meta": progress}})
        await s.send({"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
        await s.until(answered(2, 3, 4, 6, 7))
        assert 1 in surface.started
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled"}
        await s.send({**cancel, "params": {"requestId": 1}})
        await s.send({"jsonrpc": "2.0", "id": 5, "method": "ping"})
        got = await s.until(answered(5))
        await s.to_server.aclose()
    by_id = {m.get("id"): m for m in got if "method" not in m}
    assert surface.cancelled == [1]
    assert 1 not in by_id, "a cancelled request gets no answer"
    assert by_id[0]["result"]["capabilities"]["tools"] == {"listChanged": True}
    assert by_id[2]["result"]["content"][0]["text"] == "done"
    assert by_id[3]["error"]["code"] == -32603
    assert by_id[3]["error"]["data"]["code"] == "internal_unexpected_failure"
    assert "secret detail" not in json.dumps(by_id[3])
    assert by_id[4]["error"] == {
        "code": -32602,
        "message": "bad",
        "data": {"code": "validation_x", "message": "m", "details": None},
    }
    assert by_id[5]["result"] == {}
    assert by_id[6]["result"]["structuredContent"] == {"k": 1}
    assert by_id[7]["result"]["tools"][1]["outputSchema"] == {"type": "object"}
    notes = [m for m in got if "method" in m]
    assert {"method": "notifications/tools/list_changed", "jsonrpc": "2.0"} in [
        {k: v for k, v in m.items() if k != "params"} for m in notes
    ]
    assert any(
        m["method"] == "notifications/progress"
        and m["params"]
        == {"progressToken": "p-1", "progress": 1.0, "total": 2.0, "message": "half"}
        for m in notes
    )
