"""Bad protocol input: hypothesis fuzzes the real host's stdin over one long-lived process.

Every input is followed by a `ping`. The host must answer the ping (no hang, nothing lost after
the bad line), answer every well-formed request that carries a valid id, keep stdout strictly
JSON-RPC (RFC 8259 JSON: no NaN), stay alive, and print no traceback (no silent crash of a task
or a callback). A host that exits instead would have to exit 0; none is expected to.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcphost.catalog import CATALOG
from mcphost.testing import DevCenter
from tests.hardening.conftest import RawHost, host_env
from tests.thorough import depth

# deep (make test-slow): hypothesis over malformed protocol input.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(300)]

FIGURES: dict[str, int] = {"inputs": 0, "answered_requests": 0, "hosts": 0}
CRASH_MARKERS = (b"Traceback", b"never retrieved", b"Exception in callback", b"Fatal error")
TOOL_NAMES = [d.name for d in CATALOG]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(
        [
            "\ud800",
            "agent\u200bid",
            "\uff41\uff47\uff45\uff4e\uff54\uff3f\uff49\uff44",
            "\x00",
            "\u2028",
        ]
    )
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# Fuzz ids stay below the driver's own ping ids (1_000_000+), so answers never collide.
ids = (
    st.integers(min_value=-(2**63), max_value=999_999)
    | st.text(max_size=10).map(lambda s: f"fz-{s}")
    | st.none()
    | st.booleans()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
)
methods = (
    st.sampled_from(
        [
            "initialize",
            "ping",
            "tools/list",
            "tools/call",
            "notifications/cancelled",
            "notifications/initialized",
            "resources/list",
            "",
            "tools/call ",
            "TOOLS/CALL",
        ]
    )
    | st.text(max_size=16)
    | json_values
)
call_params = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(TOOL_NAMES) | st.text(max_size=12) | json_values,
        "arguments": st.dictionaries(
            st.sampled_from(["task_id", "query", "names", "agent_id", "path", "title"])
            | st.text(max_size=8),
            json_values,
            max_size=4,
        )
        | json_values,
        "_meta": st.dictionaries(st.just("progressToken"), json_values) | json_values,
    },
)
messages = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.just("2.0") | json_values,
        "id": ids,
        "method": methods,
        "params": call_params | json_values,
        "result": json_values,
        "error": json_values,
    },
)

# Well-formed envelopes with wrongly typed or odd params: these are owed an answer.
requests = st.fixed_dictionaries(
    {
        "jsonrpc": st.just("2.0"),
        "id": st.integers(min_value=0, max_value=999_999)
        | st.text(max_size=10).map("fz-{}".format),
        "method": st.sampled_from(["tools/call", "tools/list", "initialize", "ping", "nope/x"]),
    },
    optional={"params": call_params | json_values},
)


@pytest.fixture(scope="module", autouse=True)
def report_figures() -> Iterator[None]:
    """Prints the figures for the closing report (`pytest -s`)."""
    yield
    print(f"\nprotocol fuzz figures: {FIGURES}")


def encode(message: dict[str, Any]) -> bytes:
    # allow_nan: Python's json module also *reads* NaN/Infinity, so the host must cope with them
    return json.dumps(message, allow_nan=True).encode()


def expects_answer(message: Any) -> Any:
    """The id a well-formed request must be answered under, or None if no answer is owed."""
    if not isinstance(message, dict) or "id" not in message:
        return None
    request_id = message["id"]
    if isinstance(request_id, bool) or not isinstance(request_id, (int, str)):
        return None
    if not isinstance(message.get("method"), str):
        return None
    return request_id


def check_raw_line(host: RawHost, line: bytes) -> None:
    """`check_input` for bytes that may or may not parse: the answer owed follows from them."""
    try:
        parsed = json.loads(line)
    except (ValueError, RecursionError):
        parsed = None
    check_input(host, line, expects_answer(parsed))


def check_input(host: RawHost, line: bytes, owed: Any) -> None:
    """Send one fuzz line, then prove the host is alive, pure and answered what it owed."""
    FIGURES["inputs"] += 1
    mark = len(host.stderr)
    if owed is not None:  # an earlier input's unowed answer under the same id is not this one
        host.by_id.pop(owed, None)
    host.write(line if line.endswith(b"\n") else line + b"\n")
    host.alive(timeout=15)
    if owed is not None:
        answer = host.wait(owed, timeout=15)
        assert "result" in answer or "error" in answer
        FIGURES["answered_requests"] += 1
    assert host.proc.poll() is None, "the host exited on bad input"
    assert not host.bad_lines, f"non-JSON-RPC on stdout: {host.bad_lines[:3]!r}"
    new_err = bytes(host.stderr[mark:])
    for marker in CRASH_MARKERS:
        assert marker not in new_err, new_err.decode(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def host(center: DevCenter) -> Iterator[RawHost]:
    """One host for every test here: each input is checked on its own (its ping, its answer, its
    slice of stderr), so a fresh process per test would prove nothing more, while bad input from
    one test that left the host wedged or noisy shows in the next. It must exit 0 on stdin EOF
    once all of them are done, with no crash marker anywhere on its stderr."""
    with RawHost(host_env(center.binding_env("unix"))) as running:
        running.initialize()
        FIGURES["hosts"] += 1
        yield running
        assert running.close() == 0
        for marker in CRASH_MARKERS:
            assert marker not in running.stderr, running.stderr.decode(errors="replace")[-3000:]


FUZZ = settings(
    max_examples=depth(full=200, quick=50),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
)


@pytest.mark.thorough
def test_structured_messages_with_wrong_types(host: RawHost) -> None:
    @FUZZ
    @given(messages | requests)
    def run(message: dict[str, Any]) -> None:
        owed = expects_answer(message)
        if isinstance(owed, float) and math.isnan(owed):
            owed = None
        check_input(host, encode(message), owed)

    run()


@pytest.mark.thorough
def test_truncated_and_corrupted_lines(host: RawHost) -> None:
    @FUZZ
    @given(messages | requests, st.floats(min_value=0, max_value=1), st.binary(max_size=8))
    def run(message: dict[str, Any], cut: float, junk: bytes) -> None:
        full = encode(message)
        line = full[: int(len(full) * cut)] + junk
        line = line.replace(b"\n", b" ")
        check_raw_line(host, line)

    run()


@pytest.mark.thorough
def test_raw_bytes_and_odd_framing(host: RawHost) -> None:
    @FUZZ
    @given(
        st.binary(max_size=64)
        | st.sampled_from(
            [
                b"\xff\xfe{}",
                b"\x00" * 10,
                b'{"jsonrpc":"2.0","id":1,"method":"ping"}\r',
                b"[]",
                b"[" * 100_000 + b"]" * 100_000,
                b'{"a":' * 50_000,
                b"1" * 5000,
                b'{"jsonrpc":"2.0","id":' + b"9" * 4000 + b',"method":"ping"}',
                b'{"jsonrpc":"2.0","id":2,"id":3,"method":"ping"}',
                b'{"jsonrpc":"2.0","id":NaN}',
                b'{"jsonrpc":"2.0","id":Infinity,"method":"ping"}',
                b'\xef\xbb\xbf{"jsonrpc":"2.0","id":4,"method":"ping"}',
                '{"jsonrpc":"2.0","id":5,"method":"ping"}'.encode("utf-16"),
            ]
        )
    )
    def run(raw: bytes) -> None:
        for line in raw.split(b"\n"):
            check_raw_line(host, line)

    run()


def test_the_line_cap_discards_one_huge_line_and_keeps_serving(host: RawHost) -> None:
    """A line over the 64 MiB cap is discarded with an error (under its own id, see
    test_stdio_wire.py); the next request is served."""
    # an id of the driver's own (the fuzz tests may have left answers to small ids unclaimed)
    big_id = host.next_id()
    big = b'{"jsonrpc":"2.0","id":%d,"method":"ping","params":{"pad":"' % big_id
    host.write(big + b"x" * (65 << 20) + b'"}}\n')
    host.alive(timeout=30)
    assert "exceeds" in host.wait(big_id, timeout=1)["error"]["message"]
    # a huge but legal line (10 MB argument) is read and refused by validation, not by framing
    is_error, refused = host.call("post_task_message", {"task_id": "t", "content": "y" * 10**7})
    assert is_error and refused["error"] == "invalid_arguments"
    FIGURES["inputs"] += 2
    assert not host.bad_lines


@pytest.mark.thorough
def test_odd_cancellations_while_a_call_is_in_flight(center: DevCenter, host: RawHost) -> None:
    """Cancel notifications with every kind of requestId while a real call waits on the center."""
    with center.faults(delay_ms={"get_my_work": 1500}):
        slow = host.request("tools/call", {"name": "get_my_work", "arguments": {}})

        @settings(
            max_examples=depth(full=60, quick=20),
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(json_values)
        def run(request_id: Any) -> None:
            note = {"jsonrpc": "2.0", "method": "notifications/cancelled"}
            line = encode({**note, "params": {"requestId": request_id, "reason": "fuzz"}})
            check_input(host, line, None)

        run()
        answer = host.wait(slow, timeout=15)  # untouched by the odd cancels
        assert "result" in answer
