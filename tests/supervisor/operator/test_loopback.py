"""The operator's loopback listener (loopback.py): the pure bookkeeping, then a real listener.

Pure: `Bounds` (per listener, per owner uid, released), `refusal` (agent uids first, an unknown
owner refused); the address and `Host` rules are values.py's (tests/supervisor/test_values.py).
Real, in process, on a `LoopbackServer` on 127.0.0.1: a half-sent request head is closed at the
head deadline (shortened here), a connection past the per-uid bound is closed at once, never
queued, every reply closes its connection (no keep-alive), a foreign `Host` is 403, and a
connection of an agent's uid (this process's, named as one) is closed before any byte is read;
the refusals are logged once per kind with the count left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from mcphost.supervisor.operator import loopback
from mcphost.supervisor.operator.loopback import (
    AGENT_PEER,
    PEER_UNKNOWN,
    LoopbackServer,
    refusal,
)
from mcphost.supervisor.values import LISTENER_FULL, PEER_FULL, Bounds, Listen
from tests.waiting import eventually


def test_bounds_count_per_listener_and_per_uid_and_release() -> None:
    bounds = Bounds(total=3, per_peer=2)
    assert bounds.admit(1000) is None and bounds.admit(1000) is None
    assert bounds.admit(1000) == PEER_FULL  # the uid's bound; nothing counted
    assert bounds.admit(1001) is None
    assert bounds.admit(1002) == LISTENER_FULL  # the listener's, whoever asks
    assert (bounds.open, bounds.by_uid) == (3, {1000: 2, 1001: 1})
    bounds.release(1000)
    bounds.release(1001)
    assert (bounds.open, bounds.by_uid) == (1, {1000: 1})
    assert bounds.admit(1002) is None


def test_an_agents_uid_or_an_unknown_owner_is_refused_before_any_bound_is_counted() -> None:
    bounds = Bounds(total=1, per_peer=1)
    assert refusal(None, frozenset(), bounds) == (PEER_UNKNOWN, -1)
    assert refusal(1234, frozenset({1234}), bounds) == (AGENT_PEER, 1234)
    assert bounds.open == 0
    assert refusal(0, frozenset({1234}), bounds) == (None, 0)
    assert refusal(0, frozenset(), bounds) == (LISTENER_FULL, 0)


async def _hello(request: web.Request) -> web.Response:
    return web.Response(text="hello")


@asynccontextmanager
async def serving(**kwargs: object) -> AsyncIterator[LoopbackServer]:
    app = web.Application()
    app.router.add_get("/", _hello)
    server = LoopbackServer(app, Listen(host="127.0.0.1", port=0), "test", **kwargs)  # type: ignore[arg-type]
    await server.start()
    try:
        yield server
    finally:
        await server.aclose()


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sent until it closed (a reset counts as closed)."""
    try:
        return await reader.read()
    except ConnectionResetError:
        return b""


async def _connect(server: LoopbackServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    assert server.bound is not None
    return await asyncio.open_connection(server.bound.host, server.bound.port)


def test_a_half_sent_head_is_closed_at_the_deadline_and_replies_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(loopback, "HEAD_SECONDS", 0.2)

    async def run() -> None:
        async with serving() as server:
            host = str(server.bound)
            reader, writer = await _connect(server)
            writer.write(f"GET / HTTP/1.1\r\nHost: {host}\r\nX-Waiting: ".encode())
            assert await asyncio.wait_for(_closed(reader), 30) == b""  # closed, unanswered
            await eventually(lambda: server.bounds.open == 0, "the bound released")

            reader, writer = await _connect(server)
            writer.write(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            reply = await asyncio.wait_for(_closed(reader), 30)  # the server closes after it
            assert reply.startswith(b"HTTP/1.1 200") and b"Connection: close" in reply
            assert reply.endswith(b"hello")

            reader, writer = await _connect(server)
            writer.write(b"GET / HTTP/1.1\r\nHost: rebound.example\r\n\r\n")
            assert (await asyncio.wait_for(_closed(reader), 30)).startswith(b"HTTP/1.1 403")
            writer.close()

    asyncio.run(run())


def test_past_the_per_uid_bound_a_connection_is_closed_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def run() -> None:
        async with serving(bounds=Bounds(total=64, per_peer=2)) as server:
            held = [await _connect(server) for _ in range(2)]
            await eventually(lambda: server.bounds.open == 2, "two admitted")
            with contextlib.suppress(ConnectionResetError):  # reset before seen through
                reader, _ = await _connect(server)
                assert await asyncio.wait_for(_closed(reader), 30) == b""  # never queued
            await eventually(lambda: server.refused == {PEER_FULL: 1}, "the third refused")
            assert server.bounds.open == 2
            for _, writer in held:
                writer.close()
            await eventually(lambda: server.bounds.open == 0, "the bound released")

    asyncio.run(run())


def test_a_connection_of_an_agents_uid_is_closed_and_logged_once_per_kind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines: list[tuple[str, dict[str, object]]] = []
    monkeypatch.setattr(
        loopback.events, "emit", lambda event, level="info", **f: lines.append((event, f))
    )

    async def run() -> None:
        async with serving(agent_uids=lambda: frozenset({os.geteuid()})) as server:
            for _ in range(5):
                try:
                    reader, writer = await _connect(server)
                    writer.write(b"GET / HTTP/1.1\r\n\r\n")
                except ConnectionResetError:
                    continue  # reset before the connect was seen through
                assert await asyncio.wait_for(_closed(reader), 30) == b""
            assert server.refused == {AGENT_PEER: 5} and server.bounds.open == 0

    asyncio.run(run())
    refused = [f for event, f in lines if event == "supervisor.listener_refused"]
    assert refused == [
        {"suppressed": 0, "listener": "test", "reason": AGENT_PEER, "uid": os.geteuid()}
    ]  # the four after it counted, for the next line
