"""`fetch_fleet` against the real reference center (Unix socket and pinned TLS), and the
strict reading of its reply (`parse_fleet`) for what a real center could not be made to send."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from mcphost.admin.client import AdminClient, Reply
from mcphost.admin.pinning import parse_pins
from mcphost.admin.target import parse_target
from mcphost.errors import AdminFailure, AdminUnavailable, AdmissionRefused, CenterRefusal
from mcphost.supervisor.center.generations import (
    MAX_AGENTS,
    fetch_fleet,
    parse_fleet,
    reserve_generation,
)
from mcphost.testing import DevCenter

pytestmark = pytest.mark.anyio


async def fetch_assigned(client: AdminClient) -> list[str]:
    """The agent ids `fetch_fleet` reads, in the center's order."""
    return (await fetch_fleet(client)).ids


def parse_assigned(reply: Reply, *, target: str = "the center") -> list[str]:
    return parse_fleet(reply, target=target).ids


@pytest.fixture(scope="module")
def center(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCenter]:
    with DevCenter.start(tmp_path_factory.mktemp("cf"), unix=True, tcp=True) as running:
        yield running


def client_for(center: DevCenter, worker: str = "w-1", transport: str = "unix") -> AdminClient:
    if transport == "tcp":
        return AdminClient(
            parse_target(center.admin_url("tcp")),
            token=center.worker_token(worker),
            pins=parse_pins(center.fingerprint),
        )
    return AdminClient(parse_target(center.admin_url("unix")), token=center.worker_token(worker))


@pytest.fixture
async def w1(center: DevCenter) -> AsyncIterator[AdminClient]:
    client = client_for(center)
    try:
        yield client
    finally:
        await client.aclose()


class bound:
    """Bind agents to a worker for the duration of a `with` block (then delete them)."""

    def __init__(self, center: DevCenter, worker: str, agent_ids: list[str]) -> None:
        self.center, self.worker, self.agent_ids = center, worker, agent_ids

    def __enter__(self) -> None:
        reply = self.center.request(
            "POST", "/_devcenter/agents", {"worker_id": self.worker, "agent_ids": self.agent_ids}
        )
        assert reply.status == 200, reply.body

    def __exit__(self, *exc: object) -> None:
        for agent_id in self.agent_ids:
            reply = self.center.request("DELETE", f"/_devcenter/agents/{quote(agent_id, safe='')}")
            assert reply.status == 200, reply.body


async def test_each_worker_gets_its_own_agents(center: DevCenter, w1: AdminClient) -> None:
    assert await fetch_assigned(w1) == ["agent-1", "agent-2"]
    for transport in ("unix", "tcp"):
        client = client_for(center, "w-2", transport)
        try:
            assert await fetch_assigned(client) == ["agent-x"]
        finally:
            await client.aclose()
    last = center.requests(1)[0]
    assert (last["method"], last["route"], last["query"], last["body"]) == (
        "GET",
        "/admin/worker/agents",
        {},
        None,
    )
    assert "X-AC-MCP-Generation" not in last["headers"]  # no agent's identity in this request


async def test_bound_agents_appear_and_leave(center: DevCenter, w1: AdminClient) -> None:
    with bound(center, "w-1", ["agent-7", "B.worker_2"]):
        assert await fetch_assigned(w1) == ["B.worker_2", "agent-1", "agent-2", "agent-7"]
    assert await fetch_assigned(w1) == ["agent-1", "agent-2"]


async def test_an_empty_fleet(center: DevCenter) -> None:
    client = client_for(center, "w-2")
    center.request("POST", "/_devcenter/agents", {"worker_id": "w-1", "agent_ids": ["agent-x"]})
    try:
        assert await fetch_assigned(client) == []
    finally:
        center.request("POST", "/_devcenter/agents", {"worker_id": "w-2", "agent_ids": ["agent-x"]})
        await client.aclose()


@pytest.mark.parametrize(
    "bad",
    ["../escape", "a b", "-leading-dash", ".hidden", "x" * 129, "agent\u200b1", "ａgent"],
)
async def test_an_id_outside_the_grammar_is_refused(
    center: DevCenter, w1: AdminClient, bad: str
) -> None:
    with bound(center, "w-1", [bad]), pytest.raises(AdminFailure) as caught:
        await fetch_assigned(w1)
    failure = caught.value
    assert type(failure) is AdminFailure
    assert failure.code == "admin_protocol_error"
    assert failure.details["reason"] == "invalid_agent_id"
    assert len(failure.message) < 600  # at most 80 characters of the id are shown


async def test_at_most_10000_agents(tmp_path: Path) -> None:
    # its own center: nothing to undo in the shared one
    with DevCenter.start(tmp_path) as own:
        many = [f"bulk-{n:05d}" for n in range(MAX_AGENTS - 2)]  # + agent-1, agent-2 = the cap
        reply = own.request("POST", "/_devcenter/agents", {"worker_id": "w-1", "agent_ids": many})
        assert reply.status == 200
        client = client_for(own)
        try:
            assert len(await fetch_assigned(client)) == MAX_AGENTS
            own.request("POST", "/_devcenter/agents", {"worker_id": "w-1", "agent_ids": ["more"]})
            with pytest.raises(AdminFailure) as caught:
                await fetch_assigned(client)
            assert caught.value.details["reason"] == "too_many_agents"
            assert caught.value.details["agents"] == MAX_AGENTS + 1
        finally:
            await client.aclose()


async def test_the_centers_refusals_are_typed(center: DevCenter) -> None:
    stranger = AdminClient(parse_target(center.admin_url("unix")), token="acat_unknown")
    try:
        with pytest.raises(AdmissionRefused) as caught:
            await fetch_assigned(stranger)
        assert (caught.value.code, caught.value.status) == ("auth_unknown", 401)
    finally:
        await stranger.aclose()
    client = client_for(center)
    try:
        with center.faults(status={"worker_agents": [503, "center_down"]}):
            with pytest.raises(CenterRefusal) as refused:
                await fetch_assigned(client)
            assert (refused.value.code, refused.value.status) == ("center_down", 503)
        with center.faults(big_result_bytes={"worker_agents": 5 * 1024 * 1024}):
            with pytest.raises(AdminFailure) as big:
                await fetch_assigned(client)
            assert big.value.details["reason"] == "reply_too_large"
        with center.faults(big_result_bytes={"worker_agents": 17 * 1024 * 1024}):
            with pytest.raises(AdminFailure) as huge:
                await fetch_assigned(client)
            assert huge.value.code == "admin_response_too_large"  # the client's own cap
        with center.faults(big_result_bytes={"worker_agents": 1000}):
            assert await fetch_assigned(client) == ["agent-1", "agent-2"]  # other keys: ignored
    finally:
        await client.aclose()


async def test_a_center_that_is_down_is_unavailable(tmp_path: Path) -> None:
    client = AdminClient(parse_target(f"unix:{tmp_path}/nothing.sock"), token="acat_x")
    try:
        with pytest.raises(AdminUnavailable) as caught:
            await fetch_assigned(client)
        assert caught.value.code == "admin_unavailable"
    finally:
        await client.aclose()


# -- what a real center could not be made to send --------------------------------------------------


def reply(body: Any, content_type: str = "application/json") -> Reply:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Reply(200, raw, content_type)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "not_json"),
        (b"[" * 100_000 + b"]" * 100_000, "json_nesting_too_deep"),
        (b'{"agents": [], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "json_nesting_too_deep"),
        ([], "not_an_object"),
        ({"worker_id": "w-1"}, "not_an_object"),
        ({"agents": {"agent-1": {}}}, "not_an_object"),
        ({"worker_id": 7, "agents": []}, "not_an_object"),
        ({"agents": ["agent-1"]}, "invalid_agent_id"),
        ({"agents": [{"id": "agent-1"}]}, "invalid_agent_id"),
        ({"agents": [{"agent_id": 1}]}, "invalid_agent_id"),
        ({"agents": [{"agent_id": None}]}, "invalid_agent_id"),
        ({"agents": [{"agent_id": "a"}, {"agent_id": "a"}]}, "duplicate_agent_id"),
        ({"agents": [{"agent_id": "a", "generation": -1}]}, "invalid_generation"),
        ({"agents": [{"agent_id": "a", "generation": True}]}, "invalid_generation"),
        ({"agents": [{"agent_id": "a", "generation": "3"}]}, "invalid_generation"),
        ({"agents": [{"agent_id": "a", "generation": 1 << 63}]}, "invalid_generation"),
        (b" " * (4 * 1024 * 1024 + 1), "reply_too_large"),
    ],
)
def test_malformed_replies_are_protocol_errors(body: Any, reason: str) -> None:
    with pytest.raises(AdminFailure) as caught:
        parse_assigned(reply(body), target="unix:/c.sock")
    assert caught.value.code == "admin_protocol_error"
    assert caught.value.details["reason"] == reason
    assert caught.value.details["target"] == "unix:/c.sock"


def test_content_type_must_be_json() -> None:
    with pytest.raises(AdminFailure) as caught:
        parse_assigned(reply({"agents": []}, "text/html"))
    assert caught.value.details["reason"] == "not_json"


def test_extra_keys_are_ignored_and_order_kept() -> None:
    body = {"agents": [{"agent_id": "b", "bundle": "party"}, {"agent_id": "a"}], "next": None}
    assert parse_assigned(reply(body)) == ["b", "a"]


def test_a_long_bad_id_is_shown_cut() -> None:
    with pytest.raises(AdminFailure) as caught:
        parse_assigned(reply({"agents": [{"agent_id": "../" + "x" * 5000}]}))
    assert "x" * 81 not in caught.value.message and "…" in caught.value.message


def test_generations_the_center_says_it_has_seen() -> None:
    body = {"agents": [{"agent_id": "b", "generation": 4}, {"agent_id": "a", "generation": None}]}
    assert parse_fleet(reply(body)).generations == {"b": 4}  # null: not said
    assert parse_fleet(reply({"agents": [{"agent_id": "a"}]})).generations == {}


# -- the next generation, from the center ----------------------------------------------------------


async def test_the_center_reserves_generations_above_all_it_has_seen(
    center: DevCenter, w1: AdminClient
) -> None:
    with bound(center, "w-1", ["agent-r"]):
        assert await reserve_generation(w1, "agent-r", 1) == 1
        assert await reserve_generation(w1, "agent-r", 1) == 2
        assert await reserve_generation(w1, "agent-r", 9) == 9
        assert center.call("get_my_work", agent_id="agent-r", generation=20).status == 200
        assert (await fetch_fleet(w1)).generations["agent-r"] == 20
        assert await reserve_generation(w1, "agent-r", 10) == 21
        last = center.requests(1)[0]
        assert (last["route"], last["body"]) == (
            "/admin/worker/agents/agent-r/generation",
            {"at_least": 10},
        )
        assert "X-AC-MCP-Generation" not in last["headers"]
        other = client_for(center, "w-2")
        try:
            with pytest.raises(AdmissionRefused) as caught:
                await reserve_generation(other, "agent-r", 1)
            assert caught.value.code == "agent_not_bound_to_worker"
        finally:
            await other.aclose()
        # a center without the route: a refusal the supervisor falls back from
        with center.faults(status={"worker_generation": [404, "not_found"]}):
            with pytest.raises(CenterRefusal) as missing:
                await reserve_generation(w1, "agent-r", 1)
            assert (missing.value.code, missing.value.status) == ("not_found", 404)
