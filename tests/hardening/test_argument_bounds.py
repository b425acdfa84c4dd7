"""Argument bounds: an oversized arguments object costs a few bytes of reply, not gigabytes.

Both real processes, driven over raw JSON-RPC: `mcphost host` against the devcenter, and
`mcphost relay-tools` against the relay harness's fake relay. Before the bounds, every unknown
key became its own error entry, written twice (fields list and message): an object of 1M
unknown keys (a 15 MB line) took the host to 1.7 GB and froze its loop for many seconds.

Each test measures the process's own baseline (VmHWM after warm-up calls; the process is one
no other test has used, see `unused`) and checks that:
(a) the refusal is the bounded one (`arguments_too_large` with the limits, or at most
`MAX_REPORTED_FIELDS` fields plus a count), (b) the reply is small, (c) peak RSS grows by a
small multiple of the request line at most (parsing the line is the protocol core's cost and stays),
(d) a ping and a real call sent right behind the big line are answered. No wall-clock bounds:
every wait is on an answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from mcphost.argbounds import MAX_DEPTH, MAX_KEYS_PER_OBJECT, MAX_REPORTED_FIELDS, MAX_VALUES
from mcphost.testing import DevCenter
from mcphost.testing.relayharness import FakeRelay, cleanup, make_env
from tests.hardening.conftest import RawHost, host_env
from tests.hardening.test_relaytools_security import RelayLoop, server, succeed

# deep (make test-slow): argument size and shape bounds, with peak memory.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(300)]

UNKNOWN_KEYS = 200_000  # a ~3.5 MB line: enough to show the amplification, cheap to parse
RSS_PER_LINE_BYTE = 30  # peak RSS growth allowed per byte of request line (unbounded: ~110)
SMALL_REPLY = 4096  # bytes

T = TypeVar("T")


def vm_hwm_kib(pid: int) -> int:
    """Peak resident set size of `pid` (KiB): it catches a spike that came and went."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for {pid}")


def wide(base: dict[str, Any], keys: int = UNKNOWN_KEYS) -> dict[str, Any]:
    return {**base, **{f"unknown_{i:07d}": i for i in range(keys)}}


def call_line(host: RawHost, tool: str, arguments: dict[str, Any]) -> tuple[int, bytes]:
    request_id = host.next_id()
    message = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    return request_id, json.dumps(message).encode() + b"\n"


def reply_bytes(answer: dict[str, Any]) -> int:
    return len(json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode())


def tool_error(answer: dict[str, Any]) -> dict[str, Any]:
    result = answer["result"]
    assert result["isError"] is True, answer
    parsed: dict[str, Any] = json.loads(result["content"][0]["text"])
    return parsed


# -- which process a test gets ----------------------------------------------------------------

UNUSED: set[RawHost] = set()  # the shared processes no test has used since their warm-up


def process(value: RawHost | tuple[RawHost, Any]) -> RawHost:
    return value[0] if isinstance(value, tuple) else value


def unused(
    request: pytest.FixtureRequest, shared: str, start: Callable[[], Iterator[T]]
) -> Iterator[T]:
    """A process no test has used since its warm-up, for a test that reads VmHWM (it only grows,
    so the test needs a baseline no earlier test raised): the module's shared one while it is
    still unused (the test comes first in file order, and `--dist loadfile` keeps that order),
    else a fresh one from `start`."""
    value = request.getfixturevalue(shared)
    if process(value) in UNUSED:
        UNUSED.discard(process(value))
        yield value
    else:
        yield from start()


def used(value: T) -> T:
    """The shared process for a test that only reads replies: no longer unused."""
    UNUSED.discard(process(value))  # type: ignore[arg-type]
    return value


# -- the center-tools host -------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_host(center: DevCenter) -> Iterator[RawHost]:
    """One host for the module: the tests that only read replies (each also proves it keeps
    serving), and, while no test has used it yet, the one that reads VmHWM."""
    yield from started_host(center)


@pytest.fixture()
def fresh_host(request: pytest.FixtureRequest, center: DevCenter) -> Iterator[RawHost]:
    """A host no test has used since its warm-up (`unused`)."""
    yield from unused(request, "shared_host", lambda: started_host(center))


@pytest.fixture()
def host(shared_host: RawHost) -> RawHost:
    return used(shared_host)


def started_host(center: DevCenter) -> Iterator[RawHost]:
    with RawHost(host_env(center.binding_env("unix", AC_MCP_TIER_TOOLS="false"))) as running:
        running.initialize()
        is_error, work = running.call("get_my_work", {})  # aiohttp imported, connection pooled
        assert not is_error, work
        is_error, refused = running.call("get_task", {"task_id": "t-1", "stowaway": 1})
        assert is_error and refused["error"] == "invalid_arguments", refused
        UNUSED.add(running)
        try:
            yield running
        finally:
            UNUSED.discard(running)


def test_a_million_key_style_object_is_refused_unread_and_other_calls_are_served(
    fresh_host: RawHost,
) -> None:
    host = fresh_host
    baseline = vm_hwm_kib(host.proc.pid)
    request_id, line = call_line(host, "get_task", wide({"task_id": "t-1", "agent_id": "x"}))
    host.write(line)
    ping = host.request("ping")
    follow_up = host.request("tools/call", {"name": "get_my_work", "arguments": {}})

    answer = host.wait(request_id, timeout=120)
    assert reply_bytes(answer) < SMALL_REPLY, reply_bytes(answer)
    refused = tool_error(answer)
    assert refused["error"] == "invalid_arguments", refused
    details = refused["details"]
    assert details["reason"] == "arguments_too_large", details
    assert (details["limit"], details["at"], details["found"]) == (
        "keys",
        "(arguments)",
        UNKNOWN_KEYS + 2,
    )
    assert details["max_keys_per_object"] == MAX_KEYS_PER_OBJECT, details
    assert {"max_depth", "max_values", "remedy", "tool"} <= set(details), details
    assert "identity is fixed" in refused["message"], refused  # agent_id is still called out

    assert "result" in host.wait(ping, timeout=120)
    served = host.wait(follow_up, timeout=120)
    assert served["result"]["isError"] is False, served

    growth = (vm_hwm_kib(host.proc.pid) - baseline) * 1024
    print(
        f"\nhost: line {len(line)} B, reply {reply_bytes(answer)} B, "
        f"peak RSS growth {growth / 2**20:.1f} MiB ({growth / len(line):.1f} x line)"
    )
    assert growth < RSS_PER_LINE_BYTE * len(line), (growth, len(line))
    assert host.bad_lines == []


def test_unknown_fields_within_the_limits_are_listed_a_few_plus_a_count(host: RawHost) -> None:
    keys = MAX_KEYS_PER_OBJECT - 2
    arguments = wide({"task_id": "t-1"}, keys)
    arguments["agent_id"] = "agent-2"  # last in the object, first in the report
    answer = host.wait(host.request("tools/call", {"name": "get_task", "arguments": arguments}))
    refused = tool_error(answer)
    assert refused["error"] == "invalid_arguments" and "reason" not in refused["details"]
    fields = refused["details"]["fields"]
    assert len(fields) == MAX_REPORTED_FIELDS, fields
    assert fields[0]["field"] == "agent_id" and "identity is fixed" in fields[0]["problem"]
    assert refused["details"]["omitted_fields"] == keys + 1 - MAX_REPORTED_FIELDS
    assert f"and {keys + 1 - MAX_REPORTED_FIELDS} more field(s)" in refused["message"]
    assert reply_bytes(answer) < SMALL_REPLY


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.parametrize(
    ("value", "limit"),
    [
        ([0] * (MAX_VALUES + 1), "values"),
        ([[[0]]] * (MAX_VALUES // 2), "values"),
        (nested(MAX_DEPTH + 5), "depth"),
    ],
    ids=["long-list", "many-small-lists", "deep"],
)
def test_too_many_values_or_too_deep_is_refused_before_validation(
    host: RawHost, value: Any, limit: str
) -> None:
    is_error, refused = host.call("get_task", {"task_id": "t-1", "stowaway": value})
    assert is_error and refused["error"] == "invalid_arguments", refused
    assert refused["details"]["reason"] == "arguments_too_large", refused
    assert refused["details"]["limit"] == limit, refused
    assert refused["details"]["at"].startswith("stowaway"), refused
    host.alive()


def test_a_megabyte_long_key_is_not_echoed(host: RawHost) -> None:
    key = "k" * 1_000_000
    answer = host.wait(
        host.request("tools/call", {"name": "get_task", "arguments": {"task_id": "t", key: 1}})
    )
    refused = tool_error(answer)
    assert refused["details"]["fields"][0]["field"].startswith("k" * 80 + "…")
    assert reply_bytes(answer) < SMALL_REPLY
    answer = host.wait(host.request("tools/call", {"name": key, "arguments": {}}))
    assert tool_error(answer)["error"] == "unknown_tool"
    assert reply_bytes(answer) < SMALL_REPLY


# -- the relay tools -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def relay_loop() -> Iterator[RelayLoop]:
    loop = RelayLoop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def shared_relay_tools(relay_loop: RelayLoop) -> Iterator[tuple[RawHost, FakeRelay]]:
    """One relay-tools process for the module: the tests that only read replies and count
    frames, and, while no test has used it yet, the one that reads VmHWM."""
    yield from started_relay_tools(relay_loop)


@pytest.fixture()
def fresh_relay_tools(
    request: pytest.FixtureRequest, relay_loop: RelayLoop
) -> Iterator[tuple[RawHost, FakeRelay]]:
    """Relay tools no test has used since their warm-up (`unused`)."""
    yield from unused(request, "shared_relay_tools", lambda: started_relay_tools(relay_loop))


@pytest.fixture()
def relay_tools(
    shared_relay_tools: tuple[RawHost, FakeRelay],
) -> tuple[RawHost, FakeRelay]:
    return used(shared_relay_tools)


def started_relay_tools(relay_loop: RelayLoop) -> Iterator[tuple[RawHost, FakeRelay]]:
    env = make_env()
    relay = relay_loop.run(FakeRelay(env.socket, handler=succeed).start())
    try:
        with server(env) as running:
            running.initialize()
            warm = running.rpc("tools/call", {"name": "look", "arguments": {"target_session": "b"}})
            assert "result" in warm, warm  # the relay stream is up
            UNUSED.add(running)
            try:
                yield running, relay
            finally:
                UNUSED.discard(running)
    finally:
        relay_loop.run(relay.stop())
        cleanup(env)


def test_relay_tools_refuse_a_huge_object_unread_and_keep_serving(
    fresh_relay_tools: tuple[RawHost, FakeRelay],
) -> None:
    host, relay = fresh_relay_tools
    baseline = vm_hwm_kib(host.proc.pid)
    frames = len(relay.requests)
    request_id, line = call_line(host, "send", wide({"message": "hi", "targets": ["bravo"]}))
    host.write(line)
    ping = host.request("ping")
    follow_up = host.request(
        "tools/call", {"name": "send", "arguments": {"message": "hi", "targets": ["bravo"]}}
    )

    answer = host.wait(request_id, timeout=120)
    assert reply_bytes(answer) < SMALL_REPLY, reply_bytes(answer)
    error = answer["error"]
    assert (error["code"], error["data"]["code"]) == (-32602, "validation_invalid_params"), error
    details = error["data"]["details"]
    assert details["reason"] == "arguments_too_large", details
    assert (details["limit"], details["found"]) == ("keys", UNKNOWN_KEYS + 2), details
    assert details["max_keys_per_object"] == MAX_KEYS_PER_OBJECT, details

    assert "result" in host.wait(ping, timeout=120)
    assert "result" in host.wait(follow_up, timeout=120)
    assert len(relay.requests) == frames + 1  # only the follow-up reached the relay

    growth = (vm_hwm_kib(host.proc.pid) - baseline) * 1024
    print(
        f"\nrelay-tools: line {len(line)} B, reply {reply_bytes(answer)} B, "
        f"peak RSS growth {growth / 2**20:.1f} MiB ({growth / len(line):.1f} x line)"
    )
    assert growth < RSS_PER_LINE_BYTE * len(line), (growth, len(line))
    assert host.bad_lines == []


@pytest.mark.parametrize("where", ["top", "args"])
def test_relay_tools_list_a_few_unknown_fields_plus_a_count(
    relay_tools: tuple[RawHost, FakeRelay], where: str
) -> None:
    host, relay = relay_tools
    keys = MAX_KEYS_PER_OBJECT - 3
    extra = {f"stowaway_{i:03d}": i for i in range(keys)}
    if where == "top":
        tool, arguments, prefix = "look", {"target_session": "b", **extra}, ""
        context = "look request"
    else:
        tool, arguments, prefix = "updown", {"command": "up", "args": extra}, "args."
        context = "updown up command"
    frames = len(relay.requests)
    answer = host.rpc("tools/call", {"name": tool, "arguments": arguments})
    data = answer["error"]["data"]
    assert data["code"] == "validation_invalid_params", data
    names = [f"{prefix}stowaway_{i:03d}" for i in range(MAX_REPORTED_FIELDS)]
    assert data["details"] == {"fields": names, "omitted_fields": keys - MAX_REPORTED_FIELDS}
    assert data["message"] == (
        f"unknown parameter(s) for {context}: {', '.join(names)} "
        f"and {keys - MAX_REPORTED_FIELDS} more"
    )
    assert reply_bytes(answer) < SMALL_REPLY
    assert len(relay.requests) == frames


def test_relay_tools_keep_agentmux_wording_for_a_few_unknown_fields(
    relay_tools: tuple[RawHost, FakeRelay],
) -> None:
    host, _ = relay_tools
    answer = host.rpc(
        "tools/call", {"name": "send", "arguments": {"message": "m", "zz": 1, "sender": "x"}}
    )
    assert answer["error"]["data"] == {
        "code": "validation_invalid_params",
        "message": "unknown parameter(s) for send request: sender, zz",
        "details": {"fields": ["sender", "zz"]},
    }
