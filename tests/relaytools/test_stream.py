"""The multiplexed relay stream against the fake relay, in-process."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from mcphost.relaytools.errors import RelayIOError, ToolFailure
from mcphost.relaytools.stream import RelayStream, SharedStream, new_request_id
from mcphost.testing.relayharness import Env, FakeRelay, relay_error
from tests.waiting import eventually

pytestmark = pytest.mark.anyio


def make_stream(path: Path, **kw: Any) -> RelayStream:
    return RelayStream(str(path), "alpha@party", lambda: "socket-trust", **kw)


def echo(frame: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "send", "schema_version": "1", "request_id": frame["request"].get("request_id")}


async def test_hello_then_lazy_single_connection(relay: FakeRelay, env: Env) -> None:
    relay.respond("send", echo)
    stream = make_stream(env.socket)
    assert relay.connections == 0
    for i in range(3):
        out = await stream.request({"operation": "send", "request_id": f"r{i}"})
        assert out["request_id"] == f"r{i}"
    await stream.aclose()
    assert relay.connections == 1
    assert relay.hellos == [
        {
            "frame": "hello",
            "schema_version": "1",
            "principal_id": "alpha@party",
            "identity_token": "socket-trust",
        }
    ]
    frame = relay.requests[0]
    assert list(frame) == ["frame", "request_id", "request"]
    assert len(frame["request_id"]) == 36


async def test_register_now_sends_hello_before_any_call(relay: FakeRelay, env: Env) -> None:
    relay.respond("send", echo)
    stream = make_stream(env.socket, register_now=True)
    deadline = time.monotonic() + 5
    while not relay.hellos:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert relay.requests == []
    out = await stream.request({"operation": "send", "request_id": "r"})
    assert out["request_id"] == "r"
    await stream.aclose()
    assert relay.connections == 1 and len(relay.hellos) == 1


async def test_register_now_with_the_relay_down_raises_nothing_and_calls_connect_later(
    env: Env,
) -> None:
    stream = make_stream(env.socket, register_now=True)
    with pytest.raises(RelayIOError) as caught:  # waits on the start-up Hello: its failure
        await stream.request({"operation": "send"})
    assert caught.value.kind == "NotFound"
    relay = await FakeRelay(env.socket).start()
    try:
        relay.respond("send", echo)
        out = await stream.request({"operation": "send", "request_id": "later"})
        assert out["request_id"] == "later" and relay.connections == 1
    finally:
        await stream.aclose()
        await relay.stop()


async def test_a_call_waiting_on_the_start_up_hello_gets_its_refusal(
    relay: FakeRelay, env: Env
) -> None:
    relay.hello_reply = {
        "frame": "response",
        "response": relay_error("validation_unknown_sender", "no"),
    }
    stream = make_stream(env.socket, register_now=True)
    with pytest.raises(ToolFailure) as caught:
        await stream.request({"operation": "send"})
    assert caught.value.code == "validation_unknown_sender"
    await stream.aclose()
    assert relay.requests == [] and len(relay.hellos) == 1


async def test_parallel_calls_answered_out_of_order_take_one_round_trip(
    relay: FakeRelay, env: Env
) -> None:
    n = 24
    arrived: list[int] = []
    all_in = asyncio.Event()
    answered = [asyncio.Event() for _ in range(n + 1)]
    answered[n].set()

    async def reverse(frame: dict[str, Any]) -> dict[str, Any]:
        i = int(frame["request"]["request_id"])
        arrived.append(i)
        if len(arrived) == n:
            all_in.set()
        # no answer before all n are at the relay: a serialising stream would never get there
        await asyncio.wait_for(all_in.wait(), 30)
        await answered[i + 1].wait()  # then the last request is answered first
        asyncio.get_running_loop().call_soon(answered[i].set)
        return echo(frame)

    relay.respond("send", echo)
    stream = make_stream(env.socket)
    await stream.request({"operation": "send", "request_id": "warm"})  # connect first
    relay.handler = reverse
    results = await asyncio.gather(
        *(stream.request({"operation": "send", "request_id": str(i)}) for i in range(n))
    )
    await stream.aclose()
    assert [r["request_id"] for r in results] == [str(i) for i in range(n)]
    assert sorted(arrived) == list(range(n))
    assert relay.connections == 1


async def test_failure_fails_waiters_is_not_replayed_and_next_call_reconnects(
    relay: FakeRelay, env: Env
) -> None:
    gate = asyncio.Event()

    async def hold(frame: dict[str, Any]) -> Any:
        if frame["request"].get("request_id") == "held":
            await gate.wait()
            return None
        return echo(frame)

    relay.handler = hold
    stream = make_stream(env.socket)
    call = asyncio.ensure_future(stream.request({"operation": "send", "request_id": "held"}))
    while not relay.requests:
        await asyncio.sleep(0.01)
    await relay.drop_connections()
    with pytest.raises(RelayIOError) as info:
        await call
    assert info.value.kind in ("UnexpectedEof", "ConnectionReset")
    out = await stream.request({"operation": "send", "request_id": "next"})
    assert out["request_id"] == "next"
    assert relay.connections == 2
    assert [r["request"]["request_id"] for r in relay.requests] == ["held", "next"]
    gate.set()
    await stream.aclose()


async def test_timeout_keeps_connection_and_drops_late_answer(relay: FakeRelay, env: Env) -> None:
    # "late" is answered only once "ok" has arrived, and "ok" only after: on the one
    # connection the late answer comes first, then ok's (the fake relay writes an answer as
    # soon as its handler returns)
    arrived, late_answered = asyncio.Event(), asyncio.Event()

    async def late(frame: dict[str, Any]) -> Any:
        if frame["request"].get("request_id") == "late":
            await arrived.wait()
            late_answered.set()
        else:
            arrived.set()
            await late_answered.wait()
        return echo(frame)

    relay.handler = late
    stream = make_stream(env.socket, request_timeout=0.1)
    with pytest.raises(RelayIOError) as info:
        await stream.request({"operation": "send", "request_id": "late"})
    assert info.value.kind == "TimedOut"
    stream.request_timeout = 5.0
    assert (await stream.request({"operation": "send", "request_id": "ok"}))["request_id"] == "ok"
    assert relay.connections == 1
    await stream.aclose()


async def test_missing_socket_is_not_found(env: Env) -> None:
    stream = make_stream(env.socket)
    with pytest.raises(RelayIOError) as info:
        await stream.request({"operation": "up"})
    assert info.value.kind == "NotFound"


async def test_claim_conflict_is_retried_then_reported_as_itself(
    relay: FakeRelay, env: Env
) -> None:
    relay.hello_reply = {
        "frame": "response",
        "response": relay_error(
            "runtime_identity_claim_conflict",
            "stream identity is already claimed by a live connection",
            {"principal_id": "alpha@party", "reason": "existing identity owner is still live"},
        ),
    }
    stream = make_stream(env.socket, claim_retry=0.25)
    started = time.monotonic()
    with pytest.raises(ToolFailure) as info:  # a claim conflict, not a saturated relay
        await stream.request({"operation": "up"})
    assert info.value.code == "runtime_identity_claim_conflict"
    assert info.value.rpc_code == -32603
    assert info.value.details == {
        "principal_id": "alpha@party",
        "reason": "existing identity owner is still live",
        "retried_for_ms": 250,
    }
    assert "alpha@party" in info.value.message and "End that process" in info.value.message
    assert time.monotonic() - started >= 0.25
    assert len(relay.hellos) >= 3


async def test_hello_rejection_passes_through(relay: FakeRelay, env: Env) -> None:
    relay.hello_reply = {
        "frame": "response",
        "response": relay_error(
            "validation_unknown_sender", "hello session_id is not configured in associated bundle"
        ),
    }
    stream = make_stream(env.socket)
    with pytest.raises(ToolFailure) as info:
        await stream.request({"operation": "up"})
    assert info.value.code == "validation_unknown_sender"


async def test_hello_ack_timeout(env: Env) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    server = await asyncio.start_unix_server(silent, path=str(env.socket))
    stream = make_stream(env.socket, hello_timeout=0.1)
    with pytest.raises(RelayIOError) as info:
        await stream.request({"operation": "up"})
    assert info.value.kind == "TimedOut"
    server.close()


async def test_events_are_counted_not_surfaced(relay: FakeRelay, env: Env) -> None:
    relay.respond("send", echo)
    relay.events_per_request = 3
    seen: list[int] = []
    stream = make_stream(env.socket, on_events=seen.append)
    out = await stream.request({"operation": "send", "request_id": "x"})
    await eventually(lambda: sum(seen) == 3, "the three events reported")
    await stream.aclose()
    assert out["kind"] == "send"
    assert sum(seen) == 3 == stream.events_ignored


async def test_connection_level_error_fails_waiters(relay: FakeRelay, env: Env) -> None:
    gate = asyncio.Event()

    async def hold(frame: dict[str, Any]) -> Any:
        await gate.wait()
        return None

    relay.handler = hold
    stream = make_stream(env.socket)
    call = asyncio.ensure_future(stream.request({"operation": "up"}))
    while not relay.requests:
        await asyncio.sleep(0.01)
    for writer in relay._writers:
        writer.write(
            b'{"frame":"response","response":{"kind":"error","error":{"code":'
            b'"runtime_identity_revoked","message":"identity credential was rotated"}}}\n'
        )
    with pytest.raises(ToolFailure) as info:
        await call
    assert info.value.code == "runtime_identity_revoked"
    gate.set()
    await stream.aclose()


async def test_deep_socket_path_goes_through_proc_fd() -> None:
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="rt-deep-", dir="/tmp"))
    deep = root / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    fake = await FakeRelay(deep / "relay.sock").start()
    fake.respond("up", {"kind": "bundle_transition", "schema_version": "1"})
    try:
        stream = make_stream(deep / "relay.sock")
        assert (await stream.request({"operation": "up"}))["kind"] == "bundle_transition"
        await stream.aclose()
    finally:
        await fake.stop()
        shutil.rmtree(root)


def test_request_ids_are_uuid4() -> None:
    import uuid

    ids = {new_request_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(uuid.UUID(i).version == 4 for i in ids)


async def test_a_shared_stream_serves_every_handle_on_one_connection(
    relay: FakeRelay, env: Env
) -> None:
    """Sessions speaking as one principal share one connection (one Hello, one claim); calls of
    every handle are multiplexed on it; it closes with the last handle and never reconnects."""
    relay.respond("send", echo)
    relay.events_per_request = 1
    seen: dict[str, int] = {"first": 0, "second": 0}

    def counter(name: str) -> Any:
        return lambda count: seen.__setitem__(name, seen[name] + count)

    share = SharedStream(
        lambda on_events, on_note: make_stream(
            env.socket, on_events=on_events, on_note=on_note, register_now=True
        )
    )
    first = share.handle(counter("first"), lambda *a, **k: None)
    second = share.handle(counter("second"), lambda *a, **k: None)
    outs = await asyncio.gather(
        *(
            h.request({"operation": "send", "request_id": f"r{i}"})
            for i, h in enumerate([first, second] * 5)
        )
    )
    assert [o["request_id"] for o in outs] == [f"r{i}" for i in range(10)]
    assert relay.connections == 1 and len(relay.hellos) == 1
    deadline = time.monotonic() + 30
    while sum(seen.values()) < 10:  # events are reported on a later loop turn
        assert time.monotonic() < deadline, seen
        await asyncio.sleep(0.01)
    assert seen == {"first": 0, "second": 10}  # to the newest open handle only
    await second.aclose()
    assert not share.closed  # `first` still uses it
    out = await first.request({"operation": "send", "request_id": "after"})
    assert out["request_id"] == "after" and relay.connections == 1
    await first.aclose()
    assert share.closed
    with pytest.raises(RelayIOError) as info:  # closed for good: no reconnect as the principal
        await first.request({"operation": "send"})
    assert info.value.kind == "ConnectionAborted" and relay.connections == 1


async def test_a_shared_stream_reconnects_after_a_drop_and_closes_at_once_on_aclose(
    relay: FakeRelay, env: Env
) -> None:
    relay.respond("send", echo)
    share = SharedStream(lambda ev, note: make_stream(env.socket, on_events=ev, on_note=note))
    handle = share.handle(lambda n: None, lambda *a, **k: None)
    await handle.request({"operation": "send", "request_id": "one"})
    await relay.drop_connections()
    with contextlib.suppress(RelayIOError):  # a call racing the drop may fail: never replayed
        await handle.request({"operation": "send", "request_id": "racing"})
    out = await handle.request({"operation": "send", "request_id": "two"})
    assert out["request_id"] == "two" and relay.connections == 2
    await share.aclose()  # the generation ended: closed although a handle is still open
    with pytest.raises(RelayIOError) as info:
        await handle.request({"operation": "send"})
    assert info.value.kind == "ConnectionAborted" and relay.connections == 2
    await handle.aclose()
