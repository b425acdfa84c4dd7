"""Black-box: `[center] fleet = "center"`, a real `mcphost supervise` taking its agents from the
real reference center.

What the issue promises: the supervisor asks the center which agents are bound to its worker
(`GET /admin/worker/agents`, authenticated by the worker token) every `poll_seconds` and
reconciles exactly like a reload: an agent bound to the worker starts, an unbound one stops, the
rest are untouched; a center that cannot be reached at a poll changes nothing. The binding is
changed through the devcenter's control route (`POST` / `DELETE /_devcenter/agents`), as a
center assigning agents to workers would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import Supervised, descendants_alive, standin
from tests.waiting import until

# deep (make test-slow): the fleet from the center.
pytestmark = pytest.mark.deep

WORKER = "w-2"  # the devcenter binds agent-x to it; the tests bind and unbind more


@pytest.fixture
def supervised(tmp_path: Path, center: DevCenter) -> Iterator[Supervised]:
    sv = Supervised(tmp_path, center)
    sv.token_file.write_text(center.worker_token(WORKER) + "\n")
    try:
        yield sv
    finally:
        sv.close()


def bind(center: DevCenter, *agent_ids: str) -> None:
    reply = center.request(
        "POST", "/_devcenter/agents", {"worker_id": WORKER, "agent_ids": list(agent_ids)}
    )
    assert reply.status == 200, reply.body


def unbind(center: DevCenter, agent_id: str) -> None:
    reply = center.request("DELETE", f"/_devcenter/agents/{quote(agent_id, safe='')}")
    assert reply.status == 200, reply.body


def count(supervised: Supervised, event: str) -> int:
    return sum(1 for e in supervised.events() if e.get("event") == event)


def test_the_supervisor_follows_the_centers_binding(supervised: Supervised, center: DevCenter):
    supervised.write_fleet(
        [], center_keys={"fleet": "center", "poll_seconds": 0.1}, command=standin("--hold")
    )
    supervised.start()
    first = supervised.wait_running("agent-x")
    assert sorted(supervised.status()) == ["agent-x"]
    call = until(lambda: supervised.calls("agent-x"), 60, "agent-x's call")[0]
    assert call["ok"], call
    # bound to the worker: it starts at a poll, and reaches the center as itself
    bind(center, "agent-y")
    second = supervised.wait_running("agent-y")
    call = until(lambda: supervised.calls("agent-y"), 60, "agent-y's call")[0]
    assert call["ok"], call
    assert any(
        r["route"].endswith("/get_my_work") and r["body"]["agent_id"] == "agent-y"
        for r in center.requests(200)
    )
    row = supervised.status()["agent-x"]
    assert (row["pid"], row["generation"]) == (first["pid"], first["generation"])
    # unbound: it stops at a poll; the other is untouched
    unbind(center, "agent-x")
    until(lambda: "agent-x" not in supervised.status(), 60, "agent-x to leave the fleet")
    until(lambda: not descendants_alive([first["pid"]]), 60, "agent-x's process to end")
    row = supervised.status()["agent-y"]
    assert (row["pid"], row["generation"]) == (second["pid"], second["generation"])
    # the center is down at a poll: nothing changes
    before = count(supervised, "supervisor.center_fleet_failed")
    center.stop()
    try:
        until(
            lambda: count(supervised, "supervisor.center_fleet_failed") >= before + 2,
            60,
            "two polls to fail",
        )
        assert sorted(supervised.status()) == ["agent-y"]
        row = supervised.status()["agent-y"]
        assert (row["state"], row["pid"], row["generation"]) == (
            "running",
            second["pid"],
            second["generation"],
        )
    finally:
        center.restart()
    # back up: the next poll applies the binding again
    bind(center, "agent-z")
    supervised.wait_running("agent-z")
    row = supervised.status()["agent-y"]
    assert (row["pid"], row["generation"]) == (second["pid"], second["generation"])
    assert supervised.proc is not None and supervised.proc.poll() is None


def test_ctl_restart_racing_a_poll_that_unbinds_the_agent_leaves_none(
    supervised: Supervised, center: DevCenter
):
    """Issue #18: a `ctl restart` whose stop overlapped a poll removing the agent started it
    again from the discarded runner, unregistered and restarted for ever."""
    import sys
    import uuid

    from tests.supervisor.test_supervise_races import STUBBORN, marked, race

    marker = f"mcphost-poll-race-{uuid.uuid4().hex}"
    command = [sys.executable, "-c", STUBBORN, marker, "{agent_id}"]
    supervised.write_fleet(
        [], center_keys={"fleet": "center", "poll_seconds": 3600}, command=command
    )
    fleet = supervised.fleet.read_text()
    supervised.fleet.write_text(fleet.replace("stop_grace = 5", "stop_grace = 0.5"))
    bind(center, "race-a")
    try:
        supervised.start()
        for _ in range(3):
            failed = race(supervised, True, "race-a", lambda: unbind(center, "race-a"))
            assert [a for a in marked(marker).values() if a[-1] == "race-a"] == []
            assert "race-a" not in supervised.status()
            assert failed == []
            bind(center, "race-a")
            supervised.ctl("reload")
            assert len([a for a in marked(marker).values() if a[-1] == "race-a"]) == 1
    finally:  # whether or not it is bound still
        center.request("DELETE", "/_devcenter/agents/race-a")
