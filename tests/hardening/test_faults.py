"""Faults: a center killed mid-call and restarted, a slow center, a center answering errors.

The host must classify each failure with a stable code, keep serving, and recover by itself
when the center comes back: no host restart, no stale pooled connection poisoning a later call.
The tests wait for conditions and compare orders, never wall time; `make bench`
(bench/lifecycle.py) reports how fast a dead center is noticed.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from mcphost.testing import DevCenter
from tests.hardening.conftest import RawHost, host_env
from tests.waiting import arrived, count, until

# deep (make test-slow): center faults: kills, error statuses, slowness.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(180)]

FIGURES = {"faults_injected": 0, "calls": 0}


@pytest.fixture(scope="module")
def unix_host(center: DevCenter) -> Iterator[RawHost]:
    """One host on the Unix socket for the tests that inject a fault and read their own calls'
    answers: the unix kill and restart, every error status and the fault burst. Each test sets
    its faults on the center and clears them; a fresh host would prove nothing more, and the
    calls after the kill and restart also show no stale pooled connection poisons later calls.
    It must exit 0 on stdin EOF once all of them are done."""
    with RawHost(host_env(center.binding_env("unix"))) as host:
        host.initialize()
        yield host
        assert host.close() == 0


@pytest.fixture(params=["unix", "tcp"])
def transport_host(
    request: pytest.FixtureRequest, center: DevCenter, unix_host: RawHost
) -> Iterator[tuple[str, RawHost]]:
    """(transport, host): the shared Unix host, or a fresh one on TCP (its own binding) that
    must exit 0 on stdin EOF."""
    if request.param == "unix":
        yield "unix", unix_host
        return
    with RawHost(host_env(center.binding_env(request.param))) as host:
        host.initialize()
        yield request.param, host
        assert host.close() == 0


def test_center_killed_mid_call_then_restarted(
    center: DevCenter, transport_host: tuple[str, RawHost]
) -> None:
    transport, host = transport_host
    ok, _ = host.call("get_my_work", {})
    assert not ok
    center.set_faults(delay_ms={"get_my_work": 60_000})
    before = count(center, "/admin/agent-tools/get_my_work")
    pending = host.request("tools/call", {"name": "get_my_work", "arguments": {}})
    until(arrived(center, "/admin/agent-tools/get_my_work", before), what="call at center")
    assert center.pid is not None
    os.kill(center.pid, signal.SIGKILL)  # no graceful close: the socket just dies
    FIGURES["faults_injected"] += 1
    # the dead socket is noticed: `admin_unavailable`, not the call timeout's `admin_timeout`
    answer = host.wait(pending, timeout=30)
    result = answer["result"]
    assert result["isError"] and '"admin_unavailable"' in result["content"][0]["text"]
    # while it is down: classified, fast
    is_error, down = host.call("get_my_work", {}, timeout=10)
    assert is_error and down["error"] == "admin_unavailable", down
    center.restart()  # same socket path / port / certificate / state; faults cleared
    # the same host recovers: a read and a (non-retried) write both succeed first time
    is_error, work = host.call("get_my_work", {})
    assert not is_error, work
    is_error, created = host.call(
        "create_task", {"project_id": "p-1", "title": f"after restart {transport}"}
    )
    assert not is_error, created
    FIGURES["calls"] += 5


def test_slow_center_times_out_one_call_while_others_complete(center: DevCenter) -> None:
    env = host_env(center.binding_env("unix"), MCPHOST_CALL_TIMEOUT_SECONDS="3")
    with center.faults(delay_ms={"get_task": 6000}), RawHost(env) as host:
        host.initialize()
        FIGURES["faults_injected"] += 1
        started = time.monotonic()
        slow = host.request("tools/call", {"name": "get_task", "arguments": {"task_id": "t-1"}})
        fast = [
            host.request("tools/call", {"name": "get_my_work", "arguments": {}}) for _ in range(30)
        ]
        for request_id in fast:
            answer = host.wait(request_id, timeout=30)
            assert not answer["result"]["isError"], answer
        answer = host.wait(slow, timeout=30)
        slow_done = time.monotonic() - started
        text = answer["result"]["content"][0]["text"]
        # the host's own timeout (3 s), not the center's answer (6 s) and not a hang
        assert answer["result"]["isError"] and '"admin_timeout"' in text, text
        assert slow_done >= 3, slow_done  # a lower bound: it holds however busy the machine
        # the slow call held up nothing: all 30 others were answered before it (stdout order)
        order = [m.get("id") for m in host.messages]
        assert all(order.index(request_id) < order.index(slow) for request_id in fast), order
        host.alive()
        FIGURES["calls"] += 31
        assert host.close() == 0


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 429, 500, 502, 503])
def test_center_error_statuses_are_classified_with_their_code(
    center: DevCenter, unix_host: RawHost, status: int
) -> None:
    host = unix_host
    with center.faults(status={"get_my_work": (status, f"injected_{status}")}):
        is_error, failed = host.call("get_my_work", {})
        FIGURES["faults_injected"] += 1
        FIGURES["calls"] += 1
        assert is_error and failed["status"] == status, failed
        assert failed["error"] == f"injected_{status}" and failed["message"]
        host.alive()


def test_fault_figures(center: DevCenter, unix_host: RawHost) -> None:
    """Parallel fault burst on one host; also prints the module's figures (`pytest -s`)."""
    host = unix_host
    with center.faults(status={"get_task": (500, "boom")}, delay_ms={"heartbeat": 200}):

        def one(i: int) -> str:
            tool = ("get_task", "heartbeat", "get_my_work")[i % 3]
            args = {} if tool == "get_my_work" else {"task_id": f"t-{i}"}
            is_error, result = host.call(tool, args)
            return result.get("error", "ok") if is_error else "ok"

        with ThreadPoolExecutor(16) as pool:
            outcomes = list(pool.map(one, range(150)))
        FIGURES["faults_injected"] += outcomes.count("boom")
        FIGURES["calls"] += len(outcomes)
        assert outcomes.count("boom") == 50
    print(f"\nfault figures: {FIGURES}")
