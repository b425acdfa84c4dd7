"""Spawn rate: N bare fenced agents reaching `running`, this tree against BENCH_BASELINE, by turns.

A bare agent is a process that only holds (`sleep infinity`): no MCP client, no pump, so the
figure is the supervisor's own spawn path (the fence's command line, the fork and exec, the
pre-exec steps, bubblewrap's start, the generation, the cgroup, the home), nothing else. Each
round starts one supervisor of each tree (order swapped every round) with the same fleet file:
N agents, `sandbox = "auto"` (fenced; the default), as root each agent on a uid of its own, each
tree against its own reference center, through bench/fence.py's `supervise` wrapper (which
emits `bench.spawn_begin` at the top of each `AgentRunner._spawn`; the baseline's has it too).
From the supervisor's own event timestamps:
- start included: from the supervisor's process start (the bench's clock just before Popen)
  to the N-th `supervisor.agent_spawned` (an agent is `running` when its process exists);
- start excluded: from the first `bench.spawn_begin` to the N-th `supervisor.agent_spawned`.
Rates are N / those seconds; ratios are this tree ÷ the baseline per round, then median
(min-max). The machine is shared: only the ratios of one run mean anything.

Run: `BENCH_BASELINE=<checkout of the baseline, e.g. `git worktree add /tmp/base main`> python -m
bench.spawn_rate` (as root for agents of their own uids). Env: BENCH_SPAWN_N (100),
BENCH_SPAWN_ROUNDS (4), BENCH_SPAWN_SANDBOX (auto), BENCH_SPAWN_STEPS (`label=path;...`: more
trees, e.g. checkouts of intermediate commits, each run in every round and set against the
baseline, so each step's saving is a ratio of the same run). Without BENCH_BASELINE only this
tree runs. bench/results/2026-12-07-spawn-rate.md holds runs.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.fence import Events, descendants
from bench.supervisor import wait_gone

ROOT = Path(__file__).resolve().parent.parent
BASELINE = os.environ.get("BENCH_BASELINE", "")
N = int(os.environ.get("BENCH_SPAWN_N", "100"))
ROUNDS = int(os.environ.get("BENCH_SPAWN_ROUNDS", "4"))
SANDBOX = os.environ.get("BENCH_SPAWN_SANDBOX", "auto")
STEPS = os.environ.get("BENCH_SPAWN_STEPS", "")
WAIT = 300.0


def fleet_round(center: Any, base: Path, tree: str, label: str) -> dict[str, float]:
    """One supervisor of `tree` with N bare agents: seconds to the N-th `agent_spawned`, from
    the process start and from the first spawn's beginning."""
    from mcphost.testing.fleet import fleet_toml

    work = Path(tempfile.mkdtemp(prefix=f"spawn-{label}-", dir=base))
    etc = work / "etc"
    etc.mkdir()
    token = etc / "worker.token"
    token.write_text(center.token + "\n")
    token.chmod(0o600)
    agents = [
        {"id": f"s-{i:04d}", "command": ["sleep", "infinity"], "sandbox": SANDBOX} for i in range(N)
    ]
    fleet = etc / "fleet.toml"
    fleet.write_text(
        fleet_toml(center, token, agents, client="command", restart="never", stop_grace=5)
    )
    events = Events(work / "supervisor.err")
    env = {**os.environ, "PYTHONPATH": tree, "MCPHOST_LOG_LEVEL": "info"}
    argv = [sys.executable, "-m", "bench.fence", "supervise", "--fleet", str(fleet)]
    with events.path.open("wb") as err:
        started = time.time()
        proc = subprocess.Popen(
            [*argv, "--state", str(work / "state")],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            env=env,
            cwd=tree,
        )
    try:
        deadline = time.monotonic() + WAIT
        spawned: list[float] = []
        begun: list[float] = []
        while len(spawned) < N:
            records = events.poll()
            spawned = [r["ts"] for r in records if r.get("event") == "supervisor.agent_spawned"]
            begun = [r["ts"] for r in records if r.get("event") == "bench.spawn_begin"]
            failed = [r for r in records if r.get("event") == "supervisor.agent_spawn_failed"]
            if failed or proc.poll() is not None:
                tail = events.path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{label}: a spawn failed or the supervisor exited: {tail}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{label}: {len(spawned)} of {N} spawned after {WAIT:.0f} s")
            time.sleep(0.01)
        last = max(spawned)
        return {"included": last - started, "excluded": last - min(begun)}
    finally:
        tree_pids = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        wait_gone(tree_pids)


def main() -> None:
    from mcphost.testing import DevCenter

    steps = [tuple(step.split("=", 1)) for step in STEPS.split(";") if "=" in step]
    sides = [("base", BASELINE)] if BASELINE else []
    sides += [(label, path) for label, path in steps] + [("cur", str(ROOT))]
    seen: dict[str, list[dict[str, float]]] = {name: [] for name, _ in sides}
    with (
        tempfile.TemporaryDirectory(prefix="mcphost-bench-spawn-") as tmp,
        DevCenter.start(Path(tmp), unix=True, control=True) as center,
    ):
        base = Path(tmp)
        for index in range(ROUNDS):
            shift = index % len(sides)  # each tree first in turn, then the order reversed
            order = sides[shift:] + sides[:shift]
            order = order if index % 2 == 0 else order[::-1]
            for name, tree in order:
                result = fleet_round(center, base, tree, name)
                seen[name].append(result)
                print(
                    f"round {index} {name}: {N / result['included']:.1f}/s start included, "
                    f"{N / result['excluded']:.1f}/s excluded",
                    file=sys.stderr,
                    flush=True,
                )
    lines = [
        f"N = {N} bare agents (`sleep infinity`, sandbox = {SANDBOX}), {ROUNDS} rounds",
        "",
        "| tree | spawns/s, start included: median (min–max) | start excluded |",
        "|---|---|---|",
    ]
    for name, _ in sides:
        cells = [name]
        for key in ("included", "excluded"):
            rates = [N / r[key] for r in seen[name]]
            cells.append(f"{statistics.median(rates):.1f} ({min(rates):.1f}–{max(rates):.1f})")
        lines.append("| " + " | ".join(cells) + " |")
    if BASELINE:
        lines += [
            "",
            "| rate ÷ baseline's, per round: median (min–max) | start included | start excluded |",
            "|---|---|---|",
        ]
        for name, _ in sides[1:]:
            cells = [name]
            for key in ("included", "excluded"):
                ratios = [b[key] / c[key] for c, b in zip(seen[name], seen["base"], strict=True)]
                cells.append(
                    f"**{statistics.median(ratios):.2f}×** ({min(ratios):.2f}–{max(ratios):.2f})"
                )
            lines.append("| " + " | ".join(cells) + " |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
