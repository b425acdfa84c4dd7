"""RelayServer (mcphost/relay/server.py) on a real Unix socket: raw NDJSON clients, our relay
client (`RelayStream`), and the fake relay's wire vectors side by side.

No sleeps: every wait is for a frame, an EOF, or a condition (`tests.waiting.until`, polled in
a thread so the loop keeps serving); the 30 s guards only catch a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mcphost.agentmux import wire
from mcphost.agentmux.wire import Hello, Principal, RelayError, Request, parse_principal
from mcphost.peer import PeerCred
from mcphost.relay.server import (
    CLAIM_CONFLICT_MESSAGE,
    UNEXPECTED_MESSAGE,
    RelayBindError,
    RelayServer,
)
from mcphost.relaytools.errors import ClaimConflict, RelayIOError, ToolFailure
from mcphost.relaytools.stream import InProcessStream, RelayStream
from mcphost.testing.relayharness import (
    FakeRelay,
    _default_response,
    global_bundle,
    listed_bundle,
    relay_error,
)
from tests.waiting import until

pytestmark = pytest.mark.anyio

GUARD = 30.0  # only a hang reaches it


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rly-", dir="/tmp"))  # 0700, short for sun_path
    yield path
    shutil.rmtree(path, ignore_errors=True)


class App:
    """The test's `authenticate` and `handle`: a small bundle `party`, an echo-ish handler."""

    def __init__(self) -> None:
        self.creds: list[PeerCred | None] = []
        self.calls: list[tuple[str, Request]] = []
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.gate.set()

    def authenticate(self, hello: Hello, cred: PeerCred | None) -> Principal:
        self.creds.append(cred)
        principal = parse_principal(hello.principal_id)
        if hello.identity_token == "wrong-psk":
            raise RelayError("validation_unrecognized_credential", "identity token not recognized")
        if principal.kind == "session" and principal.namespace != "party":
            raise RelayError(
                "validation_unknown_bundle",
                "bundle is not loaded",
                {"bundle_name": principal.namespace},
            )
        if hello.principal_id == "crash@party":
            raise KeyError("authenticate bug")
        return dataclasses.replace(principal, verified=hello.identity_token != wire.SOCKET_TRUST)

    async def handle(self, principal: Principal, request: Request) -> dict[str, Any]:
        self.calls.append((principal.id, request))
        body = request.body
        if request.operation == "list":
            namespace = request.namespace or principal.namespace
            if namespace == "GLOBAL":
                return {"kind": "list", "schema_version": "1", "bundle": global_bundle()}
            members = ["alpha", "bravo", "charlie"]
            return {
                "kind": "list",
                "schema_version": "1",
                "bundle": listed_bundle(namespace, members),
            }
        if request.operation == "send":
            return {
                "kind": "send",
                "schema_version": "1",
                "request_id": body.get("request_id"),
                "requester_session": principal.id,
                "results": [],
            }
        if request.operation == "look":
            self.entered.set()
            await self.gate.wait()
            if body.get("target_session") == "boom@party":
                raise RuntimeError("handler bug with a secret-looking text")
            if body.get("target_session") == "none@party":
                return None  # type: ignore[return-value]
            return {
                "kind": "look",
                "schema_version": "1",
                "target_session": body.get("target_session"),
            }
        if request.operation == "raww":
            raise RelayError(
                "authorization_forbidden",
                "request denied by authorization policy",
                {"capability": "raww.write", "requester_session": principal.id, "bundle_name": "party",
                 "reason": "policy scope does not permit this access"},
            )  # fmt: skip
        if request.operation == "up":
            return {"kind": "bundle_transition", "schema_version": "1", "pad": "x" * (4 << 20)}
        raise RelayError("validation_unsupported_operation", f"{request.operation} is not served")


@contextlib.asynccontextmanager
async def serving(root: Path, app: App | None = None, **kw: Any) -> AsyncIterator[RelayServer]:
    app = app or App()
    kw.setdefault("pre_hello_timeout", GUARD)  # a loaded machine must not close a slow test client
    server = RelayServer(
        str(root / "relay.sock"), authenticate=app.authenticate, handle=app.handle, **kw
    )
    await server.start()
    try:
        yield server
    finally:
        await server.aclose()


class Raw:
    """A raw NDJSON client."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, path: str | Path) -> Raw:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=64 << 20)
        return cls(reader, writer)

    async def send(self, frame: dict[str, Any] | bytes) -> None:
        self.writer.write(frame if isinstance(frame, bytes) else wire.encode(frame))
        await self.writer.drain()

    async def line(self) -> bytes:
        data = await asyncio.wait_for(self.reader.readline(), GUARD)
        assert data.endswith(b"\n"), data
        return data

    async def recv(self) -> dict[str, Any]:
        return json.loads(await self.line())

    async def eof(self) -> None:
        rest = await asyncio.wait_for(self.reader.read(), GUARD)
        assert rest == b"", rest

    async def hello(self, principal_id: str = "alpha@party", token: str = "socket-trust") -> dict:
        await self.send(hello(principal_id, token))
        return await self.recv()

    def close(self) -> None:
        self.writer.close()


def hello(principal_id: str = "alpha@party", token: str = "socket-trust", **over: Any) -> dict:
    frame = {
        "frame": "hello",
        "schema_version": "1",
        "principal_id": principal_id,
        "identity_token": token,
    }
    frame.update(over)
    return frame


def request(op: str, rid: str | None = None, ns: str | None = None, **body: Any) -> dict:
    frame: dict[str, Any] = {"frame": "request"}
    if rid is not None:
        frame["request_id"] = rid
    if ns is not None:
        frame["namespace"] = ns
    frame["request"] = {"operation": op, **body}
    return frame


def error_frame(
    code: str, message: str, details: Any = None, request_id: str | None = None
) -> dict:
    out: dict[str, Any] = {"frame": "response"}
    if request_id is not None:
        out["request_id"] = request_id
    out["response"] = relay_error(code, message, details)
    return out


async def wait_until(condition: Callable[[], Any], what: str) -> None:
    await asyncio.to_thread(until, condition, GUARD, what)


def stream(
    path: Path, principal_id: str = "alpha@party", token: str = "socket-trust", **kw: Any
) -> RelayStream:
    return RelayStream(str(path / "relay.sock"), principal_id, lambda: token, **kw)


# -- the socket --------------------------------------------------------------------------------


async def test_socket_is_0600_replaces_a_stale_one_and_is_unlinked_on_close(root: Path) -> None:
    path = root / "relay.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # a socket file nothing listens on
    async with serving(root) as server:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with pytest.raises(RelayBindError, match="another process is serving"):
            await RelayServer(
                str(path), authenticate=App().authenticate, handle=App().handle
            ).start()
        client = await Raw.open(path)
        assert (await client.hello())["frame"] == "hello_ack"
        client.close()
        assert server.connections() <= 1
    assert not path.exists()


async def test_bind_refuses_a_non_socket_a_missing_or_shared_directory(root: Path) -> None:
    app = App()
    (root / "relay.sock").write_text("not a socket")
    with pytest.raises(RelayBindError, match="not a socket"):
        await RelayServer(
            str(root / "relay.sock"), authenticate=app.authenticate, handle=app.handle
        ).start()
    with pytest.raises(RelayBindError, match="missing"):
        await RelayServer(
            str(root / "no" / "relay.sock"), authenticate=app.authenticate, handle=app.handle
        ).start()
    shared = root / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(RelayBindError, match="writable by no one else"):
        await RelayServer(
            str(shared / "relay.sock"), authenticate=app.authenticate, handle=app.handle
        ).start()
    assert (root / "relay.sock").read_text() == "not a socket"


async def test_a_deep_path_binds_through_the_directory_fd(root: Path) -> None:
    deep = root / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True, mode=0o700)
    async with serving(deep) as _:
        s = stream(deep)
        try:
            out = await s.request({"operation": "list", "requester_session": "alpha"}, "party")
            assert out["bundle"]["id"] == "party"
        finally:
            await s.aclose()


# -- hello -------------------------------------------------------------------------------------


async def test_hello_ack_then_requests_echo_or_omit_their_id(root: Path) -> None:
    app = App()
    async with serving(root, app) as server:
        client = await Raw.open(root / "relay.sock")
        await client.send(hello())
        assert (
            await client.line()
            == b'{"frame":"hello_ack","schema_version":"1","principal_id":"alpha@party"}\n'
        )
        await client.send(request("list", "r1", "party", requester_session="alpha"))
        assert await client.recv() == {
            "frame": "response",
            "request_id": "r1",
            "response": {
                "kind": "list",
                "schema_version": "1",
                "bundle": listed_bundle("party", ["alpha", "bravo", "charlie"]),
            },
        }
        await client.send(
            request("send", None, request_id="inner", message="hi", targets=[], broadcast=False)
        )
        out = await client.recv()
        assert list(out) == ["frame", "response"] and out["response"]["request_id"] == "inner"
        await client.send(b'{"frame":"request","request_id":null,"request":{"operation":"list"}}\n')
        assert "request_id" not in await client.recv()
        await client.send(request("raww", "r4", text="y"))
        assert await client.recv() == error_frame(
            "authorization_forbidden",
            "request denied by authorization policy",
            {"capability": "raww.write", "requester_session": "alpha@party", "bundle_name": "party",
             "reason": "policy scope does not permit this access"},
            "r4",
        )  # fmt: skip
        assert server.claimed("alpha@party") and server.connections("alpha@party") == 1
        client.close()
    cred = app.creds[0]
    assert cred is not None and cred.pid == os.getpid() and cred.uid == os.geteuid()


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (
            hello(schema_version="2"),
            error_frame(
                "validation_invalid_schema_version",
                "unsupported schema_version; this relay speaks 1",
                {"schema_version": "2", "supported_schema_version": "1"},
            ),
        ),
        (
            hello("alpha"),
            error_frame(
                "validation_invalid_principal_id",
                "principal_id must be <id>@<namespace> with both parts non-empty",
                {"principal_id": "alpha"},
            ),
        ),
        (
            hello("alpha@party", "wrong-psk"),
            error_frame("validation_unrecognized_credential", "identity token not recognized"),
        ),
        (
            hello("alpha@elsewhere"),
            error_frame(
                "validation_unknown_bundle", "bundle is not loaded", {"bundle_name": "elsewhere"}
            ),
        ),
        (hello("crash@party"), error_frame("internal_unexpected_failure", UNEXPECTED_MESSAGE)),
    ],
    ids=["schema", "principal", "psk", "bundle", "authenticate-crash"],
)
async def test_a_refused_hello_gets_one_error_frame_then_eof(
    root: Path, frame: dict, expected: dict
) -> None:
    async with serving(root) as server:
        client = await Raw.open(root / "relay.sock")
        await client.send(frame)
        assert await client.recv() == expected
        await client.eof()
        assert not server.claimed(frame["principal_id"])
        client.close()


async def test_request_before_hello_is_refused_and_the_connection_stays_open(root: Path) -> None:
    async with serving(root):
        client = await Raw.open(root / "relay.sock")
        await client.send(request("list", "early"))
        await client.send(request("list"))
        missing = "hello is required before any request on a relay connection"
        assert await client.recv() == error_frame(
            "validation_missing_hello", missing, request_id="early"
        )
        assert await client.recv() == error_frame("validation_missing_hello", missing)
        assert (await client.hello())["frame"] == "hello_ack"
        await client.send(request("list", "late", "GLOBAL"))
        assert (await client.recv())["response"]["bundle"] == global_bundle()
        client.close()


@pytest.mark.parametrize("before_hello", [True, False])
@pytest.mark.parametrize(
    ("raw", "cause"),
    [
        (b"{oops\n", "Expecting property name"),
        (b'{"frame":"request","request":{"operation":"chat"}}\n', "unknown operation `chat`"),
        (b"x" * (wire.MAX_FRAME_BYTES + 10) + b"\n", "frame longer than"),
    ],
    ids=["json", "operation", "too-long"],
)
async def test_a_parse_failure_is_answered_then_the_connection_closes(
    root: Path, raw: bytes, cause: str, before_hello: bool
) -> None:
    async with serving(root):
        client = await Raw.open(root / "relay.sock")
        if not before_hello:
            assert (await client.hello())["frame"] == "hello_ack"
        await client.send(raw + wire.encode(request("list", "after")))  # never answered
        out = await client.recv()
        assert list(out) == ["frame", "response"]
        error = out["response"]["error"]
        assert (out["response"]["kind"], error["code"], error["message"]) == (
            "error",
            "validation_invalid_arguments",
            "failed to parse relay request",
        )
        assert cause in error["details"]["cause"]
        await client.eof()
        client.close()


async def test_a_second_hello_closes_the_connection(root: Path) -> None:
    async with serving(root):
        client = await Raw.open(root / "relay.sock")
        assert (await client.hello())["frame"] == "hello_ack"
        out = await client.hello()
        assert out["response"]["error"]["code"] == "validation_invalid_arguments"
        await client.eof()
        client.close()


async def test_pre_hello_idle_timeout_closes(root: Path) -> None:
    async with serving(root, pre_hello_timeout=0.05) as server:
        silent = await Raw.open(root / "relay.sock")
        await silent.eof()
        early = await Raw.open(root / "relay.sock")
        await early.send(request("list", "x"))
        assert (await early.recv())["response"]["error"]["code"] == "validation_missing_hello"
        await early.eof()  # the idle timer still runs before hello
        silent.close()
        early.close()
        await wait_until(lambda: server.connections() == 0, "connections closed")


async def test_requests_before_hello_do_not_extend_the_deadline_from_accept(root: Path) -> None:
    """SECURITY.md X5: the 2 s pre-hello timeout runs from the accept. A client that keeps
    sending requests without a hello (each answered `validation_missing_hello`) is still
    closed at that deadline; before, each request restarted the timer, so such clients kept
    their relay slots for ever (512 of them filled the relay)."""
    async with serving(root, pre_hello_timeout=0.3) as server:
        client = await Raw.open(root / "relay.sock")

        async def chatter() -> int:
            answered = 0
            while True:
                try:
                    await client.send(request("list", f"r{answered}"))
                except (BrokenPipeError, ConnectionResetError):
                    return answered
                data = await client.reader.readline()
                if not data:
                    return answered
                assert json.loads(data)["response"]["error"]["code"] == "validation_missing_hello"
                answered += 1

        answered = await asyncio.wait_for(chatter(), GUARD)  # only a hang (the old bug) reaches it
        assert answered > 1  # it did keep the connection busy until the deadline
        client.close()
        await wait_until(lambda: server.connections() == 0, "connections closed")


async def test_no_timeout_after_hello(root: Path) -> None:
    async with serving(root, pre_hello_timeout=0.05):
        client = await Raw.open(root / "relay.sock")
        assert (await client.hello())["frame"] == "hello_ack"
        silent = await Raw.open(root / "relay.sock")
        await silent.eof()  # a pre-hello timeout has run out meanwhile
        silent.close()
        await client.send(request("list", "still-here"))
        assert (await client.recv())["request_id"] == "still-here"
        client.close()


# -- requests ----------------------------------------------------------------------------------


async def test_requests_of_one_connection_run_one_at_a_time_in_order(root: Path) -> None:
    app = App()
    app.gate.clear()
    async with serving(root, app):
        client = await Raw.open(root / "relay.sock")
        other = await Raw.open(root / "relay.sock")
        assert (await client.hello())["frame"] == "hello_ack"
        assert (await other.hello("bravo@party"))["frame"] == "hello_ack"
        await client.send(
            wire.encode(request("look", "a", target_session="bravo@party"))
            + wire.encode(request("send", "b", request_id="b"))
            + wire.encode(request("list", "c"))
        )
        await asyncio.wait_for(app.entered.wait(), GUARD)
        # another connection is served while this one's first request is held
        await other.send(request("list", "o"))
        assert (await other.recv())["request_id"] == "o"
        assert [(p, r.request_id) for p, r in app.calls] == [
            ("alpha@party", "a"),
            ("bravo@party", "o"),
        ]
        app.gate.set()
        assert [(await client.recv())["request_id"] for _ in range(3)] == ["a", "b", "c"]
        client.close()
        other.close()


async def test_a_handler_crash_is_an_internal_failure_without_the_traceback(root: Path) -> None:
    async with serving(root):
        client = await Raw.open(root / "relay.sock")
        assert (await client.hello())["frame"] == "hello_ack"
        await client.send(request("look", "x", target_session="boom@party"))
        raw = await client.line()
        assert json.loads(raw) == error_frame(
            "internal_unexpected_failure", UNEXPECTED_MESSAGE, request_id="x"
        )
        assert b"secret-looking" not in raw and b"Traceback" not in raw
        await client.send(request("look", "y", target_session="none@party"))  # not a body
        assert (await client.recv())["response"]["error"]["code"] == "internal_unexpected_failure"
        await client.send(request("list", "z"))
        assert (await client.recv())["request_id"] == "z"  # the connection carries on
        client.close()


# -- identity claims ---------------------------------------------------------------------------


async def test_a_live_claim_conflicts_and_is_reclaimed_after_disconnect(root: Path) -> None:
    async with serving(root) as server:
        first = await Raw.open(root / "relay.sock")
        assert (await first.hello())["frame"] == "hello_ack"
        second = await Raw.open(root / "relay.sock")
        assert await second.hello() == error_frame(
            "runtime_identity_claim_conflict",
            CLAIM_CONFLICT_MESSAGE,
            {"principal_id": "alpha@party", "reason": "existing identity owner is still live"},
        )
        await second.eof()
        second.close()
        assert CLAIM_CONFLICT_MESSAGE == "stream identity is already claimed by a live connection"
        other = await Raw.open(root / "relay.sock")  # another principal is not affected
        assert (await other.hello("bravo@party"))["frame"] == "hello_ack"
        assert server.live_principals() == ["alpha@party", "bravo@party"]
        first.close()
        await wait_until(lambda: not server.claimed("alpha@party"), "claim released")
        third = await Raw.open(root / "relay.sock")
        assert (await third.hello())["frame"] == "hello_ack"
        third.close()
        other.close()


async def test_our_client_rides_out_a_claim_held_by_a_closing_connection(root: Path) -> None:
    async with serving(root):
        for _ in range(5):
            s = stream(root)
            out = await s.request({"operation": "list", "requester_session": "alpha"}, "party")
            assert out["kind"] == "list"
            await s.aclose()  # the next one connects at once: reclaim or retry, never an error


async def test_our_client_reports_a_claim_that_stays_live_as_a_claim_conflict(root: Path) -> None:
    async with serving(root):
        holder = await Raw.open(root / "relay.sock")
        assert (await holder.hello())["frame"] == "hello_ack"
        s = stream(root, claim_retry=0.2)
        with pytest.raises(ClaimConflict) as caught:
            await s.request({"operation": "list"})
        assert caught.value.code == "runtime_identity_claim_conflict"
        assert caught.value.details["retried_for_ms"] == 200
        await s.aclose()
        holder.close()


# -- backpressure, revocation, the cap, events -------------------------------------------------


async def test_a_client_that_does_not_read_is_dropped_while_others_are_served(root: Path) -> None:
    async with serving(root, write_timeout=0.2) as server:
        slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # never reads: no asyncio buffer
        slow.connect(str(root / "relay.sock"))
        slow.sendall(wire.encode(hello("slow@party")) + wire.encode(request("up", "big")))
        await wait_until(lambda: server.connections("slow@party") == 1, "slow client hello'd")
        fast = stream(root)
        for i in range(3):
            out = await fast.request({"operation": "send", "request_id": f"f{i}"})
            assert out["request_id"] == f"f{i}"
        await wait_until(lambda: server.connections("slow@party") == 0, "slow client torn down")
        assert not server.claimed("slow@party")

        def drain() -> int:
            got = 0
            with contextlib.suppress(ConnectionError):
                while chunk := slow.recv(1 << 20):
                    got += len(chunk)
            return got

        assert await asyncio.to_thread(drain) < 4 << 20  # cut off: the response never came whole
        slow.close()
        out = await fast.request({"operation": "list"}, "party")
        assert out["kind"] == "list"
        await fast.aclose()


async def test_revoke_writes_the_error_then_closes_and_frees_the_claim(root: Path) -> None:
    async with serving(root) as server:
        client = await Raw.open(root / "relay.sock")
        assert (await client.hello())["frame"] == "hello_ack"
        message = "identity credential was rotated; reconnect with the new credential"
        assert server.revoke("alpha@party", "runtime_identity_revoked", message) == 1
        assert not server.claimed("alpha@party")
        assert await client.recv() == error_frame("runtime_identity_revoked", message)
        await client.eof()
        client.close()
        again = await Raw.open(root / "relay.sock")
        assert (await again.hello())["frame"] == "hello_ack"
        assert server.revoke("nobody@party", "runtime_identity_revoked", message) == 0
        again.close()


async def test_revoke_fails_our_clients_waiting_call(root: Path) -> None:
    app = App()
    app.gate.clear()
    async with serving(root, app) as server:
        s = stream(root)
        call = asyncio.ensure_future(
            s.request({"operation": "look", "target_session": "bravo@party"})
        )
        await asyncio.wait_for(app.entered.wait(), GUARD)
        assert server.revoke("alpha@party", "runtime_identity_revoked", "rotated") == 1
        with pytest.raises(ToolFailure) as caught:
            await asyncio.wait_for(call, GUARD)
        assert caught.value.code == "runtime_identity_revoked"
        app.gate.set()
        out = await s.request({"operation": "list"}, "party")  # reconnects with a fresh hello
        assert out["kind"] == "list"
        await s.aclose()


async def test_the_connection_cap(root: Path) -> None:
    async with serving(root, max_connections=2) as server:
        one = await Raw.open(root / "relay.sock")
        two = await Raw.open(root / "relay.sock")  # counted before its hello
        assert (await one.hello())["frame"] == "hello_ack"
        three = await Raw.open(root / "relay.sock")
        assert await three.recv() == error_frame(
            "runtime_connection_limit_reached",
            "relay connection limit reached",
            {"max_connections": 2},
        )
        await three.eof()
        three.close()
        two.close()
        await wait_until(lambda: server.connections() == 1, "a slot freed")
        four = await Raw.open(root / "relay.sock")
        assert (await four.hello("bravo@party"))["frame"] == "hello_ack"
        one.close()
        four.close()


async def test_events_reach_the_principals_connection_and_our_client_counts_them(
    root: Path,
) -> None:
    async with serving(root) as server:
        raw = await Raw.open(root / "relay.sock")
        assert (await raw.hello("bravo@party"))["frame"] == "hello_ack"
        frame = wire.event(
            "delivery_outcome",
            "bravo@party",
            {"message_id": "m", "phase": "routed", "outcome": None},
        )
        assert server.send_event("bravo@party", frame) == 1
        assert await raw.recv() == frame
        counted: list[int] = []
        s = stream(root, on_events=counted.append)
        await s.request({"operation": "list"}, "party")
        assert server.send_event("alpha@party", frame) == 1
        assert server.send_event("nobody@party", frame) == 0
        out = await s.request({"operation": "list"}, "GLOBAL")  # the event was written before
        assert out["bundle"]["id"] == "GLOBAL"
        await wait_until(lambda: s.events_ignored == 1, "event counted")
        await s.aclose()
        raw.close()


async def test_aclose_ends_connections_and_in_flight_handlers(root: Path) -> None:
    app = App()
    app.gate.clear()
    server = RelayServer(str(root / "relay.sock"), authenticate=app.authenticate, handle=app.handle)
    await server.start()
    client = await Raw.open(root / "relay.sock")
    assert (await client.hello())["frame"] == "hello_ack"
    await client.send(request("look", "held", target_session="bravo@party"))
    await asyncio.wait_for(app.entered.wait(), GUARD)
    await server.aclose()
    with contextlib.suppress(ConnectionError):
        await client.eof()
    assert not (root / "relay.sock").exists()
    client.close()


# -- our client and the fake relay's vectors ---------------------------------------------------


async def test_our_relay_client_against_the_server(root: Path) -> None:
    app = App()
    async with serving(root, app):
        s = stream(root, register_now=True)
        outs = await asyncio.gather(
            *(s.request({"operation": "send", "request_id": f"m{i}"}) for i in range(16))
        )
        assert [o["request_id"] for o in outs] == [f"m{i}" for i in range(16)]
        listed = await s.request({"operation": "list", "requester_session": "alpha"}, "party")
        assert listed == {
            "kind": "list",
            "schema_version": "1",
            "bundle": listed_bundle("party", ["alpha", "bravo", "charlie"]),
        }
        denied = await s.request({"operation": "raww", "text": "y"})
        assert (
            denied["kind"] == "error" and denied["error"]["details"]["capability"] == "raww.write"
        )
        await s.aclose()
        psk = stream(root, "bravo@party", "a-psk")
        assert (await psk.request({"operation": "list"}, "party"))["kind"] == "list"
        await psk.aclose()
        assert [p for p, _ in app.calls][-1] == "bravo@party"
        wrong = stream(root, "bravo@party", "wrong-psk")
        with pytest.raises(ToolFailure) as caught:
            await wrong.request({"operation": "list"})
        assert caught.value.code == "validation_unrecognized_credential"
        await wrong.aclose()


# §2.6's request frames, as the relay tools send them
VECTORS: list[dict[str, Any]] = [
    {"frame": "request", "request_id": "r1", "namespace": "party", "request": {"operation": "list", "requester_session": "alpha"}},
    {"frame": "request", "request_id": "r2", "namespace": "GLOBAL", "request": {"operation": "list", "requester_session": "alpha"}},
    {"frame": "request", "request_id": "r3", "request": {"operation": "send", "request_id": "req-1", "requester_session": "alpha", "message": "hi", "targets": ["bravo@party", "user@GLOBAL"], "broadcast": False}},
    {"frame": "request", "request_id": "r4", "request": {"operation": "look", "requester_session": "alpha", "target_session": "bravo@party", "lines": 40}},
    {"frame": "request", "request_id": "r5", "request": {"operation": "raww", "request_id": None, "requester_session": "alpha", "target_session": "bravo@party", "text": "y", "no_enter": False}},
    {"frame": "request", "request_id": "r6", "request": {"operation": "choices_pick", "choice_request_id": "c-1", "outcome": "selected", "option_id": "allow_once"}},
    {"frame": "request", "request_id": "r7", "request": {"operation": "up"}},
    {"frame": "request", "request_id": "r8", "request": {"operation": "new_peer", "principal_id": "west@RELAY", "scope": "alpha,GLOBAL", "destination": {"kind": "response"}}},
    {"frame": "request", "request": {"operation": "change_psk", "principal_id": "alpha@party", "destination": {"kind": "config"}}},
    {"frame": "request", "request_id": "r9", "request": {"operation": "choices_list"}},
]  # fmt: skip


async def _exchange(path: Path, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    client = await Raw.open(path)
    try:
        out = [await client.hello()]
        for frame in frames:
            await client.send(frame)
            out.append(await client.recv())
        return out
    finally:
        client.close()


async def test_the_fake_relays_vectors_get_the_same_frames_from_the_server(root: Path) -> None:
    """The same request lines to the fake relay and to RelayServer whose handler answers the
    fake's canned bodies: identical frames back, and our client reads them the same."""
    seen: list[Request] = []

    async def canned(principal: Principal, req: Request) -> dict[str, Any]:
        seen.append(req)
        frame: dict[str, Any] = {"request": req.body}
        if req.namespace is not None:
            frame["namespace"] = req.namespace
        return _default_response(frame)

    fake_dir = root / "fake"
    fake_dir.mkdir(mode=0o700)
    fake = await FakeRelay(fake_dir / "relay.sock").start()
    server = RelayServer(str(root / "relay.sock"), authenticate=App().authenticate, handle=canned)
    await server.start()
    try:
        from_fake = await _exchange(fake_dir / "relay.sock", VECTORS)
        from_server = await _exchange(root / "relay.sock", VECTORS)
        assert from_server == from_fake
        assert [r.operation for r in seen] == [v["request"]["operation"] for v in VECTORS]
        assert [r.request_id for r in seen] == [v.get("request_id") for v in VECTORS]
        for vector in VECTORS[:2]:  # and our client parses our answers to what the fake gives
            body, ns = vector["request"], vector.get("namespace")
            ours, theirs = (
                stream(root),
                RelayStream(str(fake_dir / "relay.sock"), "alpha@party", lambda: "socket-trust"),
            )
            try:
                assert await ours.request(body, ns) == await theirs.request(body, ns)
            finally:
                await ours.aclose()
                await theirs.aclose()
    finally:
        await server.aclose()
        await fake.stop()


async def test_an_in_process_session_holds_the_claim_like_a_connection(root: Path) -> None:
    """Issue #20: the supervisor's relay tools reach the relay in process (`local_session`),
    through `InProcessStream`: same answers, no socket, and the one-holder-per-principal rule."""
    app = App()
    admit = parse_principal  # the host established it; the test admits any well-formed id
    async with serving(root, app, admit=admit) as server:
        events: list[int] = []
        local = InProcessStream(
            lambda on_event: server.local_session("alpha@party", on_event),
            "alpha@party",
            claim_retry=0.2,
            on_events=events.append,
        )
        out = await local.request({"operation": "list", "requester_session": "alpha"}, "party")
        assert out["kind"] == "list" and server.connections() == 0
        assert server.claimed("alpha@party") and server.live_principals() == ["alpha@party"]
        # a socket hello for the same principal is refused while the session is open
        raw = await Raw.open(root / "relay.sock")
        assert "runtime_identity_claim_conflict" in str(await raw.hello())
        raw.close()
        # events addressed to the principal are counted, never surfaced
        assert server.send_event("alpha@party", wire.event("x", "alpha@party", {})) == 1
        await wait_until(lambda: events == [1], "the event counted")
        # a parse failure is the relay's error, as on the wire
        with pytest.raises(ToolFailure) as bad:
            await local.request({"operation": "nope"})
        assert bad.value.code == "validation_invalid_arguments"
        # revoked: the claim is free; the next request claims it again
        assert server.revoke("alpha@party", "runtime_identity_revoked", "rotated") == 1
        assert not server.claimed("alpha@party")
        assert (await local.request({"operation": "list"}, "party"))["kind"] == "list"
        # while a socket client holds the principal, the session reports a claim conflict
        await local.aclose()
        assert not server.claimed("alpha@party")
        holder = await Raw.open(root / "relay.sock")
        assert (await holder.hello())["frame"] == "hello_ack"
        again = InProcessStream(
            lambda on_event: server.local_session("alpha@party", on_event),
            "alpha@party",
            claim_retry=0.2,
        )
        with pytest.raises(ClaimConflict):
            await again.request({"operation": "list"}, "party")
        holder.close()
        await wait_until(lambda: not server.claimed("alpha@party"), "claim released")
        assert (await again.request({"operation": "list"}, "party"))["kind"] == "list"
        await again.aclose()
        with pytest.raises(RelayIOError):
            await again.request({"operation": "list"}, "party")
