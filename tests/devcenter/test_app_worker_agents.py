"""`GET /admin/worker/agents` (a worker's fleet) and the control routes that bind agents to
workers, on the real `mcphost devcenter` process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from mcphost.testing import DevCenter

ROUTE = "/admin/worker/agents"


@pytest.fixture(scope="module")
def center(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCenter]:
    """One center for the module; tests that bind agents undo it (the seed stays as it was)."""
    with DevCenter.start(tmp_path_factory.mktemp("wa"), unix=True, tcp=True) as running:
        yield running


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def fleet(center: DevCenter, worker: str = "w-1") -> list[str]:
    reply = center.request("GET", ROUTE, headers=bearer(center.worker_token(worker)))
    assert reply.status == 200, reply.body
    body = reply.json()
    assert body["worker_id"] == worker and set(body) == {"worker_id", "agents"}
    assert all(set(entry) == {"agent_id", "generation"} for entry in body["agents"])
    return [entry["agent_id"] for entry in body["agents"]]


def test_each_worker_sees_its_own_agents(center: DevCenter) -> None:
    assert fleet(center, "w-1") == ["agent-1", "agent-2"]
    assert fleet(center, "w-2") == ["agent-x"]
    reply = center.request(
        "GET", ROUTE, headers=bearer(center.worker_token("w-1")), transport="tcp"
    )
    assert [entry["agent_id"] for entry in reply.json()["agents"]] == ["agent-1", "agent-2"]


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "auth_missing"),
        ({"Authorization": "Basic abc"}, "auth_missing"),
        ({"Authorization": "Bearer nope_123"}, "auth_invalid_format"),
        ({"Authorization": "Bearer acat_unknown"}, "auth_unknown"),
    ],
)
def test_the_same_401_codes_as_every_admin_route(
    center: DevCenter, headers: dict[str, str], code: str
) -> None:
    reply = center.request("GET", ROUTE, headers=headers)
    assert (reply.status, reply.error) == (401, code)


def test_only_get_and_logged_without_the_bearer(center: DevCenter) -> None:
    reply = center.request("POST", ROUTE, {}, bearer(center.token))
    assert (reply.status, reply.error) == (405, "method_not_allowed")
    fleet(center)
    last = center.requests(1)[0]
    assert (last["method"], last["route"], last["headers"]["Authorization"]) == (
        "GET",
        ROUTE,
        "Bearer ***",
    )


def test_faults_apply_under_worker_agents(center: DevCenter) -> None:
    with center.faults(status={"worker_agents": [503, "center_down"]}):
        reply = center.request("GET", ROUTE, headers=bearer(center.token))
        assert (reply.status, reply.error) == (503, "center_down")
        # authentication still comes first
        assert center.request("GET", ROUTE).error == "auth_missing"
    with center.faults(big_result_bytes={"worker_agents": 1000}):
        body = center.request("GET", ROUTE, headers=bearer(center.token)).json()
        assert len(body["padding"]) == 1000 and len(body["agents"]) == 2


def test_binding_moving_and_removing_agents(center: DevCenter) -> None:
    reply = center.request(
        "POST", "/_devcenter/agents", {"worker_id": "w-1", "agent_ids": ["agent-7", "agent-x"]}
    )
    assert reply.json() == {"ok": True, "worker_id": "w-1", "agent_ids": ["agent-7", "agent-x"]}
    try:
        assert fleet(center, "w-1") == ["agent-1", "agent-2", "agent-7", "agent-x"]
        assert fleet(center, "w-2") == []  # agent-x moved
        # a bound agent is an agent like the seeded ones: the agent tools serve it
        assert center.call("get_my_work", agent_id="agent-7").json() == {"tasks": []}
    finally:
        center.request("POST", "/_devcenter/agents", {"worker_id": "w-2", "agent_ids": ["agent-x"]})
        assert center.request("DELETE", "/_devcenter/agents/agent-7").json() == {
            "ok": True,
            "agent_id": "agent-7",
        }
    assert fleet(center, "w-1") == ["agent-1", "agent-2"]
    assert fleet(center, "w-2") == ["agent-x"]
    reply = center.request("DELETE", "/_devcenter/agents/agent-7")
    assert (reply.status, reply.error) == (404, "not_found")
    assert center.call("get_my_work", agent_id="agent-7").error == "not_found"


def test_bound_agents_can_join_projects_and_ids_are_stored_unchecked(center: DevCenter) -> None:
    odd = ["../escape", "a b", "x" * 300]
    reply = center.request(
        "POST",
        "/_devcenter/agents",
        {"worker_id": "w-2", "agent_ids": ["agent-8", *odd], "projects": ["p-2"]},
    )
    assert reply.status == 200, reply.body
    try:
        assert fleet(center, "w-2") == sorted(["agent-x", "agent-8", *odd])
        issue = center.call(
            "get_issue", {"issue_id": "i-2"}, agent_id="agent-8", token=center.worker_token("w-2")
        )
        assert issue.status == 200, issue.body
    finally:
        for agent_id in ["agent-8", *odd]:
            reply = center.request("DELETE", f"/_devcenter/agents/{quote(agent_id, safe='')}")
            assert reply.status == 200, (agent_id, reply.body)
    assert fleet(center, "w-2") == ["agent-x"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"worker_id": "w-9", "agent_ids": ["a"]}, 404, "not_found"),
        ({"agent_ids": ["a"]}, 404, "not_found"),
        ({"worker_id": "w-1"}, 400, "invalid_input"),
        ({"worker_id": "w-1", "agent_ids": "a"}, 400, "invalid_input"),
        ({"worker_id": "w-1", "agent_ids": [""]}, 400, "invalid_input"),
        ({"worker_id": "w-1", "agent_ids": [1]}, 400, "invalid_input"),
        ({"worker_id": "w-1", "agent_ids": ["a"], "projects": ["p-9"]}, 404, "project_not_found"),
        ({"worker_id": "w-1", "agent_ids": ["a"], "extra": 1}, 400, "invalid_input"),
    ],
)
def test_bind_refusals(center: DevCenter, body: dict[str, object], status: int, code: str) -> None:
    reply = center.request("POST", "/_devcenter/agents", body)
    assert (reply.status, reply.error) == (status, code)
    assert fleet(center, "w-1") == ["agent-1", "agent-2"]


def test_openapi_lists_the_route(center: DevCenter) -> None:
    doc = center.request("GET", "/openapi.json").json()
    operation = doc["paths"][ROUTE]["get"]
    assert operation["operationId"] == "worker_agents"
    reservation = doc["paths"][ROUTE + "/{agent_id}/generation"]["post"]
    assert reservation["operationId"] == "reserve_generation"
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["worker_id", "agents"]
    assert "401" in operation["responses"]
    assert not any(path.startswith("/_devcenter") for path in doc["paths"])


def test_control_routes_need_control(tmp_path: Path) -> None:
    with DevCenter.start(tmp_path, control=False) as bare:
        reply = bare.request("POST", "/_devcenter/agents", {"worker_id": "w-1", "agent_ids": ["a"]})
        assert (reply.status, reply.error) == (404, "not_found")
        assert fleet(bare) == ["agent-1", "agent-2"]


# -- generations: the center as the authority on what it has already seen ----------------------


def reserve(center: DevCenter, agent_id: str, worker: str, body: dict[str, object] | None = None):
    return center.request(
        "POST",
        f"{ROUTE}/{quote(agent_id, safe='')}/generation",
        {} if body is None else body,
        bearer(center.worker_token(worker)),
    )


def listed_generation(center: DevCenter, worker: str, agent_id: str) -> int:
    reply = center.request("GET", ROUTE, headers=bearer(center.worker_token(worker)))
    return next(e["generation"] for e in reply.json()["agents"] if e["agent_id"] == agent_id)


def test_reservations_climb_above_every_generation_seen(center: DevCenter) -> None:
    center.bind("w-1", "agent-g")
    try:
        assert listed_generation(center, "w-1", "agent-g") == 0  # never seen
        assert reserve(center, "agent-g", "w-1").json() == {"agent_id": "agent-g", "generation": 1}
        assert reserve(center, "agent-g", "w-1").json()["generation"] == 2
        # a host's own calls raise the mark; the next reservation is above them
        assert center.call("get_my_work", agent_id="agent-g", generation=9).status == 200
        assert listed_generation(center, "w-1", "agent-g") == 9
        assert reserve(center, "agent-g", "w-1").json()["generation"] == 10
        # at_least: a worker whose own counter is higher gets that one, and it is recorded
        assert reserve(center, "agent-g", "w-1", {"at_least": 40}).json()["generation"] == 40
        assert reserve(center, "agent-g", "w-1", {"at_least": 3}).json()["generation"] == 41
        assert listed_generation(center, "w-1", "agent-g") == 41
        # the reservation fences every lower generation at once, with both generations named
        stale = center.call("get_my_work", agent_id="agent-g", generation=40)
        assert (stale.status, stale.error) == (409, "stale_generation")
        assert (stale.json()["generation"], stale.json()["current_generation"]) == (40, 41)
        # moved to another worker: that worker reserves above the old one, the old one may not
        center.bind("w-2", "agent-g")
        assert reserve(center, "agent-g", "w-2").json()["generation"] == 42
        refused = reserve(center, "agent-g", "w-1")
        assert (refused.status, refused.error) == (403, "agent_not_bound_to_worker")
        assert listed_generation(center, "w-2", "agent-g") == 42
    finally:
        center.request("DELETE", "/_devcenter/agents/agent-g")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"at_least": -1}, 400, "invalid_input"),
        ({"at_least": True}, 400, "invalid_input"),
        ({"at_least": "3"}, 400, "invalid_input"),
        ({"at_least": 1 << 63}, 400, "invalid_input"),
        ({"extra": 1}, 400, "invalid_input"),
    ],
)
def test_reservation_refusals(
    center: DevCenter, body: dict[str, object], status: int, code: str
) -> None:
    reply = reserve(center, "agent-2", "w-1", body)
    assert (reply.status, reply.error) == (status, code)
    assert reserve(center, "agent-nobody", "w-1").error == "not_found"
    unauthenticated = center.request("POST", f"{ROUTE}/agent-2/generation", {})
    assert (unauthenticated.status, unauthenticated.error) == (401, "auth_missing")


def test_a_reservation_at_the_last_generation_is_refused(center: DevCenter) -> None:
    center.bind("w-1", "agent-h")
    try:
        top = (1 << 63) - 1
        assert reserve(center, "agent-h", "w-1", {"at_least": top}).json()["generation"] == top
        reply = reserve(center, "agent-h", "w-1")
        assert (reply.status, reply.error) == (409, "generation_exhausted")
    finally:
        center.request("DELETE", "/_devcenter/agents/agent-h")


def test_more_workers_through_the_control_route(center: DevCenter) -> None:
    token = center.add_worker("w-7")
    assert token.startswith("acat_") and token not in (center.token, center.worker_token("w-2"))
    assert fleet(center, "w-7") == []
    again = center.request("POST", "/_devcenter/workers", {"worker_id": "w-7"})
    assert (again.status, again.error) == (409, "worker_exists")
    for bad in ({"worker_id": "../x"}, {"worker_id": "w-7", "x": 1}, {}):
        reply = center.request("POST", "/_devcenter/workers", bad)
        assert (reply.status, reply.error) == (400, "invalid_input")


def test_the_documented_curl_calls_work_once_the_agent_has_run(tmp_path: Path) -> None:
    """docs/devcenter.md's "Talking to it by hand", run as written (its paths pointed at this
    center), after agent-1 has run at generation 3: each call sends the generation the
    worker's agent list reports, so none is refused as stale."""
    import re
    import shutil
    import subprocess

    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "devcenter.md").read_text()
    block = re.search(r"```sh\n(TOKEN=\$\(cat /tmp/dc/worker-token\).*?)\n# over TLS", doc, re.S)
    assert block is not None, "the doc's by-hand block"
    with DevCenter.start(tmp_path / "dc", unix=True) as center:
        token = center.worker_token()
        ran = center.request(
            "POST",
            "/admin/agent-tools/get_my_work",
            {"agent_id": "agent-1"},
            headers={**bearer(token), "X-AC-MCP-Generation": "3"},
        )
        assert ran.status == 200, ran.body
        script = block.group(1).replace("/tmp/dc/admin.sock", str(center.socket_path))
        script = script.replace("/tmp/dc/worker-token", str(center.state_dir / "worker-token"))
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    assert "stale_generation" not in done.stdout and '"tasks"' in done.stdout, done.stdout
    assert "Try the host" in done.stdout, done.stdout
