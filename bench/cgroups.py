"""Spawn time with per-agent cgroups against without (issue #27: target <= 1.2x).

One spawn as the supervisor does it (`kernel.child_setup`'s pre-exec step, its own session,
the child exec'ing a short Python agent that exits at once), measured from before the group is
made to after the child is reaped and the group removed; without a group, the same spawn with
nothing to enter. Both unfenced (the fence's bubblewrap would only add the same time to both
sides, hiding the ratio), and no center: nothing here talks to one. Alternated,
so load on the machine falls on both alike. Skipped, saying why, without a usable backend.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time

from bench.harness import Stats
from mcphost.supervisor import cgroups as cg
from mcphost.supervisor.kernel import child_setup

RUNS = int(os.environ.get("BENCH_CGROUPS_RUNS", "40"))
AGENT = [sys.executable, "-I", "-S", "-c", "pass"]


async def _spawn(group: cg.AgentGroup | None) -> float:
    started = time.perf_counter()
    placement = group.ensure() if group is not None else ()
    setup = child_setup(AGENT, cwd="/", env={}, creds=None, fence=None, cgroup=placement)
    child = subprocess.Popen(
        setup.argv, cwd=setup.cwd, env={}, preexec_fn=setup.preexec, start_new_session=True
    )
    child.wait()
    if group is not None:
        await group.remove()
    return time.perf_counter() - started


async def section(out: list[str]) -> None:
    backend = cg.detect()
    title = "## Per-agent cgroups: spawn time with a group against without"
    if backend.kind == "none":
        out += [title, "", f"skipped: no usable cgroup backend ({backend.reason})", ""]
        return
    with tempfile.TemporaryDirectory(prefix="mcphost-bench-cg-") as state:
        groups = cg.Cgroups(backend, state)
        groups.prepare()
        limits = groups.defaults
        try:
            without: list[float] = []
            within: list[float] = []
            for i in range(RUNS):
                without.append(await _spawn(None))
                within.append(await _spawn(groups.group(f"bench{i}", limits)))
        finally:
            groups.close()
    base, with_groups = Stats.of(without), Stats.of(within)
    ratio = with_groups.median / base.median
    out += [
        title,
        "",
        f"{RUNS} spawns each, alternated; backend {backend.kind}; the child exits at once.",
        "",
        "| spawn | median (IQR) | ratio | target |",
        "|---|---|---|---|",
        f"| without a group | {base.fmt()} | 1.00x | |",
        f"| in its group (made, entered, removed) | {with_groups.fmt()} | {ratio:.2f}x | <= 1.2x |",
        "",
        f"Added per spawn: {(with_groups.median - base.median) * 1000:+.1f} ms (median). On v1 "
        "the child's move into its groups waits one RCU grace period (the kernel's "
        "threadgroup lock; the `favordynmods` mount option removes it), once for all "
        "controllers: against a bare interpreter start this is the worst case; a real agent's "
        "spawn (bubblewrap, its start, its pump: bench/fence.py section 10.1) is many times "
        "longer.",
        "",
    ]


if __name__ == "__main__":
    report: list[str] = []
    asyncio.run(section(report))
    print("\n".join(report))
