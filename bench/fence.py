"""The fence's cost (issue 21): spawn time and memory per agent, `sandbox = "auto"` against
`sandbox = "none"`, measured in the same run.

Both arms run one real `mcphost supervise` with N stand-in agents (`mcphost/testing/
standin_agent.py --hold`: it launches its attach entry, makes one `get_my_work` call, records it
in `calls.jsonl`, then holds), against the reference center; only the fleet's `sandbox` key
differs. Per round and arm:
- spawn: per agent, from its `supervisor.agent_spawned` event to its first recorded call (the
  mtime of its `calls.jsonl`: fork, the fence, exec, the pump's attach and one call), median
  over the agents; and the fleet's wall, from the supervisor's start to the last first call;
- memory: PSS (`smaps_rollup`) of every process below the supervisor (the agents and their
  pumps), divided by N, read once every agent has called.
Arms alternate (the order swapped each round); ratios are fenced ÷ unfenced. And the fence's
own price, without the agents' start-up around it: fork + exec of `/bin/true` with the fence
applied in the child (as the supervisor does) against without, EXECS times each, interleaved. Targets (the
issue): spawn <= 1.2x, memory <= 1.05x. The kernel's own cost of a mount namespace and its
tmpfs is not in PSS; MemAvailable before and after would be too noisy on a shared machine.

Run alone with `python -m bench.fence`; `make bench` runs it as a section.
Env: BENCH_FENCE_SIZES (1,10,100), BENCH_FENCE_ROUNDS (rounds per size, 5,3,1),
BENCH_FENCE_EXECS (200).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.supervisor import avail_mb, children_of, pss_mb, wait_files, wait_gone

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
SIZES = [int(n) for n in os.environ.get("BENCH_FENCE_SIZES", "1,10,100").split(",")]
ROUNDS = [int(n) for n in os.environ.get("BENCH_FENCE_ROUNDS", "5,3,1").split(",")]
EXECS = int(os.environ.get("BENCH_FENCE_EXECS", "200"))
ARMS = ("none", "auto")


def descendants(root: int) -> list[int]:
    found, frontier = [], {root}
    while frontier:
        kids = [pid for pids in children_of(frontier).values() for pid in pids]
        found += kids
        frontier = set(kids)
    return found


def run_arm(center: Any, base: Path, n: int, sandbox: str) -> dict[str, float]:
    """One supervisor with `n` stand-ins under `sandbox`: its spawn and memory figures."""
    from mcphost.testing.fleet import fleet_toml, standin

    work = Path(tempfile.mkdtemp(prefix=f"fence-{sandbox}-", dir=base))
    state = Path(tempfile.mkdtemp(prefix="sv-", dir=base))
    token = work / "worker.token"
    token.write_text(center.token + "\n")
    token.chmod(0o600)
    agents: list[dict[str, Any]] = [
        {"id": f"f-{i:03d}", "command": standin("--hold")} for i in range(n)
    ]
    fleet = work / "fleet.toml"
    fleet.write_text(
        fleet_toml(center, token, agents, client="command", sandbox=sandbox, stop_grace=5)
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MCPHOST_LOG_LEVEL": "info"}
    calls = [state / "agents" / a["id"] / "workspace" / "calls.jsonl" for a in agents]
    argv = [PY, "-m", "mcphost", "supervise", "--fleet", str(fleet), "--state", str(state)]
    err_path = work / "supervisor.err"
    with err_path.open("wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)

    def check() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"the supervisor exited: {err_path.read_text()[-2000:]}")

    try:
        done = wait_files(calls, 600, check)
        tree = descendants(proc.pid)
        memory = sum(pss_mb(pid) for pid in tree) / n
        spawned: dict[str, float] = {}
        for line in err_path.read_text().splitlines():
            if line.startswith("{") and '"supervisor.agent_spawned"' in line:
                record = json.loads(line)
                spawned.setdefault(record["agent_id"], record["ts"])
        spawn = [path.stat().st_mtime - spawned[path.parent.parent.name] for path in calls]
        return {"spawn": statistics.median(spawn), "wall": done - start, "pss": memory}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        wait_gone(descendants(proc.pid))


def section_exec(base: Path, out: list[str]) -> None:
    """fork + exec of /bin/true, fenced (a real agent's plan) and not, interleaved."""
    from mcphost.supervisor import fence

    state = base / "exec-state"
    home = state / "agents" / "x"
    (home / "workspace").mkdir(parents=True)
    plan = fence.plan(state_dir=str(state), home=str(home), sockets=(), secrets=())
    fenced_step = fence.Fence(plan, fence.probe().landlock_abi)
    times: dict[str, list[float]] = {"none": [], "auto": []}
    for _ in range(EXECS):
        for arm, step in (("none", None), ("auto", fenced_step)):
            start = time.perf_counter()
            subprocess.run(["/bin/true"], preexec_fn=step, check=True)
            times[arm].append(time.perf_counter() - start)
    plain, fenced = (statistics.median(times[arm]) * 1000 for arm in ("none", "auto"))
    out += [
        f"fork + exec of `/bin/true` ({EXECS} each, interleaved, medians): unfenced "
        f"{plain:.2f} ms, fenced {fenced:.2f} ms ({fenced / plain:.2f}×, +{fenced - plain:.2f} ms"
        " per spawn: namespaces, tmpfs covers, bind mounts, Landlock).",
        "",
    ]


def section_sizes(center: Any, base: Path, out: list[str]) -> None:
    out += [
        "| N | rounds | spawn→first call, none | fenced | ratio | fleet wall, none | fenced "
        "| ratio | PSS per agent, none | fenced | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, rounds in zip(SIZES, ROUNDS + [1] * len(SIZES), strict=False):
        seen: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
        for index in range(rounds):
            for arm in ARMS if index % 2 == 0 else tuple(reversed(ARMS)):
                seen[arm].append(run_arm(center, base, n, arm))
        cells = [str(n), str(rounds)]
        for key, unit, scale in (("spawn", "ms", 1000), ("wall", "s", 1), ("pss", "MB", 1)):
            plain = statistics.median(r[key] for r in seen["none"])
            fenced = statistics.median(r[key] for r in seen["auto"])
            fmt = "{:.0f} " if unit == "ms" else "{:.2f} "
            cells += [
                fmt.format(plain * scale) + unit,
                fmt.format(fenced * scale) + unit,
                f"{fenced / plain:.2f}×" if plain else "n/a",
            ]
        out.append("| " + " | ".join(cells) + " |")


async def section(out: list[str]) -> None:
    from mcphost.supervisor import fence
    from mcphost.testing import DevCenter

    missing = fence.probe().missing()
    out += ["## 10. The fence: spawn time and memory per agent, fenced ÷ unfenced (issue 21)", ""]
    if missing is not None:
        out += [f"Skipped: this machine lacks {missing}.", ""]
        return
    loadavg = os.getloadavg()
    out += [
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {os.cpu_count()} CPUs · "
        f"load average at start {loadavg[0]:.2f} · {avail_mb()} MB available · "
        f"fence: namespaces+landlock{fence.probe().landlock_abi}",
        "",
        "Spawn→first call: per agent, `agent_spawned` to its first recorded center call (median"
        " over agents, then rounds). Fleet wall: supervisor start to the last agent's first call."
        " PSS: every process below the supervisor (agents and pumps) ÷ N. Targets: spawn ≤ 1.2×,"
        " memory ≤ 1.05×.",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="mcphost-bench-fence-", dir="/tmp") as tmp:
        base = Path(tmp)
        with DevCenter.start(base / "center", unix=True, control=True) as center:
            ids = [f"f-{i:03d}" for i in range(max(SIZES))]
            reply = center.request(
                "POST", "/_devcenter/agents", {"worker_id": "w-1", "agent_ids": ids}
            )
            if reply.status != 200:
                raise RuntimeError(
                    f"binding the agents failed: {reply.status} {reply.body[:300]!r}"
                )
            section_sizes(center, base, out)
        out.append("")
        section_exec(base, out)
    out.append("")


if __name__ == "__main__":
    import asyncio

    report: list[str] = []
    asyncio.run(section(report))
    print("\n".join(report))
