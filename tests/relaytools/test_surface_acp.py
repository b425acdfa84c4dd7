"""The relay tools' MCP surface against the real relay with an ACP member: `send`, `look`,
`list` command=decisions and `choose` as a model calls them.

The surface (`RelayToolsSurface`: validation, the association, the handlers, the error shapes)
reaches the relay as the supervisor's agents' tools do: an `InProcessStream` onto an in-process
session of the relay's `RelayServer` (`local_session`), which serves the real `RelayBehaviour`
with the bundle `mixed` hosted by the real `TmuxHost` (tests/relay/members/acp_world.py: `lead`
with the `operator` policy, `agent` the stand-in ACP agent as a real process). Tools called as
`lead` decide; as `agent` (the file default: no `choose`) they are refused. The real
`mcphost relay-tools` process against a real relay is test_relay_tools_realrelay.py's (deep).

No sleeps: waits poll `look` or `list decisions` (`tests.waiting.eventually`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcphost.relay.server import RelayServer
from mcphost.relaytools import layout as layout_mod
from mcphost.relaytools.stream import InProcessStream
from mcphost.relaytools.surface import RelayToolsSurface
from mcphost.surface import CallContext, RpcError
from tests.relay.members.acp_world import AGENT, LEAD, OPTIONS, World, hosted, lines
from tests.waiting import eventually

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


@dataclass
class Tools:
    """One member's relay tools (the surface), as a model calls them."""

    surface: RelayToolsSurface

    async def ok(self, name: str, arguments: dict[str, Any]) -> Any:
        result = await self.surface.call_tool(name, arguments, CallContext(request_id=1))
        return json.loads(result.text)

    async def error(self, name: str, arguments: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The JSON-RPC error code and `data` ({code, message, details}) of a refused call."""
        with pytest.raises(RpcError) as caught:
            await self.surface.call_tool(name, arguments, CallContext(request_id=1))
        data: dict[str, Any] = caught.value.data
        return caught.value.code, data

    async def entries(self, needle: str, kind: str) -> list[dict[str, Any]]:
        """agent's look entries once a line of an entry of `kind` contains `needle`."""

        async def found() -> list[dict[str, Any]] | None:
            look = await self.ok("look", {"target_session": AGENT, "lines": 1000})
            entries: list[dict[str, Any]] = look["snapshot_entries"]
            hit = any(needle in line for e in entries if e["kind"] == kind for line in lines(e))
            return entries if hit else None

        result: list[dict[str, Any]] = await eventually(found, f"{needle!r} in agent's look")
        return result

    async def decisions(self, count: int) -> list[dict[str, Any]]:
        async def listed() -> list[dict[str, Any]] | None:
            out = await self.ok("list", {"command": "decisions"})
            pending: list[dict[str, Any]] = out["pending_requests"]
            return pending if len(pending) == count else None

        result: list[dict[str, Any]] = await eventually(listed, f"{count} pending decision(s)")
        return result


@dataclass
class Served:
    world: World
    lead: Tools
    agent: Tools


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rta-", dir="/tmp"))  # short: tmux.sock fits sun_path
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def served(root: Path) -> AsyncIterator[Served]:
    async with hosted(root) as world:
        relay = world.relay
        server = RelayServer(
            str(world.state / "relay.sock"), authenticate=relay.authenticate,
            handle=relay.handle, admit=relay.admit, registry=relay.connections,
            inscribe=relay.inscribe,
        )  # fmt: skip
        surfaces = {}
        for member in ("lead", "agent"):
            layout = layout_mod.resolve(
                bundle_flag="mixed", session_flag=member, configuration_flags=[str(world.config)],
                state_flag=str(world.state), env={},
            )  # fmt: skip
            assert layout.associated, layout

            def stream(layout: layout_mod.Layout, on_events: Any, on_note: Any) -> InProcessStream:
                principal = layout.principal_id
                return InProcessStream(
                    lambda on_event: server.local_session(principal, on_event),
                    principal,
                    request_timeout=30.0,
                    on_events=on_events,
                )

            surfaces[member] = RelayToolsSurface(layout, stream)
        try:
            yield Served(world, Tools(surfaces["lead"]), Tools(surfaces["agent"]))
        finally:
            for surface in surfaces.values():
                await surface.aclose()


async def test_send_then_look_shows_the_turn_as_structured_entries(served: Served) -> None:
    sent = await served.lead.ok("send", {"message": "hello-from-the-tools", "targets": ["agent"]})
    (result,) = sent["results"]
    assert (result["target_session"], result["outcome"]) == (AGENT, "queued")
    entries = await served.lead.entries("thought about", "cognition")
    assert [e["kind"] for e in entries] == ["user", "agent", "cognition"]
    assert "hello-from-the-tools" in entries[0]["lines"]
    look = await served.lead.ok("look", {"target_session": AGENT, "lines": 2, "offset": 1})
    assert {k: v for k, v in look.items() if k not in ("captured_at", "snapshot_age_ms")} == {
        "schema_version": "1",
        "requester_session": LEAD,
        "target_session": AGENT,
        "snapshot_format": "structured_entries_v1",
        "snapshot_entries": entries[:2],
        "entries_total": 3,
        "returned_entries_count": 2,
        "freshness": "fresh",
        "snapshot_source": "live_buffer",
    }
    code, data = await served.lead.error("look", {"target_session": LEAD, "offset": 1})
    assert (code, data["code"]) == (-32602, "validation_offset_unsupported")
    code, data = await served.lead.error("look", {"target_session": AGENT, "lines": 1001})
    assert (code, data["code"]) == (-32602, "validation_invalid_lines")


async def test_list_decisions_and_choose_resolve_a_permission_request(served: Served) -> None:
    lead = served.lead
    sent = await lead.ok("send", {"message": "ACP-ASK: touch /tmp/tools", "targets": ["agent"]})
    (choice,) = await lead.decisions(1)
    choice_id = choice["choice_request_id"]
    assert (choice["message_id"], choice["target_session"]) == (
        sent["results"][0]["message_id"],
        AGENT,
    )
    assert choice["requested_details"]["tool_call_title"] == "touch /tmp/tools"
    assert choice["requested_details"]["options"] == OPTIONS
    picked = await lead.ok(
        "choose", {"choice_request_id": choice_id, "outcome": "selected", "option_id": "allow"}
    )
    assert picked == {
        "schema_version": "1",
        "status": "resolved",
        "choice_request_id": choice_id,
        "outcome": "selected",
        "decided_by": LEAD,
    }
    await lead.entries("selected:allow", "agent")
    assert (await lead.ok("list", {"command": "decisions"}))["pending_requests"] == []


async def test_choose_refusals_keep_the_choice_pending(served: Served) -> None:
    lead = served.lead
    await lead.ok("send", {"message": "ACP-ASK: drop table", "targets": ["agent"]})
    (choice,) = await lead.decisions(1)
    choice_id = choice["choice_request_id"]
    offered = {"offered_option_ids": ["allow", "reject"]}
    refusals: list[tuple[dict[str, Any], dict[str, Any] | None]] = [
        (
            {"choice_request_id": choice_id, "outcome": "selected", "option_id": "sure"},
            {"choice_request_id": choice_id, "option_id": "sure", **offered},
        ),
        (
            {"choice_request_id": choice_id, "outcome": "cancelled", "option_id": "allow"},
            {"field": "option_id", "outcome": "cancelled"},
        ),
        (
            {"choice_request_id": choice_id, "outcome": "selected"},
            {"field": "option_id", "outcome": "selected"},
        ),
        (
            {"choice_request_id": choice_id, "outcome": "cancelled", "decided_by": "op@GLOBAL"},
            {"fields": ["decided_by"]},
        ),
        ({"choice_request_id": choice_id, "outcome": "cancelled", "bundle_name": "party"}, None),
    ]
    for arguments, details in refusals:
        code, data = await lead.error("choose", arguments)
        assert (code, data["code"]) == (-32602, "validation_invalid_params"), arguments
        if details is not None:
            assert data["details"] == details, arguments
        assert data["message"]
    code, data = await lead.error("list", {"command": "decisions", "args": {"bundle": "mixed"}})
    assert (code, data["code"]) == (-32602, "validation_invalid_params")
    assert await lead.decisions(1) == [choice]  # still pending: the agent still waits

    picked = await lead.ok("choose", {"choice_request_id": choice_id, "outcome": "cancelled"})
    assert (picked["outcome"], picked["reason_code"]) == (
        "cancelled",
        "runtime_choices_request_cancelled",
    )
    code, data = await lead.error(
        "choose", {"choice_request_id": choice_id, "outcome": "selected", "option_id": "allow"}
    )
    assert (code, data["code"]) == (-32603, "runtime_choices_request_already_resolved")
    assert data["details"] == {"choice_request_id": choice_id}
    entries = await lead.entries("cancelled", "agent")
    assert not any("selected:" in line for e in entries for line in lines(e))


async def test_a_member_without_choose_is_refused_both_tools(served: Served) -> None:
    code, data = await served.agent.error("list", {"command": "decisions"})
    assert (code, data["code"]) == (-32602, "authorization_forbidden")
    assert {k: data["details"][k] for k in ("capability", "requester_session", "bundle_name")} == {
        "capability": "choose",
        "requester_session": AGENT,
        "bundle_name": "mixed",
    }
    code, data = await served.agent.error(
        "choose", {"choice_request_id": "c-1", "outcome": "cancelled"}
    )
    assert (code, data["code"]) == (-32602, "authorization_forbidden")
    assert (data["details"]["capability"], data["details"]["choice_request_id"]) == (
        "choose",
        "c-1",
    )
