"""Spawn time with per-agent cgroups against without (issue #27: target <= 1.2x).

One spawn as the supervisor does it (`kernel.child_setup`'s pre-exec step, its own session,
the child exec'ing a short Python agent that exits at once), measured from before the group is
made to after the child is reaped and the group removed; without a group, the same spawn with
nothing to enter; and in a kept group (made once, before the runs: each spawn writes its limits
again and enters it, nothing is removed), which is what reusing an agent's group across its
restarts would save. All unfenced (the fence's bubblewrap would only add the same time to every
arm, hiding the ratio), and no center: nothing here talks to one. The arms alternate, so load on
the machine falls on all alike, and BENCH_CGROUPS_GAP seconds (0.1) pass between two spawns, as
between an agent's restarts: on cgroup v1 a move into a group by `cgroup.procs` waits for an RCU
grace period unless another move came just before (tens of milliseconds), so spawns back to
back would hide that wait. Skipped, saying why, without a usable backend.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time

from bench.harness import Stats
from mcphost.supervisor.confine import cgroups as cg
from mcphost.supervisor.confine.kernel import child_setup

RUNS = int(os.environ.get("BENCH_CGROUPS_RUNS", "40"))
GAP = float(os.environ.get("BENCH_CGROUPS_GAP", "0.1"))
AGENT = [sys.executable, "-I", "-S", "-c", "pass"]


async def _spawn(group: cg.AgentGroup | None, remove: bool = True) -> float:
    await asyncio.sleep(GAP)  # apart from the previous spawn, as an agent's restarts are
    started = time.perf_counter()
    placement = group.ensure() if group is not None else ()
    setup = child_setup(AGENT, cwd="/", env={}, creds=None, fence=None, cgroup=placement)
    child = subprocess.Popen(
        setup.argv, cwd=setup.cwd, env={}, preexec_fn=setup.preexec, start_new_session=True
    )
    child.wait()
    if group is not None and remove:
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
        kept = groups.group("bench-kept", limits)
        assert kept is not None
        without: list[float] = []
        within: list[float] = []
        reused: list[float] = []
        try:
            for i in range(RUNS):
                without.append(await _spawn(None))
                within.append(await _spawn(groups.group(f"bench{i}", limits)))
                reused.append(await _spawn(kept, remove=False))
        finally:
            await kept.remove()
            groups.close()
    base = Stats.of(without)

    def row(label: str, samples: list[float]) -> str:
        stats = Stats.of(samples)
        ratio = stats.median / base.median
        return f"| {label} | {stats.fmt()} | {ratio:.2f}x | <= 1.2x |"

    added = (Stats.of(within).median - base.median) * 1000
    out += [
        title,
        "",
        f"{RUNS} spawns each, alternated, {GAP:g} s apart; backend {backend.kind}; the child "
        "exits at once.",
        "",
        "| spawn | median (IQR) | ratio | target |",
        "|---|---|---|---|",
        f"| without a group | {base.fmt()} | 1.00x | |",
        row("in its group (made, entered, removed)", within),
        row("in a kept group (limits written, entered)", reused),
        "",
        f"Added per spawn: {added:+.1f} ms (median). Against a bare interpreter start this is "
        "the worst case; a real agent's spawn (bubblewrap, its start, its pump: bench/fence.py "
        "section 10.1) is many times longer.",
        "",
    ]


if __name__ == "__main__":
    report: list[str] = []
    asyncio.run(section(report))
    print("\n".join(report))
