"""The protocol core without a process: our framing, and the SDK server behind the adapter.

The adapter is driven over in-memory SDK streams with raw JSON-RPC messages (the same
`serve_streams` a supervisor hands Unix-socket streams); the framing by feeding lines.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from mcphost.mcpserve import stdio
from mcphost.mcpserve.adapter import serve_streams
from mcphost.surface import CallContext, RpcError, ToolResult, ToolSpec


def test_lines_split_across_chunks_and_overlong_lines_are_discarded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stdio, "MAX_LINE_BYTES", 16)
    lines: list[bytes] = []
    overlong: list[bytes] = []
    reader = stdio._LineReader(lines.append, overlong.append)
    reader.feed(b'{"a":')
    reader.feed(b"1}\n\n  \n{")
    reader.feed(b"x" * 40)  # over the cap: dropped up to the next newline
    reader.feed(b"yyy\n[2]\n")
    reader.feed(b"[3]")
    reader.eof_received()
    assert lines == [b'{"a":1}', b"[2]", b"[3]"]
    assert overlong == [b"{" + b"x" * 40]  # the line's start, for the id; the rest is skipped


def test_a_full_line_over_the_cap_in_one_chunk_is_refused_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stdio, "MAX_LINE_BYTES", 16)
    lines: list[bytes] = []
    overlong: list[bytes] = []
    reader = stdio._LineReader(lines.append, overlong.append)
    reader.feed(b'{"id":1,"pad":"' + b"x" * 20 + b'"}\n[1]\n')
    assert lines == [b"[1]"]
    assert overlong == [b'{"id":1,"pad":"' + b"x" * 20 + b'"}']


def test_the_reader_stops_splitting_while_saturated_and_resumes_where_it_stopped() -> None:
    lines: list[bytes] = []
    full = [False]
    reader = stdio._LineReader(lines.append, lambda prefix: None, lambda: full[0])

    def take(line: bytes) -> None:
        lines.append(line)
        full[0] = len(lines) == 2  # saturated right after the second line

    reader._on_line = take
    reader.feed(b"[1]\n[2]\n[3]\n[4")
    assert lines == [b"[1]", b"[2]"] and reader.paused and not reader.room.is_set()
    reader.eof_received()  # EOF seen while paused waits for the held lines
    assert not reader.eof.is_set()
    full[0] = False
    reader.resume()
    assert lines == [b"[1]", b"[2]", b"[3]", b"[4"]
    assert reader.eof.is_set() and not reader.paused


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        (b'{"jsonrpc":"2.0","id":7,"method":"ping","params":{"pad":"xxx', 7),
        (
            b'\xef\xbb\xbf {"method":"x","params":{"id":5,"a":[{"id":3}]},"id" : "r-\\u00e9","p',
            "r-\u00e9",
        ),
        (b'{"a":true,"b":null,"c":[1,"]"],"id":-12,"d":"', -12),
        (b'{"params":{"id":5,"pad":"xxxx', None),  # only a nested id so far
        (b'{"id":12', None),  # cut off: the number may go on
        (b'{"id":12.5,', None),
        (b'{"id":null,', None),
        (b'{"id":true,', None),
        (b'{"id":[1],', None),
        (b'{"id":"cut', None),
        (b'{"id":1,"id":2,', None),  # ambiguous
        (b'{"result":{},"id":1,', None),  # a response
        (b'[{"id":1},', None),
        (b'{"a":"\xff","id":1,', None),  # not UTF-8
        (b'{"id":' + b"9" * 5000 + b",", None),  # beyond Python's int-parsing limit
        (b'{"id":1,"x":' + b"[" * 100_000, 1),  # deep nesting: no recursion
    ],
)
def test_recovering_the_id_of_an_over_cap_line(prefix: bytes, expected: Any) -> None:
    assert stdio.recover_request_id(prefix) == expected


def test_recovering_the_id_reads_only_the_scan_window() -> None:
    late = b'{"pad":"' + b"x" * stdio.ID_SCAN_BYTES + b'","id":9,'
    assert stdio.recover_request_id(late) is None


class Recorder:
    """A wire that keeps what would have been written."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.closed = False

    async def send(self, message: Any) -> None:
        data = message() if callable(message) else stdio._dumps(message)
        self.sent.append(json.loads(data))


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


@pytest.mark.anyio
async def test_the_framing_answers_what_never_becomes_a_message() -> None:
    wire = Recorder()
    transport = stdio.StdioTransport(wire)  # type: ignore[arg-type]
    for raw in (
        b"{not json",
        b'{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}',
        b'{"jsonrpc":"2.0","id":"p","method":"ping","params":[1]}',
        b'{"id":"v","method":"ping"}',
        b'{"jsonrpc":"2.0","method":"notifications/whatever","params":7}',
    ):
        assert await transport._parse(raw) is None
    assert [(m.get("id"), m["error"]["code"]) for m in wire.sent] == [
        (None, -32700),
        (None, -32600),
        ("p", -32602),
        ("v", -32600),
    ]
    assert all("id" not in m for m in wire.sent[:2]), "MCP: omit, never null"
    assert await transport._parse(b'{"jsonrpc":"2.0","id":1,"method":"ping"}') is not None
    assert await transport._parse(b'{"jsonrpc":"2.0","id":"1","method":"ping"}') is None
    assert wire.sent[-1] == {
        "jsonrpc": "2.0",
        "id": "1",
        "error": {"code": -32600, "message": "duplicate request id"},
    }


def test_lone_surrogates_are_escaped_not_dropped() -> None:
    import mcp_types

    encoded = stdio._dumps({"jsonrpc": "2.0", "id": 1, "error": {"message": "\ud800"}})
    assert json.loads(encoded)["error"]["message"] == "\ud800"
    error = mcp_types.JSONRPCError(
        jsonrpc="2.0", id=None, error=mcp_types.ErrorData(code=-32600, message="\ud800")
    )
    line = json.loads(stdio._encode(error))
    assert "id" not in line and line["error"]["message"] == "\ud800"
