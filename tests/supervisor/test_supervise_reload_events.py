"""Black-box: what a real `mcphost supervise` writes to its event log about reloads.

What docs/supervisor.md promises: a reload that applies nothing is an error event
(`supervisor.reload_failed`, with its trigger and the problems) whether it came from SIGHUP or
from `ctl reload`; a `fleet = "center"` poll that changes nothing logs its
`supervisor.reconciled` at debug, so the log at info is not one line per poll.
"""

from __future__ import annotations

import json
from typing import Any

from tests.supervisor.supervise_harness import Supervised, standin
from tests.waiting import until


def named(supervised: Supervised, event: str) -> list[dict[str, Any]]:
    return [e for e in supervised.events() if e.get("event") == event]


def test_a_failed_ctl_reload_is_in_the_event_log(supervised: Supervised) -> None:
    supervised.write_fleet([{"id": "agent-1", "command": standin("--hold")}])
    supervised.start()
    supervised.wait_running("agent-1")
    supervised.fleet.write_text(supervised.fleet.read_text() + '\n[[agent]]\nid = "a b"\n')
    done = supervised.ctl("reload", check=False)
    assert done.returncode == 1 and "reload_failed" in done.stderr, done.stderr
    (failed,) = until(
        lambda: named(supervised, "supervisor.reload_failed"), 60, "the failed reload's event"
    )
    assert (failed["level"], failed["trigger"], failed["code"]) == ("error", "ctl", "reload_failed")
    assert "agent[1].id" in failed["message"], failed
    assert [p["variable"] for p in failed["details"]["problems"]] == [
        f"{supervised.fleet}: agent[1].id"
    ], failed


def test_a_ctl_reload_names_every_problem_of_the_file(supervised: Supervised) -> None:
    """Three problems, three lines (as `supervise --check` prints them), not only the first."""
    supervised.write_fleet([{"id": "agent-1", "command": standin("--hold")}])
    supervised.start()
    supervised.wait_running("agent-1")
    command = json.dumps(standin("--hold"))
    bad = (("sandbox", '"maybe"'), ("restart", '"sometimes"'), ("bundle", '"no bundle"'))
    supervised.fleet.write_text(
        supervised.fleet.read_text()
        + "".join(
            f'\n[[agent]]\nid = "agent-{n}"\ncommand = {command}\n{key} = {value}\n'
            for n, (key, value) in enumerate(bad, 2)
        )
    )
    done = supervised.ctl("reload", check=False)
    assert done.returncode == 1 and "3 problems" in done.stderr, done.stderr
    for key in ("agent[1].sandbox", "agent[2].restart", "agent[3].bundle"):
        assert key in done.stderr, done.stderr


def test_a_center_poll_that_changes_nothing_logs_at_debug(supervised: Supervised) -> None:
    supervised.token_file.write_text(supervised.center.worker_token("w-2") + "\n")
    supervised.write_fleet(
        [], center_keys={"fleet": "center", "poll_seconds": 0.05}, command=standin("--hold")
    )
    supervised.start()
    supervised.wait_running("agent-x")  # the devcenter binds agent-x to w-2
    seen = until(
        lambda: (found := named(supervised, "supervisor.reconciled"))[5:] and found,
        60,
        "several polls",
    )
    quiet = [e for e in seen if not (e["added"] or e["removed"] or e["changed"])]
    busy = [e for e in seen if e["added"] or e["removed"] or e["changed"]]
    assert [e["added"] for e in busy] == [["agent-x"]] and busy[0]["level"] == "info", busy
    # the first reconcile (the file's empty fleet, at start) is not a poll; the polls after
    # agent-x started change nothing
    assert quiet[0]["level"] == "info" and quiet[0]["unchanged"] == 0, seen
    assert {e["level"] for e in quiet[1:]} == {"debug"} and len(quiet) >= 4, seen
