"""What per-agent usage costs `ctl status` (issue 27, part 2): a real `mcphost supervise` with
N = 100 agents (each a shell with two sleeping children: 300 processes, unfenced), then

- the `status` round trip over the control socket (median of ROUNDS), usage included (every
  status within `operations.USAGE_SAMPLE_SECONDS` reads the same sample: most of the ROUNDS
  reuse one), and the round trip of a status that takes a new sample (FRESH of them, each
  USAGE_SAMPLE_SECONDS after the last);
- the usage part alone, in this process on the same agents: one sample as the supervisor takes
  it, from each agent's own cgroup files (`usage.cgroup_usage` of `AgentGroup.usage_files`: what
  status reads with a cgroup backend; skipped without one), and from one /proc scan and the N
  trees (`usage.ProcTable.scan`, `agent_usage`: the fallback, backend `none`), with RSS and with
  PSS (`smaps_rollup`, not used: its cost is why);
- the ratio of the two round trips: what a new sample adds to a status.

Run: `.venv/bin/python -m bench.usage [N]`; prints one Markdown table.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mcphost.supervisor.confine import cgroups
from mcphost.supervisor.confine.usage import Peaks, ProcTable, agent_usage
from mcphost.supervisor.control.client import request
from mcphost.supervisor.operator.operations import USAGE_SAMPLE_SECONDS
from mcphost.testing.devcenter import DevCenter
from mcphost.testing.fleet import fleet_toml

ROUNDS = 30
FRESH = 5
TREE = ["/bin/sh", "-c", "sleep 600 & sleep 600 & wait"]


# unfenced, as the supervisor's own user: an agent's own uid may not run this interpreter
UNFENCED = {"sandbox": "none", **({"user": "root"} if os.geteuid() == 0 else {})}


def _median_ms(fn: object, rounds: int = ROUNDS) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main(n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bu-", dir="/tmp") as base:
        root = Path(base)
        with DevCenter.start(root / "center") as center:
            token = root / "token"
            token.write_text(center.token + "\n")
            token.chmod(0o600)
            agents = [{"id": f"a{i:03d}", "command": TREE} for i in range(n)]
            fleet = root / "fleet.toml"
            fleet.write_text(
                fleet_toml(center, token, agents, client="command", stop_grace=2, **UNFENCED)
            )
            state = root / "s"
            proc = subprocess.Popen(
                [sys.executable, "-m", "mcphost", "supervise", "--fleet", str(fleet),
                 "--state", str(state)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            sock = str(state / "control.sock")
            try:
                deadline = time.monotonic() + 120
                while True:
                    try:
                        rows = request(sock, "status", timeout=30)["agents"]
                        if sum(r["state"] == "running" for r in rows) == n:
                            break
                    except Exception:  # not up yet
                        pass
                    if time.monotonic() > deadline:
                        raise SystemExit("the fleet did not start")
                    time.sleep(0.2)
                time.sleep(1)  # every shell's children started
                status_ms = _median_ms(lambda: request(sock, "status", timeout=30))
                spent: list[float] = []
                for _ in range(FRESH):
                    time.sleep(USAGE_SAMPLE_SECONDS + 0.1)  # the last sample too old
                    started = time.perf_counter()
                    request(sock, "status", timeout=30)
                    spent.append((time.perf_counter() - started) * 1000)
                fresh_ms = statistics.median(spent)
                rows = request(sock, "status", timeout=30)["agents"]
                processes = sum(r["usage"]["processes"] or 0 for r in rows)
                roots = {r["agent_id"]: r["pid"] for r in rows}
                table = ProcTable.scan()
                trees = {a: [(pid, table.entries[pid].starttime)] for a, pid in roots.items()}

                def usage(pss: bool) -> None:
                    scanned, peaks = ProcTable.scan(), Peaks()
                    for agent_id, tree in trees.items():
                        agent_usage(agent_id, 1, tree, table=scanned, peaks=peaks, pss=pss)

                rss_ms = _median_ms(lambda: usage(False))
                pss_ms = _median_ms(lambda: usage(True), 10)
                groups = cgroups.Cgroups(cgroups.detect(), str(state))
                files = {
                    a: group.usage_files
                    for a in roots
                    if (group := groups.group(a, groups.defaults)) is not None
                }
                source = rows[0]["usage"]["source"]

                def from_groups() -> None:
                    peaks = Peaks()
                    for agent_id, group_files in files.items():
                        agent_usage(agent_id, 1, (), table=None, peaks=peaks, cgroup=group_files)

                group_ms = _median_ms(from_groups) if all(files.values()) and files else None
            finally:
                proc.terminate()
                proc.wait(60)
    backend = groups.kind
    print(
        f"| N = {n} agents, {processes} processes ({os.cpu_count()} CPUs, backend {backend}) | ms |"
    )
    print("|---|---|")
    print(
        f"| `ctl status` round trip, usage included (median of {ROUNDS}; source `{source}`) | "
        f"{status_ms:.1f} |"
    )
    print(f"| `ctl status` round trip taking a new sample (median of {FRESH}) | {fresh_ms:.1f} |")
    if group_ms is not None:
        print(
            f"| usage part: {n} agents' cgroup files (a sample with a cgroup backend) | {group_ms:.1f} |"
        )
    print(f"| usage part: one /proc scan + {n} trees, RSS (backend none) | {rss_ms:.1f} |")
    print(f"| same with PSS from smaps_rollup (not used) | {pss_ms:.1f} |")
    print(f"| ratio new sample / shared sample | {fresh_ms / status_ms:.2f}x |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
