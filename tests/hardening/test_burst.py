"""Bursts: thousands of concurrent calls on a healthy center all complete; giving up is truthful.

End to end, 4,000 `tools/call` requests are written back to back to the real host (pinned TLS to
the real devcenter, which holds each `get_my_work` for 100 ms so exchanges overlap for longer
than the connect timeout) and every one must succeed. The pooled client is then driven in
process (real sockets, real devcenter) with 3,000 concurrent calls, more than the host's stdio
lanes would let through: waiting for one of the client's request slots is queueing, not a
connect timeout. Those are the counts of `make test-slow`; `make test` sends a fifth of the
calls and holds each one five times longer, so the queue is as long in time (the last calls
still wait well past the 5 s connect timeout) for a fifth of the CPU. A call that gives up in the queue (a scripted center on a real Unix socket that
holds its answers) fails `admin_timeout` phase `queue`, says nothing was sent, reports the
queue's own timeout, and indeed reached nothing; waiting calls are served in FIFO order.
No test bounds wall-clock time.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcphost.errors import ToolFailure
from mcphost.testing import DevCenter
from tests.hardening.conftest import RawHost, host_env
from tests.hardening.scripted_center import Answer, Request, ScriptedServer
from tests.thorough import FULL

# deep (make test-slow): thousands of concurrent calls held by the center.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(900)]

# (calls, ms the center holds each): the same total hold time at either depth
BURST, HOLD_MS = (4000, 100) if FULL else (800, 500)
CLIENT_BURST, CLIENT_HOLD_MS = (3000, 200) if FULL else (600, 1000)


def send_burst(host: RawHost, count: int) -> list[int]:
    call = {"name": "get_my_work", "arguments": {}}
    return [host.request("tools/call", call) for _ in range(count)]


@pytest.mark.thorough
def test_a_burst_on_a_healthy_center_completes(center: DevCenter) -> None:
    env = host_env(center.binding_env("tcp"), MCPHOST_CALL_TIMEOUT_SECONDS="600")
    with RawHost(env) as host, center.faults(delay_ms={"get_my_work": HOLD_MS}):
        host.initialize()
        ids = send_burst(host, BURST)
        outcomes: Counter[str] = Counter()
        for request_id in ids:
            result = host.wait(request_id, timeout=600)["result"]
            if result["isError"]:
                outcomes[result["content"][0]["text"][:200]] += 1
            else:
                outcomes["ok"] += 1
        assert outcomes["ok"] == BURST, outcomes.most_common(3)
        assert not host.bad_lines
        assert host.close() == 0


@pytest.mark.thorough
def test_the_client_queues_a_burst_instead_of_timing_out_on_connect(center: DevCenter) -> None:
    """The pooled client itself, in process, against the real devcenter over pinned TLS."""
    from mcphost.admin.client import AdminClient, AdminRequest
    from mcphost.admin.pinning import parse_pins
    from mcphost.admin.target import parse_target

    async def burst() -> Counter[str]:
        client = AdminClient(
            parse_target(center.admin_url("tcp")),
            token=center.token,
            pins=parse_pins(center.fingerprint),
            call_timeout=600,
        )
        body = {"agent_id": center.agent_id}

        async def one() -> str:
            try:
                request = AdminRequest("POST", "/admin/agent-tools/get_my_work", body)
                await client.call(request, retry_safe=True)
            except ToolFailure as failure:
                return f"{failure.code}:{failure.details.get('phase')}"
            return "ok"

        try:
            return Counter(await asyncio.gather(*(one() for _ in range(CLIENT_BURST))))
        finally:
            await client.aclose()

    # 64 exchanges at a time, CLIENT_HOLD_MS each: the last calls wait over 9 s for a slot,
    # far longer than the 5 s connect timeout
    assert CLIENT_BURST * CLIENT_HOLD_MS / 64 > 9_000
    with center.faults(delay_ms={"get_my_work": CLIENT_HOLD_MS}):
        outcomes = asyncio.run(burst())
    assert outcomes == {"ok": CLIENT_BURST}, outcomes


@pytest.fixture
def silent_center() -> Iterator[tuple[ScriptedServer, threading.Event]]:
    release = threading.Event()

    def hold(request: Request) -> Answer:
        release.wait(120)
        return Answer(200, b'{"tasks": []}')

    short = Path(tempfile.mkdtemp(prefix="mcph-bq-"))
    server = ScriptedServer(hold, unix_path=str(short / "admin.sock"))
    try:
        yield server, release
    finally:
        release.set()
        server.close()
        shutil.rmtree(short, ignore_errors=True)


def test_calls_that_give_up_in_the_queue_say_nothing_was_sent(
    silent_center: tuple[ScriptedServer, threading.Event],
) -> None:
    """4 slots held by a center that has not answered yet; 8 more calls give up in the queue."""
    from mcphost.admin.client import AdminClient, AdminRequest
    from mcphost.admin.target import AdminTarget

    server, release = silent_center
    assert server.unix_path is not None

    async def scenario() -> list[str | dict]:
        client = AdminClient(
            AdminTarget(kind="unix", path=server.unix_path),
            pool_size=4,
            call_timeout=120,
            queue_timeout=0.5,
        )

        async def one(n: int) -> str | dict:
            try:
                await client.call(
                    AdminRequest("POST", f"/admin/agent-tools/get_task?n={n}", {"n": n})
                )
            except ToolFailure as failure:
                return failure.payload()
            return "ok"

        try:
            tasks = [asyncio.ensure_future(one(n)) for n in range(12)]
            while sum(task.done() for task in tasks) < 8:  # the queued ones give up
                await asyncio.wait(
                    [t for t in tasks if not t.done()], return_when="FIRST_COMPLETED"
                )
            assert len(server.requests) == 4
            release.set()  # now the center answers the four it received
            return list(await asyncio.gather(*tasks))
        finally:
            await client.aclose()

    results = asyncio.run(scenario())
    assert results[:4] == ["ok"] * 4, results[:4]
    for failure in results[4:]:
        assert isinstance(failure, dict) and failure["error"] == "admin_timeout", failure
        assert failure["details"]["phase"] == "queue", failure
        assert failure["details"]["timeout_seconds"] == 0.5
        assert failure["details"]["in_flight"] == 4
        assert "nothing was sent" in failure["message"]
    assert sorted(r.path for r in server.requests) == sorted(
        f"/admin/agent-tools/get_task?n={n}" for n in range(4)
    )


def test_waiting_calls_are_served_first_come_first_served() -> None:
    from mcphost.admin.client import AdminClient, AdminRequest
    from mcphost.admin.target import AdminTarget

    short = Path(tempfile.mkdtemp(prefix="mcph-bf-"))
    server = ScriptedServer(lambda request: Answer(), unix_path=str(short / "admin.sock"))

    async def scenario() -> None:
        client = AdminClient(AdminTarget(kind="unix", path=str(short / "admin.sock")), pool_size=1)
        try:
            await asyncio.gather(
                *(client.call(AdminRequest("POST", f"/x/{n}", {})) for n in range(40))
            )
        finally:
            await client.aclose()

    try:
        asyncio.run(scenario())
        assert [r.path for r in server.requests] == [f"/x/{n}" for n in range(40)]
    finally:
        server.close()
        shutil.rmtree(short, ignore_errors=True)
