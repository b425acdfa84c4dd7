"""Black-box: the restart policy of a real `mcphost supervise` for an agent that ends cleanly.

What docs/supervisor.md ("Restart policy") promises: a `restart = "always"` agent that exits 0
is restarted (with the backoff) however often it does, never marked `failed`: the intensity
limit (`max_restarts` within `restart_window`) counts failures, and a clean exit is not one.
"""

from __future__ import annotations

from tests.supervisor.supervise_harness import Supervised, standin
from tests.waiting import until


def test_an_always_agent_that_exits_0_is_restarted_not_failed(supervised: Supervised) -> None:
    supervised.write_fleet(
        [{"id": "agent-1", "command": standin(), "restart": "always"}],
        max_restarts=2,
        restart_delay=0.01,
        restart_max_delay=0.05,
    )
    supervised.start()
    states = []

    def restarted() -> bool:
        row = supervised.status()["agent-1"]
        states.append(row["state"])
        return row["restarts"] >= 6 or row["state"] == "failed"

    until(restarted, 60, "agent-1 to be restarted more than max_restarts times")
    assert "failed" not in states, states
    failed = [e for e in supervised.events() if e.get("event") == "supervisor.agent_failed"]
    assert failed == [], failed
    assert len(supervised.calls("agent-1")) >= 6
