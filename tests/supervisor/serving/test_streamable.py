"""HttpHub in process: a real listener on the loopback, the SDK's real streamable-HTTP client.

The hub is given hooks that stand for the supervisor's (surfaces.py): the test's own uid is the
agent's, at a generation the test moves; the surface answers one tool, `whoami`, with the
identity the hub handed it. The supervisor as a whole (agents of their own uids, the center)
is tests/supervisor/test_supervise_http.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from mcphost.mcpserve.budget import Budgets
from mcphost.supervisor.refusals import Refused
from mcphost.supervisor.serving import streamable
from mcphost.supervisor.serving.sessions import Attached
from mcphost.supervisor.serving.streamable import HttpHub
from mcphost.surface import CallContext, ToolResult, ToolSpec
from tests.waiting import eventually

pytestmark = pytest.mark.anyio


class Whoami:
    """A surface of one tool that names the session's agent and generation."""

    name = "whoami"
    version = "0"
    instructions = None
    list_changed = False

    def __init__(self, attached: Attached) -> None:
        self.attached = attached
        self.closed = False

    def list_tools(self) -> Sequence[ToolSpec]:
        return [ToolSpec("whoami", "who this session is", {"type": "object"})]

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], ctx: CallContext
    ) -> ToolResult:
        who = {"agent": self.attached.agent_id, "generation": self.attached.generation}
        return ToolResult(json.dumps(who))

    async def aclose(self) -> None:
        self.closed = True


class Blocking(Whoami):
    """`whoami` that answers only once `release` is set: calls held in flight."""

    release: asyncio.Event

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], ctx: CallContext
    ) -> ToolResult:
        await self.release.wait()
        return await super().call_tool(name, arguments, ctx)


class Agent:
    """The hooks: the test's uid is agent `a` at `generation` (when `serves`)."""

    def __init__(self) -> None:
        self.generation = 1
        self.serves = True
        self.surfaces: list[Whoami] = []
        self.release: asyncio.Event | None = None  # set: every call waits for it

    def identify(self, surface: str, uid: int) -> Attached:
        assert uid == os.geteuid()
        return Attached("a", self.generation)

    def surface_for(self, surface: str, attached: Attached) -> Whoami:
        if surface == "relay":
            raise Refused("surface_unavailable", "no relay here")
        if self.release is not None:
            blocking = Blocking(attached)
            blocking.release = self.release
            self.surfaces.append(blocking)
        else:
            self.surfaces.append(Whoami(attached))
        return self.surfaces[-1]


@asynccontextmanager
async def running(agent: Agent, budget: int = 1 << 20) -> AsyncIterator[HttpHub]:
    hub = HttpHub(
        identify=agent.identify,
        surface_for=agent.surface_for,
        serves=lambda uid: agent.serves and uid == os.geteuid(),
        budgets=Budgets(budget),
    )
    await hub.start()
    try:
        yield hub
    finally:
        await hub.aclose()


async def whoami(session: ClientSession) -> dict[str, Any]:
    result = await session.call_tool("whoami", {})
    return dict(json.loads(result.content[0].text))  # type: ignore[union-attr]


@asynccontextmanager
async def client(url: str) -> AsyncIterator[ClientSession]:
    """The SDK's own streamable-HTTP client, initialized."""
    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def test_a_session_is_the_agents_at_its_generation_and_ends_with_it() -> None:
    agent = Agent()
    async with running(agent) as hub:
        async with client(hub.url("center")) as session:
            assert await whoami(session) == {"agent": "a", "generation": 1}
            assert hub.count("a", "center") == 1
            agent.generation = 2  # a respawn: the supervisor closes what is older
            assert hub.close_where(lambda a: a.generation < 2) == 1
            with pytest.raises(Exception):  # noqa: B017 (the SDK's error for a 404)
                await whoami(session)
        await eventually(lambda: agent.surfaces[0].closed, "the old surface closed")
        async with client(hub.url("center")) as session:
            assert await whoami(session) == {"agent": "a", "generation": 2}


async def test_a_session_of_an_older_generation_is_refused_even_unclosed() -> None:
    agent = Agent()
    async with running(agent) as hub, httpx2.AsyncClient() as http:
        opened = await http.post(hub.url("center"), json=initialize(), headers=HEADERS)
        sid = opened.headers["mcp-session-id"]
        agent.generation = 2  # the kernel's word now names generation 2
        again = await http.post(
            hub.url("center"), json=tools_list(), headers={**HEADERS, "mcp-session-id": sid}
        )
        assert again.status_code == 404
        assert again.json()["error"]["code"] == "session_closed"


async def test_a_connection_the_hub_does_not_serve_is_reset_unread() -> None:
    agent = Agent()
    agent.serves = False
    async with running(agent) as hub:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", hub.port)
            writer.write(b"GET /mcp/center HTTP/1.1\r\nHost: x\r\n\r\n")
            data = await reader.read(100)
            writer.close()
        except ConnectionResetError:
            data = b""
        assert data == b""
        assert hub.refused == {streamable.NOT_AN_AGENT: 1}


async def test_an_oversized_body_a_wrong_path_and_a_refused_surface_get_their_codes() -> None:
    async with running(Agent()) as hub, httpx2.AsyncClient() as http:
        reader, writer = await asyncio.open_connection("127.0.0.1", hub.port)
        claimed = streamable.BODY_MAX + 1  # claimed, never sent: refused on the head
        writer.write(
            f"POST /mcp/center HTTP/1.1\r\nHost: x\r\nContent-Length: {claimed}\r\n\r\n{{}}".encode()
        )
        big = await reader.read(4096)
        writer.close()
        assert big.startswith(b"HTTP/1.1 413") and b"request_too_large" in big
        base = hub.url("center").removesuffix("/mcp/center")
        lost = await http.post(base + "/elsewhere", json=initialize(), headers=HEADERS)
        assert (lost.status_code, lost.json()["error"]["code"]) == (404, "not_found")
        relay = await http.post(hub.url("relay"), json=initialize(), headers=HEADERS)
        assert relay.status_code == 403
        assert relay.json()["error"]["code"] == "surface_unavailable"


@asynccontextmanager
async def held_calls(
    budget: int, calls: list[dict[str, Any]]
) -> AsyncIterator[tuple[HttpHub, httpx2.AsyncClient, dict[str, str]]]:
    """A hub whose tool calls wait; `calls` sent on one session and held in flight."""
    agent = Agent()
    agent.release = asyncio.Event()
    async with running(agent, budget) as hub, httpx2.AsyncClient(timeout=60) as http:
        opened = await http.post(hub.url("center"), json=initialize(), headers=HEADERS)
        headers = {**HEADERS, "mcp-session-id": opened.headers["mcp-session-id"]}
        held = [
            asyncio.ensure_future(http.post(hub.url("center"), json=c, headers=headers))
            for c in calls
        ]
        await eventually(
            lambda: any(h.done() for h in held) or hub._agents["a"].in_flight == len(held),
            "the calls in flight",
        )
        assert not any(h.done() for h in held), [h.result().text for h in held if h.done()]
        yield hub, http, headers
        agent.release.set()
        assert [(await h).status_code for h in held] == [200] * len(held)
        await eventually(lambda: hub.budgets.used("a") == 0, "the budget given back")


async def test_an_agents_requests_in_flight_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streamable, "REQUESTS_PER_AGENT", 2)
    small = {"name": "whoami", "arguments": {}}
    async with held_calls(1 << 20, [call(3, small), call(4, small)]) as (hub, http, headers):
        third = await http.post(hub.url("center"), json=call(5, small), headers=headers)
        assert (third.status_code, third.json()["error"]["code"]) == (429, "too_many_requests")


async def test_an_agents_held_request_bytes_are_bounded_by_its_budget() -> None:
    padded = {"name": "whoami", "arguments": {}, "_meta": {"pad": "x" * 500}}
    async with held_calls(400, [call(3, padded)]) as (hub, http, headers):
        # the one call's body, read whole and held until answered
        await eventually(lambda: hub.budgets.used("a") > 400, "the body held")
        small = {"name": "whoami", "arguments": {}}
        spent = await http.post(hub.url("center"), json=call(4, small), headers=headers)
        assert (spent.status_code, spent.json()["error"]["code"]) == (503, "budget_spent")


def call(request_id: int, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


HEADERS = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-06-18"}


def initialize() -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }


def tools_list() -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}


def test_a_supervisor_loads_the_http_server_only_when_an_agent_asks_for_it() -> None:
    """uvicorn and the SDK's HTTP transport load when the listener starts, at the first HTTP
    agent (`Supervisor.attach_points`), never with the supervisor."""
    code = (
        "import sys, mcphost.supervisor.supervisor\n"
        "print(sorted({'uvicorn', 'mcp.server.streamable_http'} & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
