"""Black-box: a center at the top of the generation range, through a real `mcphost supervise`.

What docs/supervisor.md ("Generations") promises: when the center has seen an agent's
generation 2^63 - 1 (the most `X-AC-MCP-Generation` can carry), no next generation exists; the
spawn is refused with the code `generation_exhausted` and the agent takes its normal failure
path (`failed`, with that reason, in `ctl status`), never left `starting`. The other agents run on.
"""

from __future__ import annotations

from tests.supervisor.supervise_harness import Supervised, standin
from tests.waiting import until

TOP = (1 << 63) - 1


def test_a_generation_at_the_top_of_the_range_fails_the_agent_with_a_code(
    supervised: Supervised,
) -> None:
    supervised.center.bind("w-1", "agent-top")
    seen = supervised.center.call("get_my_work", agent_id="agent-top", generation=TOP)
    assert seen.status == 200, seen.body
    supervised.write_fleet(
        [
            {"id": "agent-top", "command": standin("--hold")},
            {"id": "agent-ok", "command": standin("--hold")},
        ]
    )
    supervised.start()
    supervised.wait_running("agent-ok")
    row = until(
        lambda: (r := supervised.status()["agent-top"])["state"] == "failed" and r,
        60,
        "agent-top to fail",
    )
    assert "generation_exhausted" in row["last_reason"], row
    assert row["pid"] is None, row
    failed = [
        e
        for e in supervised.events()
        if e.get("event") == "supervisor.agent_spawn_failed" and e["agent_id"] == "agent-top"
    ]
    assert failed and failed[-1]["code"] == "generation_exhausted", failed
    assert not any("OverflowError" in line for line in supervised.stderr().splitlines())
    # the operator's restart takes the same path, and answers
    supervised.ctl("restart", "agent-top", check=False)
    assert supervised.status()["agent-top"]["state"] == "failed"
    assert supervised.status()["agent-ok"]["state"] == "running"
