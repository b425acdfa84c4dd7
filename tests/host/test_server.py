"""`HostSurface` driven in process against the real reference center: no subprocess, no stdio.

The black-box suites prove the same behaviour through the real `mcphost host` process; these
are the fast unit-level checks of the surface itself (listing, tiering, the generic
passthrough, refusals before any I/O), and every spec and result they see must validate
against the MCP SDK's own models (`mcp_types`), whatever core serves the surface.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import mcp_types
import pytest

from mcphost.binding import AgentBinding
from mcphost.catalog import CATALOG
from mcphost.host.server import HostSurface
from mcphost.surface import CallContext, ToolResult
from mcphost.testing import DevCenter

pytestmark = pytest.mark.anyio

CORE = {d.name for d in CATALOG if d.tier == "core"}
ALL = {d.name for d in CATALOG}


class Notifications:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, method: str, params: dict[str, Any]) -> None:
        self.sent.append((method, params))


def context(notifications: Notifications | None = None) -> CallContext:
    return CallContext(request_id=1, send_notification=notifications)


async def open_surface(center: DevCenter, **overrides: str | None) -> HostSurface:
    return HostSurface(AgentBinding.from_env(center.binding_env("unix", **overrides)))


@pytest.fixture
async def surface(devcenter_session: DevCenter) -> AsyncIterator[HostSurface]:
    opened = await open_surface(devcenter_session, AC_MCP_TIER_TOOLS="0")
    yield opened
    await opened.aclose()


def listed(surface: HostSurface) -> set[str]:
    specs = surface.list_tools()
    for spec in specs:  # every listed tool is a valid MCP Tool, as tools/list sends it
        mcp_types.Tool.model_validate(spec.wire())
    return {spec.name for spec in specs}


def payload(result: ToolResult) -> Any:
    mcp_types.CallToolResult.model_validate(result.wire())
    return json.loads(result.text)


def admin_requests(center: DevCenter, since: int) -> list[dict[str, Any]]:
    return [r for r in center.requests(1000)[since:] if r["route"].startswith("/admin/")]


async def test_untiered_lists_the_whole_catalog_without_search_tools(surface: HostSurface) -> None:
    assert listed(surface) == ALL - {"search_tools"}
    assert surface.list_changed is False


async def test_tiered_lists_core_tools_then_loads_what_search_finds(
    devcenter_session: DevCenter,
) -> None:
    surface = await open_surface(devcenter_session, AC_MCP_TIER_TOOLS="1")
    try:
        assert surface.list_changed is True
        assert listed(surface) == CORE
        deferred = sorted(ALL - CORE)
        notes = Notifications()
        found = payload(
            await surface.call_tool("search_tools", {"names": deferred[:1]}, context(notes))
        )
        assert [tool["name"] for tool in found["loaded"]] == deferred[:1]
        assert notes.sent == [("notifications/tools/list_changed", {})]
        assert listed(surface) == CORE | {deferred[0]}
        again = Notifications()  # loading is additive: the same search changes nothing
        await surface.call_tool("search_tools", {"names": deferred[:1]}, context(again))
        assert again.sent == []
    finally:
        await surface.aclose()


async def test_a_passthrough_call_reaches_the_center_as_the_binding_agent(
    surface: HostSurface, devcenter_session: DevCenter
) -> None:
    center = devcenter_session
    before = len(center.requests(1000))
    created = await surface.call_tool(
        "create_task", {"project_id": "p-1", "title": "in process"}, context()
    )
    assert not created.is_error, created.text
    task_id = payload(created)["task_id"]
    fetched = await surface.call_tool("get_task", {"task_id": task_id}, context())
    assert not fetched.is_error and payload(fetched)["task_id"] == task_id
    sent = admin_requests(center, before)
    assert [r["route"] for r in sent][-2:] == [
        "/admin/agent-tools/create_task",
        "/admin/agent-tools/get_task",
    ]
    assert all(r["body"]["agent_id"] == surface.binding.agent_id for r in sent[-2:])
    assert all(r["headers"]["Authorization"] == "Bearer ***" for r in sent[-2:])


async def test_a_center_error_is_an_error_result_with_its_code(surface: HostSurface) -> None:
    result = await surface.call_tool("get_task", {"task_id": "t-does-not-exist"}, context())
    assert result.is_error
    body = payload(result)
    assert body["error"] and body["message"] and body["status"] == 404, body


@pytest.mark.parametrize(
    ("tool", "arguments", "code"),
    [
        ("get_my_work", {"agent_id": "agent-2"}, "invalid_arguments"),
        ("get_task", {"task_id": "t-1", "extra": 1}, "invalid_arguments"),
        ("get_task", {}, "invalid_arguments"),
        ("get_task", {f"k{i}": i for i in range(300)}, "invalid_arguments"),
        ("no_such_tool", {}, "unknown_tool"),
    ],
)
async def test_refusals_happen_before_any_io(
    surface: HostSurface,
    devcenter_session: DevCenter,
    tool: str,
    arguments: dict[str, Any],
    code: str,
) -> None:
    before = len(devcenter_session.requests(1000))
    result = await surface.call_tool(tool, arguments, context())
    assert result.is_error
    assert payload(result)["error"] == code, result.text
    assert admin_requests(devcenter_session, before) == []
