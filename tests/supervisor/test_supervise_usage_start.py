"""Black-box: an agent's usage as a status shows it while the agent starts, through a real
`mcphost supervise` polled as `make demo-fleet` polls it.

Found by the fleet demo (issue 34): every running agent's row read 0B and 0 processes. The
first status after a spawn read the agent's figures while its tmux pane still waited in its gate,
outside the group it enters next (and before any agent starts its pumps), and the sample kept
that figure for its 5 s. The figures of a run are read again once its sessions change, or while
its group holds no process, so the row that first shows both sessions shows the agent's tree.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mcphost.supervisor.control.client import NotRunning, request
from mcphost.supervisor.control.protocol import ControlError
from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import Supervised
from tests.waiting import until

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
AGENTS = {"pane": {"runner": "tmux"}, "plain": {}}  # in one bundle: 2 sessions each


def _rows(sv: Supervised) -> dict[str, dict[str, Any]]:
    try:
        reply = request(str(sv.state / "control.sock"), "status", timeout=30)
    except (ControlError, NotRunning, OSError):
        return {}
    return {row["agent_id"]: row for row in reply["agents"]}


def test_the_row_that_first_shows_both_sessions_shows_the_agents_tree(
    tmp_path: Path, center: DevCenter
) -> None:
    sv = Supervised(tmp_path, center)
    sv.write_fleet(
        [{"id": agent, "command": sv.standin("--hold"), **keys} for agent, keys in AGENTS.items()],
        bundle="party",
    )
    sv.proc = subprocess.Popen(
        sv.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=sv.stderr_path.open("ab"), env=sv.env(),
    )  # fmt: skip
    try:
        first: dict[str, dict[str, Any]] = {}
        reads: dict[str, int] = dict.fromkeys(AGENTS, 0)  # statuses that saw the run started

        def both_up() -> bool:
            assert sv.proc is not None and sv.proc.poll() is None, sv.stderr()
            for agent, row in _rows(sv).items():
                if row.get("pid"):
                    reads[agent] += 1
                if row.get("sessions") == 2 and agent not in first:
                    first[agent] = row
            return len(first) == len(AGENTS)

        until(both_up, 60, "both agents holding their 2 sessions", every=0.02)
        assert all(count >= 2 for count in reads.values()), reads  # a status saw each starting
        for agent, row in first.items():
            usage = row["usage"]
            # the stand-in and its two pumps at least, and the memory they hold
            assert usage["processes"] >= 3 and usage["memory_current_bytes"] > 0, (agent, row)
    finally:
        sv.close()
