"""Black-box: restart policy, intensity, generations, reload by SIGHUP and `ctl logs --follow`,
through a real `mcphost supervise` process against the real reference center.

What the issue promises an operator about an agent's life: an agent that keeps crashing goes
`failed` after more than `max_restarts` restarts in `restart_window` and stays there until
`ctl restart`; `restart = "never"` and `"on-failure"` leave a clean exit alone; every spawn gets a
new generation (`ctl stop` + `ctl start` too), persisted across supervisor restarts, and the
center hears it; SIGHUP is `ctl reload`; `ctl logs --follow` shows what the agent writes next.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import Supervised, descendants_alive, standin
from tests.waiting import until

# deep (make test-slow): restarts, reloads and generations over time.
pytestmark = pytest.mark.deep

# An agent that fails (exit 1) until its workspace holds a file `ok`, then behaves.
FLAKY = (
    "import os, sys\n"
    "if not os.path.exists('ok'):\n"
    "    sys.exit(1)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)
# An agent that prints one line, waits for `go` in its workspace, prints another and holds.
CHATTY = (
    "import os, signal, sys, time\n"
    "print('line-before-follow', flush=True)\n"
    "while not os.path.exists('go'):\n"
    "    time.sleep(0.01)\n"
    "print('line-after-follow', flush=True)\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "while True:\n"
    "    signal.pause()\n"
)


def generations_heard(center: DevCenter, agent_id: str) -> set[str]:
    """The X-AC-MCP-Generation headers of `agent_id`'s get_my_work calls the center received."""
    out = set()
    for entry in center.requests(500):
        if entry["route"].endswith("/get_my_work") and entry["body"]["agent_id"] == agent_id:
            headers = {k.lower(): v for k, v in entry["headers"].items()}
            out.add(headers.get("x-ac-mcp-generation"))
    return out


def first_generation(center: DevCenter, agent_id: str) -> int:
    """The generation a fresh state directory's first spawn of `agent_id` gets: one above the
    highest the center has seen (the module's center outlives each test's supervisor)."""
    reply = center.request(
        "GET", "/admin/worker/agents", headers={"Authorization": f"Bearer {center.token}"}
    )
    return 1 + next(e["generation"] for e in reply.json()["agents"] if e["agent_id"] == agent_id)


def test_a_crashing_agent_fails_after_max_restarts_until_ctl_restart(
    supervised: Supervised, center: DevCenter
):
    supervised.write_fleet(
        [
            {
                "id": "agent-1",
                "command": [sys.executable, "-c", FLAKY, *standin("--hold")[1:]],
                "max_restarts": 2,
                "restart_window": 60,
                "restart_delay": 0.01,
                "restart_max_delay": 0.02,
            }
        ]
    )
    supervised.start()
    failed = until(
        lambda: (row := supervised.status()["agent-1"])["state"] == "failed" and row,
        60,
        "agent-1 to fail",
    )
    # the first spawn and max_restarts restarts, then the intensity limit: no fourth spawn
    assert (failed["generation"], failed["restarts"], failed["pid"]) == (3, 2, None)
    assert "more than 2 restarts within 60 s" in failed["last_reason"], failed
    assert failed["last_exit"] == "exit 1", failed
    failures = [e for e in supervised.events() if e.get("event") == "supervisor.agent_failed"]
    assert len(failures) == 1
    # it stays failed: `ctl start` is for stopped agents, `ctl restart` brings it back
    (supervised.workspace("agent-1") / "ok").write_text("ok")
    supervised.ctl("restart", "agent-1")
    row = supervised.wait_running("agent-1", generation=4)
    assert row["restarts"] == 2  # the count of automatic restarts is not reset by an operator
    until(lambda: supervised.calls("agent-1"), 60, "the restarted agent's call")
    assert "4" in generations_heard(center, "agent-1")


def test_never_and_on_failure_leave_a_clean_exit_stopped(supervised: Supervised, center: DevCenter):
    exit_0 = [sys.executable, "-c", "print('done')"]
    supervised.write_fleet(
        [
            {"id": "agent-1", "command": exit_0, "restart": "never"},
            {"id": "agent-2", "command": exit_0, "restart": "on-failure"},
        ]
    )
    first = {agent: first_generation(center, agent) for agent in ("agent-1", "agent-2")}
    supervised.start()
    for agent in ("agent-1", "agent-2"):
        # "stopped" is set when the supervision task ends: nothing can respawn it later
        row = until(
            lambda a=agent: (r := supervised.status()[a])["state"] == "stopped" and r,
            60,
            f"{agent} to stop",
        )
        assert (row["generation"], row["restarts"], row["pid"]) == (first[agent], 0, None), row
        assert row["last_exit"] == "exit 0", row
    assert not [e for e in supervised.events() if e.get("event") == "supervisor.agent_backoff"]


def test_never_leaves_a_crash_failed_without_a_restart(supervised: Supervised, center: DevCenter):
    supervised.write_fleet(
        [{"id": "agent-1", "command": [sys.executable, "-c", "exit(1)"], "restart": "never"}]
    )
    first = first_generation(center, "agent-1")
    supervised.start()
    row = until(
        lambda: (r := supervised.status()["agent-1"])["state"] == "failed" and r,
        60,
        "agent-1 to fail",
    )
    assert (row["generation"], row["restarts"]) == (first, 0), row
    assert "restart = never" in row["last_reason"], row


def test_ctl_stop_then_start_gives_a_new_generation(supervised: Supervised, center: DevCenter):
    supervised.write_fleet([{"id": "agent-1", "command": standin("--hold")}])
    supervised.start()
    first = supervised.wait_running("agent-1")
    until(lambda: supervised.calls("agent-1"), 60, "the first call")
    supervised.ctl("stop", "agent-1")
    row = supervised.status()["agent-1"]
    assert (row["state"], row["pid"]) == ("stopped", None), row
    assert row["sessions"] == 0, row
    until(lambda: not descendants_alive([first["pid"]]), 60, "the agent's process to end")
    # stopped by the operator: it stays stopped (no restart policy applies)
    assert supervised.status()["agent-1"]["generation"] == first["generation"]
    supervised.ctl("start", "agent-1")
    second = supervised.wait_running("agent-1", generation=first["generation"] + 1)
    assert second["pid"] != first["pid"]
    until(lambda: len(supervised.calls("agent-1")) >= 2, 60, "the second generation's call")
    heard = generations_heard(center, "agent-1")
    assert {str(first["generation"]), str(second["generation"])} <= heard


def test_generations_continue_across_supervisor_restarts(supervised: Supervised, center: DevCenter):
    supervised.write_fleet([{"id": "agent-1", "command": standin("--hold")}])
    supervised.start()
    first = supervised.wait_running("agent-1")
    until(lambda: supervised.calls("agent-1"), 60, "the first run's call")
    assert supervised.terminate() == 0
    until(lambda: not descendants_alive([first["pid"]]), 60, "the first run's agent to end")
    supervised.start()
    second = supervised.wait_running("agent-1")
    assert second["generation"] == first["generation"] + 1, (first, second)
    until(lambda: len(supervised.calls("agent-1")) >= 2, 60, "the second run's call")
    assert str(second["generation"]) in generations_heard(center, "agent-1")
    # the center fences the older generation: a call that claims it is refused
    stale = center.call("get_my_work", agent_id="agent-1", generation=first["generation"])
    assert stale.status != 200 and b"stale_generation" in stale.body, stale.body


def test_sighup_reloads_like_ctl_reload(supervised: Supervised):
    supervised.write_fleet(
        [
            {"id": "agent-1", "command": standin("--hold")},
            {"id": "agent-2", "command": standin("--hold")},
        ]
    )
    supervised.start()
    kept = supervised.wait_running("agent-1")
    gone = supervised.wait_running("agent-2")
    supervised.write_fleet(
        [
            {"id": "agent-1", "command": standin("--hold")},
            {"id": "agent-3", "command": standin("--hold")},
        ]
    )
    assert supervised.proc is not None
    supervised.proc.send_signal(signal.SIGHUP)
    supervised.wait_running("agent-3")
    until(lambda: "agent-2" not in supervised.status(), 60, "agent-2 to leave the fleet")
    row = supervised.status()["agent-1"]
    assert (row["pid"], row["generation"]) == (kept["pid"], kept["generation"])
    until(lambda: not descendants_alive([gone["pid"]]), 60, "agent-2 to stop")
    # a bad file by SIGHUP changes nothing either, and says why in the event log
    supervised.fleet.write_text(supervised.fleet.read_text() + '\n[[agent]]\nid = "a b"\n')
    before = supervised.status()
    supervised.proc.send_signal(signal.SIGHUP)
    failed = until(
        lambda: [e for e in supervised.events() if e.get("event") == "supervisor.reload_failed"],
        60,
        "the failed reload's event",
    )
    assert failed[0]["code"] == "reload_failed" and "a b" in failed[0]["message"], failed
    after = supervised.status()
    assert {a: (r["pid"], r["generation"]) for a, r in after.items()} == {
        a: (r["pid"], r["generation"]) for a, r in before.items()
    }
    assert supervised.proc.poll() is None


def test_ctl_logs_follow_shows_what_the_agent_writes_next(supervised: Supervised):
    supervised.write_fleet([{"id": "agent-1", "command": [sys.executable, "-c", CHATTY]}])
    supervised.start()
    supervised.wait_running("agent-1")
    follow = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mcphost",
            "ctl",
            "--state",
            str(supervised.state),
            "logs",
            "agent-1",
            "--follow",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=supervised.env(),
    )
    seen = bytearray()

    def read() -> None:
        assert follow.stdout is not None
        while chunk := follow.stdout.read1(65536):
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        until(lambda: b"line-before-follow" in seen, 60, "the tail of the log")
        assert b"line-after-follow" not in seen
        (supervised.workspace("agent-1") / "go").write_text("go")
        until(lambda: b"line-after-follow" in seen, 60, "the line written after --follow began")
        assert follow.poll() is None  # still following
    finally:
        follow.send_signal(signal.SIGINT)
        try:
            follow.wait(timeout=60)
        finally:
            if follow.poll() is None:
                follow.kill()
        reader.join(60)
    assert os.path.exists(supervised.workspace("agent-1") / "go")
