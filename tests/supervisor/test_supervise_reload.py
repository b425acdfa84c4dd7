"""Black-box: a reload does only what was asked, through a real `mcphost supervise`.

What docs/supervisor.md ("Reload") promises: a reload restarts only the agents whose running
behaviour changed (their command, environment, user, runner, fence, bundle, policy...); a
change of the restart policy's timings, `stop_grace` or the log limits applies in place to the
running agent; a finished one-shot (`restart = "never"`, exited 0) is not run again by a reload
that does not change it; `ctl reload --dry-run` says what a reload would stop, start and
restart, and what it would do with each changed key, and changes nothing (the keys of
`[center]`, `[page]` and `[metrics]`: test_supervise_reload_keys.py).
"""

from __future__ import annotations

import json
from typing import Any

from tests.supervisor.supervise_harness import Supervised, standin
from tests.waiting import until


def _reconciled(supervised: Supervised) -> list[dict[str, Any]]:
    return [e for e in supervised.events() if e.get("event") == "supervisor.reconciled"]


def test_a_policy_change_in_defaults_restarts_nothing(supervised: Supervised) -> None:
    agents = [{"id": f"agent-{n}", "command": standin("--hold")} for n in (1, 2)]
    supervised.write_fleet(agents)
    supervised.start()
    before = {a["id"]: supervised.wait_running(a["id"]) for a in agents}
    supervised.write_fleet(
        agents, restart_delay=0.07, max_restarts=9, restart_window=30, stop_grace=4, log_keep=2
    )
    done = supervised.ctl("reload")
    assert "0 changed; 2 updated (agent-1, agent-2)" in done.stdout, done.stdout
    rows = supervised.status()
    for agent_id, row in before.items():
        assert (rows[agent_id]["pid"], rows[agent_id]["generation"]) == (
            row["pid"],
            row["generation"],
        ), rows
    (last,) = _reconciled(supervised)[-1:]
    assert last["changed"] == [] and sorted(last["updated"]) == ["agent-1", "agent-2"], last
    # the new policy is the running one: agent-1 now gives up after 9 quick restarts, not 5
    supervised.write_fleet(
        [{"id": "agent-1", "command": ["false"]}, agents[1]],
        restart_delay=0.01,
        restart_max_delay=0.01,
        max_restarts=9,
    )
    supervised.ctl("reload")
    failed = until(
        lambda: (row := supervised.status()["agent-1"])["state"] == "failed" and row,
        60,
        "agent-1 to fail",
    )
    assert failed["restarts"] == 9 and "more than 9 restarts" in failed["last_reason"], failed
    assert supervised.status()["agent-2"]["pid"] == before["agent-2"]["pid"]


def test_a_command_change_still_restarts_that_agent_only(supervised: Supervised) -> None:
    agents = [{"id": f"agent-{n}", "command": standin("--hold")} for n in (1, 2)]
    supervised.write_fleet(agents)
    supervised.start()
    first = supervised.wait_running("agent-1")
    other = supervised.wait_running("agent-2")
    supervised.write_fleet([{**agents[0], "env": {"X": "1"}}, agents[1]])
    supervised.ctl("reload")
    supervised.wait_running("agent-1", first["generation"] + 1)
    assert supervised.status()["agent-2"]["pid"] == other["pid"]


def test_a_finished_one_shot_is_not_run_again_by_a_reload(supervised: Supervised) -> None:
    shot = {"id": "shot", "command": standin(), "restart": "never"}
    supervised.write_fleet([shot])
    supervised.start()
    until(lambda: supervised.status()["shot"]["state"] == "stopped", 60, "the one-shot to end")
    ran = len(supervised.calls("shot"))
    generation = supervised.status()["shot"]["generation"]
    supervised.ctl("reload")  # unchanged
    supervised.write_fleet([shot], restart_delay=0.1)  # a policy timing only
    supervised.ctl("reload")
    supervised.write_fleet([shot, {"id": "other", "command": standin("--hold")}])
    supervised.ctl("reload")
    supervised.wait_running("other")
    row = supervised.status()["shot"]
    assert (row["state"], row["generation"]) == ("stopped", generation), row
    assert len(supervised.calls("shot")) == ran
    spawned = [
        e
        for e in supervised.events()
        if e.get("event") == "supervisor.agent_spawned" and e["agent_id"] == "shot"
    ]
    assert len(spawned) == 1, spawned


def test_reload_dry_run_says_what_would_change_and_changes_nothing(
    supervised: Supervised,
) -> None:
    agents = [{"id": f"agent-{n}", "command": standin("--hold")} for n in (1, 2, 3)]
    supervised.write_fleet(agents)
    supervised.start()
    rows = {a["id"]: supervised.wait_running(a["id"]) for a in agents}
    supervised.write_fleet(
        [
            {**agents[0], "env": {"X": "1"}},  # restarted
            {**agents[1], "stop_grace": 3},  # updated in place
            {"id": "agent-4", "command": standin("--hold")},  # started
        ]  # agent-3: stopped
    )
    done = supervised.ctl("reload", "--dry-run")
    assert done.stdout.splitlines() == [
        "would stop: agent-3",
        "would start: agent-4",
        "would restart: agent-1",
        "would update in place: agent-2",
        "[[agent]] env: would restart agent-1",
        "[[agent]] stop_grace: would apply in place (agent-2)",
    ], done.stdout
    plan = json.loads(supervised.ctl("reload", "--dry-run", "--json").stdout)
    assert plan == {
        "dry_run": True,
        "removed": ["agent-3"],
        "added": ["agent-4"],
        "changed": ["agent-1"],
        "updated": ["agent-2"],
        "unchanged": [],
        "keys": [
            {"key": "[[agent]] env", "reload": "restarts_agent", "agents": ["agent-1"]},
            {"key": "[[agent]] stop_grace", "reload": "live", "agents": ["agent-2"]},
        ],
    }, plan
    now = supervised.status()
    assert sorted(now) == ["agent-1", "agent-2", "agent-3"], now
    assert all(now[a]["pid"] == rows[a]["pid"] for a in now), now
