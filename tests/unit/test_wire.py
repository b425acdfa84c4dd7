"""The wire core without a process: framing, dispatch, cancellation, error shapes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from mcphost.mcpwire import stdio
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

    async def send(self, message: Mapping[str, Any]) -> None:
        self.sent.append(json.loads(stdio._dumps(message)))


class Slow:
    name = "slow"
    version = "1"
    instructions = None
    list_changed = False

    def __init__(self) -> None:
        self.cancelled: list[Any] = []

    def list_tools(self) -> Sequence[ToolSpec]:
        return [ToolSpec("wait", "waits", {"type": "object"})]

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], ctx: CallContext
    ) -> ToolResult:
        if name == "boom":
            raise RuntimeError("secret detail")
        if name == "rpc":
            raise RpcError(-32602, "bad", {"code": "validation_x"})
        try:
            await asyncio.sleep(arguments.get("seconds", 0))
        except asyncio.CancelledError:
            self.cancelled.append(ctx.request_id)
            raise
        return ToolResult(text="done")

    async def aclose(self) -> None:
        pass


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode()


@pytest.mark.anyio
async def test_dispatch_cancellation_and_errors() -> None:
    wire = Recorder()
    surface = Slow()
    server = stdio.StdioServer(surface, wire)  # type: ignore[arg-type]
    call = {"jsonrpc": "2.0", "method": "tools/call"}
    server.on_line(line({**call, "id": 1, "params": {"name": "wait", "arguments": {"seconds": 5}}}))
    server.on_line(line({**call, "id": 2, "params": {"name": "wait", "arguments": {}}}))
    server.on_line(line({**call, "id": 3, "params": {"name": "boom"}}))
    server.on_line(line({**call, "id": 4, "params": {"name": "rpc"}}))
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled"}
    server.on_line(line({**cancel, "params": {"requestId": True}}))  # not id 1
    server.on_line(line({**cancel, "params": {"requestId": [1]}}))
    await asyncio.sleep(0.05)
    assert surface.cancelled == []
    server.on_line(line({**cancel, "params": {"requestId": 1}}))
    server.on_line(line({"jsonrpc": "2.0", "id": 5, "method": "ping"}))
    server.on_line(b"{not json")
    server.on_line(line({"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"}))
    await asyncio.sleep(0.05)
    by_id: dict[Any, dict[str, Any]] = {}
    for message in wire.sent:
        by_id.setdefault(message.get("id"), message)
    assert surface.cancelled == [1]
    assert 1 not in by_id, "a cancelled request gets no answer"
    assert by_id[2]["result"]["content"][0]["text"] == "done"
    assert by_id[3]["error"]["code"] == -32603
    assert by_id[3]["error"]["data"]["code"] == "internal_unexpected_failure"
    assert "secret detail" not in json.dumps(by_id[3])
    assert by_id[4]["error"] == {"code": -32602, "message": "bad", "data": {"code": "validation_x"}}
    assert by_id[5]["result"] == {}
    idless = [m["error"]["code"] for m in wire.sent if "id" not in m]
    assert sorted(idless) == [-32700, -32600]
    assert all(m["id"] is not None for m in wire.sent if "id" in m), "MCP: omit, never null"


@pytest.mark.anyio
async def test_initialize_echoes_known_versions_and_offers_latest_otherwise() -> None:
    wire = Recorder()
    server = stdio.StdioServer(Slow(), wire)  # type: ignore[arg-type]
    for n, version in enumerate(["2024-11-05", "1999-01-01"], start=1):
        server.on_line(
            line(
                {
                    "jsonrpc": "2.0",
                    "id": n,
                    "method": "initialize",
                    "params": {"protocolVersion": version},
                }
            )
        )
        await asyncio.sleep(0.01)
    versions = [m["result"]["protocolVersion"] for m in wire.sent]
    assert versions == ["2024-11-05", "2025-11-25"]


def test_lone_surrogates_are_escaped_not_dropped() -> None:
    encoded = stdio._dumps({"jsonrpc": "2.0", "id": 1, "error": {"message": "\ud800"}})
    assert json.loads(encoded)["error"]["message"] == "\ud800"
