"""Own uids (issue 32) against today's fence: the current tree against BENCH_BASELINE, by turns.

Under a root supervisor the current tree runs every agent as a uid of its own (`[identity]
uids`; the fence's bubblewrap as that uid where it can reach every bound path, else root's
bubblewrap switching to it with `setpriv`); the baseline (the commit before, `eb7fda8`) runs
them as root in the same fence. Both fleets here are the DEFAULT fleet (no `sandbox` and no
`user` key: fenced, `auto`), so the two arms differ only by what issue 32 changed. Every agent
is the stand-in (`mcphost/testing/standin_agent.py --hold`, the same file and interpreter in both
arms: BENCH_UIDS_AGENT_PY, default this interpreter), under a real supervisor of each tree run
through `python -m bench.fence supervise` (the spawn timed from `bench.spawn_begin`; the
baseline's bench/fence.py has the same wrapper), each against its own reference center.

1. Spawn to the first MCP answer: one supervisor per tree, one agent each; the bench restarts
   the two in turn over their control sockets (BENCH_UIDS_PAIRS pairs after one warm-up pair,
   ABBA) and times each from `bench.spawn_begin` to the agent's attach session at the
   supervisor, and to the stand-in's first answered call recorded (`calls.jsonl`: spawn, fence,
   exec, the agent's start, `initialize`, `tools/list`, one `get_my_work`).
2. PSS per agent: per round, one supervisor of each tree with N agents (BENCH_UIDS_N), order
   swapped each round; once every agent has answered, PSS (`smaps_rollup`) of each agent's whole
   tree (bubblewrap, its init, the agent, its pump) ÷ N, and the supervisor's own PSS.
3. The supervisor's CPU in the same rounds, `[metrics]` (Unix socket) and `[page]` (loopback)
   on in both: BENCH_UIDS_WINDOW seconds left alone (idle), then as long watched (`GET
   /api/fleet` every 2 s after one `GET /`, a `/metrics` scrape every 15 s: the page before its
   stream, issue 35), CPU as
   the sum of its threads' `schedstat` run time over each window.

Ratios are current / baseline per pair or per round, then median (min-max).
Criteria (issue 32): spawn <= 1.05x, PSS per agent <= 1.02x, supervisor CPU idle and watched
about 1.0x.
Run: `BENCH_BASELINE=<checkout of eb7fda8> python -m bench.own_uids` (as root: otherwise
neither tree gives agents uids of their own). Not part of `make bench`.
Where the supervisor's interpreter lies under a 0700 home (/root), an agent's own uid cannot
reach it, so the current tree takes root's bubblewrap and `setpriv` inside; with an interpreter
every uid can reach (BENCH_UIDS_PY and BENCH_UIDS_AGENT_PY, e.g. a venv under /opt holding the
project's dependencies: each tree still comes first on sys.path), its bubblewrap runs as the
agent's uid. Section 1's first line shows which (the tree's processes with their uids).
Env: BENCH_UIDS_PAIRS (30), BENCH_UIDS_N (10), BENCH_UIDS_ROUNDS (4), BENCH_UIDS_WINDOW (20),
BENCH_UIDS_PY (the supervisors' interpreter), BENCH_UIDS_AGENT_PY (the stand-in's),
BENCH_UIDS_RAW (a file: every sample, as JSON). bench/results/2026-12-07-own-uids.md holds runs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import fence
from bench.fence import Events, bench_dir, descendants, machine_line, tree_pss
from bench.metrics import scrape
from bench.supervisor import pss_mb
from bench.watching import POLL_EVERY, SCRAPE_EVERY, free_port, get, run_time

ROOT = Path(__file__).resolve().parent.parent
BASELINE = os.environ.get("BENCH_BASELINE", "")
AGENT_PY = os.environ.get("BENCH_UIDS_AGENT_PY", sys.executable)
SUPERVISOR_PY = os.environ.get("BENCH_UIDS_PY", "")
STANDIN = str(ROOT / "mcphost" / "testing" / "standin_agent.py")
PAIRS = int(os.environ.get("BENCH_UIDS_PAIRS", "30"))
N = int(os.environ.get("BENCH_UIDS_N", "10"))
ROUNDS = int(os.environ.get("BENCH_UIDS_ROUNDS", "4"))
WINDOW = float(os.environ.get("BENCH_UIDS_WINDOW", "20"))
SIDES = ("base", "cur")
RAW: dict[str, Any] = {}  # every sample, written to BENCH_UIDS_RAW (a JSON file) when it is set
EACH_VENV = "each tree's .venv"


def tree_of(side: str) -> str:
    return BASELINE if side == "base" else str(ROOT)


def python_of(tree: str) -> str:
    """The supervisors' interpreter: BENCH_UIDS_PY, else the tree's own venv's where it has one
    (its own editable install); the tree comes first on sys.path either way."""
    if SUPERVISOR_PY:
        return SUPERVISOR_PY
    own = Path(tree) / ".venv" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


class Supervisor(fence.Supervisor):
    """One supervisor of `tree` (through bench/fence.py's `supervise`) with `ids`, default
    fleet: bench/fence.py's, started from another tree (its waits, restart and stop as there)."""

    def __init__(self, center: Any, base: Path, tree: str, ids: list[str], label: str,
                 watch: bool = False) -> None:  # fmt: skip
        from mcphost.testing.fleet import fleet_toml

        self.work = Path(tempfile.mkdtemp(prefix=f"uids-{label}-", dir=base))
        self.work.chmod(0o755)  # a worker's /var/lib/mcphost: the agents' uids pass through
        self.state = self.work / "state"
        etc = self.work / "etc"
        etc.mkdir()
        token = etc / "worker.token"
        token.write_text(center.token + "\n")
        token.chmod(0o600)
        agents = [{"id": i, "command": [AGENT_PY, STANDIN, "{mcp_config}", "--hold"]} for i in ids]
        text = fleet_toml(center, token, agents, client="command", restart="never", stop_grace=5)
        self.sock, self.port = str(self.work / "m.sock"), free_port()
        if watch:
            text += (f'\n[metrics]\nlisten = "unix:{self.sock}"\n\n'
                     f'[page]\nlisten = "127.0.0.1:{self.port}"\n')  # fmt: skip
        fleet = etc / "fleet.toml"
        fleet.write_text(text)
        self.ids = ids
        self.events = Events(self.work / "supervisor.err")
        env = {**os.environ, "PYTHONPATH": tree, "MCPHOST_LOG_LEVEL": "info"}
        with self.events.path.open("wb") as err:
            self.proc = subprocess.Popen(
                [python_of(tree), "-m", "bench.fence", "supervise", "--fleet", str(fleet),
                 "--state", str(self.state)],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env,
                cwd=tree,  # `-m` puts the working directory first on sys.path: the tree's
            )  # fmt: skip


def spread(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    return (
        fmt.format(statistics.median(values))
        + f" ({fmt.format(min(values))}–{fmt.format(max(values))})"
    )


def ratios(cur: Sequence[float], base: Sequence[float]) -> list[float]:
    return [c / b for c, b in zip(cur, base, strict=True) if b]


def ratio_cell(values: Sequence[float]) -> str:
    return f"**{statistics.median(values):.3f}×** ({min(values):.3f}–{max(values):.3f})"


def uid_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    return -1


def section_spawn(centers: dict[str, Any], base: Path, out: list[str]) -> dict[str, list[float]]:
    svs = {s: Supervisor(centers[s], base, tree_of(s), [f"p-{s}"], f"p-{s}") for s in SIDES}
    seen: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
    uids: dict[str, str] = {}
    try:
        for side, sv in svs.items():
            first = sv.started_all()[f"p-{side}"]
            tree = [first["pid"], *descendants(first["pid"])]
            uids[side] = ", ".join(
                f"{Path(os.readlink(f'/proc/{p}/exe')).name}:{uid_of(p)}" for p in tree
            )
        for index in range(PAIRS + 1):
            for side in SIDES if index % 2 == 0 else SIDES[::-1]:
                spawn = svs[side].restart(f"p-{side}")
                if index > 0:
                    seen[side].append(spawn)
    finally:
        for sv in svs.values():
            sv.stop()
    rows = [
        ("spawn → first MCP answer recorded", "begin", "called"),
        ("spawn → attach session at the supervisor", "begin", "attached"),
        ("of which: wrap, fork, pre-exec, exec (to `agent_spawned`)", "begin", "spawned"),
        ("of which: `agent_spawned` → attach session", "spawned", "attached"),
    ]
    out += [
        f"### 1. Spawn, the two trees by turns ({PAIRS} pairs of restarts after one warm-up, ABBA)",
        "",
        f"Process tree (exe:uid) of the first spawn: baseline {uids['base']}; current "
        f"{uids['cur']}.",
        "",
        "| interval | baseline, median (min–max) ms | current | current ÷ baseline per pair | "
        "current − baseline, median |",
        "|---|---|---|---|---|",
    ]
    found: dict[str, list[float]] = {}
    for label, start, end in rows:
        times = {s: [(x[end] - x[start]) * 1000 for x in seen[s]] for s in SIDES}
        per = ratios(times["cur"], times["base"])
        RAW[f"spawn {start}-{end}"] = {**times, "ratios": per}
        found.setdefault("spawn", per)
        diff = statistics.median(c - b for c, b in zip(times["cur"], times["base"], strict=True))
        out.append(
            f"| {label} | {spread(times['base'])} | {spread(times['cur'])} | {ratio_cell(per)} | "
            f"{diff:+.1f} ms |"
        )
    out.append("")
    return found


def fleet_round(center: Any, base: Path, side: str) -> dict[str, Any]:
    ids = [f"f-{i:03d}" for i in range(N)]
    sv = Supervisor(center, base, tree_of(side), ids, f"f-{side}", watch=True)
    try:
        spawns = sv.started_all()
        roles: dict[str, float] = {}
        for spawn in spawns.values():
            found, _, _ = tree_pss(spawn["pid"])
            for name, mb in found.items():
                roles[name] = roles.get(name, 0.0) + mb / N
        fig: dict[str, Any] = {"pss": sum(roles.values()), "roles": roles}
        time.sleep(2.0)  # past the start's last bursts
        fig["sv_pss"] = pss_mb(sv.proc.pid)
        before = run_time(sv.proc.pid)
        time.sleep(WINDOW)
        fig["idle"] = (run_time(sv.proc.pid) - before) * 1000
        before, began = run_time(sv.proc.pid), time.monotonic()
        get(sv.port, "/")
        polls = scrapes = 0
        while (now := time.monotonic() - began) < WINDOW:
            if now >= scrapes * SCRAPE_EVERY:
                scrape(sv.sock)
                scrapes += 1
            if now >= polls * POLL_EVERY:
                get(sv.port, "/api/fleet")
                polls += 1
            time.sleep(0.02)
        fig["watched"] = (run_time(sv.proc.pid) - before) * 1000
        fig["polls"], fig["scrapes"] = polls, scrapes
        return fig
    finally:
        sv.stop()


def section_fleets(centers: dict[str, Any], base: Path, out: list[str]) -> dict[str, list[float]]:
    got: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
    for r in range(ROUNDS):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            got[side].append(fleet_round(centers[side], base, side))
    out += [
        f"### 2–3. Fleets of N = {N} by turns ({ROUNDS} rounds per tree, order swapped each "
        f"round): PSS per agent, and the supervisor's CPU over {WINDOW:.0f} s idle, then "
        f"{WINDOW:.0f} s watched",
        "",
        f"Watched: `GET /` once, `GET /api/fleet` every {POLL_EVERY:g} s "
        f"({got['cur'][0]['polls']} polls), `/metrics` every {SCRAPE_EVERY:.0f} s "
        f"({got['cur'][0]['scrapes']} scrapes).",
        "",
        "| figure | baseline, median (min–max) | current | current ÷ baseline per round |",
        "|---|---|---|---|",
    ]
    found: dict[str, list[float]] = {}
    rows = [
        ("pss", "PSS per agent (its whole tree), MB", "{:.2f}"),
        ("sv_pss", "supervisor PSS, MB", "{:.1f}"),
        ("idle", f"supervisor CPU, {WINDOW:.0f} s idle, ms", "{:.1f}"),
        ("watched", f"supervisor CPU, {WINDOW:.0f} s watched, ms", "{:.1f}"),
    ]
    for key, label, fmt in rows:
        values = {s: [g[key] for g in got[s]] for s in SIDES}
        found[key] = ratios(values["cur"], values["base"])
        RAW[key] = {**values, "ratios": found[key]}
        out.append(
            f"| {label} | {spread(values['base'], fmt)} | {spread(values['cur'], fmt)} | "
            f"{ratio_cell(found[key])} |"
        )
    for name in sorted({n for g in got["base"] + got["cur"] for n in g["roles"]}):
        values = {s: [g["roles"].get(name, 0.0) for g in got[s]] for s in SIDES}
        out.append(
            f"| of which {name}, MB per agent | {spread(values['base'], '{:.2f}')} | "
            f"{spread(values['cur'], '{:.2f}')} | |"
        )
    out.append("")
    return found


def main() -> None:
    from mcphost.testing import DevCenter

    if not BASELINE:
        raise SystemExit("BENCH_BASELINE=<checkout of the baseline commit> is needed")
    out = [
        "## Own uids against today's fence: current ÷ baseline, by turns (issue 32)",
        "",
        f"baseline `{BASELINE}` · current `{ROOT}` · supervisor uid {os.geteuid()} · "
        f"{os.cpu_count()} CPUs · supervisors' interpreter "
        f"`{SUPERVISOR_PY or EACH_VENV}` · agent interpreter `{AGENT_PY}`",
        "",
        machine_line("Start"),
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="mcphost-bench-uids-", dir=bench_dir()) as tmp:
        base = Path(tmp)
        base.chmod(0o755)  # as /var/lib/mcphost would be: the agents' own uids pass through
        centers = {}
        with (
            DevCenter.start(base / "center-base", unix=True, control=True) as centers["base"],
            DevCenter.start(base / "center-cur", unix=True, control=True) as centers["cur"],
        ):
            for side, center in centers.items():
                ids = [f"f-{i:03d}" for i in range(N)] + [f"p-{side}"]
                reply = center.request(
                    "POST", "/_devcenter/agents", {"worker_id": "w-1", "agent_ids": ids}
                )
                if reply.status != 200:
                    raise RuntimeError(f"binding the agents failed: {reply.status}")
            found = section_spawn(centers, base, out) if PAIRS else {}
            if ROUNDS:
                found |= section_fleets(centers, base, out)
    out += [machine_line("End"), ""]
    targets = {"spawn": 1.05, "pss": 1.02, "idle": None, "watched": None}
    verdicts = []
    for key, target in targets.items():
        if key in found:
            m = statistics.median(found[key])
            verdict = (
                f" ({'meets' if m <= target else 'misses'} ≤ {target}×)" if target else " (≈1.0×)"
            )
            verdicts.append(f"{key} {m:.3f}×{verdict}")
    out += ["Against the criteria (medians of the ratios): " + "; ".join(verdicts), ""]
    print("\n".join(out))
    if os.environ.get("BENCH_UIDS_RAW"):
        Path(os.environ["BENCH_UIDS_RAW"]).write_text(json.dumps(RAW, indent=1))


if __name__ == "__main__":
    main()
