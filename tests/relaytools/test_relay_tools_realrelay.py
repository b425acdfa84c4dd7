"""Black-box: the real `mcphost relay-tools` process over stdio against the REAL relay.

The same tools process and drivers as test_relay_tools.py (the official SDK client, the
raw JSON-RPC driver with its schema check), but the socket is served by a real `RelayServer` +
`RelayBehaviour` over a real `BundleHost` on real tmux (mcphost/testing/realrelay.py: the bundle
`party` of three stand-in agents that print `> ` and echo what they read, alpha with the
`operator` policy, bravo and charlie with `default`; the bundle `mixed`; `op@GLOBAL`). The relay
runs on its own event loop in a background thread, one per module (under xdist's loadfile one
module is one worker), serving the configuration tree and state root the tools resolve
(`--configuration-directory <config> --state-directory <state>`; socket trust for the tree's
principals, as the supervisor vouches for its agents).

Run against both relays (here with real answers, in test_relay_tools.py with canned ones):
the association and help (help never reaches the relay), the start-up Hello, `list` (home +
GLOBAL fan-out, `*`, validation before the relay), `send` (forwarded frame, per-target results,
broadcast, then the message seen in the target's pane through `look`), `look` (bounds, real
errors), `raww` (then read back with `look`), `updown` (skipped, down, up), `new peer` / `change
psk` (the three destinations, a minted PSK presented at Hello by another tools process, which
the relay accepts), policy refusals (`authorization_forbidden` with the capability, as bravo),
parallel calls on one connection, the raw wire shapes, and the inscriptions (the tools' `mcp.log`
beside the relay's `relay.log`).

An ACP member (test_acp_member_send_decisions_choose_and_look): `lead` brings `mixed` up, whose
`agent` is the stand-in ACP agent (mcphost/testing/acp_agent.py), sends it a task that asks
permission, sees the request in `list` command=decisions, `choose`s an option, and reads the
turn back with `look` as structured entries; then takes `mixed` down again.

Fake-only (they assert canned fake-relay behaviour a real relay cannot be made to produce, or
need no relay at all), and why:
- the error passthrough parts of the send / look / raww / choose tests: arbitrary relay errors
  (`delivery_target_fail_stopped`, a `look` answer to a `send`, `validation_unknown_sender` for
  a configured sender) are canned; here only the errors the real relay really gives are
  checked;
- test_parallel_calls_are_all_in_flight_at_once: the fake holds every answer until all 16
  requests arrived and answers in reverse; a real relay serves a connection's requests in order
  (§2.1), so only "all answered on one connection" is relay-independent (checked here);
- test_relay_timeout_and_inscriptions: a never-answered request and injected stream events;
- test_relay_down_at_start_then_up_serves_and_connects_on_the_next_call,
  test_list_unreachable_relay_synthesizes_down_views, test_unassociated_server_lists_tools_and_
  refuses_relay_tools, test_explicit_bad_association_is_a_retained_fault: no relay, or a relay
  started mid-test (relay-independent by construction);
- test_stream.py: the client's reaction to fake revocations, hello rejections, hello
  timeouts, out-of-order answers and connection-level errors (tests/relay/test_server.py drives
  our client against the real server for those the server can produce);
- test_layout_member_ids.py: the relay is never dialled, or only the Hello's PSK matters.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcphost.testing.realrelay import GUARD, RealRelay, config_tree
from mcphost.testing.relayharness import Env, error_of, ok, raw_server, sdk_client

# deep (make test-slow): the relay tools against the real relay.
pytestmark = [
    pytest.mark.deep,
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

MESSAGE_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$")


class World:
    def __init__(self, env: Env, relay: RealRelay) -> None:
        self.env = env
        self.relay = relay

    def args(self, session: str = "alpha") -> list[str]:
        return self.env.args(session=session)

    def requests_since(self, mark: int) -> list[dict[str, Any]]:
        return self.relay.requests[mark:]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    root = Path(tempfile.mkdtemp(prefix="rtr-", dir="/tmp"))  # short: sockets fit sun_path
    config, state = config_tree(root)
    (root / "home").mkdir()
    relay = RealRelay(config, state).start()
    try:
        yield World(Env(root, config, state), relay)
    finally:
        relay.stop()
        shutil.rmtree(root, ignore_errors=True)


async def eventually(condition: Callable[[], Awaitable[Any]], what: str) -> Any:
    """Poll an async condition until it is truthy (the guard only catches a hang)."""
    deadline = time.monotonic() + GUARD
    while True:
        value = await condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not met"
        await asyncio.sleep(0.02)


async def pane_shows(client: Client, target: str, needle: str) -> list[str]:
    """`look` at `target` through the tools until a line contains `needle`."""

    async def look() -> list[str] | None:
        out = await ok(client, "look", {"target_session": target, "lines": 200})
        lines: list[str] = out["snapshot_lines"]
        return lines if any(needle in line for line in lines) else None

    result: list[str] = await eventually(look, f"{needle!r} in {target}'s pane")
    return result


def party(ready: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"id": "party", "hosted": ready, "state": "up" if ready else "down"}
    if ready:
        out["startup_health"] = "healthy"
    out.update(
        startup_failure_count=0,
        recent_startup_failures=[],
        principals=[
            {"id": "alpha@party", "name": "Alpha", "transport": "tmux", "ready": ready},
            {"id": "bravo@party", "transport": "tmux", "ready": ready},
            {"id": "charlie@party", "transport": "tmux", "ready": ready},
        ],
    )
    return out


GLOBAL_VIEW = {
    "id": "GLOBAL",
    "hosted": False,
    "state": "down",
    "startup_failure_count": 0,
    "recent_startup_failures": [],
    "principals": [{"id": "op@GLOBAL", "transport": "ui", "ready": False}],
}


# -- association, help, hello ------------------------------------------------------------------


async def test_instructions_help_and_the_start_up_hello(world: World) -> None:
    relay = world.relay
    hellos, mark = len(relay.hellos), len(relay.requests)
    async with sdk_client(world.env, world.args()) as c:
        assert c.instructions == (
            "agentmux MCP server for tmux-backed multi-agent coordination. "
            "Associated with session 'alpha' in namespace 'party'."
        )
        doc = await ok(c, "help", {})
        assert doc["association"] == {"associated": True, "namespace": "party", "session": "alpha"}

        async def hello_seen() -> bool:
            return len(relay.hellos) > hellos

        await eventually(hello_seen, "the start-up hello")  # seed 000: before any call
        assert relay.hellos[hellos:] == [
            {"principal_id": "alpha@party", "socket_trust": True, "accepted": True}
        ]
        assert world.requests_since(mark) == []  # help never reaches the relay
        await ok(c, "list", {"command": "principals"})
        assert len(relay.hellos) == hellos + 1  # the same connection


# -- list --------------------------------------------------------------------------------------


async def test_list_principals_home_global_fanout_and_validation(world: World) -> None:
    async with sdk_client(world.env, world.args()) as c:
        mark = len(world.relay.requests)
        out = await ok(c, "list", {"command": "principals"})
        assert out == {"schema_version": "1", "bundles": [party(), GLOBAL_VIEW]}
        assert [(r.get("namespace"), r["request"]) for r in world.requests_since(mark)] == [
            ("party", {"operation": "list", "requester_session": "alpha"}),
            ("GLOBAL", {"operation": "list", "requester_session": "alpha"}),
        ]
        out = await ok(c, "list", {"command": "principals", "args": {"namespace": "GLOBAL"}})
        assert out["bundles"] == [GLOBAL_VIEW]
        out = await ok(c, "list", {"command": "principals", "args": {"namespace": "*"}})
        assert [b["id"] for b in out["bundles"]] == ["mixed", "party", "GLOBAL"]
        mixed = out["bundles"][0]
        assert (mixed["state"], mixed["hosted"]) == ("down", False)
        mark = len(world.relay.requests)
        for arguments in (
            {"command": "principals", "args": {"namespace": "ALL"}},
            {"command": "principals", "args": {"namespace": "RELAY"}},
            {},
            {"command": "sessions"},
            {"command": "principals", "bogus": 1},
        ):
            code, data = await error_of(c, "list", arguments)
            assert (code, data["code"]) == (-32602, "validation_invalid_params"), arguments
        assert world.requests_since(mark) == []  # nothing invalid reached the relay
    async with sdk_client(world.env, world.args("bravo")) as c:  # policy "default": home only
        code, data = await error_of(
            c, "list", {"command": "principals", "args": {"namespace": "mixed"}}
        )
        assert (code, data["code"]) == (-32602, "authorization_forbidden")
        assert data["details"]["capability"] == "list.read"


# -- send / look / raww ------------------------------------------------------------------------


async def test_send_forwarding_results_and_the_message_in_the_pane(world: World) -> None:
    async with sdk_client(world.env, world.args()) as c:
        mark = len(world.relay.requests)
        invalid: list[tuple[dict[str, Any], str]] = [
            (
                {"message": "hi", "targets": ["bravo"], "broadcast": True},
                "validation_conflicting_targets",
            ),
            ({"message": "hi"}, "validation_empty_targets"),
            ({"message": "  ", "targets": ["bravo"]}, "validation_invalid_arguments"),
        ]
        for arguments, expected in invalid:
            assert (await error_of(c, "send", arguments))[1]["code"] == expected
        assert world.requests_since(mark) == []
        out = await ok(c, "send", {"message": "hello bravo, real relay", "targets": ["bravo"]})
        assert world.requests_since(mark)[0]["request"] == {
            "operation": "send",
            "request_id": None,
            "requester_session": "alpha",
            "message": "hello bravo, real relay",
            "targets": ["bravo@party"],
            "broadcast": False,
        }
        assert set(out) == {"schema_version", "requester_session", "sender_display_name",
                            "results"}  # fmt: skip
        assert (out["requester_session"], out["sender_display_name"]) == ("alpha@party", "Alpha")
        (result,) = out["results"]
        assert (result["target_session"], result["outcome"]) == ("bravo@party", "queued")
        assert MESSAGE_ID.match(result["message_id"])
        lines = await pane_shows(c, "bravo@party", "hello bravo, real relay")
        assert f"Message-Id: {result['message_id']}" in lines
        out = await ok(c, "send", {"message": "to all", "broadcast": True, "request_id": "b-1"})
        assert out["request_id"] == "b-1"
        assert [r["target_session"] for r in out["results"]] == ["bravo@party", "charlie@party"]
        await pane_shows(c, "charlie@party", "to all")
        # real refusals pass through with their code and details
        code, data = await error_of(c, "send", {"message": "x", "targets": ["zed"]})
        assert (code, data["code"]) == (-32602, "validation_unknown_target")
        assert data["details"] == {"target_session": "zed@party"}
    async with sdk_client(world.env, world.args("bravo")) as c:
        code, data = await error_of(c, "send", {"message": "x", "targets": ["lead@mixed"]})
        assert (code, data["code"]) == (-32602, "authorization_forbidden")
        assert data["details"]["capability"] == "send.deliver"


async def test_look_bounds_and_real_errors(world: World) -> None:
    async with sdk_client(world.env, world.args()) as c:
        mark = len(world.relay.requests)
        for lines in (0, 1001):
            code, data = await error_of(
                c, "look", {"target_session": "bravo@party", "lines": lines}
            )
            assert (code, data["code"]) == (-32602, "validation_invalid_lines")
            assert data["details"] == {"lines": lines, "min": 1, "max": 1000}
        assert world.requests_since(mark) == []
        out = await ok(c, "look", {"target_session": "bravo@party", "lines": 3})
        assert world.requests_since(mark)[0]["request"] == {
            "operation": "look",
            "requester_session": "alpha",
            "target_session": "bravo@party",
            "lines": 3,
        }
        assert (out["target_session"], out["snapshot_format"]) == ("bravo@party", "lines")
        assert 1 <= len(out["snapshot_lines"]) <= 3
        code, data = await error_of(c, "look", {"target_session": "bravo@party", "offset": 3})
        assert (code, data["code"]) == (-32602, "validation_offset_unsupported")
        assert data["details"] == {"target_session": "bravo@party", "offset": 3}
        code, data = await error_of(c, "look", {"target_session": "bravo"})
        assert (code, data["code"]) == (-32602, "validation_unqualified_target")
        code, data = await error_of(c, "look", {"target_session": "agent@mixed"})
        assert (code, data["code"]) == (-32603, "transport_unavailable")  # mixed is not up
        code, data = await error_of(c, "look", {"target_session": "term@mixed"})
        assert (code, data["code"]) == (-32603, "runtime_session_type_not_implemented")


async def test_raww_then_read_back_and_a_forbidden_raww(world: World) -> None:
    async with sdk_client(world.env, world.args()) as c:
        mark = len(world.relay.requests)
        out = await ok(c, "raww", {"target_session": "charlie@party", "text": "raw-words-1"})
        assert world.requests_since(mark)[0]["request"] == {
            "operation": "raww",
            "request_id": None,
            "requester_session": "alpha",
            "target_session": "charlie@party",
            "text": "raw-words-1",
            "no_enter": False,
        }
        assert {k: v for k, v in out.items() if k != "message_id"} == {
            "schema_version": "1",
            "status": "queued",
            "target_session": "charlie@party",
            "transport": "tmux",
        }
        await pane_shows(c, "charlie@party", "echo: raw-words-1")
    async with sdk_client(world.env, world.args("bravo")) as c:
        code, data = await error_of(c, "raww", {"target_session": "charlie@party", "text": "y"})
        assert (code, data["details"]["capability"]) == (-32602, "raww.write")


# -- updown ------------------------------------------------------------------------------------


async def test_updown_skipped_down_and_up(world: World) -> None:
    async with sdk_client(world.env, world.args("bravo")) as c:
        code, data = await error_of(c, "updown", {"command": "down"})
        assert (code, data["details"]["capability"]) == (-32602, "updown")
    async with sdk_client(world.env, world.args()) as c:
        mark = len(world.relay.requests)
        out = await ok(c, "updown", {"command": "up", "args": {}})
        assert out == {
            "schema_version": "1",
            "action": "up",
            "bundles": [
                {
                    "bundle_name": "party",
                    "outcome": "skipped",
                    "reason_code": "already_hosted",
                    "reason": "bundle runtime is already hosted",
                }
            ],
            "changed_bundle_count": 0,
            "skipped_bundle_count": 1,
            "failed_bundle_count": 0,
            "changed_any": False,
        }
        out = await ok(c, "updown", {"command": "down"})
        assert out["bundles"] == [{"bundle_name": "party", "outcome": "unhosted"}]
        assert out["changed_any"] is True
        listed = await ok(c, "list", {"command": "principals"})
        assert listed["bundles"][0] == party(ready=False)
        out = await ok(c, "updown", {"command": "up"})
        assert out["bundles"] == [{"bundle_name": "party", "outcome": "hosted"}]
        listed = await ok(c, "list", {"command": "principals"})
        assert listed["bundles"][0] == party()
        assert [
            r["request"]
            for r in world.requests_since(mark)
            if r["request"]["operation"] in ("up", "down")
        ] == [
            {"operation": "up"},
            {"operation": "down"},
            {"operation": "up"},
        ]
        await pane_shows(c, "bravo@party", ">")  # the restarted stand-in is back


# -- credentials -------------------------------------------------------------------------------


async def test_new_peer_and_change_psk_and_the_minted_psk_at_hello(world: World) -> None:
    env, relay = world.env, world.relay
    config_psk = env.state / "bundles/party/sessions/bravo/identity.psk"
    out_path = env.root / "w.psk"
    try:
        async with sdk_client(env, world.args()) as c:
            _code, data = await error_of(
                c, "new", {"command": "user", "args": {"principal_id": "w"}}
            )
            assert data["details"] == {"command": "user"}
            out = await ok(c, "new", {"command": "peer", "args": {"principal_id": "w@party"}})
            assert set(out) == {"schema_version", "principal_id", "principal_type", "psk",
                                "config_snippet"}  # fmt: skip
            assert len(out["psk"]) == 43 and out["principal_type"] == "session"
            shown = out["psk"]
            out = await ok(
                c,
                "new",
                {"command": "peer",
                 "args": {"principal_id": "op@GLOBAL", "output_path": str(out_path)}},
            )  # fmt: skip
            assert out["written_path"] == str(out_path) and "psk" not in out
            assert stat.S_IMODE(out_path.stat().st_mode) == 0o600
            out = await ok(
                c,
                "new",
                {
                    "command": "peer",
                    "args": {"principal_id": "bravo@party", "write_to_config": True},
                },
            )
            assert out["written_path"] == str(config_psk)
            _code, data = await error_of(
                c,
                "new",
                {"command": "peer", "args": {"principal_id": "x@party", "output_path": "rel"}},
            )
            assert data["code"] == "validation_invalid_output_path"
            out = await ok(c, "change", {"command": "psk", "args": {"principal_id": "w@party"}})
            assert set(out) == {"schema_version", "principal_id", "psk"}
            assert out["psk"] != shown
            rotated = out["psk"]
        # another tools process, as bravo, presents the minted PSK at Hello and is accepted
        hellos = len(relay.hellos)
        async with sdk_client(env, world.args("bravo")) as c:
            out = await ok(c, "look", {"target_session": "alpha@party", "lines": 1})
            assert out["authenticated_identity"] == "bravo@party"
        assert relay.hellos[hellos:] == [
            {"principal_id": "bravo@party", "socket_trust": False, "accepted": True}
        ]
        # no PSK in any inscription
        logs = "".join(p.read_text() for p in env.inscriptions.rglob("*.log"))
        assert shown not in logs and rotated not in logs
        assert config_psk.read_text().strip() not in logs
    finally:
        config_psk.unlink(missing_ok=True)  # bravo goes back to socket trust


# -- concurrency, wire shapes, inscriptions ----------------------------------------------------


async def test_parallel_calls_share_one_connection(world: World) -> None:
    hellos = len(world.relay.hellos)
    async with sdk_client(world.env, world.args()) as c:
        outs = await asyncio.gather(
            *(
                ok(c, "send", {"message": f"p{i}", "targets": ["charlie"], "request_id": str(i)})
                for i in range(16)
            )
        )
    assert [o["request_id"] for o in outs] == [str(i) for i in range(16)]
    assert all(o["results"][0]["outcome"] == "queued" for o in outs)
    assert len(world.relay.hellos) == hellos + 1


async def test_wire_shapes_raw(world: World) -> None:
    async with raw_server(world.env, world.args()) as s:
        reply = await s.call("send", {"message": " ", "targets": ["b"]})
        assert reply["error"]["data"]["code"] == "validation_invalid_arguments"
        reply = await s.call("send", {"message": "raw hi", "broadcast": True})
        result = reply["result"]
        assert result["isError"] is False and "structuredContent" not in result
        document = json.loads(result["content"][0]["text"])
        assert [r["target_session"] for r in document["results"]] == [
            "bravo@party",
            "charlie@party",
        ]
        listed = await s.request("tools/list", {})
        assert "null" not in json.dumps([t["inputSchema"] for t in listed["result"]["tools"]])
    assert all(json.loads(line).get("jsonrpc") == "2.0" for line in s.lines)


async def test_the_relays_inscriptions_sit_beside_the_tools(world: World) -> None:
    marker = "inscribed-by-both"
    async with sdk_client(world.env, world.args()) as c:
        await ok(c, "send", {"message": marker, "targets": ["bravo"]})
    tools = world.env.inscription_events()
    relay_log = world.env.inscriptions / "relay.log"
    relay = [json.loads(line) for line in relay_log.read_text().splitlines()]
    assert any(
        r["event"] == "mcp.tool.send.request" and r["details"]["message_length"] == len(marker)
        for r in tools
    )
    assert any(
        r["event"] == "relay.send.request" and r["details"]["message_length"] == len(marker)
        for r in relay
    )
    assert marker not in relay_log.read_text()


# -- an ACP member -----------------------------------------------------------------------------


async def test_acp_member_send_decisions_choose_and_look(world: World) -> None:
    async with sdk_client(world.env, world.env.args(bundle="mixed", session="lead")) as c:
        out = await ok(c, "updown", {"command": "up"})
        assert out["bundles"] == [{"bundle_name": "mixed", "outcome": "hosted"}]
        try:
            sent = await ok(c, "send", {"message": "ACP-ASK: run tests", "targets": ["agent"]})
            message_id = sent["results"][0]["message_id"]

            async def pending() -> list[dict[str, Any]]:
                listed = await ok(c, "list", {"command": "decisions"})
                result: list[dict[str, Any]] = listed["pending_requests"]
                return result

            (choice,) = await eventually(pending, "the permission request in list decisions")
            assert (choice["message_id"], choice["target_session"]) == (message_id, "agent@mixed")
            assert choice["requested_details"]["tool_call_title"] == "run tests"
            picked = await ok(
                c,
                "choose",
                {"choice_request_id": choice["choice_request_id"], "outcome": "selected",
                 "option_id": "allow"},
            )  # fmt: skip
            assert (picked["status"], picked["decided_by"]) == ("resolved", "lead@mixed")

            async def finished() -> dict[str, Any] | None:
                look: dict[str, Any] = await ok(c, "look", {"target_session": "agent@mixed"})
                kinds = [e["kind"] for e in look["snapshot_entries"]]
                return look if kinds[-1:] == ["cognition"] else None

            look = await eventually(finished, "the turn's end in look")
            assert look["snapshot_format"] == "structured_entries_v1"
            entries = look["snapshot_entries"]
            assert [e["kind"] for e in entries] == ["user", "invocation", "agent", "cognition"]
            assert entries[1]["status"] == "Completed"
            assert entries[2]["lines"][0] == "selected:allow"
            assert await pending() == []
        finally:
            out = await ok(c, "updown", {"command": "down"})
            assert out["bundles"] == [{"bundle_name": "mixed", "outcome": "unhosted"}]
