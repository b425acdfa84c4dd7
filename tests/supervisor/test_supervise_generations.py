"""Black-box: generations never go backwards, across workers and state directories (issue #19).

One real reference center, three real `mcphost supervise` processes (three workers, three
tokens, three state directories) with `[center] fleet = "center"`. The center moves an agent
from worker to worker and back (its control route, as a center spreading a fleet would), and a
state directory is wiped between two runs of its supervisor. What must hold:

- every spawn's generation is above every generation the center has seen for the agent, so
  every call from the agent's current home succeeds (its first call, and calls run as the agent
  with `ctl exec`) — never `stale_generation`;
- two workers never run the agent at once for longer than one poll interval plus `stop_grace`,
  measured from the processes themselves: the new process's start time (/proc) to the moment
  the old one ended (a pidfd);
- with a center that offers no reservation route, a generation the center fences is shown in
  `ctl status` (`fenced`) and the agent is restarted above the center's generation.
"""

from __future__ import annotations

import os
import select
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import STANDIN, Supervised, standin
from tests.waiting import until

# deep (make test-slow): three workers moving one agent: generations.
pytestmark = pytest.mark.deep

AGENT = "agent-m"
POLL = 0.5
STOP_GRACE = 5  # the harness's [defaults] stop_grace
EXEC_CALLS = 2  # calls run as the agent (`ctl exec`) in each new home, besides its first call


@pytest.fixture
def center(tmp_path: Path) -> Iterator[DevCenter]:
    with DevCenter.start(tmp_path / "center") as running:
        for agent_id in ("agent-1", "agent-2", "agent-x"):  # only the agent under test runs
            running.request("DELETE", f"/_devcenter/agents/{agent_id}")
        yield running


@pytest.fixture
def workers(tmp_path: Path, center: DevCenter) -> Iterator[dict[str, Supervised]]:
    center.add_worker("w-3")
    out: dict[str, Supervised] = {}
    try:
        for worker in ("w-1", "w-2", "w-3"):
            base = tmp_path / worker
            base.mkdir()
            sv = Supervised(base, center)
            sv.token_file.write_text(center.worker_token(worker) + "\n")
            sv.write_fleet(
                [],
                center_keys={"fleet": "center", "poll_seconds": POLL},
                command=standin("--hold"),
            )
            out[worker] = sv.start()
        yield out
    finally:
        for sv in out.values():
            sv.close()
            shutil.rmtree(sv.state, ignore_errors=True)


# -- observing processes -------------------------------------------------------------------------


def boot_seconds_at_start(pid: int) -> float:
    """When `pid` started, in CLOCK_BOOTTIME seconds (/proc/<pid>/stat field 22)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rpartition(")")[2].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


class ExitWatch:
    """The CLOCK_BOOTTIME moment a process ended, seen through a pidfd by a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.ended: float | None = None
        self._fd = os.pidfd_open(pid)
        self._thread = threading.Thread(target=self._wait, daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        select.select([self._fd], [], [])
        self.ended = time.clock_gettime(time.CLOCK_BOOTTIME)
        os.close(self._fd)


# -- the agent's calls ---------------------------------------------------------------------------


def exec_call(sv: Supervised) -> int:
    """One MCP call as the agent, from its current home (`ctl exec` runs the stand-in there)."""
    config = str(sv.state / "agents" / AGENT / "mcp.json")
    return sv.ctl("exec", AGENT, "--", sys.executable, STANDIN, config, check=False).returncode


def center_calls(sv: Supervised) -> list[dict[str, Any]]:
    return [c for c in sv.calls(AGENT) if c.get("server") == "agent-center"]


def running_on(sv: Supervised, above: int) -> dict[str, Any]:
    """The agent's row once it runs on `sv` with a generation above `above`."""

    def row() -> dict[str, Any] | None:
        found = sv.status().get(AGENT)
        if found and found["state"] == "running" and found["pid"] and found["generation"] > above:
            return found
        return None

    return until(row, 60, f"{AGENT} running above generation {above}")


def center_generation(center: DevCenter, worker: str) -> int:
    reply = center.request(
        "GET",
        "/admin/worker/agents",
        headers={"Authorization": f"Bearer {center.worker_token(worker)}"},
    )
    return next(e["generation"] for e in reply.json()["agents"] if e["agent_id"] == AGENT)


def test_moves_between_three_workers_and_a_wiped_state_never_go_backwards(
    center: DevCenter, workers: dict[str, Supervised]
) -> None:
    # (worker to move the agent to, wipe that worker's state directory first?)
    moves = [
        ("w-2", False),
        ("w-1", False),
        ("w-3", False),
        ("w-1", True),  # back to a wiped (or restored, or new) state directory
        ("w-2", False),
        ("w-3", False),
        ("w-2", True),
        ("w-1", False),
        ("w-3", False),
    ]
    center.bind("w-1", AGENT)
    home = "w-1"
    row = running_on(workers[home], 0)
    generations = [row["generation"]]
    calls = failures = 0
    overlaps: list[float] = []
    seen: dict[str, int] = {}  # center-tool calls already counted, per worker's workspace

    def count_calls(worker: str, wanted: int) -> None:
        nonlocal calls, failures
        sv = workers[worker]
        fresh = until(
            lambda: (
                center_calls(sv)[seen.get(worker, 0) :]
                if len(center_calls(sv)) >= seen.get(worker, 0) + wanted
                else None
            ),
            60,
            f"{wanted} calls on {worker}",
        )
        seen[worker] = seen.get(worker, 0) + len(fresh)
        calls += len(fresh)
        bad = [c for c in fresh if not c["ok"]]
        failures += len(bad)
        assert not bad, bad  # never stale_generation (nor anything else) from the current home

    count_calls(home, 1)
    for target, wipe in moves:
        if wipe:
            sv = workers[target]
            assert AGENT not in sv.status()
            sv.terminate()
            shutil.rmtree(sv.state)
            seen.pop(target, None)
            sv.start()
        old_pid = row["pid"]
        watch = ExitWatch(old_pid)
        center.bind(target, AGENT)
        row = running_on(workers[target], generations[-1])
        started = boot_seconds_at_start(row["pid"])
        until(lambda watch=watch: watch.ended is not None, 60, f"the agent on {home} to end")
        assert watch.ended is not None
        overlaps.append(max(0.0, watch.ended - started))
        # nobody else runs it: the old home let it go, the third worker never took it
        for worker, sv in workers.items():
            if worker != target:
                until(lambda sv=sv: AGENT not in sv.status(), 60, f"{worker} to drop {AGENT}")
        generations.append(row["generation"])
        assert center_generation(center, target) == row["generation"]
        home = target
        count_calls(home, 1)  # its first call, as it started
        for _ in range(EXEC_CALLS):
            assert exec_call(workers[home]) == 0
        count_calls(home, EXEC_CALLS)
        assert workers[home].status()[AGENT]["fenced"] is None
    assert generations == sorted(set(generations)), generations  # strictly increasing
    assert max(overlaps) <= POLL + STOP_GRACE, overlaps
    assert failures == 0
    assert calls == (1 + len(moves) * (1 + EXEC_CALLS))
    # every spawn took its generation from the center's reservation
    for sv in workers.values():
        assert not [e for e in sv.events() if e.get("event") == "supervisor.generation_unreserved"]
    print(
        f"\nmoves={len(moves)} (2 wipes) calls={calls} failures={failures} "
        f"generations={generations} overlap_max={max(overlaps):.3f}s "
        f"overlap_mean={sum(overlaps) / len(overlaps):.3f}s bound={POLL + STOP_GRACE}s"
    )


def test_without_the_reservation_route_a_fenced_agent_is_shown_and_replaced(
    center: DevCenter, tmp_path: Path
) -> None:
    token = center.worker_token("w-2")
    center.bind("w-2", AGENT)
    center.set_faults(status={"worker_generation": [404, "not_found"]})  # an older center
    (tmp_path / "sv").mkdir()
    sv = Supervised(tmp_path / "sv", center)
    sv.token_file.write_text(token + "\n")
    # one poll at start: from then on only the agent's own calls can reveal a fence
    sv.write_fleet(
        [],
        center_keys={"fleet": "center", "poll_seconds": 3600},
        command=standin("--hold"),
    )
    try:
        sv.start()
        first = sv.wait_running(AGENT)
        until(lambda: center_calls(sv), 60, "the agent's first call")
        assert center_calls(sv)[0]["ok"], center_calls(sv)
        assert first["fenced"] is None
        assert any(e.get("event") == "supervisor.generation_unreserved" for e in sv.events())
        # another host takes the agent over with a much higher generation (the same worker
        # token: a restored state directory elsewhere, say)
        taken = center.call(
            "get_my_work", agent_id=AGENT, generation=first["generation"] + 50, token=token
        )
        assert taken.status == 200, taken.body
        newer = first["generation"] + 50
        # the agent's next call is fenced; the supervisor shows it and replaces the agent
        exec_call(sv)  # (its call fails: the exit status is the stand-in's or the fence's)
        replaced = sv.wait_running(AGENT, generation=newer + 1)
        assert replaced["pid"] != first["pid"]
        assert replaced["fenced"] == {
            "code": "stale_generation",
            "generation": first["generation"],
            "center_generation": newer,
            "at": replaced["fenced"]["at"],
            "action": "restarted",
        }
        fenced_events = [e for e in sv.events() if e.get("event") == "supervisor.agent_fenced"]
        assert [(e["generation"], e["center_generation"]) for e in fenced_events] == [
            (first["generation"], newer)
        ]
        # the fenced call was refused as such; the replacement's own first call succeeds
        fenced_calls = [c for c in center_calls(sv) if not c["ok"]]
        assert all("stale_generation" in str(c) for c in fenced_calls), fenced_calls

        def after_the_fence() -> list[dict[str, Any]]:
            # the calls the replacement made: those after the refused one (a fenced agent
            # numbers its own pid in its own namespace, so pids name no run)
            calls = center_calls(sv)
            refused = max(i for i, call in enumerate(calls) if not call["ok"])
            return calls[refused + 1 :]

        own = until(after_the_fence, 60, "the replacement's call")
        assert own[0]["ok"], own
    finally:
        sv.close()
        center.clear_faults()
        shutil.rmtree(sv.state, ignore_errors=True)
