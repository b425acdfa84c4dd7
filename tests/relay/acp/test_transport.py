"""BoundedTransport (mcphost/relay/acp/transport.py): each bound of SECURITY.md X10 in process,
with a stream reader fed by the test and a writer whose drain the test holds (an agent that
stops reading its stdin); then an AcpSession over the hostile stand-in's real pipes.

No sleeps: waits are for the transport's own state (`eventually`), and the rate bound runs on a
clock the test moves.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any, cast

import pytest

from mcphost.relay.acp.session import AcpSession
from mcphost.relay.acp.transport import BoundedTransport, Bounds, Violation
from mcphost.relay.reasons import ACP_FLOOD as FLOOD
from tests.waiting import eventually

pytestmark = pytest.mark.anyio


class StalledWriter:
    """A StreamWriter whose drain waits until `flowing` is set (an agent not reading)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.flowing = asyncio.Event()
        self.aborted = False
        self.transport = self

    def write(self, data: bytes) -> None:
        self.written.append(data)

    async def drain(self) -> None:
        await self.flowing.wait()

    def abort(self) -> None:
        self.aborted = True


def made(
    bounds: Bounds,
    lines: list[bytes] = (),
    *,
    clock: Any = None,  # type: ignore[assignment]
) -> tuple[BoundedTransport, asyncio.StreamReader, StalledWriter, list[Violation]]:
    reader = asyncio.StreamReader(limit=64)  # frames longer than this are read in pieces
    for line in lines:
        reader.feed_data(line)
    writer = StalledWriter()
    told: list[Violation] = []
    kwargs: dict[str, Any] = {"clock": clock} if clock is not None else {}
    transport = BoundedTransport(
        reader, cast(asyncio.StreamWriter, writer), bounds, on_flood=told.append, **kwargs
    )
    return transport, reader, writer, told


def frame(message: dict[str, Any]) -> bytes:
    return (json.dumps(message) + "\n").encode()


def request(n: int) -> bytes:
    return frame({"jsonrpc": "2.0", "id": n, "method": "fs/read_text_file", "params": {}})


def reply(n: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": n, "result": None}


async def test_replies_the_agent_never_reads_end_the_connection_at_the_write_queue() -> None:
    transport, _, writer, told = made(Bounds(write_queue=4))
    sends = [asyncio.create_task(transport.send(reply(n))) for n in range(4)]
    await eventually(lambda: transport.queued[0] == 4, "four replies queued")
    assert transport.violation is None and len(writer.written) == 1  # one drains, three wait
    await transport.send(reply(4))  # the fifth: over the bound, dropped
    assert transport.violation is not None and transport.violation.bound == "write_queue"
    assert [v.bound for v in told] == ["write_queue"]  # told once
    assert "restart" in transport.violation.message and "stdin" in transport.violation.message
    with pytest.raises(ConnectionError):  # a request of ours is refused from now on
        await transport.send({"jsonrpc": "2.0", "id": 9, "method": "session/prompt"})
    assert await transport.receive() is None  # and the SDK reads end-of-stream
    await transport.close()
    assert writer.aborted  # what waited in the pipe's buffer is dropped
    writer.flowing.set()
    await asyncio.gather(*sends)
    assert transport.queued == (0, 0)
    assert len(writer.written) == 1  # the waiting replies were never written


async def test_bytes_waiting_for_the_agent_are_bounded() -> None:
    transport, _, writer, told = made(Bounds(write_bytes=1000))
    big = {"jsonrpc": "2.0", "id": 1, "result": {"text": "x" * 600}}
    first = asyncio.create_task(transport.send(big))  # one frame alone may exceed nothing
    await eventually(lambda: transport.queued[0] == 1, "the first reply draining")
    # a large request of ours (a prompt) is ours to bound: it waits, and counts for nothing
    prompt = {"jsonrpc": "2.0", "id": 5, "method": "session/prompt", "params": "p" * 5000}
    ours = asyncio.create_task(transport.send(prompt))
    await eventually(lambda: transport._write_lock.locked() and not ours.done(), "it waits")
    assert transport.queued[0] == 1 and told == []
    await transport.send({**big, "id": 2})  # a second reply: over the bytes bound
    assert [v.bound for v in told] == ["write_bytes"], told
    writer.flowing.set()
    await first
    with pytest.raises(ConnectionError):  # it was still waiting when the connection ended
        await ours


async def test_a_reader_that_keeps_up_is_never_cut_off() -> None:
    transport, _, writer, told = made(Bounds(write_queue=2, write_bytes=200))
    writer.flowing.set()
    for n in range(100):
        await transport.send(reply(n))
    assert told == [] and len(writer.written) == 100


async def test_requests_in_flight_make_it_read_less_not_queue() -> None:
    transport, reader, _, told = made(Bounds(in_flight=2), [request(1), request(2), request(3)])
    assert (await transport.receive() or {})["id"] == 1
    assert (await transport.receive() or {})["id"] == 2
    third = asyncio.create_task(transport.receive())
    await eventually(lambda: transport.paused, "the transport pausing at the bound")
    assert not third.done() and transport.in_flight == 2
    transport._writer.transport.flowing.set()  # type: ignore[attr-defined]
    await transport.send(reply(1))  # a slot frees: the next frame is read
    assert (await third or {})["id"] == 3
    assert transport.in_flight == 2 and told == []
    reader.feed_eof()


async def test_a_frame_over_the_bound_ends_the_connection() -> None:
    limit = 1000
    fits = frame({"jsonrpc": "2.0", "method": "x", "params": {"p": "y" * (limit - 60)}})
    assert len(fits) <= limit + 1
    transport, _, _, told = made(Bounds(frame_bytes=limit), [fits, b"z" * (limit + 1)])
    assert (await transport.receive() or {})["method"] == "x"  # read in pieces, whole
    assert await transport.receive() is None
    assert [v.bound for v in told] == ["frame_bytes"]


async def test_blank_and_malformed_lines_are_skipped_and_eof_ends() -> None:
    transport, reader, _, told = made(Bounds(), [b"\n  \n", b"not json\n", b"[1]\n", request(7)])
    reader.feed_data(b'{"jsonrpc":"2.0","id":8,"result":null}')  # the last, without a newline
    reader.feed_eof()
    assert (await transport.receive() or {})["id"] == 7
    assert await transport.receive() == {"jsonrpc": "2.0", "id": 8, "result": None}
    assert await transport.receive() is None and told == []


async def test_the_rate_bound_is_a_token_bucket_once_metered() -> None:
    now = [0.0]
    notes = [frame({"jsonrpc": "2.0", "method": "session/update", "params": {}})] * 8
    transport, _, _, told = made(Bounds(rate=2.0, burst=3), notes, clock=lambda: now[0])
    for _ in range(4):  # not metered yet (the bootstrap's replay): nothing counted
        assert await transport.receive() is not None
    transport.metered = True
    for _ in range(3):  # the burst
        assert await transport.receive() is not None
    now[0] += 0.5  # one token back
    assert await transport.receive() is not None
    assert told == []
    transport2, _, _, told2 = made(Bounds(rate=2.0, burst=3), notes, clock=lambda: now[0])
    transport2.metered = True
    for _ in range(3):
        assert await transport2.receive() is not None
    assert await transport2.receive() is None
    assert [v.bound for v in told2] == ["rate"]
    # lines that are not JSON (each one logged) count too, and replies
    junk = [b"not json\n"] * 5 + [frame(reply(1))]
    transport3, _, _, told3 = made(Bounds(rate=2.0, burst=3), junk, clock=lambda: now[0])
    transport3.metered = True
    assert await transport3.receive() is None
    assert [v.bound for v in told3] == ["rate"]


@pytest.mark.parametrize("kind", ["requests", "updates"])
async def test_a_flooding_agent_makes_the_session_unavailable_for_respawn(kind: str) -> None:
    """The hostile stand-in over real pipes: once set up it floods and never reads its stdin."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mcphost.testing.acp_agent", "--flood", kind,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    session = AcpSession(proc.stdout, proc.stdin, target_session="alpha@party")
    try:
        await session.bootstrap(os.getcwd())
        await eventually(lambda: session.state == "unavailable", "the flood to be cut off", 60)
        assert session.state_reason_code == FLOOD and session.needs_respawn
        violation = session.violation
        assert violation is not None and session.state_reason == violation.message
        expected = {"requests": ("write_queue", "write_bytes"), "updates": ("rate",)}[kind]
        assert violation.bound in expected, violation
        assert await session.prompt("anyone?") is False
    finally:
        await session.close()
        proc.kill()
        await proc.stdout.read()  # what it wrote before it died (its pipe stays paused else)
        await proc.wait()
