"""A thousand agents on one worker (issue 35): one fenced `mcphost supervise` with N agents,
against one standalone `mcphost host` per agent measured in the same run and extrapolated.

Arms, each a fresh supervisor (bench/fence.py's `Supervisor`: `mcphost supervise` with its
spawns' events, the fleet under a worker-like /var/lib directory, every agent `sandbox = "auto"`
and, as root, of its own uid), N agents each, N in `--sizes`:
- `bare`: agents that run `sleep infinity` and open no session: the supervisor's spawn path alone;
- `pumps`: bench/peers/scale_agent.py on its config's stdio entry (the per-agent pump, today's
  path): `initialize`, one `get_my_work` through the supervisor to the center, then it holds;
- `http`: the same agent on the HTTP entry, chosen by the fleet key `--http-key` (default
  `mcp_transport = "http"`) on every agent. Skipped, with a line saying so, when the installed
  mcphost does not know the key (`fleet.SECTIONS["agent"]`).
The baseline: bench/supervisor.py's standalone arm (`fleet_round(..., supervised=False)`: its
stdlib driver agents, each running a configgen config whose `agent-center` is `mcphost host`,
unfenced as that arm is) at N = `--baseline`, extrapolated linearly to every other N
(`extrapolate`): at N = 1000 the hosts would not fit in this machine's memory.

Per arm and N:
- wall: the supervisor's start to the last agent's first answer (the `at` its `answer` records),
  or for `bare` to the last `supervisor.agent_spawned` (the agent is `running`);
- spawn rate: N ÷ (the last `agent_spawned` minus the supervisor's start), and from its first spawn;
- serving memory: PSS (`smaps_rollup`) of the supervisor and every pump under it, read once every
  agent answered; the supervisor's own PSS per agent;
- idle CPU: the supervisor's CPU (its threads' `schedstat`, bench/operations.py's `run_time`)
  over `--idle` seconds, after every agent answered and `SETTLE` seconds passed, nobody looking.
Printed: each arm's figures; ratios against the baseline (measured at its N, extrapolated at the
others); growth from the smallest N to the largest; and issue 35's targets (`TARGETS`), each
beside its figure with pass or fail (they are written for the HTTP arm; `pumps` and `bare` rows
show where today's paths stand). One run, one machine: a noisy neighbour moves both sides.

Run alone: `python -m bench.scale [--sizes 100,1000] [--arms bare,pumps,http] [--baseline 100]
[--idle 10] [--http-key 'mcp_transport = "http"']`; `make bench` runs it as section 14 with the
same defaults, or BENCH_SCALE_SIZES, BENCH_SCALE_ARMS, BENCH_SCALE_BASELINE, BENCH_SCALE_IDLE,
BENCH_SCALE_HTTP_KEY. N = 1000 needs about 10 GiB free (agents, pumps and fences) and a few
minutes; the baseline at N = 100 needs `bench.supervisor.HOST_MB` per host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PY = sys.executable
AGENT = str(Path(__file__).resolve().parent / "peers" / "scale_agent.py")
ARMS = ("bare", "pumps", "http")
SETTLE = 2.0  # seconds between the last answer and the idle window
POLL = 0.2  # seconds between looks for answers: the figures come from the agents' own clocks
WAIT = 600.0  # seconds for a fleet to answer before the bench gives up

Figures = dict[str, float]


# -- the pure parts: extrapolation, ratios, the targets -------------------------------------------


def extrapolate(value: float, measured_at: int, to: int) -> float:
    """A figure measured with `measured_at` agents, scaled linearly to `to` agents (a per-process
    host's memory, CPU and start-up work grow with the number of hosts)."""
    if measured_at <= 0:
        raise ValueError(f"cannot extrapolate from N = {measured_at}")
    return value * to / measured_at


def baseline_at(baseline: Figures, n: int) -> Figures:
    """The per-process figures at N = `n`: measured when `n` is the baseline's N, else scaled."""
    measured = int(baseline["n"])
    scaled = {k: extrapolate(v, measured, n) for k, v in baseline.items() if k in ("wall", "pss")}
    return {**scaled, "n": float(n), "extrapolated": float(n != measured)}


@dataclass(frozen=True)
class Target:
    """One of issue 35's "done when" figures: `figure` at N = `n`, for each of `arms` (the first
    is the arm the issue names; the others show where today's paths stand). `kind`: `baseline`
    (÷ the per-process figure at that N), `growth` (÷ the same arm's figure at N = `against`) or
    `absolute`; met when at most `limit` (at least, with `at_least`)."""

    text: str
    arms: tuple[str, ...]
    n: int
    figure: str
    kind: str
    limit: float
    at_least: bool = False
    against: int = 100


SESSIONS = ("http", "pumps")
TARGETS = (
    Target("serving memory ≤ 0.02× per-process", SESSIONS, 100, "serving_pss", "baseline", 0.02),
    Target("wall to every first answer ≤ 0.05×", SESSIONS, 100, "wall", "baseline", 0.05),
    Target("every agent answered within 20 s", SESSIONS, 1000, "wall", "absolute", 20.0),
    Target("serving memory ≤ 0.01× per-process", SESSIONS, 1000, "serving_pss", "baseline", 0.01),
    Target("supervisor PSS per agent ≤ 1.1× N = 100's", SESSIONS, 1000, "per_agent", "growth", 1.1),
    Target("bare fenced agents spawn ≥ 50 a second", ("bare",), 1000, "rate", "absolute", 50, True),
    Target("idle supervisor CPU ≤ 1.2× N = 100's", ARMS, 1000, "idle_cpu", "growth", 1.2),
)


def target_value(
    target: Target, arm: str, results: Mapping[str, Mapping[int, Figures]], baseline: Figures | None
) -> float | None:
    """`target`'s figure for `arm`; None when the run did not measure it."""
    seen = results.get(arm, {})
    if target.figure not in seen.get(target.n, {}):
        return None
    value = seen[target.n][target.figure]
    if target.kind == "absolute":
        return value
    if target.kind == "baseline":
        if baseline is None:
            return None
        key = "pss" if target.figure == "serving_pss" else target.figure
        return value / baseline_at(baseline, target.n)[key]
    if target.figure not in seen.get(target.against, {}):
        return None
    return value / seen[target.against][target.figure]


def verdict(value: float | None, target: Target) -> str:
    if value is None:
        return "not measured"
    met = value >= target.limit if target.at_least else value <= target.limit
    return "**pass**" if met else "**fail**"


def target_rows(
    results: Mapping[str, Mapping[int, Figures]], baseline: Figures | None
) -> list[str]:
    """The targets table: each target for each of its arms, with the figure, the limit and
    pass or fail (or "not measured")."""
    unit = {"absolute": "", "baseline": "×", "growth": "×"}
    rows = [
        "| target (issue 35) | N | arm | figure | limit | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for target in TARGETS:
        for arm in target.arms:
            value = target_value(target, arm, results, baseline)
            shown = "–" if value is None else f"{value:.3g}{unit[target.kind]}"
            sign = "≥" if target.at_least else "≤"
            rows.append(
                f"| {target.text} | {target.n} | {arm} | {shown} | {sign} {target.limit:g}"
                f"{unit[target.kind]} | {verdict(value, target)} |"
            )
    return rows


def growth_rows(results: Mapping[str, Mapping[int, Figures]]) -> list[str]:
    """Each arm's figures at its largest N ÷ at its smallest."""
    keys = ("wall", "rate", "serving_pss", "supervisor_pss", "per_agent", "idle_cpu")
    rows = [
        "| arm | from N | to N | " + " | ".join(keys) + " | supervisor PSS per added agent |",
        "|---|---|---|" + "---|" * (len(keys) + 1),
    ]
    for arm, seen in results.items():
        if len(seen) < 2:
            continue
        low, high = seen[min(seen)], seen[max(seen)]
        cells = [f"{high[k] / low[k]:.2f}×" if low.get(k) and k in high else "–" for k in keys]
        if "supervisor_pss" in low and "supervisor_pss" in high:
            added = (high["supervisor_pss"] - low["supervisor_pss"]) / (max(seen) - min(seen))
            cells.append(f"{added * 1024:.0f} KiB")
        else:
            cells.append("–")
        rows.append(f"| {arm} | {min(seen)} | {max(seen)} | " + " | ".join(cells) + " |")
    return rows if len(rows) > 2 else ["(One N only: no growth to show.)"]


def http_key(spec: str, known: Sequence[str]) -> dict[str, Any] | None:
    """The agent keys `spec` (TOML, `key = value`) sets, or None when a key is not in `known`
    (the installed mcphost has no HTTP sessions)."""
    keys = tomllib.loads(spec)
    return keys if keys and all(key in known for key in keys) else None


# -- one supervised fleet -------------------------------------------------------------------------


def answers(sv: Any, ids: list[str]) -> dict[str, dict[str, Any]]:
    """Wait for every agent's `answer` (looking every POLL seconds, so the bench's own CPU stays
    off the supervisor's); each record."""
    found: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + WAIT
    while len(found) < len(ids):
        for agent in ids:
            path = sv.state / "agents" / agent / "workspace" / "answer"
            if agent not in found and path.exists():
                found[agent] = json.loads(path.read_text())
        if sv.proc.poll() is not None:
            tail = sv.events.path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the supervisor exited with {len(found)} answers: {tail}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(ids) - len(found)} agents had not answered after {WAIT} s")
        time.sleep(POLL)
    failed = {agent: record for agent, record in found.items() if not record["ok"]}
    if failed:
        raise RuntimeError(f"{len(failed)} agents' calls failed: {list(failed.items())[:2]}")
    return found


def spawned(sv: Any, ids: list[str]) -> list[float]:
    """Wait until every agent is `running` (its `supervisor.agent_spawned`); the timestamps."""
    want, stamps, seen = set(ids), {}, 0
    deadline = time.monotonic() + WAIT
    while len(stamps) < len(want):
        records = sv.events.poll()
        for record in records[seen:]:
            agent = record.get("agent_id")
            if record.get("event") == "supervisor.agent_spawned" and agent in want:
                stamps.setdefault(agent, record["ts"])
        seen = len(records)
        if len(stamps) == len(want):
            break
        if sv.proc.poll() is not None or time.monotonic() > deadline:
            tail = sv.events.path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{len(want) - len(stamps)} agents never ran: {tail}")
        time.sleep(POLL)
    return sorted(stamps.values())


def run_arm(
    center: Any, base: Path, arm: str, n: int, keys: dict[str, Any], idle: float
) -> Figures:
    """One fresh supervisor with `n` agents of `arm`: its figures (module doc)."""
    from bench.fence import Supervisor, descendants, role
    from bench.supervisor import pss_mb
    from bench.watching import run_time

    command = ["sleep", "infinity"] if arm == "bare" else [PY, "-I", "-S", AGENT, "{mcp_config}"]
    ids = [f"{arm[0]}-{i:04d}" for i in range(n)]
    agents = [{"id": a, "command": command, "sandbox": "auto", **keys} for a in ids]
    sv = Supervisor(center, base, agents, f"{arm}-{n}")
    try:
        stamps = spawned(sv, ids)
        figures: Figures = {
            "rate": n / (stamps[-1] - sv.started),
            "rate_spawning": (n - 1) / (stamps[-1] - stamps[0]) if n > 1 else float("nan"),
        }
        if arm == "bare":
            figures["wall"] = stamps[-1] - sv.started
        else:
            figures["wall"] = max(r["at"] for r in answers(sv, ids).values()) - sv.started
        time.sleep(SETTLE)
        before = run_time(sv.proc.pid)
        time.sleep(idle)
        figures["idle_cpu"] = (run_time(sv.proc.pid) - before) / idle * 1000  # ms per second
        pumps = [p for p in descendants(sv.proc.pid) if role(p) == "pump"]
        figures["supervisor_pss"] = pss_mb(sv.proc.pid)
        figures["pumps"] = float(len(pumps))
        figures["serving_pss"] = figures["supervisor_pss"] + sum(pss_mb(p) for p in pumps)
        figures["per_agent"] = figures["supervisor_pss"] / n
        return figures
    finally:
        sv.stop()


def run_baseline(center: Any, base: Path, n: int) -> Figures:
    """bench/supervisor.py's standalone arm at N = `n` (fewer where memory is short)."""
    from bench.supervisor import fits, fleet_round

    figures = fleet_round(center, base, fits(n), supervised=False, burst=False)
    return {"n": float(figures["n"]), "wall": figures["wall"], "pss": figures["pss"]}


# -- the report -----------------------------------------------------------------------------------


WITH_BASELINE = (("wall", "wall"), ("serving_pss", "pss"))  # an arm's figure, the hosts' figure


def arm_rows(results: Mapping[str, Mapping[int, Figures]], baseline: Figures | None) -> list[str]:
    rows = [
        "| arm | N | wall to every first answer (bare: to `running`) | spawn rate from start "
        "(from first spawn) | serving PSS (supervisor + pumps) | supervisor PSS per agent "
        "| idle supervisor CPU | wall ÷ per-process | serving PSS ÷ per-process |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if baseline is not None:
        rows.append(
            f"| per-process hosts (baseline) | {baseline['n']:.0f} | {baseline['wall']:.2f} s "
            f"| | {baseline['pss']:.0f} MB (hosts) | | | 1× | 1× |"
        )
    for arm, seen in results.items():
        for n, f in sorted(seen.items()):
            ratios = ["–", "–"]  # bare agents have no session to compare with a host's
            if baseline is not None and arm != "bare":
                base = baseline_at(baseline, n)
                mark = " (extrap.)" if base["extrapolated"] else ""
                ratios = [f"{f[k] / base[b]:.3f}×{mark}" for k, b in WITH_BASELINE]
            rows.append(
                f"| {arm} | {n} | {f['wall']:.2f} s | {f['rate']:.1f}/s ({f['rate_spawning']:.1f}/s) "
                f"| {f['serving_pss']:.0f} MB ({f['supervisor_pss']:.0f} + {f['pumps']:.0f} pumps "
                f"{f['serving_pss'] - f['supervisor_pss']:.0f}) | {f['per_agent'] * 1024:.0f} KiB "
                f"| {f['idle_cpu']:.1f} ms/s | " + " | ".join(ratios) + " |"
            )
    return rows


def options(argv: Sequence[str]) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", default=env("BENCH_SCALE_SIZES", "100,1000"))
    parser.add_argument("--arms", default=env("BENCH_SCALE_ARMS", ",".join(ARMS)))
    parser.add_argument(
        "--baseline",
        type=int,
        default=int(env("BENCH_SCALE_BASELINE", "100")),
        help="N of the per-process baseline (0: none)",
    )
    parser.add_argument("--idle", type=float, default=float(env("BENCH_SCALE_IDLE", "10")))
    parser.add_argument("--http-key", default=env("BENCH_SCALE_HTTP_KEY", 'mcp_transport = "http"'))
    parsed = parser.parse_args(list(argv))
    parsed.command = " ".join(["python -m bench.scale", *argv])
    parsed.sizes = sorted(int(n) for n in parsed.sizes.split(","))
    parsed.arms = [a for a in ARMS if a in parsed.arms.split(",")]
    return parsed


def run(opts: argparse.Namespace, out: list[str]) -> None:
    from bench.fence import bench_dir, machine_line
    from mcphost.supervisor import fleet
    from mcphost.supervisor.confine import probe
    from mcphost.testing import DevCenter

    out += ["## 14. A thousand agents on one worker: fenced fleets at scale (issue 35)", ""]
    missing = probe.probe().missing()
    if missing is not None:
        out += [f"Skipped: no fence here ({missing}).", ""]
        return
    keys: dict[str, dict[str, Any]] = {"bare": {}, "pumps": {}}
    if "http" in opts.arms:
        known = http_key(opts.http_key, list(fleet.SECTIONS["agent"].model_fields))
        if known is None:
            opts.arms.remove("http")
            out += [
                f"Arm `http` skipped: the installed mcphost has no agent key `{opts.http_key}` "
                "(no HTTP sessions here; `--http-key` names another).",
                "",
            ]
        keys["http"] = known or {}
    out += [f"Command: `{opts.command}`", "", machine_line("Start"), ""]
    results: dict[str, dict[int, Figures]] = {arm: {} for arm in opts.arms}
    baseline: Figures | None = None
    with tempfile.TemporaryDirectory(prefix="mcphost-bench-scale-", dir=bench_dir()) as tmp:
        base = Path(tmp)
        base.chmod(0o755)  # as /var/lib/mcphost would be: the agents' own uids pass through
        with DevCenter.start(base / "center", unix=True, control=True) as center:
            ids = [f"{arm[0]}-{i:04d}" for arm in opts.arms for i in range(max(opts.sizes))]
            ids += [f"sa-{i:03d}" for i in range(1, opts.baseline + 1)]
            reply = center.request(
                "POST", "/_devcenter/agents", {"worker_id": "w-1", "agent_ids": ids}
            )
            if reply.status != 200:
                raise RuntimeError(
                    f"binding the agents failed: {reply.status} {reply.body[:300]!r}"
                )
            if opts.baseline:
                baseline = run_baseline(center, base, opts.baseline)
            for n in opts.sizes:
                for arm in opts.arms:
                    results[arm][n] = run_arm(center, base, arm, n, keys[arm], opts.idle)
    out += [
        f"Arms: {', '.join(opts.arms)}; N = {', '.join(map(str, opts.sizes))}; baseline: "
        + (f"{baseline['n']:.0f} per-process hosts" if baseline else "none")
        + f"; idle window {opts.idle:g} s.",
        "",
        *arm_rows(results, baseline),
        "",
        "Growth, largest N ÷ smallest:",
        "",
        *growth_rows(results),
        "",
        *target_rows(results, baseline),
        "",
        "Not measured here: watched ≤ 1.05× idle (bench/operations.py, section 13) and the real "
        "clients on HTTP entries (their tests).",
        "",
        machine_line("End"),
        "",
    ]


async def section(out: list[str]) -> None:
    run(options([]), out)


if __name__ == "__main__":
    report: list[str] = []
    run(options(sys.argv[1:]), report)
    print("\n".join(report))
