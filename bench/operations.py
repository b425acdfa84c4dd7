"""Issue #27's operating costs in one run: metrics and the fleet page on against off, the scrape
at N = 100, and spawn time with per-agent cgroups against without.

1. The supervisor at N agents (BENCH_OPS_N, 100), by turns in fresh `mcphost supervise` runs
   (bench/supervisor.py's `Arm` and driver agents, unfenced as there: each attaches, makes one
   `get_my_work`, waits at a FIFO barrier): arm `off` (neither `[metrics]` nor `[page]`), arm
   `on` (both: metrics on a Unix socket, the page on 127.0.0.1), and with BENCH_BASELINE
   (another tree's mcphost, as bench/__main__.py says) arm `baseline`, that tree with neither.
   Per round, of the supervisor process alone (utime + stime; `smaps_rollup` PSS):
   - start-up: CPU and PSS once every agent's call is recorded;
   - burst: CPU per 1000 center calls while every agent makes BENCH_SV_BURST_CALLS calls;
   - steady state: CPU (here its threads' `schedstat` run time, to the nanosecond: `run_time`)
     over BENCH_OPS_WINDOW seconds (30) after the burst, during which the `on`
     arm is looked at as an operator would: an open browser tab (bench/watching.py's `Watcher`: the
     page fetched once, then its live updates as its script follows them: the page's stream
     held open, or `GET /api/fleet` every 2 s for a tree whose page polls) and a
     `/metrics` scrape every 15 s (Prometheus' usual interval); the others are left alone;
   - PSS at the end of the window, and the total CPU of the run.
   Ratios are medians of per-round ratios (rounds alternate the arms' order). Target on / off
   <= 1.05.
2. Scrape and page poll at N (after the window, arm `on`): BENCH_OPS_SCRAPES sequential
   `/metrics` scrapes and as many `/api/fleet` polls, each timed from the request to the last
   byte; the supervisor's CPU per request (`run_time`). Requests within `operations.USAGE_SAMPLE_SECONDS` share
   one usage sample (and the page's JSON and the metrics' text are rebuilt only when the status
   changed), so these are mostly requests between two samples; what the samples add is in the
   window's figure of 1 (on - off), which the summary line reports per second.
3. Spawn with cgroups against without: bench/cgroups.py's figure (a bare interpreter start, the
   worst case), then a real fenced agent: two supervisors (bench/fence.py's wrapper, which times
   a spawn from `bench.spawn_begin`), one with per-agent groups and one with the backend forced
   to `none` (BENCH_NO_CGROUPS), each with one `sandbox = "auto"` stand-in agent; the bench
   restarts the two in turn (BENCH_OPS_SPAWN_PAIRS pairs after one warm-up pair, ABBA) and
   times each spawn to the agent's attach session reaching the supervisor and to its first
   center call recorded.

Run alone: `python -m bench.operations` (BENCH_BASELINE=<dir> for the baseline arm); `make bench`
runs it as section 13. BENCH_OPS_PARTS (a comma list of `fleet` (1 and 2), `cgroups` and `spawn`
(3); default all) runs only those: `BENCH_OPS_PARTS=cgroups,spawn` measures spawn alone. bench/results/2026-12-05-operations.md holds a run with its machine.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.metrics import scrape
from bench.supervisor import (
    BURST_CALLS,
    PY,
    ROOT,
    THIS,
    UNFENCED,
    Arm,
    avail_mb,
    check_calls,
    cpu_seconds,
    pss_mb,
    run_burst,
)
from bench.watching import POLL_EVERY, SCRAPE_EVERY, Watcher, free_port, get, has_stream, run_time

N = int(os.environ.get("BENCH_OPS_N", "100"))
ROUNDS = int(os.environ.get("BENCH_OPS_ROUNDS", "2"))
WINDOW = float(os.environ.get("BENCH_OPS_WINDOW", "30"))
SCRAPES = int(os.environ.get("BENCH_OPS_SCRAPES", "30"))
PAIRS = int(os.environ.get("BENCH_OPS_SPAWN_PAIRS", "8"))
BASELINE = os.environ.get("BENCH_BASELINE", "")
PARTS = ("fleet", "cgroups", "spawn")
ONLY = frozenset(p.strip() for p in os.environ.get("BENCH_OPS_PARTS", ",".join(PARTS)).split(","))


def fleet_round(center: Any, base: Path, arm_name: str) -> dict[str, Any]:
    """One fresh supervisor of arm `arm_name` (off, on, baseline): module doc, 1 and 2."""
    ids = [f"sv-{i:03d}" for i in range(1, N + 1)]
    tree = BASELINE if arm_name == "baseline" else str(ROOT)
    arm = Arm(center, base, ids, True, tree=tree, defaults=UNFENCED)
    sock, port = str(arm.dir / "metrics.sock"), free_port()
    if arm_name == "on":
        arm.defaults = (
            *UNFENCED,
            "",
            "[metrics]",
            f'listen = "unix:{sock}"',
            "",
            "[page]",
            f'listen = "127.0.0.1:{port}"',
        )
    fifo = str(arm.dir / "go")
    os.mkfifo(fifo)
    command = [PY, "-I", "-S", THIS, "agent", "{mcp_config}", fifo, str(BURST_CALLS)]
    try:
        arm.prepare(command)
        arm.start(command)
        arm.wait_ready()
        check_calls(arm)
        servers, agents = arm.servers(), arm.agent_pids()
        supervisor = servers[0]
        fig: dict[str, Any] = {
            "start_cpu": cpu_seconds(supervisor),
            "start_pss": pss_mb(supervisor),
        }
        fig["burst_cpu"] = run_burst(center, arm, fifo, servers, agents)["cpu"]["supervisor"]

        before, began = run_time(supervisor), time.monotonic()
        scrapes = 0
        with contextlib.ExitStack() as tab:
            watcher = None
            if arm_name == "on":  # the tab is opened once; its script then follows it
                watcher = tab.enter_context(Watcher(port, has_stream(tree)))
            while (now := time.monotonic() - began) < WINDOW:
                if watcher is not None:
                    if now >= scrapes * SCRAPE_EVERY:
                        scrape(sock)
                        scrapes += 1
                    watcher.tick(now)
                time.sleep(0.02)
        polls = watcher.polls + watcher.messages if watcher is not None else 0
        fig["window_cpu"] = run_time(supervisor) - before
        fig["end_pss"] = pss_mb(supervisor)
        fig["total_cpu"] = cpu_seconds(supervisor)
        fig["polls"], fig["scrapes"] = polls, scrapes
        if arm_name == "on":
            for key, call in (
                ("scrape", lambda: scrape(sock)[0]),
                ("poll", lambda: get(port, "/api/fleet")),
            ):
                cpu0, times = run_time(supervisor), []
                for _ in range(SCRAPES):
                    times.append(call())
                fig[f"{key}_times"] = times
                fig[f"{key}_cpu"] = (run_time(supervisor) - cpu0) / SCRAPES
            body = scrape(sock)[1].decode()
            fig["bytes"] = len(body)
            fig["series"] = sum(1 for ln in body.splitlines() if ln and not ln.startswith("#"))
        return fig
    finally:
        arm.stop()


def per_round(a: list[dict[str, Any]], b: list[dict[str, Any]], key: str) -> float | None:
    ratios = [x[key] / y[key] for x, y in zip(a, b, strict=True) if y[key]]
    return statistics.median(ratios) if ratios else None


def cell(value: float | None, target: float | None = None) -> str:
    if value is None:
        return "n/a"
    mark = "" if target is None else (" (met)" if value <= target else " (**over**)")
    return f"{value:.3f}x{mark}"


def section_fleet(out: list[str]) -> None:
    from bench.harness import Stats
    from mcphost.testing import DevCenter

    arms = ["off", "on", *(["baseline"] if BASELINE else [])]
    seen: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    with contextlib.ExitStack() as stack:
        base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bops-", dir="/tmp")))
        ids = [f"sv-{i:03d}" for i in range(1, N + 1)]
        centers = {}
        # a center per tree: a tree numbers its generations its own way, and a center that has
        # seen one tree's would fence the other's (`stale_generation`; bench/before_after.py)
        for tree in {"current", *(["baseline"] if BASELINE else [])}:
            center = stack.enter_context(
                DevCenter.start(base / f"center-{tree}", unix=True, control=True)
            )
            reply = center.request(
                "POST", "/_devcenter/agents", {"worker_id": "w-1", "agent_ids": ids}
            )
            if reply.status != 200:
                raise RuntimeError(f"binding the agents failed: {reply.status}")
            centers[tree] = center
        for index in range(ROUNDS):
            for arm in arms if index % 2 == 0 else arms[::-1]:
                center = centers["baseline" if arm == "baseline" else "current"]
                seen[arm].append(fleet_round(center, base, arm))
    on, off = seen["on"], seen["off"]
    keys = (
        ("start_pss", "PSS once every agent's call is recorded", "MB", 1),
        ("end_pss", f"PSS at the end of the {WINDOW:.0f} s window", "MB", 1),
        ("start_cpu", "CPU for the fleet's start-up", "s", 2),
        ("burst_cpu", f"CPU per 1000 center calls (burst: {N} x {BURST_CALLS})", "s", 3),
        ("window_cpu", f"CPU over the {WINDOW:.0f} s window (on: a page tab open, scraped every 15 s)", "s", 3),
        ("total_cpu", "CPU for the whole run (start-up + burst + window)", "s", 2),
    )  # fmt: skip

    def med(rows: list[dict[str, Any]], key: str, digits: int) -> str:
        return f"{statistics.median(r[key] for r in rows):.{digits}f}"

    head = "| figure (the supervisor process) | off | on | on / off (target <= 1.05) |"
    rule = "|---|---|---|---|"
    if BASELINE:
        head += " baseline | off / baseline | on / baseline |"
        rule += "---|---|---|"
    out += [
        f"### 13.1 The supervisor at N = {N}: metrics and page off, on{', baseline' if BASELINE else ''} "
        f"({ROUNDS} rounds each, arms by turns)",
        "",
        head,
        rule,
    ]
    for key, label, unit, digits in keys:
        row = (
            f"| {label} | {med(off, key, digits)} {unit} | {med(on, key, digits)} {unit} | "
            f"{cell(per_round(on, off, key), 1.05)} |"
        )
        if BASELINE:
            bl = seen["baseline"]
            row += (
                f" {med(bl, key, digits)} {unit} | {cell(per_round(off, bl, key))} | "
                f"{cell(per_round(on, bl, key))} |"
            )
        out.append(row)
    polls, scrapes = (
        Stats.of([t for r in on for t in r["poll_times"]]),
        Stats.of([t for r in on for t in r["scrape_times"]]),
    )
    per_poll = statistics.median(r["poll_cpu"] for r in on)
    per_scrape = statistics.median(r["scrape_cpu"] for r in on)
    requests = per_poll / POLL_EVERY + per_scrape / SCRAPE_EVERY
    looked = statistics.median(
        (x["window_cpu"] - y["window_cpu"]) / WINDOW for x, y in zip(on, off, strict=True)
    )
    idle = statistics.median(r["window_cpu"] for r in off) / WINDOW
    out += [
        "",
        f"In the window the `on` arm served {on[0]['polls']} page polls or stream messages and {on[0]['scrapes']} "
        "scrapes per round; the others served nothing.",
        "",
        f"### 13.2 Scrape and page poll at N = {N} ({SCRAPES} sequential requests each per round, "
        "after the window; request to last byte)",
        "",
        "| request | median (IQR) | p99 | the supervisor's CPU per request |",
        "|---|---|---|---|",
        f"| `GET /metrics` (Unix socket) | {scrapes.fmt()} | {scrapes.p99 * 1e3:.2f} ms | "
        f"{per_scrape * 1e3:.2f} ms |",
        f"| `GET /api/fleet` (the page's poll) | {polls.fmt()} | {polls.p99 * 1e3:.2f} ms | "
        f"{per_poll * 1e3:.2f} ms |",
        "",
        f"The exposition: {int(statistics.median(r['bytes'] for r in on))} bytes, "
        f"{int(statistics.median(r['series'] for r in on))} series. Being looked at (one open "
        f"page tab and a 15 s scrape) costs the supervisor {looked * 1e3:.2f} ms of CPU per "
        f"second at N = {N} (the window's on - off, per round: {looked * 100:.3f}% of one CPU; "
        f"the requests alone, at the per-request CPU above: {requests * 1e3:.2f} ms/s); left "
        f"alone (`off`) it uses {idle * 1e3:.2f} ms/s.",
        "",
    ]


def section_spawn(out: list[str]) -> None:
    from bench.fence import Supervisor
    from bench.harness import Stats
    from mcphost.supervisor.confine import cgroups as cg
    from mcphost.testing import DevCenter
    from mcphost.testing.fleet import standin

    title = "### 13.4 A real fenced agent's spawn with its cgroup against without"
    backend = cg.detect()
    if backend.kind == "none":
        out += [title, "", f"skipped: no usable cgroup backend ({backend.reason})", ""]
        return
    arms = {"with": {}, "without": {"BENCH_NO_CGROUPS": "1"}}
    seen: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    with (
        tempfile.TemporaryDirectory(prefix="bops-sp-", dir="/tmp") as tmp,
        DevCenter.start(Path(tmp) / "center", unix=True, control=True) as center,
    ):
        ids = [f"cg-{arm}" for arm in arms]
        reply = center.request("POST", "/_devcenter/agents", {"worker_id": "w-1", "agent_ids": ids})
        if reply.status != 200:
            raise RuntimeError(f"binding the agents failed: {reply.status}")
        supervisors: dict[str, Supervisor] = {}
        try:
            for arm, env in arms.items():
                agent = {"id": f"cg-{arm}", "command": standin("--hold"), "sandbox": "auto"}
                supervisors[arm] = Supervisor(center, Path(tmp), [agent], f"cg-{arm}", env=env)
            for sv in supervisors.values():
                sv.started_all()
            for index in range(PAIRS + 1):
                for arm in list(arms) if index % 2 == 0 else list(arms)[::-1]:
                    spawn = supervisors[arm].restart(f"cg-{arm}")
                    if index > 0:  # the first pair warms both up
                        seen[arm].append(spawn)
        finally:
            for sv in supervisors.values():
                sv.stop()
    rows = []
    for key, label in (
        ("attached", "to its attach session"),
        ("called", "to its first center call"),
    ):
        per = {arm: [s[key] - s["begin"] for s in seen[arm]] for arm in arms}
        ratios = [w / o for w, o in zip(per["with"], per["without"], strict=True)]
        a, b = Stats.of(per["with"]), Stats.of(per["without"])
        rows.append(
            f"| spawn {label} | {b.fmt()} | {a.fmt()} | {statistics.median(ratios):.3f}x "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f}) | {(a.median - b.median) * 1e3:+.1f} ms |"
        )
    out += [
        title,
        "",
        f'One `sandbox = "auto"` stand-in per supervisor (backend {backend.kind} against `none`), '
        f"restarted by turns, {PAIRS} pairs after a warm-up pair; from `bench.spawn_begin` "
        "(before the group is made and the child forked).",
        "",
        "| spawn | without a group | in its group | with / without (per pair; target <= 1.2x) "
        "| added (medians) |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]


async def section(out: list[str]) -> None:
    import bench.cgroups

    load = os.getloadavg()
    out += [
        "## 13. Operating costs (issue #27): metrics and page, the scrape, spawn with cgroups",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {os.cpu_count()} CPUs · "
        f"{avail_mb()} MB available · load average at start {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f}" + (f" · baseline `{BASELINE}`" if BASELINE else " · no BENCH_BASELINE"),
        "",
    ]
    if ONLY - set(PARTS):
        raise SystemExit(f"BENCH_OPS_PARTS: expected a comma list of {', '.join(PARTS)}")
    if "fleet" in ONLY:
        section_fleet(out)
    if "cgroups" in ONLY:
        cg_out: list[str] = []
        await bench.cgroups.section(cg_out)
        cg_out[0] = "### 13.3 Spawn time with per-agent cgroups against without (bench/cgroups.py)"
        out += cg_out
    if "spawn" in ONLY:
        section_spawn(out)
    load = os.getloadavg()
    out += [f"Load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.", ""]


if __name__ == "__main__":
    import asyncio

    report: list[str] = []
    asyncio.run(section(report))
    print("\n".join(report))
