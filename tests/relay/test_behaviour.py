"""RelayBehaviour (mcphost/relay/behaviour.py) over a real tmux and a real configuration tree.

The bundle `party` has three members (alpha: operator, bravo and charlie: the file default),
each a tiny interactive stand-in in its own tmux session that prints the prompt `> ` and echoes
what it reads; the coder's `prompt-regex` matches that prompt, so the readiness gate is real.
The `BundleHost` (`TmuxHost`, with the tree, in mcphost/testing/realrelay.py) is a small real one
(one TmuxServer per bundle under the state root), as the supervisor's is. Requests go straight to `RelayBehaviour.handle`, and a few through a
real `RelayServer` socket with our relay client (`RelayStream`).

No sleeps as waits: a pane is polled until it shows what a test needs (a 30 s guard only catches
a hang); delivery outcomes are awaited with `drain()`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcphost.agentmux.operations import ListRequest, LookRequest, SendRequest
from mcphost.agentmux.wire import Hello, Principal, RelayError, Request, parse_principal
from mcphost.peer import PeerCred
from mcphost.relay import admission
from mcphost.relay.behaviour import BundleHost, RelayBehaviour
from mcphost.relay.connections import Connections
from mcphost.relay.server import RelayServer
from mcphost.relay.tmux import TmuxServer
from mcphost.relaytools import validation as V
from mcphost.relaytools.errors import ToolFailure
from mcphost.relaytools.stream import RelayStream
from mcphost.testing.realrelay import TmuxHost, config_tree

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

GUARD = 30.0


class Recording(Connections):
    """The relay's real registry, recording the revocations asked of it; `also_live` counts as
    connected too (the GLOBAL view without a socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.revoked: list[tuple[str, str, str]] = []
        self.also_live: set[str] = set()

    def revoke(self, principal_id: str, code: str, message: str) -> int:
        self.revoked.append((principal_id, code, message))
        return super().revoke(principal_id, code, message)

    def live_principals(self) -> list[str]:
        return sorted(set(super().live_principals()) | self.also_live)


@dataclass
class World:
    config: Path
    state: Path
    host: TmuxHost
    relay: RelayBehaviour
    revoked: list[tuple[str, str, str]]
    trusted: set[str]
    connections: Recording

    def principal(self, pid: str) -> Principal:
        return parse_principal(pid)

    async def call(self, pid: str, operation: str, namespace: str | None = None,
                   **body: Any) -> dict[str, Any]:  # fmt: skip
        request = Request("r1", namespace, operation, {"operation": operation, **body})
        return await self.relay.handle(self.principal(pid), request)

    async def refused(self, pid: str, operation: str, namespace: str | None = None,
                      **body: Any) -> RelayError:  # fmt: skip
        with pytest.raises(RelayError) as caught:
            await self.call(pid, operation, namespace, **body)
        return caught.value

    def server(self) -> TmuxServer:
        server = self.host.servers.get("party")
        assert server is not None
        return server

    async def pane(self, member: str, needle: str) -> list[str]:
        """The member's pane once a line of it contains `needle` (polled; 30 s guard)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GUARD
        while True:
            lines = await self.server().capture(f"party-{member}", 1000)
            if any(needle in line for line in lines):
                return lines
            if loop.time() > deadline:
                raise AssertionError(f"{needle!r} never showed in {member}'s pane: {lines[-10:]}")
            await asyncio.sleep(0.02)


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rbh-", dir="/tmp"))  # short: tmux.sock fits sun_path
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def world(root: Path) -> AsyncIterator[World]:
    config, state = config_tree(root)
    host = TmuxHost(state)
    connections = Recording()
    trusted: set[str] = {"alpha@party", "bravo@party", "charlie@party", "op@GLOBAL"}

    def socket_trust(principal_id: str, cred: PeerCred | None) -> bool:
        return principal_id in trusted

    relay = RelayBehaviour(
        [config], state, host, socket_trust=socket_trust, connections=connections, quiet_ms=150,
        poll_ms=20, environ={},
    )  # fmt: skip
    w = World(config, state, host, relay, connections.revoked, trusted, connections)
    up = await w.call("alpha@party", "up", "party")
    assert up["bundles"][0]["outcome"] == "hosted"
    try:
        yield w
    finally:
        await relay.aclose()
        for bundle_id, server in list(host.servers.items()):
            for name in await server.sessions():
                await server.kill_session(name)
            await server.kill_server()
            host.servers.pop(bundle_id, None)


def assert_bundle_host(host: BundleHost) -> None:
    """The test host satisfies the protocol (checked by mypy at this call)."""


# -- list -------------------------------------------------------------------------------------


async def test_list_shows_every_member_ready(world: World) -> None:
    assert_bundle_host(world.host)
    response = await world.call("bravo@party", "list", "party", requester_session="bravo")
    assert response == {
        "kind": "list",
        "schema_version": "1",
        "bundle": {
            "id": "party",
            "hosted": True,
            "state": "up",
            "startup_health": "healthy",
            "startup_failure_count": 0,
            "recent_startup_failures": [],
            "principals": [
                {"id": "alpha@party", "name": "Alpha", "transport": "tmux", "ready": True},
                {"id": "bravo@party", "transport": "tmux", "ready": True},
                {"id": "charlie@party", "transport": "tmux", "ready": True},
            ],
        },
    }
    # the namespace defaults to the requester's bundle
    again = await world.call("bravo@party", "list", requester_session="bravo@party")
    assert again == response


async def test_list_global_view_and_its_refusals(world: World) -> None:
    live = world.connections.also_live
    response = await world.call("alpha@party", "list", "GLOBAL", requester_session="alpha")
    assert response["bundle"] == {
        "id": "GLOBAL",
        "hosted": False,
        "state": "down",
        "startup_failure_count": 0,
        "recent_startup_failures": [],
        "principals": [{"id": "op@GLOBAL", "transport": "ui", "ready": False}],
    }
    live.add("op@GLOBAL")
    response = await world.call("op@GLOBAL", "list", "GLOBAL")
    assert response["bundle"]["state"] == "up"
    assert response["bundle"]["principals"][0]["ready"] is True
    # a relay-wide principal must name a namespace; EXTERNAL is not routable
    err = await world.refused("op@GLOBAL", "list")
    assert err.code == "validation_missing_routing_namespace"
    err = await world.refused("alpha@party", "list", "EXTERNAL")
    assert err.code == "validation_unsupported_namespace"
    # an unknown bundle is an existence error, before authorization
    err = await world.refused("bravo@party", "list", "nowhere")
    assert err.code == "validation_unknown_bundle"
    # another principal's requester_session is refused
    err = await world.refused("bravo@party", "list", "party", requester_session="alpha")
    assert err.code == "validation_unknown_sender"


# -- send -------------------------------------------------------------------------------------


async def test_send_delivers_the_envelope_into_the_target_pane(world: World) -> None:
    response = await world.call(
        "alpha@party", "send", request_id="req-1", requester_session="alpha",
        message="hello bravo, from the test", targets=["bravo@party"], broadcast=False,
    )  # fmt: skip
    [result] = response["results"]
    assert response == {
        "kind": "send",
        "schema_version": "1",
        "request_id": "req-1",
        "requester_session": "alpha@party",
        "sender_display_name": "Alpha",
        "results": [
            {
                "target_session": "bravo@party",
                "message_id": result["message_id"],
                "outcome": "queued",
            }
        ],
    }
    message_id = result["message_id"]
    lines = await world.pane("bravo", "hello bravo, from the test")
    text = "\n".join(lines)
    assert f"Message-Id: {message_id}" in text
    assert "From: Alpha <session:alpha@party>" in text
    assert "To: bravo@party <session:bravo@party>" in text
    assert f"--agentmux-{message_id.replace('-', '')}--" in text
    await world.relay.drain()
    assert world.relay.outcomes[message_id] == {
        "target_session": "bravo@party",
        "outcome": "delivered",
    }
    # nothing reached the others
    assert not any("hello bravo" in line for line in await world.server().capture("party-charlie"))


async def test_broadcast_reaches_every_other_member(world: World) -> None:
    response = await world.call(
        "bravo@party", "send", requester_session="bravo", message="all hands", targets=[],
        broadcast=True,
    )  # fmt: skip
    assert [r["target_session"] for r in response["results"]] == ["alpha@party", "charlie@party"]
    assert {r["outcome"] for r in response["results"]} == {"queued"}
    alpha = "\n".join(await world.pane("alpha", "all hands"))
    charlie = "\n".join(await world.pane("charlie", "all hands"))
    assert "Cc: charlie@party <session:charlie@party>" in alpha
    assert "Cc: Alpha <session:alpha@party>" in charlie
    await world.relay.drain()
    assert {world.relay.outcomes[r["message_id"]]["outcome"] for r in response["results"]} == {
        "delivered"
    }


async def test_send_validation_comes_before_authorization(world: World) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"message": "  ", "targets": ["bravo@party"]}, "validation_invalid_arguments"),
        ({"message": "x", "targets": ["bravo@party"], "broadcast": True},
         "validation_conflicting_targets"),
        ({"message": "x", "targets": []}, "validation_empty_targets"),
        ({"message": "x", "targets": ["bravo"]}, "validation_unqualified_target"),
        ({"message": "x", "targets": ["zulu@party"]}, "validation_unknown_target"),
        ({"message": "x", "targets": ["bravo@nowhere"]}, "validation_unknown_bundle"),
        ({"message": "x", "targets": ["bravo@party!west"]}, "runtime_cross_relay_unavailable"),
        ({"message": "x", "targets": ["w@RELAY"]}, "validation_unsupported_namespace"),
    ]  # fmt: skip
    for body, code in cases:
        err = await world.refused("bravo@party", "send", requester_session="bravo", **body)
        assert err.code == code, (body, err)
    assert not world.relay.outcomes


async def test_request_bodies_are_refused_as_the_relay_tools_refuse_them(
    world: World,
) -> None:
    """One reader of a send/raww/look/choices_pick body (agentmux.operations) on both ends: a
    flawed body gets the same code, message and details from the relay as from the relay
    tools, and the relay ignores unknown fields (reference §2.4)."""
    cases: list[tuple[str, dict[str, Any]]] = [
        ("send", {"message": "x", "targets": ["bravo@party", " "]}),
        ("send", {"message": "x", "targets": "bravo@party"}),
        ("send", {"message": 5, "targets": ["bravo@party"]}),
        ("send", {"message": "x", "targets": ["bravo@party", 3]}),
        ("send", {"message": "x", "targets": ["bravo@party"], "broadcast": "yes"}),
        ("send", {"message": "x", "targets": ["bravo@party"], "request_id": 9}),
        ("raww", {"target_session": "  "}),
        ("raww", {"target_session": "bravo@party"}),
        ("raww", {"target_session": "bravo@party", "text": 7}),
        ("raww", {"target_session": "bravo@party", "text": "x", "no_enter": 1}),
        ("raww", {"target_session": "bravo@party", "text": "é" * (16 * 1024) + "x"}),
        ("look", {"target_session": " "}),
        ("look", {"target_session": "bravo@party", "lines": 0}),
        ("look", {"target_session": "bravo@party", "lines": True}),
        ("look", {"target_session": "bravo@party", "offset": -1}),
        ("choices_pick", {"outcome": "cancelled"}),
        ("choices_pick", {"choice_request_id": "c", "outcome": "maybe"}),
        ("choices_pick", {"choice_request_id": "c", "outcome": "selected"}),
        ("choices_pick", {"choice_request_id": "c", "outcome": "cancelled", "option_id": "x"}),
        ("choices_pick", {"choice_request_id": "c", "outcome": 3}),
    ]
    tools = {
        "send": V.validate_send,
        "raww": V.validate_raww,
        "look": V.validate_look,
        "choices_pick": V.validate_choose,
    }
    for operation, body in cases:
        tool = tools[operation]
        with pytest.raises(ToolFailure) as caught:
            tool(body)
        err = await world.refused("alpha@party", operation, **body)
        assert (err.code, err.message, err.details) == (
            caught.value.code,
            caught.value.message,
            caught.value.details,
        ), (operation, body)
    assert not world.relay.outcomes
    response = await world.call(
        "alpha@party", "raww", target_session="bravo@party", text="x", future_field={"a": [1]}
    )
    assert response["status"] == "queued"


async def test_an_in_process_caller_hands_the_model_itself(world: World) -> None:
    """In process the relay tools hand the operation's model to the relay (no dict, no JSON):
    the answer is the one its `wire()` body gets, and its strings are checked as a decoded
    frame's are."""
    alpha = world.principal("alpha@party")
    typed = ListRequest(requester_session="alpha")
    request = typed.request("party")
    assert request.body is typed
    by_model = await world.relay.handle(alpha, request)
    by_dict = await world.relay.handle(alpha, Request(None, "party", "list", typed.wire()))
    assert by_model == by_dict and by_model["kind"] == "list"
    look = LookRequest.read({"target_session": "bravo@party", "lines": 3})
    assert (await world.relay.handle(alpha, look.request()))["snapshot_format"] == "lines"
    lone = SendRequest.read({"message": "\ud800", "targets": ["bravo@party"]})
    with pytest.raises(RelayError) as caught:
        lone.request()
    assert caught.value.code == "validation_invalid_arguments"
    assert caught.value.details == {"cause": "a string holds a lone surrogate escape"}


# -- raww and look ----------------------------------------------------------------------------


async def test_raww_writes_raw_text_and_look_reads_it_back(world: World) -> None:
    response = await world.call(
        "alpha@party", "raww", request_id=None, requester_session="alpha",
        target_session="charlie@party", text="raw words here", no_enter=False,
    )  # fmt: skip
    assert response == {
        "kind": "raww",
        "schema_version": "1",
        "status": "queued",
        "target_session": "charlie@party",
        "transport": "tmux",
        "message_id": response["message_id"],
    }
    await world.pane("charlie", "echo: raw words here")  # submitted: the stand-in read a line
    await world.relay.drain()
    assert world.relay.outcomes[response["message_id"]]["outcome"] == "delivered"

    look = await world.call(
        "alpha@party", "look", requester_session="alpha", target_session="charlie@party", lines=40
    )
    assert look["kind"] == "look" and look["schema_version"] == "1"
    assert look["requester_session"] == "alpha@party"
    assert look["target_session"] == "charlie@party"
    assert look["snapshot_format"] == "lines"
    assert look["captured_at"].endswith("Z")
    # raww has no readiness gate: the text may land before the stand-in's first prompt
    assert any("echo: raw words here" in line for line in look["snapshot_lines"])
    assert look["snapshot_lines"][-1].startswith(">")
    assert "authenticated_identity" not in look  # socket trust: no verified identity
    # default and maximum lines (once bravo's stand-in has drawn its prompt: an empty pane
    # captures as no line)
    await world.pane("bravo", ">")
    assert 1 <= len((await world.call("alpha@party", "look", target_session="bravo@party"))[
        "snapshot_lines"]) <= 120  # fmt: skip
    for bad in (0, 1001):
        err = await world.refused("alpha@party", "look", target_session="bravo@party", lines=bad)
        assert err.code == "validation_invalid_lines"
        assert err.details == {"lines": bad, "min": 1, "max": 1000}
    err = await world.refused("alpha@party", "look", target_session="bravo@party", offset=3)
    assert err.code == "validation_offset_unsupported"
    err = await world.refused("alpha@party", "look", target_session="op@GLOBAL")
    assert err.code == "validation_unsupported_operation"


async def test_raww_no_enter_and_size_cap(world: World) -> None:
    response = await world.call(
        "alpha@party", "raww", target_session="bravo@party", text="typed-not-sent", no_enter=True
    )
    await world.pane("bravo", "typed-not-sent")
    await world.relay.drain()
    assert world.relay.outcomes[response["message_id"]]["outcome"] == "delivered"
    lines = await world.server().capture("party-bravo")
    assert not any("echo: typed-not-sent" in line for line in lines)
    err = await world.refused(
        "alpha@party", "raww", target_session="bravo@party", text="x" * (32 * 1024 + 1)
    )
    assert err.code == "validation_invalid_params"


async def test_raww_is_a_barrier_in_the_target_queue(world: World) -> None:
    first = await world.call("alpha@party", "send", message="first-one", targets=["bravo@party"])
    raw = await world.call("alpha@party", "raww", target_session="bravo@party", text="middle-raw")
    last = await world.call("alpha@party", "send", message="last-one", targets=["bravo@party"])
    await world.relay.drain()
    ids = [first["results"][0]["message_id"], raw["message_id"], last["results"][0]["message_id"]]
    assert [world.relay.outcomes[i]["outcome"] for i in ids] == ["delivered"] * 3
    text = "\n".join(await world.pane("bravo", "last-one"))
    assert text.index("first-one") < text.index("middle-raw") < text.index("last-one")


# -- authorization ----------------------------------------------------------------------------


async def test_forbidden_operations_name_the_capability(world: World) -> None:
    err = await world.refused(
        "bravo@party", "raww", requester_session="bravo", target_session="charlie@party", text="x"
    )
    assert err.code == "authorization_forbidden"
    assert err.message == "request denied by authorization policy"
    assert err.details is not None
    assert err.details["capability"] == "raww.write"
    assert err.details["requester_session"] == "bravo@party"
    assert err.details["target_session"] == "charlie@party"
    for operation, body, capability in (
        ("up", {}, "updown"),
        ("new_peer", {"principal_id": "x@party", "destination": {"kind": "response"}}, "new.peer"),
        ("change_psk", {"principal_id": "alpha@party"}, "change.psk"),
        ("choices_list", {}, "choose"),
    ):
        err = await world.refused("bravo@party", operation, **body)
        assert err.code == "authorization_forbidden", operation
        assert err.details is not None and err.details["capability"] == capability
    assert not world.relay.outcomes
    # a validation error wins over the refusal (order, §3.2)
    err = await world.refused("bravo@party", "raww", target_session="nobody@party", text="x")
    assert err.code == "validation_unknown_target"


# -- credentials ------------------------------------------------------------------------------


async def test_new_peer_psk_authenticates_and_a_wrong_one_is_refused(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    response = await world.call(
        "alpha@party", "new_peer", principal_id="bravo@party", scope=None,
        destination={"kind": "response"},
    )  # fmt: skip
    psk = response["psk"]
    assert isinstance(psk, str) and len(psk) == 43
    assert response == {
        "kind": "new_peer",
        "schema_version": "1",
        "principal_id": "bravo@party",
        "principal_type": "session",
        "psk": psk,
        "config_snippet": response["config_snippet"],
    }
    assert "identity.psk" in response["config_snippet"] and psk not in response["config_snippet"]
    principal = world.relay.authenticate(Hello("1", "bravo@party", psk), None)
    assert principal == Principal("bravo@party", "bravo", "party", "session", True)
    # verified principals carry authenticated_identity on send
    sent = await world.call("bravo@party", "send", message="m", targets=["charlie@party"])
    assert "authenticated_identity" not in sent  # the test principal here is unverified
    request = Request(None, None, "send", {"operation": "send", "message": "m",
                                           "targets": ["charlie@party"]})  # fmt: skip
    verified = await world.relay.handle(principal, request)
    assert verified["authenticated_identity"] == "bravo@party"

    with pytest.raises(RelayError) as caught:
        world.relay.authenticate(Hello("1", "bravo@party", "A" * 43), None)
    assert caught.value.code == "validation_unrecognized_credential"
    with pytest.raises(RelayError) as caught:
        world.relay.authenticate(Hello("1", "charlie@party", psk), None)
    assert caught.value.code == "validation_identity_binding_mismatch"
    assert caught.value.details == {
        "principal_id": "charlie@party",
        "registered_principal_id": "bravo@party",
    }
    err = await world.refused("alpha@party", "new_peer", principal_id="bravo@party")
    assert err.code == "validation_principal_exists"
    # the store keeps only the hash, and no event carries the PSK
    store = (world.state / "identity" / "principals.json").read_text()
    assert psk not in store
    captured = capsys.readouterr()
    assert "relay.identity.principal_registered" in captured.err
    assert psk not in captured.err and psk not in captured.out


async def test_change_psk_rotates_and_revokes(world: World) -> None:
    old = (await world.call("alpha@party", "new_peer", principal_id="charlie@party"))["psk"]
    world.relay.authenticate(Hello("1", "charlie@party", old), None)
    response = await world.call(
        "alpha@party", "change_psk", principal_id="charlie@party", destination={"kind": "config"}
    )
    path = world.state / "bundles" / "party" / "sessions" / "charlie" / "identity.psk"
    assert response == {
        "kind": "change_psk",
        "schema_version": "1",
        "principal_id": "charlie@party",
        "written_path": str(path),
    }
    new = path.read_text().strip()
    assert len(new) == 43 and new != old
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(RelayError) as caught:
        world.relay.authenticate(Hello("1", "charlie@party", old), None)
    assert caught.value.code == "validation_unrecognized_credential"
    assert world.relay.authenticate(Hello("1", "charlie@party", new), None).verified
    assert world.revoked == [
        (
            "charlie@party",
            "runtime_identity_revoked",
            "identity credential was rotated; reconnect with the new credential",
        )
    ]
    err = await world.refused("alpha@party", "change_psk", principal_id="zulu@party")
    assert err.code == "validation_unknown_principal"


async def test_credential_destinations(world: World, root: Path) -> None:
    target = root / "op.psk"
    response = await world.call(
        "alpha@party", "new_peer", principal_id="op@GLOBAL",
        destination={"kind": "path", "path": str(target)},
    )  # fmt: skip
    assert response["written_path"] == str(target) and "psk" not in response
    psk = target.read_text().strip()
    assert world.relay.authenticate(Hello("1", "op@GLOBAL", psk), None).verified
    # config is for sessions only; a relative path is refused before the store changes
    err = await world.refused(
        "alpha@party", "new_peer", principal_id="x@EXTERNAL", destination={"kind": "config"}
    )
    assert err.code == "validation_config_destination_unsupported"
    err = await world.refused(
        "alpha@party", "new_peer", principal_id="y@EXTERNAL",
        destination={"kind": "path", "path": "relative.psk"},
    )  # fmt: skip
    assert err.code == "validation_invalid_output_path"
    assert world.relay.state.store.get("y@EXTERNAL") is None
    # drop: never oneself; then the principal is gone and its connections revoked
    err = await world.refused("alpha@party", "drop_peer", principal_id="alpha@party")
    assert err.code == "validation_self_drop_forbidden"
    dropped = await world.call("alpha@party", "drop_peer", principal_id="op@GLOBAL")
    assert dropped == {
        "kind": "drop_peer",
        "schema_version": "1",
        "principal_id": "op@GLOBAL",
        "principal_type": "user",
    }
    with pytest.raises(RelayError) as caught:
        world.relay.authenticate(Hello("1", "op@GLOBAL", psk), None)
    assert caught.value.code == "validation_unrecognized_credential"
    assert world.revoked[-1][0] == "op@GLOBAL"


async def test_socket_trust_needs_the_hosts_word(world: World) -> None:
    principal = world.relay.authenticate(Hello("1", "alpha@party", "socket-trust"), None)
    assert principal == Principal("alpha@party", "alpha", "party", "session", False)
    world.trusted.discard("alpha@party")
    for pid in ("alpha@party", "app@EXTERNAL"):
        with pytest.raises(RelayError) as caught:
            world.relay.authenticate(Hello("1", pid, "socket-trust"), None)
        assert caught.value.code == "validation_credential_required"
    world.trusted.add("zulu@party")
    with pytest.raises(RelayError) as caught:
        world.relay.authenticate(Hello("1", "zulu@party", "socket-trust"), None)
    assert caught.value.code == "validation_unknown_sender"
    world.trusted.add("alpha@elsewhere")
    with pytest.raises(RelayError) as caught:
        world.relay.authenticate(Hello("1", "alpha@elsewhere", "socket-trust"), None)
    assert caught.value.code == "validation_unknown_bundle"


# -- up / down, choices, not implemented ------------------------------------------------------


async def test_down_then_up(world: World) -> None:
    again = await world.call("alpha@party", "up")
    assert again == {
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
    server = world.server()
    down = await world.call("alpha@party", "down")
    assert down["bundles"] == [{"bundle_name": "party", "outcome": "unhosted"}]
    assert down["changed_any"] is True and down["changed_bundle_count"] == 1
    assert await server.sessions() == {}
    listed = (await world.call("alpha@party", "list"))["bundle"]
    assert listed["state"] == "down" and listed["hosted"] is False
    assert "startup_health" not in listed and "state_reason_code" not in listed
    assert {p["ready"] for p in listed["principals"]} == {False}
    skipped = await world.call("alpha@party", "down")
    assert skipped["bundles"][0]["reason_code"] == "already_unhosted"
    # a send while down is refused at admission: its members are stopped
    err = await world.refused("alpha@party", "send", message="m", targets=["bravo@party"])
    assert (err.code, err.details) == (
        "delivery_target_fail_stopped",
        {"target_session": "bravo@party"},
    )
    err = await world.refused("alpha@party", "look", target_session="bravo@party")
    assert err.code == "transport_unavailable"

    up = await world.call("alpha@party", "up")
    assert up["bundles"] == [{"bundle_name": "party", "outcome": "hosted"}]
    listed = (await world.call("alpha@party", "list"))["bundle"]
    assert listed["startup_health"] == "healthy"
    assert sorted(await world.server().sessions()) == [
        "party-alpha",
        "party-bravo",
        "party-charlie",
    ]
    assert (world.host.ups, world.host.downs) == (2, 1)


async def test_a_stopped_target_is_refused_at_admission(world: World) -> None:
    """agentmux's `delivery_target_fail_stopped` (§1.6, §1.13): a target the host reports
    stopped refuses a send or raww whole, after authorization, with nothing queued; in a
    broadcast a stopped member gets outcome `not_submitted` with that reason code."""
    world.host.stopped.add(("party", "bravo"))
    before = dict(world.relay.outcomes)
    err = await world.refused(
        "alpha@party", "send", message="m", targets=["charlie@party", "bravo@party"]
    )
    assert (err.code, err.message, err.details) == (
        "delivery_target_fail_stopped",
        "target session bravo@party is stopped and accepts no messages; nothing of this request "
        "was queued: start it again (ctl start, or updown up) and send then",
        {"target_session": "bravo@party"},
    )
    assert world.relay.outcomes == before and world.relay.state.queue_bounds.count == 0
    err = await world.refused("alpha@party", "raww", target_session="bravo@party", text="x")
    assert (err.code, err.details) == (
        "delivery_target_fail_stopped",
        {"target_session": "bravo@party"},
    )
    # authorization first: a member who may not send across bundles learns nothing of it
    world.host.stopped.add(("mixed", "lead"))
    err = await world.refused("bravo@party", "send", message="m", targets=["lead@mixed"])
    assert err.code == "authorization_forbidden"
    world.host.stopped.discard(("mixed", "lead"))
    sent = await world.call("alpha@party", "send", message="to all", broadcast=True)
    assert [(r["target_session"], r["outcome"], r.get("reason_code")) for r in sent["results"]] == [
        ("charlie@party", "queued", None),
        ("bravo@party", "not_submitted", "delivery_target_fail_stopped"),
    ]
    # the queued member's envelope still names the stopped one as a co-recipient
    lines = await world.pane("charlie", "to all")
    assert any("Cc: bravo@party <session:bravo@party>" in line for line in lines), lines
    world.host.stopped.clear()
    sent = await world.call("alpha@party", "send", message="back", targets=["bravo@party"])
    assert sent["results"][0]["outcome"] == "queued"


def _receipts(world: World) -> list[dict[str, Any]]:
    log = world.state / "inscriptions" / "relay.log"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return [r["details"] for r in records if r["event"] == "relay.delivery.receipt"]


async def test_a_non_delivered_outcome_is_receipted_to_a_coder_sender(world: World) -> None:
    """§3.4: a queued message that ends any way but `delivered` gets its coder-backed sender
    a receipt from `relay@RELAY` in its own pane (agentmux's layout and wording); a user sender
    gets none (its `delivery_outcome` event tells it), a receipt gets none, and a sender that
    is not running loses its receipt (recorded)."""
    server = world.server()
    pasted: dict[str, list[str]] = {}
    paste = server.paste

    async def recording(name: str, text: str, *, bracketed: bool, submit: bool = False) -> None:
        pasted.setdefault(name, []).append(text)
        await paste(name, text, bracketed=bracketed, submit=submit)

    server.paste = recording  # type: ignore[method-assign]
    await world.call("alpha@party", "raww", target_session="bravo@party", text="hold")
    await world.pane("bravo", "holding")
    await world.relay.drain()
    sent = await world.call("alpha@party", "send", message="lost", targets=["bravo@party"])
    lost = sent["results"][0]["message_id"]
    await server.kill_session("party-bravo")  # bravo dies before its gate ever opens
    await world.pane("alpha", "relay@RELAY")
    await world.relay.drain()
    assert world.relay.outcomes[lost] == {
        "target_session": "bravo@party",
        "outcome": "not_submitted",
        "reason_code": "delivery_target_unreachable",
    }
    [text] = pasted["party-alpha"]
    receipt_id = text.split("Message-Id: ", 1)[1].split("\n", 1)[0]
    date = text.split("Date: ", 1)[1].split("\n", 1)[0]
    mark = "--agentmux-" + receipt_id.replace("-", "")
    assert text == (
        "--- agentmux terminal-outcome receipt ---\n"
        f"{mark}\n"
        f"Message-Id: {receipt_id}\n"
        f"Date: {date}\n"
        "From: relay <session:relay@RELAY>\n"
        "To: Alpha <session:alpha@party>\n"
        "\n"
        f"{mark}\n"
        "Content-Type: text/plain; charset=utf-8\n"
        "\n"
        f"Your message {lost} to bravo@party was not delivered (failed). "
        "reason_code=delivery_target_unreachable\n"  # the gate gives no reason text
        f"{mark}--\n"
    )
    assert world.relay.outcomes[receipt_id] == {
        "target_session": "alpha@party",
        "outcome": "delivered",
    }
    assert _receipts(world) == [
        {
            "message_id": lost,
            "receipt_message_id": receipt_id,
            "sender_session": "alpha@party",
            "target_session": "bravo@party",
            "outcome": "not_submitted",
            "reason_code": "delivery_target_unreachable",
            "dropped": None,
        }
    ]
    assert world.relay.state.queue_bounds.count == 0  # the receipt's place was freed too

    # a user sender: no receipt (it is told by its delivery_outcome event)
    sent = await world.call("op@GLOBAL", "send", message="lost too", targets=["bravo@party"])
    await world.relay.drain()
    assert world.relay.outcomes[sent["results"][0]["message_id"]]["outcome"] == "not_submitted"
    assert len(_receipts(world)) == 1

    # a receipt whose own delivery fails gets no receipt of its own
    await world.call("alpha@party", "raww", target_session="charlie@party", text="hold")
    await world.pane("charlie", "holding")
    await world.relay.drain()
    await world.call("charlie@party", "send", message="lost again", targets=["bravo@party"])
    while len(_receipts(world)) < 2:  # charlie's receipt is queued behind its closed gate
        await asyncio.sleep(0.02)
    receipt_id = _receipts(world)[1]["receipt_message_id"]
    await server.kill_session("party-charlie")
    await world.relay.drain()
    assert world.relay.outcomes[receipt_id]["outcome"] == "not_submitted"
    assert len(_receipts(world)) == 2
    # ... and a sender that is not running loses its receipt, which is recorded
    sent = await world.call(
        "charlie@party", "send", message="from the dead", targets=["bravo@party"]
    )
    await world.relay.drain()
    dropped = _receipts(world)[2]
    assert dropped["message_id"] == sent["results"][0]["message_id"]
    assert (dropped["receipt_message_id"], dropped["dropped"]) == (None, "sender_not_running")
    assert "party-charlie" not in pasted or all(
        "relay@RELAY" not in t for t in pasted["party-charlie"]
    )


async def test_choices_and_unimplemented_operations(world: World) -> None:
    listed = await world.call("alpha@party", "choices_list")
    assert listed == {"kind": "choices_list", "schema_version": "1", "pending_requests": []}
    err = await world.refused(
        "alpha@party", "choices_pick", choice_request_id="c-1", outcome="selected",
        option_id="allow_once",
    )  # fmt: skip
    assert err.code == "runtime_choices_request_already_resolved"  # nothing pending in party
    assert err.details == {"choice_request_id": "c-1"}
    err = await world.refused("alpha@party", "choices_pick", choice_request_id="c-1",
                              outcome="cancelled", option_id="")  # fmt: skip
    assert err.code == "validation_invalid_params"
    err = await world.refused("alpha@party", "identity_introspect", target_session="bravo@party")
    assert err.code == "runtime_operation_not_implemented"
    err = await world.refused("alpha@party", "change_scope", principal_id="w@RELAY", scope="")
    assert err.code == "runtime_operation_not_implemented"
    err = await world.refused("bravo@party", "change_scope", principal_id="w@RELAY", scope="")
    assert err.code == "authorization_forbidden"
    assert err.details is not None and err.details["capability"] == "change.scope"
    relays = await world.call("alpha@party", "list_relays")
    assert relays == {"kind": "list_relays", "schema_version": "1", "relays": []}
    namespaces = await world.call("alpha@party", "discover_namespaces")
    assert namespaces["namespaces"] == ["mixed", "party"]
    err = await world.refused("alpha@party", "discover_namespaces", relay="west")
    assert err.code == "runtime_cross_relay_unavailable"


# -- through the socket -----------------------------------------------------------------------


async def test_list_and_send_through_a_relay_server(world: World, root: Path) -> None:
    path = str(root / "relay.sock")
    server = RelayServer(
        path,
        authenticate=world.relay.authenticate,
        handle=world.relay.handle,
        registry=world.relay.connections,
    )
    vouched: list[str] = []

    def kernel_says(principal_id: str, cred: PeerCred | None) -> bool:
        # the host decides from the kernel's credentials: here, the client is this process
        ok = cred is not None and cred.pid == os.getpid() and cred.uid == os.geteuid()
        if ok:
            vouched.append(principal_id)
        return ok

    world.relay.state.socket_trust = kernel_says
    await server.start()
    stream = RelayStream(path, "alpha@party", lambda: "socket-trust")
    operator = RelayStream(path, "op@GLOBAL", lambda: "socket-trust")
    try:
        listed = await stream.request(
            {"operation": "list", "requester_session": "alpha"}, namespace="party"
        )
        assert listed["kind"] == "list"
        assert [p["ready"] for p in listed["bundle"]["principals"]] == [True, True, True]
        sent = await stream.request(
            {
                "operation": "send",
                "request_id": None,
                "requester_session": "alpha",
                "message": "over the socket",
                "targets": ["charlie@party"],
                "broadcast": False,
            }
        )
        assert sent["kind"] == "send"
        assert vouched == ["alpha@party"]
        assert sent["results"][0]["outcome"] == "queued"
        await world.pane("charlie", "over the socket")
        refused = await stream.request(
            {"operation": "look", "requester_session": "alpha", "target_session": "x@party"}
        )
        assert refused["kind"] == "error"
        assert refused["error"]["code"] == "validation_unknown_target"
        # a connected user is ready in the GLOBAL view, and receives a send as an event
        registry = await operator.request({"operation": "list"}, namespace="GLOBAL")
        assert registry["bundle"]["principals"] == [
            {"id": "op@GLOBAL", "transport": "ui", "ready": True}
        ]
        to_op = await stream.request(
            {"operation": "send", "message": "to the operator", "targets": ["op@GLOBAL"]}
        )
        message_id = to_op["results"][0]["message_id"]
        assert world.relay.outcomes[message_id]["outcome"] == "delivered"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GUARD
        while operator.events_ignored < 1:  # the incoming_message event reached op's stream
            assert loop.time() < deadline, "no event reached the operator's connection"
            await asyncio.sleep(0.01)
    finally:
        await operator.aclose()
        await stream.aclose()
        await server.aclose()


async def test_members_this_relay_cannot_host(world: World) -> None:
    listed = (await world.call("lead@mixed", "list"))["bundle"]
    assert listed == {
        "id": "mixed",
        "hosted": False,
        "state": "down",
        "startup_failure_count": 0,
        "recent_startup_failures": [],
        "principals": [
            {"id": "lead@mixed", "transport": "tmux", "ready": False},
            {"id": "agent@mixed", "transport": "acp", "ready": False},
            {"id": "panel@mixed", "transport": "ui", "ready": False},
            {"id": "term@mixed", "transport": "pty", "ready": False},
        ],
    }
    for operation, body in (
        ("look", {"target_session": "term@mixed"}),
        ("raww", {"target_session": "term@mixed", "text": "x"}),
        ("send", {"message": "x", "targets": ["term@mixed"]}),
    ):
        err = await world.refused("lead@mixed", operation, **body)
        assert err.code == "runtime_session_type_not_implemented", operation
        assert err.details == {"target_session": "term@mixed", "transport": "pty"}
    err = await world.refused("lead@mixed", "look", target_session="panel@mixed")
    assert err.code == "validation_unsupported_operation"
    # an ACP member is hosted by its kind: while its bundle is down it cannot be read
    err = await world.refused("lead@mixed", "look", target_session="agent@mixed")
    assert err.code == "transport_unavailable"
    # a broadcast reports the members it cannot reach, and queues nothing for them
    sent = await world.call("lead@mixed", "send", message="hi all", broadcast=True)
    assert [(r["target_session"], r["outcome"], r.get("reason_code")) for r in sent["results"]] == [
        ("agent@mixed", "queued", None),
        ("panel@mixed", "not_submitted", "runtime_session_type_not_implemented"),
        ("term@mixed", "not_submitted", "runtime_session_type_not_implemented"),
    ]
    # cross-bundle: the operator in party may look into mixed; a default member may not
    err = await world.refused("bravo@party", "look", target_session="lead@mixed")
    assert err.code == "authorization_forbidden"
    assert err.details is not None and err.details["capability"] == "look.inspect"
    err = await world.refused("alpha@party", "look", target_session="lead@mixed")
    assert err.code == "transport_unavailable"  # allowed, but mixed is not hosted


async def test_the_gate_holds_deliveries_until_the_prompt_and_then_batches_them(
    world: World,
) -> None:
    server = world.server()
    pastes: list[str] = []
    paste = server.paste

    async def counting(name: str, text: str, *, bracketed: bool, submit: bool = False) -> None:
        if name == "party-bravo":
            pastes.append(text)
        await paste(name, text, bracketed=bracketed, submit=submit)

    server.paste = counting  # type: ignore[method-assign]
    await world.call("alpha@party", "raww", target_session="bravo@party", text="hold")
    await world.pane("bravo", "holding")
    await world.relay.drain()
    ids = []
    for n in range(3):
        sent = await world.call(
            "alpha@party", "send", message=f"queued-{n}", targets=["bravo@party"]
        )
        ids.append(sent["results"][0]["message_id"])
    # busy (no prompt): nothing is delivered; release it behind the relay's back
    assert not any(i in world.relay.outcomes for i in ids)
    await paste("party-bravo", "release", bracketed=True, submit=True)
    text = "\n".join(await world.pane("bravo", "echo: queued-2"))
    await world.relay.drain()
    assert [world.relay.outcomes[i]["outcome"] for i in ids] == ["delivered"] * 3
    assert text.index("released") < text.index("queued-0") < text.index("queued-1")
    # the three envelopes went as one prompt: one bracketed paste after the raww's
    assert len(pastes) == 2 and pastes[0] == "hold"
    assert all(f"Message-Id: {i}" in pastes[1] for i in ids)


async def test_shutdown_drops_what_is_still_queued(world: World) -> None:
    await world.call("alpha@party", "raww", target_session="bravo@party", text="hold")
    await world.pane("bravo", "holding")
    sent = await world.call("alpha@party", "send", message="never", targets=["bravo@party"])
    later = await world.call("alpha@party", "raww", target_session="bravo@party", text="nope")
    await world.relay.aclose()
    for message_id in (sent["results"][0]["message_id"], later["message_id"]):
        assert world.relay.outcomes[message_id] == {
            "target_session": "bravo@party",
            "outcome": "failed",
            "reason_code": "dropped_on_shutdown",
            "reason": "relay shut down",
        }
    assert not any("never" in line for line in await world.server().capture("party-bravo"))
    after = await world.call("alpha@party", "send", message="late", targets=["bravo@party"])
    assert world.relay.outcomes[after["results"][0]["message_id"]]["outcome"] == "failed"


async def test_the_queue_is_bounded_and_a_request_is_refused_whole(world: World) -> None:
    """SECURITY.md X8: what waits for a target is bounded (admission.py); over the bound the
    request is refused with `runtime_delivery_queue_full` and nothing of it is queued; every
    outcome (delivered, dropped) frees its place. One sender holds at most its share of a
    target's queue, so another sender still reaches a target the first keeps busy."""
    bounds = world.relay.state.queue_bounds
    await world.call("alpha@party", "raww", target_session="bravo@party", text="hold")
    await world.pane("bravo", "holding")
    await world.relay.drain()
    assert (bounds.count, bounds.bytes) == (0, 0)  # the delivered raww freed its place
    ids = []
    share = admission.MAX_QUEUED_PER_SENDER_PER_TARGET
    for n in range(share):  # bravo is busy: all of them wait
        sent = await world.call("alpha@party", "send", message=f"m{n}", targets=["bravo@party"])
        ids.append(sent["results"][0]["message_id"])
    assert bounds.queued("target", "bravo@party")[0] == share
    err = await world.refused("alpha@party", "send", message="one more", targets=["bravo@party"])
    assert err.code == "runtime_delivery_queue_full"
    assert {k: err.details[k] for k in ("target_session", "sender_session", "scope", "component",
                                        "limit", "queued")} == {
        "target_session": "bravo@party", "sender_session": "alpha@party", "scope": "share",
        "component": "envelopes", "limit": share, "queued": share,
    }  # fmt: skip
    # another sender still gets its share of bravo's queue
    fair = await world.call("charlie@party", "send", message="mine", targets=["bravo@party"])
    assert fair["results"][0]["outcome"] == "queued"
    ids.append(fair["results"][0]["message_id"])
    err = await world.refused("alpha@party", "send", message="to all", broadcast=True)
    assert err.code == "runtime_delivery_queue_full"
    assert bounds.queued("target", "charlie@party") == (0, 0)  # refused whole: charlie too
    refused = await world.refused("alpha@party", "raww", target_session="bravo@party", text="x")
    assert refused.code == "runtime_delivery_queue_full"
    other = await world.call("alpha@party", "send", message="fits", targets=["charlie@party"])
    assert other["results"][0]["outcome"] == "queued"
    await world.relay.aclose()  # what still waits is dropped, and frees its place
    assert all(world.relay.outcomes[i]["outcome"] == "failed" for i in ids)
    assert (bounds.count, bounds.bytes) == (0, 0)


async def test_an_expired_credential_is_refused(world: World) -> None:
    psk = world.relay.state.store.mint(
        "charlie@party", "session", expires_at="2000-01-01T00:00:00Z"
    )
    with pytest.raises(RelayError) as caught:
        world.relay.authenticate(Hello("1", "charlie@party", psk), None)
    assert caught.value.code == "runtime_identity_expired"
    assert caught.value.details == {
        "principal_id": "charlie@party",
        "expires_at": "2000-01-01T00:00:00Z",
    }
