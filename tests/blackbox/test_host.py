"""The per-agent host end to end: real process, real SDK client, real center (Unix and TLS).

Tests on `host` run both ways (tests/blackbox/conftest.py): the standalone `mcphost host`, and
the supervisor serving an agent's pump started with `mcphost ctl exec`. Tests of the binding
itself (TLS pins, a down center, no runtime socket, chosen generations) take `center`: under the
supervisor that binding is the fleet's `[center]` (tests/supervisor/test_fleet.py).

The tests that only call tools share one tiered session per way (`client`); a test gets a session
of its own when it is about the session (its listing era, its loaded tools, its notifications)
or about the binding the process starts with.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import pytest
from mcp import Client

from mcphost.admin.pinning import format_pin
from mcphost.catalog import CATALOG
from mcphost.testing import DevCenter
from tests.blackbox.conftest import HostUnderTest, admin_bodies, call, open_host

pytestmark = pytest.mark.anyio

CORE = {d.name for d in CATALOG if d.tier == "core" and d.name != "search_tools"}
DEFERRED = {d.name for d in CATALOG if d.tier == "deferred"}
WRONG_PIN = format_pin(hashlib.sha256(b"not the center's certificate").digest())


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module scope, so that `client` (one session per module and way) can be async."""
    return "asyncio"


@pytest.fixture(scope="module")
async def client(host: HostUnderTest) -> AsyncIterator[Client]:
    """One tiered session per way (standalone host process, or supervised pump), shared.

    For the tests that only call tools: a fresh process per test would prove nothing more (the
    binding is the same, and each test reads only its own results and its own slice of the
    center's request log). Nothing here loads a deferred tool (`search_tools` has a session of
    its own), so every test sees the session as it started: core tools listed, nothing loaded.
    Closing it at the end of the module (stdin EOF) must succeed.
    """
    async with host.open() as session:
        yield session


async def test_tiered_listing_shows_core_and_search_tools(client: Client) -> None:
    names = {t.name for t in (await client.list_tools()).tools}
    assert names == CORE | {"search_tools"}
    caps = client.session.server_capabilities
    assert caps is not None and caps.tools is not None and caps.tools.list_changed is True


async def test_untiered_listing_is_the_whole_catalog(host: HostUnderTest) -> None:
    async with host.open(tier_tools=False) as client:
        tools = (await client.list_tools()).tools
        assert {t.name for t in tools} == CORE | DEFERRED
        for tool in tools:
            assert tool.input_schema["additionalProperties"] is False
            assert "agent_id" not in tool.input_schema["properties"]


async def test_task_lifecycle(client: Client) -> None:
    await task_lifecycle(client)


async def test_task_lifecycle_over_tls(center: DevCenter) -> None:
    async with open_host(center.binding_env("tcp")) as client:
        await task_lifecycle(client)


async def task_lifecycle(client: Client) -> None:
    failed, created = await call(
        client, "create_task", {"project_id": "p-1", "title": "t", "assignee": "agent-1"}
    )
    assert not failed, created
    task_id = created["task_id"]
    _, task = await call(client, "get_task", {"task_id": task_id})
    assert task["status"] == "open" and task["assignee"] == "agent-1"
    _, beat = await call(client, "heartbeat", {"task_id": task_id})
    assert beat["status"] == "running"
    failed, _ = await call(client, "post_task_message", {"task_id": task_id, "content": "hi"})
    assert not failed
    failed, _ = await call(client, "update_task", {"task_id": task_id, "title": "renamed"})
    assert not failed
    _, done = await call(client, "complete_task", {"task_id": task_id, "summary": "done"})
    assert done["status"] == "completed"
    _, work = await call(client, "get_my_work", {})
    assert task_id not in [t["task_id"] for t in work["tasks"]]
    failed, again = await call(client, "heartbeat", {"task_id": task_id})
    assert failed and again["status"] == 409 and again["error"] == "illegal_transition"


async def test_identity_is_the_bindings_and_smuggling_is_refused(
    host: HostUnderTest, client: Client
) -> None:
    center = host.center
    before = len(center.requests(500))
    for smuggled in ({"agent_id": "agent-2"}, {"agentId": "agent-2"}, {"AGENT_ID": "x"}):
        failed, refused = await call(client, "get_my_work", smuggled)
        assert failed and refused["error"] == "invalid_arguments"
    assert len(center.requests(500)) == before, "refused calls made no request"
    await call(client, "get_my_work", {})
    await call(client, "get_issue", {"issue_id": "i-1"})
    bodies = admin_bodies(center, before)
    assert bodies and {b["agent_id"] for b in bodies} == {"agent-1"}
    generations = {
        {k.lower(): v for k, v in r["headers"].items()}.get("x-ac-mcp-generation")
        for r in center.requests(500)[before:]
        if str(r.get("route", "")).startswith("/admin/")
    }
    assert generations == {str(host.generation())}


async def test_center_errors_keep_status_code_and_message(client: Client) -> None:
    failed, missing = await call(client, "get_task", {"task_id": "t-missing"})
    assert failed and missing["status"] == 404 and missing["error"] == "not_found"
    failed, foreign = await call(client, "get_issue", {"issue_id": "i-2"})
    assert failed and foreign["status"] == 403 and foreign["message"]


async def test_a_wrong_pin_sends_nothing_and_says_why(center: DevCenter) -> None:
    before = len(center.requests(500))
    env = center.binding_env("tcp", AC_MCP_SERVER_FINGERPRINT=WRONG_PIN)
    async with open_host(env) as client:
        failed, refused = await call(client, "get_my_work", {})
    assert failed and refused["error"] == "admin_pin_mismatch"
    assert refused["details"]["expected"] == [WRONG_PIN]
    assert refused["details"]["received"] == center.fingerprint
    assert "rotated" in refused["message"] and "intercepted" in refused["message"]
    assert len(center.requests(500)) == before


async def test_a_pin_set_allows_rotation_overlap(center: DevCenter) -> None:
    env = center.binding_env(
        "tcp", AC_MCP_SERVER_FINGERPRINT=f"{WRONG_PIN},{center.fingerprint.lower()}"
    )
    async with open_host(env) as client:
        failed, work = await call(client, "get_my_work", {})
    assert not failed and "tasks" in work


async def test_a_down_center_still_lists_tools_and_classifies_calls(tmp_path: object) -> None:
    env = {"AC_MCP_AGENT_ID": "agent-1", "AC_MCP_ADMIN_URL": "unix:/nonexistent/center.sock"}
    async with open_host(env) as client:
        assert (await client.list_tools()).tools
        failed, down = await call(client, "get_my_work", {})
    assert failed and down["error"] == "admin_unavailable"
    assert down["details"]["reason"] == "socket_missing"


async def test_generation_fencing_reports_a_superseded_host(center: DevCenter) -> None:
    # agent-2 (same worker) so the fence does not affect agent-1 in the other tests
    newer = center.binding_env("unix", AC_MCP_AGENT_ID="agent-2", AC_MCP_GENERATION="5")
    async with open_host(newer) as client:
        assert not (await call(client, "get_my_work", {}))[0]
    older = center.binding_env("unix", AC_MCP_AGENT_ID="agent-2", AC_MCP_GENERATION="3")
    async with open_host(older) as client:
        failed, stale = await call(client, "get_my_work", {})
    assert failed and stale["error"] == "stale_generation" and stale["status"] == 409
    assert "superseded" in stale["message"]


async def test_fork_executor_goes_to_the_runtime_socket(
    host: HostUnderTest, client: Client
) -> None:
    center = host.center
    _, created = await call(
        client, "create_task", {"project_id": "p-1", "title": "fork me", "assignee": "agent-1"}
    )
    failed, accepted = await call(
        client, "fork_executor", {"task_id": created["task_id"], "model": "m1"}
    )
    assert not failed and accepted["status"] == "accepted"
    forks = [f for f in center.forks() if f["task_id"] == created["task_id"]]
    assert forks and forks[-1]["agent_id"] == "agent-1" and forks[-1]["model"] == "m1"


async def test_fork_executor_without_runtime_socket_is_a_clear_error(center: DevCenter) -> None:
    async with open_host(center.binding_env("unix", AC_MCP_RUNTIME_SOCKET=None)) as client:
        failed, err = await call(client, "fork_executor", {"task_id": "t-1"})
    assert failed and err["error"] == "runtime_socket_unconfigured"
    assert "AC_MCP_RUNTIME_SOCKET" in err["message"]


async def test_search_tools_loads_additively_and_notifies(host: HostUnderTest) -> None:
    notifications: list[str] = []

    async def on_message(message: object) -> None:
        notifications.append(type(message).__name__ + ":" + str(getattr(message, "method", "")))

    async with host.open(message_handler=on_message) as client:
        failed, found = await call(client, "search_tools", {"query": "subscribe"})
        assert not failed
        loaded = {t["name"] for t in found["loaded"]}
        assert loaded == {"subscribe", "unsubscribe"}
        assert all(t["inputSchema"]["additionalProperties"] is False for t in found["loaded"])
        await call(client, "search_tools", {"names": ["verify_task"]})
        names = {t.name for t in (await client.list_tools(cache_mode="bypass")).tools}
        assert {"subscribe", "unsubscribe", "verify_task"} <= names, "loading is additive"
        _, nothing = await call(client, "search_tools", {"query": "zzzz"})
        assert nothing["loaded"] == [] and "subscribe" in {
            t.name for t in (await client.list_tools(cache_mode="bypass")).tools
        }
    assert any("list_changed" in n or "ToolListChanged" in n for n in notifications), notifications


async def test_deferred_tools_are_callable_by_name_without_a_refresh(client: Client) -> None:
    _, created = await call(client, "create_task", {"project_id": "p-1", "title": "x"})
    failed, ok = await call(client, "subscribe", {"task_id": created["task_id"]})
    assert not failed and ok["ok"] is True


async def test_oversized_results_are_cut_with_a_note(host: HostUnderTest, client: Client) -> None:
    with host.center.faults(big_result_bytes={"get_my_work": 300_000}):
        failed, big = await call(client, "get_my_work", {})
    assert not failed and big["truncated"] is True
    assert big["total_bytes"] > 300_000 and big["omitted_bytes"] > 200_000
    assert "note" in big and isinstance(big["partial"], dict)


async def test_unknown_tool_is_an_error_result(client: Client) -> None:
    failed, err = await call(client, "no_such_tool", {})
    assert failed and err["error"] == "unknown_tool" and "search_tools" in err["message"]


async def test_an_auto_mode_client_speaks_2026_07_28_without_falling_back(
    host: HostUnderTest,
) -> None:
    """SDK clients in `mode="auto"` probe `server/discover` first; the SDK core answers it, so
    the session runs in the 2026-07-28 era (no `initialize` handshake), and tools work there."""
    async with Client(host.params(), mode="auto") as client:
        assert client.session.protocol_version == "2026-07-28"
        failed, work = await call(client, "get_my_work", {})
        _, found = await call(client, "search_tools", {"query": "subscribe"})
        failed_deferred, ok = await call(client, "get_task", {"task_id": "t-missing"})
    assert not failed and "tasks" in work
    assert found["loaded"], found
    assert failed_deferred and ok["error"], ok  # a deferred tool, reached by name
