"""The relay's inscriptions (reference §5; mcphost/relay/inscriptions.py).

The real relay (mcphost/testing/realrelay.py: `RelayServer` + `RelayBehaviour` over real tmux, on a
thread of its own) is driven over its socket by our relay client; its records land in
`<state>/inscriptions/relay.log`, where the relay tools put their `mcp.log` files. What is
proven: the record shape (`timestamp` RFC 3339 UTC, `pid`, `event`, `details`; file 0600,
directory 0700); that `send`, its per-envelope metadata (which matches the envelope the pane
shows), its delivery outcomes, `look`, `list`, `raww`, PSK minting, rotation and dropping are
inscribed, and a refused request with its code and capability; that no message body, raww text or PSK is ever in the file. The server's connection
records (`relay.stream.stale_claim_reclaimed`, `relay.connection.write_timeout`,
`relay.connection.identity_revoked_teardown`) are proven on a bare `RelayServer`.

Waits are conditions (`until`), never sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from mcphost.agentmux import wire
from mcphost.agentmux.wire import Hello, Principal, Request, parse_principal
from mcphost.peer import PeerCred
from mcphost.relay import server as server_mod
from mcphost.relay.inscriptions import RelayInscriptions, relay_log_path
from mcphost.relay.server import RelayServer
from mcphost.relaytools.stream import RelayStream
from mcphost.testing.realrelay import GUARD, RealRelay, config_tree
from tests.waiting import until

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
CREATED_AT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture(scope="module")
def relay() -> Iterator[RealRelay]:
    root = Path(tempfile.mkdtemp(prefix="rin-", dir="/tmp"))  # short: tmux.sock fits sun_path
    config, state = config_tree(root)
    real = RealRelay(config, state).start()
    try:
        yield real
    finally:
        real.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.asynccontextmanager
async def client(relay: RealRelay, principal_id: str = "alpha@party") -> AsyncIterator[RelayStream]:
    stream = RelayStream(
        str(relay.socket), principal_id, lambda: wire.SOCKET_TRUST, request_timeout=GUARD
    )
    try:
        yield stream
    finally:
        await stream.aclose()


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def relay_records(relay: RealRelay) -> list[dict[str, Any]]:
    return records(relay.state / "inscriptions" / "relay.log")


def find(relay: RealRelay, event: str, **match: Any) -> list[dict[str, Any]]:
    return [
        r
        for r in relay_records(relay)
        if r["event"] == event and all(r["details"].get(k) == v for k, v in match.items())
    ]


async def wait_for(relay: RealRelay, event: str, count: int = 1, **match: Any) -> list[dict]:
    def enough() -> list[dict[str, Any]]:
        hits = find(relay, event, **match)
        return hits if len(hits) >= count else []

    return await asyncio.to_thread(until, enough, GUARD, f"{count} {event} {match}")


def pane_with(relay: RealRelay, member: str, needle: str) -> str:
    """The member's pane once it shows `needle` (polled)."""

    def shown() -> str:
        text = "\n".join(relay.pane(member))
        return text if needle in text else ""

    return until(shown, GUARD, f"{needle!r} in {member}'s pane")


# -- the relay's records ----------------------------------------------------------------------


async def test_a_send_is_inscribed_with_its_envelope_metadata_never_its_body(
    relay: RealRelay,
) -> None:
    body = f"body-marker-{uuid.uuid4().hex}"
    async with client(relay) as alpha:
        out = await alpha.request(
            {
                "operation": "send",
                "requester_session": "alpha",
                "message": body,
                "targets": ["bravo@party", "charlie@party"],
                "broadcast": False,
            }
        )
    assert out["kind"] == "send", out
    ids = {r["target_session"]: r["message_id"] for r in out["results"]}
    for target, message_id in ids.items():
        (outcome,) = await wait_for(relay, "relay.delivery.outcome", message_id=message_id)
        assert outcome["details"] == {
            "message_id": message_id,
            "sender_session": "alpha@party",
            "target_session": target,
            "outcome": "delivered",
            "reason_code": None,
        }
    (request,) = find(relay, "relay.send.request", message_length=len(body))
    assert request["details"] == {
        "requester_session": "alpha@party",
        "request_id": None,
        "targets": ["bravo@party", "charlie@party"],
        "broadcast": False,
        "message_length": len(body),
    }
    metadata = {
        r["details"]["message_id"]: r["details"]
        for r in find(relay, "relay.send.envelope.metadata", sender_session="alpha@party")
    }
    bravo = metadata[ids["bravo@party"]]
    assert set(bravo) == {
        "schema_version", "message_id", "namespace", "sender_session", "target_sessions",
        "cc_sessions", "created_at", "message_length",
    }  # fmt: skip
    assert bravo["schema_version"] == "1" and bravo["namespace"] == "party"
    assert bravo["target_sessions"] == ["bravo@party"]
    assert bravo["cc_sessions"] == ["charlie@party"]
    assert metadata[ids["charlie@party"]]["cc_sessions"] == ["bravo@party"]
    assert CREATED_AT.match(bravo["created_at"]), bravo
    # the metadata is the envelope's: bravo's pane shows this message id and this date
    pane = await asyncio.to_thread(pane_with, relay, "bravo", body)
    assert f"Message-Id: {ids['bravo@party']}" in pane
    assert f"Date: {bravo['created_at']}" in pane
    # the record shape, and never the body
    path = relay.state / "inscriptions" / "relay.log"
    assert body not in path.read_text()
    for record in relay_records(relay):
        assert list(record) == ["timestamp", "pid", "event", "details"]
        assert TIMESTAMP.match(record["timestamp"]), record
        assert record["pid"] == os.getpid()  # the relay runs in this process (a thread)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


async def test_look_list_and_raww_are_inscribed_never_the_raww_text(relay: RealRelay) -> None:
    text = f"raw-marker-{uuid.uuid4().hex}"
    async with client(relay) as alpha:
        listed = await alpha.request({"operation": "list", "requester_session": "alpha"}, "party")
        assert listed["kind"] == "list"
        looked = await alpha.request(
            {"operation": "look", "requester_session": "alpha", "target_session": "charlie@party",
             "lines": 5},
        )  # fmt: skip
        assert looked["kind"] == "look"
        written = await alpha.request(
            {"operation": "raww", "requester_session": "alpha", "target_session": "charlie@party",
             "text": text},
        )  # fmt: skip
        assert written["kind"] == "raww"
    (listing, *_) = await wait_for(relay, "relay.list.response", requester_session="alpha@party")
    assert listing["details"] == {
        "requester_session": "alpha@party",
        "namespace": "party",
        "state": "up",
        "principal_count": 3,
        "ready_count": 3,
    }
    (look, *_) = await wait_for(relay, "relay.look.response", target_session="charlie@party")
    assert look["details"]["requester_session"] == "alpha@party"
    assert look["details"]["snapshot_count"] == len(looked["snapshot_lines"])
    (raww,) = await wait_for(relay, "relay.raww.request", message_id=written["message_id"])
    assert raww["details"]["text_length"] == len(text)
    await wait_for(relay, "relay.delivery.outcome", message_id=written["message_id"])
    assert text not in (relay.state / "inscriptions" / "relay.log").read_text()


async def test_psk_minting_rotation_and_drop_are_inscribed_never_the_psk(
    relay: RealRelay,
) -> None:
    target = "op@GLOBAL"
    async with client(relay) as alpha:
        minted = await alpha.request(
            {"operation": "new_peer", "principal_id": target, "destination": {"kind": "response"}}
        )
        rotated = await alpha.request(
            {"operation": "change_psk", "principal_id": target, "destination": {"kind": "response"}}
        )
        dropped = await alpha.request({"operation": "drop_peer", "principal_id": target})
    assert (minted["kind"], rotated["kind"], dropped["kind"]) == (
        "new_peer", "change_psk", "drop_peer",
    )  # fmt: skip
    (registered,) = await wait_for(
        relay, "relay.identity.principal_registered", principal_id=target
    )
    assert registered["details"]["destination"] == "response"
    (rotation,) = await wait_for(relay, "relay.identity.psk_rotated", principal_id=target)
    assert rotation["details"] == {
        "requester_session": "alpha@party",
        "principal_id": target,
        "destination": "response",
        "revoked_connections": 0,
    }
    (drop,) = await wait_for(relay, "relay.identity.principal_dropped", principal_id=target)
    assert drop["details"] == {"requester_session": "alpha@party", "principal_id": target}
    text = (relay.state / "inscriptions" / "relay.log").read_text()
    assert minted["psk"] not in text and rotated["psk"] not in text


async def test_a_refused_request_is_inscribed_with_its_code_and_capability(
    relay: RealRelay,
) -> None:
    text = f"refused-marker-{uuid.uuid4().hex}"
    async with client(relay, "bravo@party") as bravo:  # policy "default": no raww
        out = await bravo.request(
            {"operation": "raww", "target_session": "charlie@party", "text": text}
        )
    assert out["kind"] == "error" and out["error"]["code"] == "authorization_forbidden"
    (refused,) = await wait_for(relay, "relay.request.refused", requester_session="bravo@party")
    assert refused["details"] == {
        "requester_session": "bravo@party",
        "operation": "raww",
        "code": "authorization_forbidden",
        "capability": "raww.write",
    }
    assert text not in (relay.state / "inscriptions" / "relay.log").read_text()


# -- the server's connection records ----------------------------------------------------------


class App:
    def authenticate(self, hello: Hello, cred: PeerCred | None) -> Principal:
        return parse_principal(hello.principal_id)

    async def handle(self, principal: Principal, request: Request) -> dict[str, Any]:
        if request.operation == "up":  # too big for a client that does not read
            return {"kind": "bundle_transition", "schema_version": "1", "pad": "x" * (4 << 20)}
        return {"kind": "list", "schema_version": "1"}


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rins-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def serving(root: Path, **kw: Any) -> AsyncIterator[tuple[RelayServer, Path]]:
    app = App()
    inscriptions = root / "inscriptions"
    server = RelayServer(
        str(root / "relay.sock"), authenticate=app.authenticate, handle=app.handle,
        inscribe=RelayInscriptions(inscriptions), pre_hello_timeout=GUARD, **kw,
    )  # fmt: skip
    await server.start()
    try:
        yield server, relay_log_path(inscriptions)
    finally:
        await server.aclose()


async def hello_on(path: Path, principal_id: str) -> tuple[asyncio.StreamReader, Any]:
    reader, writer = await asyncio.open_unix_connection(str(path))
    frame = {"frame": "hello", "schema_version": "1", "principal_id": principal_id,
             "identity_token": wire.SOCKET_TRUST}  # fmt: skip
    writer.write(wire.encode(frame))
    await writer.drain()
    ack = json.loads(await asyncio.wait_for(reader.readline(), GUARD))
    assert ack["frame"] == "hello_ack", ack
    return reader, writer


def events_of(path: Path, event: str) -> list[dict[str, Any]]:
    return [r for r in records(path) if r["event"] == event]


async def test_a_reclaimed_stale_claim_is_inscribed(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a connection that failed a frame lingers (closing) while its client keeps the socket open:
    # its claim is stale; long linger so the second hello always meets it
    monkeypatch.setattr(server_mod, "LINGER_SECONDS", GUARD)
    async with serving(root) as (_server, log):
        reader, first = await hello_on(root / "relay.sock", "alpha@party")
        first.write(b"not json\n")
        await first.drain()
        failed = json.loads(await asyncio.wait_for(reader.readline(), GUARD))
        assert failed["response"]["error"]["code"] == "validation_invalid_arguments"
        _, second = await hello_on(root / "relay.sock", "alpha@party")
        (record,) = events_of(log, "relay.stream.stale_claim_reclaimed")
        assert record["details"]["principal_id"] == "alpha@party"
        assert record["details"]["stale_connection_id"] != record["details"]["connection_id"]
        first.close()
        second.close()


async def test_a_write_timeout_and_a_revocation_are_inscribed(root: Path) -> None:
    async with serving(root, write_timeout=0.2) as (server, log):
        slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # never reads
        slow.connect(str(root / "relay.sock"))
        hello = {"frame": "hello", "schema_version": "1", "principal_id": "slow@party",
                 "identity_token": wire.SOCKET_TRUST}  # fmt: skip
        big = {"frame": "request", "request_id": "big", "request": {"operation": "up"}}
        slow.sendall(wire.encode(hello) + wire.encode(big))
        await asyncio.to_thread(
            until, lambda: events_of(log, "relay.connection.write_timeout"), GUARD, "timeout"
        )
        (record,) = events_of(log, "relay.connection.write_timeout")
        assert record["details"]["principal_id"] == "slow@party"
        assert record["details"]["timeout"] == 0.2
        slow.close()

        _, revoked = await hello_on(root / "relay.sock", "bravo@party")
        assert server.revoke("bravo@party", "runtime_identity_revoked", "rotated") == 1
        (teardown,) = events_of(log, "relay.connection.identity_revoked_teardown")
        assert teardown["details"]["principal_id"] == "bravo@party"
        assert teardown["details"]["code"] == "runtime_identity_revoked"
        revoked.close()


def test_no_sink_or_a_broken_one_never_raises(root: Path) -> None:
    RelayInscriptions(None)("relay.look.response", target_session="a@b")  # the event log only
    blocker = root / "file"
    blocker.write_text("")
    broken = RelayInscriptions(blocker / "inscriptions")  # its directory cannot be made
    broken("relay.look.response", target_session="a@b")
    broken.close()
    assert not (root / "inscriptions").exists()
