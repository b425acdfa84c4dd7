"""Black-box: the real `mcphost relay-tools` process over stdio, driven by the official SDK client
(and a raw JSON-RPC driver where the SDK would hide omission vs null), against the fake relay.

Mirrors upstream's MCP integration suite (unassociated, schema, help, list, send, look, raww,
choices, updown, credential admin) for the nine tools.

The tests that only call tools on an associated server (alpha@party) share one process and one
fake relay (`served`); a test whose subject is the process itself (its association, its start-up
Hello, its environment, a relay absent at start, its wire bytes, its inscriptions) starts its own.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from mcp import Client

from mcphost.testing.relayharness import (
    Env,
    FakeRelay,
    cleanup,
    error_of,
    global_bundle,
    listed_bundle,
    make_env,
    ok,
    raw_server,
    relay_error,
    sdk_client,
)

pytestmark = pytest.mark.anyio

REMEDY = "mcphost relay-tools --bundle <name> --session-name <id>"
RELAY_BACKED: list[tuple[str, dict[str, Any]]] = [
    ("send", {"message": "hi", "targets": ["bravo"]}),
    ("look", {"target_session": "bravo@party"}),
    ("raww", {"target_session": "bravo@party", "text": "y"}),
    ("choose", {"choice_request_id": "c-1", "outcome": "cancelled"}),
    ("updown", {"command": "up"}),
    ("new", {"command": "peer", "args": {"principal_id": "w@party"}}),
    ("change", {"command": "psk", "args": {"principal_id": "w@party"}}),
    ("list", {"command": "principals"}),
    ("list", {"command": "decisions"}),
]


def forbidden(capability: str, **extra: Any) -> dict[str, Any]:
    return relay_error(
        "authorization_forbidden",
        "request denied by authorization policy",
        {
            "capability": capability,
            "requester_session": "alpha@party",
            "bundle_name": "party",
            "reason": "policy scope does not permit this access",
            **extra,
        },
    )


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module scope, so that `shared_server` (one process per module) can be async."""
    return "asyncio"


@dataclass
class Served:
    env: Env
    relay: FakeRelay
    client: Client


@pytest.fixture(scope="module")
async def shared_server() -> AsyncIterator[Served]:
    """One associated `mcphost relay-tools` process (alpha@party), its SDK session and its fake
    relay, shared by the tests that only call tools.

    A fresh process per test would prove nothing more: the arguments, environment and relay are
    the same, and each test starts from a reset relay (`served`) and reads only the requests it
    caused. The server Hellos once at start and keeps that one connection the whole module
    (checked when the module ends); closing the session (stdin EOF) must succeed.
    """
    env = make_env()
    relay = await FakeRelay(env.socket).start()
    try:
        async with sdk_client(env) as client:
            yield Served(env, relay, client)
        assert relay.connections == 1 and len(relay.hellos) == 1, (relay.connections, relay.hellos)
        assert relay.hellos[0]["principal_id"] == "alpha@party"
    finally:
        await relay.stop()
        cleanup(env)


@pytest.fixture
def served(shared_server: Served) -> Served:
    """The shared server, its fake relay as a fresh one answers: nothing canned, no handler, no
    extra events, no requests recorded (the start-up Hello stays in `hellos`)."""
    shared_server.relay.forget()
    return shared_server


# -- association -----------------------------------------------------------------------------


async def test_unassociated_server_lists_tools_and_refuses_relay_tools(env: Env) -> None:
    async with sdk_client(env, env.args(bundle=None, session=None)) as c:
        assert "validation_unknown_sender" in (c.instructions or "")
        assert REMEDY in (c.instructions or "")
        names = [t.name for t in (await c.list_tools()).tools]
        assert names == [
            "list",
            "help",
            "send",
            "look",
            "raww",
            "choose",
            "updown",
            "new",
            "change",
        ]
        for name, arguments in RELAY_BACKED:
            code, data = await error_of(c, name, arguments)
            assert code == -32602, name
            assert data["code"] == "validation_unknown_sender", name
            assert data["details"] == {"reason": "unassociated_server", "remedy": REMEDY}
        # validation still runs first
        code, data = await error_of(c, "send", {"message": " ", "targets": ["bravo"]})
        assert data["code"] == "validation_invalid_arguments"
        doc = await ok(c, "help", {})
        assert doc["association"] == {"associated": False, "remedy": REMEDY}


async def test_explicit_bad_association_is_a_retained_fault(env: Env) -> None:
    async with sdk_client(env, env.args(session="zed")) as c:
        code, data = await error_of(c, "look", {"target_session": "bravo@party"})
        assert code == -32602
        assert data["code"] == "validation_unknown_sender"
        assert data["details"]["reason"] == "startup_fault"
        assert data["details"]["startup_fault_code"] == "validation_unknown_sender"
        assert (await ok(c, "help", {}))["association"]["associated"] is False


async def test_associated_instructions_help_and_schemas(served: Served) -> None:
    c, relay = served.client, served.relay
    assert c.instructions == (
        "agentmux MCP server for tmux-backed multi-agent coordination. "
        "Associated with session 'alpha' in namespace 'party'."
    )
    listed = (await c.list_tools()).tools
    text = json.dumps([t.input_schema for t in listed])
    assert '"null"' not in text
    for tool in listed:
        assert tool.input_schema["additionalProperties"] is False
    doc = await ok(c, "help", {})
    assert doc["association"] == {"associated": True, "namespace": "party", "session": "alpha"}
    assert doc["tools"][0] == {
        "tool": "list",
        "kind": "meta_tool",
        "description": doc["tools"][0]["description"],
    }
    for query in (
        "send",
        "look",
        "raww",
        "choose",
        "help",
        "list.principals",
        "new.peer",
        "change.psk",
    ):
        schema = (await ok(c, "help", {"query": query}))["args_schema"]
        assert "null" not in json.dumps(schema)
        assert schema["additionalProperties"] is False
    code, data = await error_of(c, "help", {"query": "nope"})
    assert (code, data["code"]) == (-32602, "validation_invalid_params")
    code, data = await error_of(c, "help", {"unexpected": 1})
    assert data["details"] == {"fields": ["unexpected"]}
    code, data = await error_of(c, "nosuch", {})
    assert (code, data["code"]) == (-32602, "validation_invalid_params")
    assert relay.requests == []  # help never reaches the relay (only the start-up Hello does)


async def test_session_psk_is_presented_at_hello(env: Env, relay: FakeRelay) -> None:
    psk = env.state / "bundles/party/sessions/alpha/identity.psk"
    psk.parent.mkdir(parents=True)
    psk.write_text("c2VjcmV0LXBzaw\n")
    relay.respond("up", {"kind": "bundle_transition", "schema_version": "1"})
    async with sdk_client(env) as c:
        await ok(c, "updown", {"command": "up"})
    assert relay.hellos[0]["identity_token"] == "c2VjcmV0LXBzaw"
    assert relay.hellos[0]["principal_id"] == "alpha@party"


# -- list ------------------------------------------------------------------------------------


async def test_list_principals_passthrough_global_fanout_and_validation(served: Served) -> None:
    c, relay = served.client, served.relay
    out = await ok(c, "list", {"command": "principals"})
    assert out == {
        "schema_version": "1",
        "bundles": [listed_bundle("party", ["alpha", "bravo", "charlie"]), global_bundle()],
    }
    assert [(r.get("namespace"), r["request"]) for r in relay.requests] == [
        ("party", {"operation": "list", "requester_session": "alpha"}),
        ("GLOBAL", {"operation": "list", "requester_session": "alpha"}),
    ]
    out = await ok(c, "list", {"command": "principals", "args": {"namespace": "GLOBAL"}})
    assert [b["id"] for b in out["bundles"]] == ["GLOBAL"]
    out = await ok(c, "list", {"command": "principals", "args": {"namespace": "*"}})
    assert [b["id"] for b in out["bundles"]] == ["alpha", "party", "zeta", "GLOBAL"]
    sent = len(relay.requests)
    for arguments, details in [
        ({"command": "principals", "args": {"namespace": "ALL"}}, {"namespace": "ALL"}),
        ({"command": "principals", "args": {"namespace": "RELAY"}}, {"namespace": "RELAY"}),
        (
            {"command": "principals", "args": {"namespace": "EXTERNAL"}},
            {"namespace": "EXTERNAL"},
        ),
        ({}, {"command": None}),
        ({"command": "sessions"}, {"command": "sessions"}),
        ({"command": "principals", "bogus": 1}, {"fields": ["bogus"]}),
        ({"command": "principals", "args": {"stowaway": 1}}, {"fields": ["args.stowaway"]}),
    ]:
        code, data = await error_of(c, "list", arguments)
        assert (code, data["code"], data["details"]) == (
            -32602,
            "validation_invalid_params",
            details,
        ), arguments
    code, data = await error_of(c, "list", {"command": "principals", "args": '{"a":1}'})
    assert data["message"] == "invalid args for list command"
    assert data["details"]["reason"] == "args must be a JSON object, got string"
    assert len(relay.requests) == sent  # nothing invalid reached the relay

    relay.respond("list", forbidden("list.read"), namespace="alpha")
    code, data = await error_of(c, "list", {"command": "principals", "args": {"namespace": "*"}})
    assert (code, data["code"]) == (-32602, "authorization_forbidden")
    assert data["details"]["capability"] == "list.read"


async def test_unreachable_relay_synthesizes_down_views_then_serves_once_up(env: Env) -> None:
    """No relay at start: `list` synthesizes down views and calls fail naming the I/O error (no
    socket, then a stale one); once a relay listens, the next call connects (one Hello)."""
    async with sdk_client(env) as c:
        out = await ok(c, "list", {"command": "principals"})
        home, glob = out["bundles"]
        assert home["id"] == "party" and home["state"] == "down" and home["hosted"] is False
        assert home["state_reason_code"] == "not_started"
        assert [(p["id"], p["ready"]) for p in home["principals"]] == [
            ("alpha@party", False),
            ("bravo@party", False),
            ("charlie@party", False),
        ]
        assert [p["transport"] for p in home["principals"]] == ["tmux", "tmux", "acp"]
        assert glob["id"] == "GLOBAL" and glob["state_reason_code"] == "relay_unavailable"
        assert glob["principals"] == []
        code, data = await error_of(
            c, "list", {"command": "principals", "args": {"namespace": "zeta"}}
        )
        assert (code, data["code"]) == (-32603, "relay_unavailable")
        assert data["details"]["relay_socket"] == str(env.socket)
        assert data["details"]["io_error_kind"] == "NotFound"
        # a stale socket file: present but nobody listening
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(env.socket))
        stale.close()
        out = await ok(c, "list", {"command": "principals"})
        assert out["bundles"][0]["state_reason_code"] == "relay_unavailable"
        code, data = await error_of(c, "send", {"message": "hi", "targets": ["bravo"]})
        assert data["details"]["io_error_kind"] == "ConnectionRefused"
        # the relay comes up (where the stale file was): the next call connects and is served
        env.socket.unlink()
        relay = await FakeRelay(env.socket).start()
        try:
            relay.respond("up", {"kind": "bundle_transition", "schema_version": "1"})
            await ok(c, "updown", {"command": "up"})
            assert relay.connections == 1 and len(relay.hellos) == 1
        finally:
            await relay.stop()


async def _poll(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_hello_is_registered_when_the_server_is_built(env: Env, relay: FakeRelay) -> None:
    # seed 000: the relay stream is Hello-registered at server construction, before any call
    relay.respond("up", {"kind": "bundle_transition", "schema_version": "1"})
    async with sdk_client(env) as c:
        await _poll(lambda: len(relay.hellos) == 1)
        assert relay.requests == [] and relay.connections == 1
        assert relay.hellos[0]["principal_id"] == "alpha@party"
        await ok(c, "updown", {"command": "up"})
        assert relay.connections == 1 and len(relay.hellos) == 1  # the same connection


async def test_list_decisions_passthrough(served: Served) -> None:
    c, relay = served.client, served.relay
    pending = {
        "kind": "choices_list",
        "schema_version": "1",
        "pending_requests": [
            {
                "message_id": "m1",
                "choice_request_id": "c-1",
                "target_session": "charlie@party",
                "requested_kind": "permission",
                "requested_details": {"tool_call_title": "rm", "options": []},
                "enqueued_at": "2026-05-01T10:00:00Z",
            }
        ],
    }
    relay.respond("choices_list", pending)
    out = await ok(c, "list", {"command": "decisions"})
    assert out == {k: v for k, v in pending.items() if k != "kind"}
    relay.respond("choices_list", forbidden("choose"))
    _code, data = await error_of(c, "list", {"command": "decisions"})
    assert data["details"]["capability"] == "choose"
    assert relay.requests[0]["request"] == {"operation": "choices_list"}


# -- send ------------------------------------------------------------------------------------


async def test_send_validation_forwarding_and_relay_errors(served: Served) -> None:
    c, relay = served.client, served.relay
    success = {
        "kind": "send",
        "schema_version": "1",
        "requester_session": "alpha@party",
        "results": [{"target_session": "bravo@party", "message_id": "6f1c", "outcome": "queued"}],
    }
    relay.respond("send", success)
    for arguments, code in [
        (
            {"message": "hi", "targets": ["bravo"], "broadcast": True},
            "validation_conflicting_targets",
        ),
        ({"message": "hi"}, "validation_empty_targets"),
        ({"message": "  ", "targets": ["bravo"]}, "validation_invalid_arguments"),
        (
            {"message": "hi", "targets": ["bravo"], "quiescence_timeout_ms": 5},
            "validation_invalid_params",
        ),
    ]:
        assert (await error_of(c, "send", arguments))[1]["code"] == code
    assert relay.requests == []
    out = await ok(c, "send", {"message": "hello", "targets": ["bravo", "op@GLOBAL"]})
    assert out == {k: v for k, v in success.items() if k != "kind"}
    assert "request_id" not in out and "authenticated_identity" not in out
    assert relay.requests[0]["request"] == {
        "operation": "send",
        "request_id": None,
        "requester_session": "alpha",
        "message": "hello",
        "targets": ["bravo@party", "op@GLOBAL"],
        "broadcast": False,
    }
    assert "namespace" not in relay.requests[0]
    await ok(c, "send", {"message": "all", "broadcast": True, "request_id": "req-1"})
    assert relay.requests[1]["request"]["request_id"] == "req-1"
    assert relay.requests[1]["request"]["targets"] == []
    relay.respond(
        "send",
        relay_error("validation_unknown_sender", "sender is not configured", {"sender": "alpha"}),
    )
    code, data = await error_of(c, "send", {"message": "x", "targets": ["bravo"]})
    assert (code, data["code"], data["details"]) == (
        -32602,
        "validation_unknown_sender",
        {"sender": "alpha"},
    )
    relay.respond("send", forbidden("send.deliver", targets=["zed@other"]))
    code, data = await error_of(c, "send", {"message": "x", "targets": ["zed@other"]})
    assert (code, data["details"]["capability"]) == (-32602, "send.deliver")
    relay.respond("send", relay_error("delivery_target_fail_stopped", "stopped"))
    code, data = await error_of(c, "send", {"message": "x", "targets": ["bravo"]})
    assert (code, data["code"], data["details"]) == (
        -32603,
        "delivery_target_fail_stopped",
        None,
    )
    relay.respond("send", {"kind": "look", "schema_version": "1"})
    code, data = await error_of(c, "send", {"message": "x", "targets": ["bravo"]})
    assert data["code"] == "internal_unexpected_failure"
    assert data["details"] == {"response": {"kind": "look", "schema_version": "1"}}


async def test_wire_shapes_raw(env: Env, relay: FakeRelay) -> None:
    relay.respond(
        "send",
        {
            "kind": "send",
            "schema_version": "1",
            "requester_session": "alpha@party",
            "authenticated_identity": "alpha@party",
            "results": [],
        },
    )
    async with raw_server(env) as s:
        reply = await s.call("send", {"message": " ", "targets": ["b"]})
        assert reply["error"] == {
            "code": -32602,
            "message": "message must be non-empty",
            "data": {
                "code": "validation_invalid_arguments",
                "message": "message must be non-empty",
                "details": None,
            },
        }
        reply = await s.call("send", {"message": "hi", "broadcast": True})
        result = reply["result"]
        assert result["isError"] is False
        assert "structuredContent" not in result
        assert len(result["content"]) == 1 and result["content"][0]["type"] == "text"
        assert result["content"][0]["text"] == (
            '{"schema_version":"1","requester_session":"alpha@party",'
            '"authenticated_identity":"alpha@party","results":[]}'
        )
        listed = await s.request("tools/list", {})
        assert "null" not in json.dumps([t["inputSchema"] for t in listed["result"]["tools"]])
    assert all(json.loads(line).get("jsonrpc") == "2.0" for line in s.lines)


# -- look / raww -----------------------------------------------------------------------------


async def test_look_forwarding_bounds_passthrough_and_errors(served: Served) -> None:
    c, relay = served.client, served.relay
    acp = {
        "kind": "look",
        "schema_version": "1",
        "requester_session": "alpha@party",
        "target_session": "charlie@party",
        "captured_at": "2026-05-01T10:00:01Z",
        "snapshot_format": "structured_entries_v1",
        "snapshot_entries": [
            {"kind": "user", "lines": ["hi"]},
            {"kind": "invocation", "call_id": "c1", "status": "pending", "invocation": {"t": 1}},
        ],
        "entries_total": 40,
        "returned_entries_count": 2,
        "freshness": "stale",
        "snapshot_source": "live_buffer",
        "stale_reason_code": "acp_stream_stalled",
        "snapshot_age_ms": 6100,
    }
    relay.respond("look", acp)
    for lines in (0, 1001):
        code, data = await error_of(c, "look", {"target_session": "charlie@party", "lines": lines})
        assert (code, data["code"]) == (-32602, "validation_invalid_lines")
        assert data["details"] == {"lines": lines, "min": 1, "max": 1000}
    code, data = await error_of(c, "look", {"target_session": " "})
    assert data["code"] == "validation_unknown_target"
    assert relay.requests == []
    out = await ok(c, "look", {"target_session": "charlie@party", "lines": 2, "offset": 5})
    assert out == {k: v for k, v in acp.items() if k != "kind"}
    assert relay.requests[0]["request"] == {
        "operation": "look",
        "requester_session": "alpha",
        "target_session": "charlie@party",
        "lines": 2,
        "offset": 5,
    }
    await ok(c, "look", {"target_session": "bravo"})
    assert relay.requests[1]["request"] == {
        "operation": "look",
        "requester_session": "alpha",
        "target_session": "bravo",  # look does not qualify; the relay decides
    }
    for error in (
        relay_error(
            "validation_offset_unsupported",
            "offset is only supported for ACP look targets",
            {"target_session": "bravo@party", "offset": 3},
        ),
        relay_error("validation_unqualified_target", "qualify it", {"target": "bravo"}),
        forbidden("look.inspect", target_session="zed@other"),
        relay_error("runtime_session_type_not_implemented", "pty"),
    ):
        relay.respond("look", error)
        code, data = await error_of(c, "look", {"target_session": "bravo@party"})
        assert data["code"] == error["error"]["code"]
        assert data["details"] == error["error"].get("details")
        assert code == (-32603 if error["error"]["code"].startswith("runtime") else -32602)


async def test_raww_forwarding_and_errors(served: Served) -> None:
    c, relay = served.client, served.relay
    queued = {
        "kind": "raww",
        "schema_version": "1",
        "status": "queued",
        "target_session": "bravo@party",
        "transport": "tmux",
        "message_id": "9a",
    }
    relay.respond("raww", queued)
    for field in ("sender_session", "requester_session", "bundle_name"):
        code, data = await error_of(
            c, "raww", {"target_session": "bravo@party", "text": "y", field: "x"}
        )
        assert data["details"] == {"fields": [field]}
    code, data = await error_of(c, "raww", {"target_session": "", "text": "y"})
    assert data["code"] == "validation_unknown_target"
    assert relay.requests == []
    out = await ok(c, "raww", {"target_session": "bravo@party", "text": "y", "no_enter": True})
    assert out == {k: v for k, v in queued.items() if k != "kind"}
    assert relay.requests[0]["request"] == {
        "operation": "raww",
        "request_id": None,
        "requester_session": "alpha",
        "target_session": "bravo@party",
        "text": "y",
        "no_enter": True,
    }
    relay.respond("raww", forbidden("raww.write", target_session="bravo@party"))
    code, data = await error_of(c, "raww", {"target_session": "bravo@party", "text": "y"})
    assert (code, data["details"]["capability"]) == (-32602, "raww.write")


# -- choose / updown -------------------------------------------------------------------------


async def test_choose_and_updown(served: Served) -> None:
    c, relay = served.client, served.relay
    resolved = {
        "kind": "choices_pick",
        "schema_version": "1",
        "status": "resolved",
        "choice_request_id": "c-1",
        "outcome": "selected",
        "decided_by": "alpha@party",
    }
    transition = {
        "kind": "bundle_transition",
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
    relay.respond("choices_pick", resolved)
    relay.respond("up", transition)
    for arguments in (
        {"outcome": "selected", "option_id": "a"},
        {"choice_request_id": "c-1", "outcome": "selected"},
        {"choice_request_id": "c-1", "outcome": "cancelled", "option_id": "a"},
        {"choice_request_id": "c-1", "outcome": "cancelled", "decided_by": "x@y"},
    ):
        code, data = await error_of(c, "choose", arguments)
        assert (code, data["code"]) == (-32602, "validation_invalid_params")
    code, data = await error_of(c, "updown", {"command": "sideways"})
    assert data["details"] == {"command": "sideways"}
    assert relay.requests == []
    out = await ok(
        c,
        "choose",
        {"choice_request_id": " c-1 ", "outcome": "selected", "option_id": "allow_once"},
    )
    assert out == {k: v for k, v in resolved.items() if k != "kind"}
    await ok(c, "choose", {"choice_request_id": "c-2", "outcome": "cancelled"})
    assert [r["request"] for r in relay.requests] == [
        {
            "operation": "choices_pick",
            "choice_request_id": "c-1",
            "outcome": "selected",
            "option_id": "allow_once",
        },
        {"operation": "choices_pick", "choice_request_id": "c-2", "outcome": "cancelled"},
    ]
    relay.respond("choices_pick", forbidden("choose", choice_request_id="c-1"))
    code, data = await error_of(c, "choose", {"choice_request_id": "c-1", "outcome": "cancelled"})
    assert data["details"]["capability"] == "choose"
    relay.respond(
        "choices_pick",
        relay_error(
            "runtime_choices_request_already_resolved", "resolved", {"choice_request_id": "c-1"}
        ),
    )
    code, data = await error_of(c, "choose", {"choice_request_id": "c-1", "outcome": "cancelled"})
    assert (code, data["code"]) == (-32603, "runtime_choices_request_already_resolved")

    out = await ok(c, "updown", {"command": "up", "args": {}})
    assert out == {k: v for k, v in transition.items() if k != "kind"}
    relay.respond("down", forbidden("updown"))
    code, data = await error_of(c, "updown", {"command": "down"})
    assert (code, data["details"]["capability"]) == (-32602, "updown")
    assert relay.requests[-2]["request"] == {"operation": "up"}
    assert relay.requests[-1]["request"] == {"operation": "down"}


# -- credential administration ---------------------------------------------------------------


async def test_new_peer_and_change_psk(served: Served) -> None:
    c, relay = served.client, served.relay

    def minted(frame: dict[str, Any]) -> dict[str, Any]:
        dest = frame["request"]["destination"]
        out: dict[str, Any] = {
            "kind": frame["request"]["operation"],
            "schema_version": "1",
            "principal_id": frame["request"]["principal_id"],
        }
        if frame["request"]["operation"] == "new_peer":
            out["principal_type"] = "session"
        if dest["kind"] == "response":
            out["psk"] = "A" * 43
        else:
            out["written_path"] = dest.get("path", "/state/bundles/party/sessions/w/identity.psk")
        if frame["request"]["operation"] == "new_peer":
            out["config_snippet"] = "Write the PSK to its file."
        return out

    relay.respond("new_peer", minted)
    relay.respond("change_psk", minted)
    for tool, command in (("new", "peer"), ("change", "psk")):
        code, data = await error_of(
            c,
            tool,
            {
                "command": command,
                "args": {"principal_id": "w@party", "output_path": "", "write_to_config": True},
            },
        )
        assert (code, data["code"]) == (-32602, "validation_invalid_params")
    code, data = await error_of(c, "new", {"command": "user", "args": {"principal_id": "w@p"}})
    assert data["details"] == {"command": "user"}
    assert relay.requests == []
    out = await ok(c, "new", {"command": "peer", "args": {"principal_id": "w@party"}})
    assert out["psk"] == "A" * 43 and "written_path" not in out and "diagnostics" not in out
    out = await ok(
        c,
        "new",
        {"command": "peer", "args": {"principal_id": "w@party", "output_path": "/tmp/w.psk"}},
    )
    assert out["written_path"] == "/tmp/w.psk" and "psk" not in out
    await ok(
        c,
        "new",
        {"command": "peer", "args": {"principal_id": "w@party", "write_to_config": True}},
    )
    relay.respond(
        "new_peer",
        relay_error("validation_invalid_output_path", "not absolute", {"path": ""}),
    )
    code, data = await error_of(
        c, "new", {"command": "peer", "args": {"principal_id": "w@party", "output_path": ""}}
    )
    assert (data["code"], data["details"]) == ("validation_invalid_output_path", {"path": ""})
    out = await ok(c, "change", {"command": "psk", "args": {"principal_id": "w@party"}})
    assert set(out) == {"schema_version", "principal_id", "psk"}
    assert [r["request"] for r in relay.requests] == [
        {
            "operation": "new_peer",
            "principal_id": "w@party",
            "scope": None,
            "destination": {"kind": "response"},
        },
        {
            "operation": "new_peer",
            "principal_id": "w@party",
            "scope": None,
            "destination": {"kind": "path", "path": "/tmp/w.psk"},
        },
        {
            "operation": "new_peer",
            "principal_id": "w@party",
            "scope": None,
            "destination": {"kind": "config"},
        },
        {
            "operation": "new_peer",
            "principal_id": "w@party",
            "scope": None,
            "destination": {"kind": "path", "path": ""},
        },
        {
            "operation": "change_psk",
            "principal_id": "w@party",
            "destination": {"kind": "response"},
        },
    ]


# -- concurrency, timeouts, inscriptions ------------------------------------------------------


async def test_parallel_calls_are_all_in_flight_at_once(served: Served) -> None:
    c, relay = served.client, served.relay
    n = 16
    arrived: list[int] = []
    all_in = asyncio.Event()
    answered = [asyncio.Event() for _ in range(n + 1)]
    answered[n].set()

    async def reverse(frame: dict[str, Any]) -> dict[str, Any]:
        i = int(frame["request"]["request_id"])
        if i >= 0:
            arrived.append(i)
            if len(arrived) == n:
                all_in.set()
            # no answer before all n are at the relay: a serialising server never gets there
            await asyncio.wait_for(all_in.wait(), 30)
            await answered[i + 1].wait()  # then the last request is answered first
            asyncio.get_running_loop().call_soon(answered[i].set)
        return {
            "kind": "send",
            "schema_version": "1",
            "request_id": str(i),
            "requester_session": "alpha@party",
            "results": [],
        }

    relay.handler = reverse
    connections = relay.connections
    await ok(c, "send", {"message": "warm", "targets": ["bravo"], "request_id": "-1"})
    outs = await asyncio.gather(
        *(
            ok(c, "send", {"message": f"m{i}", "targets": ["bravo"], "request_id": str(i)})
            for i in range(n)
        )
    )
    assert [o["request_id"] for o in outs] == [str(i) for i in range(n)]
    assert sorted(arrived) == list(range(n))
    assert relay.connections == connections  # all on the one connection the server holds


async def test_relay_timeout_and_inscriptions(env: Env, relay: FakeRelay) -> None:
    relay.respond("look", None)  # never answered
    relay.respond(
        "send",
        {"kind": "send", "schema_version": "1", "requester_session": "alpha@party", "results": []},
    )
    relay.events_per_request = 2
    async with sdk_client(env, MCPHOST_RELAY_REQUEST_TIMEOUT_MS="300") as c:
        code, data = await error_of(c, "look", {"target_session": "bravo@party"})
        assert (code, data["code"]) == (-32603, "relay_timeout")
        assert data["details"]["io_error_kind"] == "TimedOut"
        assert data["details"]["relay_socket"] == str(env.socket)
        await ok(c, "send", {"message": "hi", "targets": ["bravo"]})
    events = [r["event"] for r in env.inscription_events()]
    assert events[0] == "mcp.startup"
    for name in (
        "mcp.tool.look.request",
        "mcp.tool.look.io_error",
        "mcp.tool.send.request",
        "mcp.tool.send.success",
        "mcp.tool.stream.events_ignored",
    ):
        assert name in events, (name, events)
    ignored = [
        r for r in env.inscription_events() if r["event"] == "mcp.tool.stream.events_ignored"
    ]
    assert sum(r["details"]["count"] for r in ignored) == 2
    assert ignored[0]["details"]["namespace"] == "party"
    request = next(r for r in env.inscription_events() if r["event"] == "mcp.tool.send.request")
    assert request["details"]["message_length"] == 2 and "hi" not in json.dumps(request)
