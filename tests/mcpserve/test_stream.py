"""`serve_socket`: the stdio session core over a connected socket (a socketpair, in-process).

Proven here: the framing's own answers are stdio's (-32700 without id, an over-cap line refused
under its recovered id with `message_too_large`, the rest of the line discarded); a half-close
is stdin's EOF (a call in flight still gets its answer, then the socket ends, "eof"); the
owner's `stop` ends the session at once ("stop"), the client reads the end, and the surface is
left for its owner to close. Sessions sharing a byte budget: while one holds it spent, another
is not read past the line it is in (and is read again once the budget is back to half),
yet a line larger than the whole budget is still read to its end and answered.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from mcphost.mcpserve.budget import Budget, Share
from mcphost.mcpserve.connection import Limits
from mcphost.mcpserve.stream import serve_socket
from mcphost.surface import CallContext, ToolResult, ToolSpec

INIT = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "stream-test", "version": "1"},
}


class Waiter:
    name = "waiter"
    version = "1"
    instructions = None
    list_changed = False

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.closed = False

    def list_tools(self) -> Sequence[ToolSpec]:
        return [ToolSpec("wait", "waits until released", {"type": "object"})]

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], ctx: CallContext
    ) -> ToolResult:
        self.started.set()
        await self.release.wait()
        return ToolResult(text="released")

    async def aclose(self) -> None:
        self.closed = True


class Peer:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def request(self, request_id: Any, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(json.dumps(message).encode() + b"\n")

    async def answer(self) -> dict[str, Any]:
        line = await self.reader.readline()
        assert line, "the stream ended"
        return dict(json.loads(line))


async def start(
    surface: Waiter, limits: Limits | None = None, share: Share | None = None
) -> tuple[Peer, asyncio.Event, asyncio.Task[str]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setblocking(False)
    stop = asyncio.Event()
    served = asyncio.ensure_future(
        serve_socket(surface, ours, stop=stop, limits=limits, share=share)
    )
    reader, writer = await asyncio.open_connection(sock=theirs)
    peer = Peer(reader, writer)
    await peer.request(0, "initialize", INIT)
    assert "result" in await peer.answer()
    await peer.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    return peer, stop, served


@pytest.mark.anyio
async def test_the_framing_answers_as_stdio_and_a_half_close_is_eof() -> None:
    surface = Waiter()
    peer, _, served = await start(surface, Limits(max_line_bytes=4096))
    await peer.send(b"{not json\n")
    error = await peer.answer()
    assert error["error"]["code"] == -32700 and "id" not in error
    await peer.send(b'{"jsonrpc":"2.0","id":7,"method":"ping","params":{"pad":"' + b"x" * 8000)
    await peer.send(b'"}}\n')
    too_long = await peer.answer()
    assert too_long["id"] == 7 and too_long["error"]["code"] == -32600
    assert too_long["error"]["data"]["code"] == "message_too_large"
    await peer.request(8, "tools/call", {"name": "wait", "arguments": {}})
    await surface.started.wait()
    peer.writer.write_eof()  # the pump's shutdown(SHUT_WR) at its stdin EOF
    surface.release.set()
    answer = await peer.answer()
    assert answer["id"] == 8 and answer["result"]["content"][0]["text"] == "released"
    assert await peer.reader.read() == b"", "then the session ends and the socket closes"
    assert await served == "eof"
    assert not surface.closed, "the surface is its owner's to close"
    peer.writer.close()


@pytest.mark.anyio
async def test_stop_ends_the_session_at_once() -> None:
    surface = Waiter()
    peer, stop, served = await start(surface)
    await peer.request(1, "tools/call", {"name": "wait", "arguments": {}})
    await surface.started.wait()
    stop.set()
    assert await served == "stop"
    rest = [json.loads(line) for line in (await peer.reader.read()).splitlines()]
    # the client sees the stream end; the SDK may close the cut call with an error, never a result
    assert all("result" not in m for m in rest), rest
    assert not surface.closed
    peer.writer.close()


async def until_true(condition: Any) -> None:
    """Let the loop run until `condition()` holds (the test's own timeout bounds a hang)."""
    while not condition():
        await asyncio.sleep(0.001)


@pytest.mark.anyio
async def test_sessions_sharing_a_spent_budget_stop_reading_but_finish_a_line() -> None:
    budget = Budget(64 * 1024)
    holder, other = Waiter(), Waiter()
    one, stop_one, served_one = await start(holder, share=budget.share())
    two, stop_two, served_two = await start(other, share=budget.share())
    # session one spends the budget: a call held with 70 KB of arguments
    await one.request(1, "tools/call", {"name": "wait", "arguments": {"pad": "x" * 70_000}})
    await holder.started.wait()
    assert budget.used >= budget.capacity
    # a line larger than the whole budget is still read to its end and answered
    await two.request(2, "ping", {"_meta": {"pad": "y" * 600_000}})
    assert (await two.answer())["id"] == 2
    # then, between lines, session two waits for room like session one
    await until_true(lambda: budget.waiting == 2)
    await two.request(3, "ping")
    assert budget.waiting == 2 and budget.used < 70_000 + 1_000, "session two read nothing"
    holder.release.set()  # the call is answered: the budget is back under half
    assert (await one.answer())["id"] == 1
    assert (await two.answer())["id"] == 3
    for stop, served, peer in ((stop_one, served_one, one), (stop_two, served_two, two)):
        stop.set()
        await served
        peer.writer.close()
