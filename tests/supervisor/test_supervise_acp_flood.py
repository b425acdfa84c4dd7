"""Black-box: an ACP agent cannot exhaust its keeper (issue 32, SECURITY.md X10).

A real `mcphost supervise` runs one well-behaved ACP agent (so the ACP code is loaded when the
baseline is taken); then a reload adds two hostile stand-ins (`mcphost/testing/acp_agent.py
--flood`): each completes its handshake, never reads its stdin again and writes 150,000 frames of
~280 bytes, `fr` requests (`session/request_permission`: each is answered, and the answers are
never read) and `fu` notifications (`session/update`). Before the bounds, the first alone grew
the supervisor from 65 to 721 MiB and was never restarted.

What must hold: each flooder's connection is ended with reason code `runtime_acp_flood` (the
event `relay.acp.flood` names the bound: `write_queue` or `write_bytes` for `fr`, the agent not
reading its stdin; `rate` for `fu`), it is restarted by its restart policy (the exit reason says
why), and the supervisor's peak resident memory (`VmHWM`) grows by less than `GROWTH_MAX`
meanwhile. Conditions only (`until`).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import Supervised
from tests.supervisor.test_supervise_acp import ACP_AGENT, row_when
from tests.waiting import until

pytestmark = [pytest.mark.deep, pytest.mark.timeout(300)]

FLOOD = "runtime_acp_flood"  # the stable reason code (transport.FLOOD), spelled out as a pin
GROWTH_MAX = 64 << 20  # SECURITY.md X10: the supervisor's peak RSS grows less than this
WRITE_BOUNDS = ("write_queue", "write_bytes")


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def flooder(kind: str) -> list[str]:
    """A hostile stand-in; without `loadSession`, so each restart sets up anew and floods again
    (a load of the id persisted by the last run would fail: it keeps no history)."""
    return [sys.executable, ACP_AGENT, "--no-load", "--flood", kind]


def floods(sv: Supervised, agent: str) -> list[dict[str, Any]]:
    """The `relay.acp.flood` events of `agent`'s connections."""
    return [
        e
        for e in sv.events()
        if e.get("event") == "relay.acp.flood"
        and str(e.get("target_session", "")).startswith(f"{agent}@")
    ]


def test_flooding_acp_agents_are_restarted_and_the_supervisor_stays_small(
    tmp_path: Path, center: DevCenter
) -> None:
    sv = Supervised(tmp_path, center)
    defaults: dict[str, Any] = {
        "bundle": "flood",
        "restart": "always",
        "restart_delay": 0.2,
        "restart_max_delay": 1.0,
        "max_restarts": 1000,
    }
    good = {"id": "ok", "runner": "acp", "command": [sys.executable, ACP_AGENT]}
    try:
        sv.write_fleet([good], **defaults)
        sv.start()
        assert sv.proc is not None
        until(row_when(sv, "ok", state="running", protocol_state="available"), 60, "ok ready")
        before = peak_rss(sv.proc.pid)
        sv.write_fleet(
            [
                good,
                {"id": "fr", "runner": "acp", "command": flooder("requests")},
                {"id": "fu", "runner": "acp", "command": flooder("updates")},
            ],
            **defaults,
        )
        sv.ctl("reload")

        def restarted_for_flood(agent: str) -> dict[str, Any]:
            """The row once the flood ended a run and the policy spawned the next one (a restart
            is counted when it is scheduled, in `backoff`; the generation rises at the spawn)."""
            row = sv.status().get(agent) or {}
            reason = row.get("last_reason") or ""
            restarted = row.get("restarts", 0) >= 1 and row.get("generation", 0) >= 2
            return row if restarted and FLOOD in reason else {}

        for agent in ("fr", "fu"):
            try:
                until(lambda a=agent: restarted_for_flood(a), 120, f"{agent} restarted")
            except AssertionError as exc:
                growth = (peak_rss(sv.proc.pid) - before) >> 20
                raise AssertionError(
                    f"{exc}; supervisor peak RSS grew {growth} MiB; {agent}: "
                    f"{sv.status().get(agent)}"
                ) from None
        lost = [
            e
            for e in sv.events()
            if e.get("event") == "supervisor.acp_connection_lost" and e.get("code") == FLOOD
        ]
        assert {e["agent_id"] for e in lost} >= {"fr", "fu"}, lost
        assert {e["bound"] for e in floods(sv, "fr")} <= set(WRITE_BOUNDS), floods(sv, "fr")
        assert {e["bound"] for e in floods(sv, "fu")} == {"rate"}, floods(sv, "fu")
        growth = peak_rss(sv.proc.pid) - before
        print(f"supervisor peak RSS: {before >> 20} MiB before, grew {growth >> 20} MiB")
        assert growth < GROWTH_MAX, f"the supervisor's peak RSS grew {growth >> 20} MiB"
        # the good agent was never touched
        assert sv.status()["ok"]["restarts"] == 0, sv.status()["ok"]
    finally:
        sv.close()
        shutil.rmtree(sv.state, ignore_errors=True)
