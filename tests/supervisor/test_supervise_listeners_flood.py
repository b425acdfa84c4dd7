"""Black-box: an agent floods the page and `/metrics` with ~3,000 half-sent requests each, and the
supervisor stays the operator's (issue 32; loopback.py's bounds).

The supervisor starts as systemd starts a service: soft `RLIMIT_NOFILE` 1024, hard 65536
(`prlimit`, hard: the test's own). `hostile` (fenced; twice: of its own uid, the default under a root supervisor, which the
listeners refuse outright, and of the supervisor's own uid, `user = "root"`, which only the
per-uid and listener bounds hold) opens 3,000 connections to each port, sends each half a
request head and holds them (`mcphost/testing/flood_agent.py`); `w` is a stand-in. While the
agent holds them: the supervisor raised its soft limit to the hard one (`supervisor.descriptors`),
holds at most `CONNECTIONS_PER_PEER` connections per listener, far fewer descriptors than
systemd's 1024, and `ctl status` answers and `ctl restart w` brings `w` back in a new generation
over the control socket; the refusals are logged a bounded number of lines (one per listener and
reason every `LOG_EVERY_SECONDS`), and no accept traceback. On the code before loopback.py the
supervisor held every connection until it ran out of descriptors, and `ctl` hung.

Conditions only (`until`), no sleeps.
"""

from __future__ import annotations

import os
import resource
import shutil
from pathlib import Path

import pytest

from mcphost.supervisor.operator.loopback import CONNECTIONS_PER_PEER
from tests.supervisor.supervise_harness import AS_ROOT, Supervised
from tests.supervisor.test_supervise_listeners import (
    descriptors,
    flooding,
    free_port,
    held,
    refused,
    report,
    with_listeners,
    within_log_bound,
)
from tests.waiting import until

FLOOD = 3000
SYSTEMD_SOFT = 1024
# per listener: what the per-uid bound admits, and the one accepted connection being decided
HELD_MOST = 2 * (CONNECTIONS_PER_PEER + 1)
HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # this test's: it may not raise it

# deep (make test-slow): ~6,000 connections and a supervisor, ~20 s on two CPUs;
# test_supervise_listeners.py (an agent's own uid refused, 300 a port) is make test's.
pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(shutil.which("prlimit") is None, reason="util-linux's prlimit is missing"),
    pytest.mark.skipif(HARD < 4 * FLOOD, reason="the hard NOFILE limit is below the flood's"),
]


class UnderSystemd(Supervised):
    """A supervisor started with systemd's descriptor limits (soft 1024)."""

    def argv(self) -> list[str]:
        return ["prlimit", f"--nofile={SYSTEMD_SOFT}:{HARD}", "--", *super().argv()]


def soft_nofile(pid: int) -> int:
    """The soft `Max open files` of /proc/<pid>/limits."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no Max open files in /proc/{pid}/limits")


@pytest.mark.parametrize(
    ("whose", "reasons"),
    [
        # the default: an agent of its own uid (a root supervisor's) is refused outright
        pytest.param("own uid", {"agent_peer"}, id="own-uid"),
        # one that shares the supervisor's uid is held by the per-uid and listener bounds
        pytest.param("shared uid", {"peer_full", "listener_full"}, id="shared-uid"),
    ],
)
def test_a_flood_of_half_sent_requests_leaves_the_supervisor_bounded_and_ctl_answering(
    supervised: Supervised, whose: str, reasons: set[str]
) -> None:
    if whose == "own uid" and os.geteuid() != 0:
        pytest.skip("agents get uids of their own from a root supervisor")
    sv = UnderSystemd(supervised.base, supervised.center)
    try:
        page, metrics = free_port(), free_port()
        sv.write_fleet(
            [
                {
                    "id": "hostile",
                    "command": flooding(sv, FLOOD, page, metrics),
                    **(AS_ROOT if whose == "shared uid" else {}),
                },
                {"id": "w", "command": sv.standin("--hold")},
            ]
        )
        with_listeners(sv, page, metrics)
        sv.start()
        assert sv.proc is not None
        pid = sv.proc.pid
        [limit] = [e for e in sv.events(this_run=True) if e["event"] == "supervisor.descriptors"]
        assert (limit["was"], limit["soft"]) == (SYSTEMD_SOFT, HARD)
        first = sv.wait_running("w")
        # what the supervisor takes for itself never reaches an agent's tree (procs.py)
        assert soft_nofile(first["pid"]) == SYSTEMD_SOFT

        flood = until(
            lambda: (got := report(sv, "hostile")) and got["done"] and got,
            120,
            "the agent's whole flood tried",
        )
        for port in (page, metrics):
            assert flood["opened"][port] + flood["failed"][port] == FLOOD, flood
        # while the agent holds what it opened: bounded, and the operator's lifeline answers
        assert held(pid, (page, metrics)) <= HELD_MOST
        assert descriptors(pid) < SYSTEMD_SOFT
        assert "w" in sv.ctl("status").stdout
        sv.ctl("restart", "w")
        sv.wait_running("w", generation=first["generation"] + 1)
        assert held(pid, (page, metrics)) <= HELD_MOST

        lines = until(lambda: refused(sv), 60, "the refusals logged")
        assert {e["reason"] for e in lines} <= reasons, lines
        assert within_log_bound(lines), lines  # not one line per connection
        log = sv.stderr()
        assert "Traceback" not in log and "out of system resource" not in log
    finally:
        sv.close()
