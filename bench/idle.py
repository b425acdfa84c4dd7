"""Issue #35: a supervisor that costs nothing idle or watched.

One fresh `mcphost supervise` per round, with N bare agents (BENCH_IDLE_SIZES, 100 and 500): each
agent is `sh -c 'echo $$ > ready; exec sleep ...'` (no pump, no MCP session: the supervisor's
own cost, not its agents'), unfenced as root (bench/supervisor.py's `UNFENCED`), `[page]` on
127.0.0.1 and `[metrics]` on a Unix socket. Once every agent wrote its `ready` file and
BENCH_IDLE_SETTLE seconds passed, the supervisor's CPU (its threads' `schedstat` run time:
`watching.run_time`) over four windows of BENCH_IDLE_WINDOW seconds each:
- idle: nobody looks;
- a page tab open: the page is opened once (`GET /`) and its live updates followed as its
  script follows them (`Watcher`: the tree's page stream `/api/stream` held open and read, or,
  for a tree whose page still polls, `GET /api/fleet` every 2 s);
- watched: that tab still open, and `/metrics` scraped every 15 s (the issue's "watched");
- scraped: the scrapes alone, the tab closed.

Arms: this tree, and with BENCH_BASELINE (another tree's mcphost: e.g. `git archive main mcphost
configgen | tar -x -C <dir>`) that tree too, each size by turns (ABBA over rounds), each with a
center of its own. Ratios: watched / idle per round; N = largest / N = smallest; this tree /
baseline; medians over BENCH_IDLE_ROUNDS rounds (2). Targets (issue 35): idle CPU flat in N
(the largest N <= 1.2x N = 100), watched <= 1.05x idle.

Run alone: `python -m bench.idle` (`make bench` runs it as section 14);
bench/results/2026-12-07-idle.md holds a run with its machine.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.metrics import scrape
from bench.supervisor import ROOT, UNFENCED, Arm, wait_gone
from bench.watching import SCRAPE_EVERY, Watcher, free_port, has_stream, run_time

SIZES = [int(n) for n in os.environ.get("BENCH_IDLE_SIZES", "100,500").split(",")]
ROUNDS = int(os.environ.get("BENCH_IDLE_ROUNDS", "2"))
WINDOW = float(os.environ.get("BENCH_IDLE_WINDOW", "30"))
SETTLE = float(os.environ.get("BENCH_IDLE_SETTLE", "5"))
BASELINE = os.environ.get("BENCH_BASELINE", "")
BARE = ["/bin/sh", "-c", "echo $$ > ready; exec sleep 100000"]


def window(
    supervisor: int, seconds: float, watcher: Watcher | None, sock: str | None
) -> dict[str, Any]:
    """The supervisor's CPU over `seconds`, watched by `watcher`, scraped at `sock`, or left
    alone."""
    before, began = run_time(supervisor), time.monotonic()
    scrapes = 0
    while (now := time.monotonic() - began) < seconds:
        if sock is not None and now >= scrapes * SCRAPE_EVERY:
            scrape(sock)
            scrapes += 1
        if watcher is not None:
            watcher.tick(now)
        time.sleep(0.05)
    return {"cpu": run_time(supervisor) - before, "scrapes": scrapes}


def idle_round(center: Any, base: Path, tree: str, n: int) -> dict[str, Any]:
    """One fresh supervisor of `tree` with `n` bare agents: its CPU idle, then watched."""
    ids = [f"ia-{i:04d}" for i in range(1, n + 1)]
    sock, port = str(base / f"m-{os.getpid()}-{time.monotonic_ns()}.sock"), free_port()
    defaults = (*UNFENCED, "", "[metrics]", f'listen = "unix:{sock}"', "", "[page]",
                f'listen = "127.0.0.1:{port}"')  # fmt: skip
    arm = Arm(center, base, ids, True, tree=tree, defaults=defaults)
    try:
        arm.prepare(BARE)
        arm.start(BARE)
        arm.wait_ready(timeout=600)
        time.sleep(SETTLE)  # the start-up's tail (the first health probe, logs) is not idle
        assert arm.supervisor is not None
        supervisor = arm.supervisor.pid
        idle = window(supervisor, WINDOW, None, None)
        with Watcher(port, has_stream(tree)) as watcher:
            page = window(supervisor, WINDOW, watcher, None)
            watched = window(supervisor, WINDOW, watcher, sock)
        scraped = window(supervisor, WINDOW, None, sock)
        arm.check_alive()
        return {
            "idle": idle["cpu"] / WINDOW,
            "page": page["cpu"] / WINDOW,
            "scraped": scraped["cpu"] / WINDOW,
            "watched": watched["cpu"] / WINDOW,
            "messages": watcher.messages,
            "polls": watcher.polls,
            "scrapes": watched["scrapes"],
            "threads": len(os.listdir(f"/proc/{supervisor}/task")),
        }
    finally:
        pids = (
            arm.agent_pids()
            if all(arm.workspace(a).joinpath("ready").exists() for a in ids)
            else []
        )
        arm.stop()
        wait_gone(pids)


def median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def ratio(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], ka: str, kb: str) -> float:
    """The median of per-round ratios a[ka] / b[kb]."""
    return statistics.median(a[ka] / b[kb] for a, b in zip(rows_a, rows_b, strict=True) if b[kb])


def mark(value: float, target: float) -> str:
    return f"{value:.2f}x " + ("(met)" if value <= target else "(**over**)")


def measure(out: list[str]) -> None:
    from mcphost.testing import DevCenter

    trees = {"this tree": str(ROOT), **({"baseline": BASELINE} if BASELINE else {})}
    seen: dict[tuple[str, int], list[dict[str, Any]]] = {(t, n): [] for t in trees for n in SIZES}
    with contextlib.ExitStack() as stack:
        base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bidle-", dir="/tmp")))
        centers = {}
        ids = [f"ia-{i:04d}" for i in range(1, max(SIZES) + 1)]
        for name in trees:  # a center per tree: each numbers its generations its own way
            center = stack.enter_context(
                DevCenter.start(base / f"center-{len(centers)}", unix=True, control=True)
            )
            reply = center.request(
                "POST", "/_devcenter/agents", {"worker_id": "w-1", "agent_ids": ids}
            )
            if reply.status != 200:
                raise RuntimeError(f"binding the agents failed: {reply.status}")
            centers[name] = center
        arms = [(t, n) for n in SIZES for t in trees]
        for index in range(ROUNDS):
            for name, n in arms if index % 2 == 0 else arms[::-1]:
                figures = idle_round(centers[name], base, trees[name], n)
                print(f"idle: {name} N={n}: {figures}", file=sys.stderr, flush=True)
                seen[(name, n)].append(figures)
    small, large = min(SIZES), max(SIZES)
    out += [
        f"### 14. The supervisor idle and watched ({ROUNDS} rounds, {WINDOW:.0f} s windows, "
        f"bare agents, arms by turns)",
        "",
        "| tree | N | idle CPU | a page tab open | scraped every 15 s | watched (both) | watched / idle (target <= 1.05) | page messages / polls, scrapes per window |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for (name, n), rows in seen.items():
        out.append(
            f"| {name} | {n} | {median(rows, 'idle') * 1e3:.2f} ms/s | "
            f"{median(rows, 'page') * 1e3:.2f} ms/s | {median(rows, 'scraped') * 1e3:.2f} ms/s | "
            f"{median(rows, 'watched') * 1e3:.2f} ms/s | "
            f"{mark(ratio(rows, rows, 'watched', 'idle'), 1.05)} | "
            f"{median(rows, 'messages'):.0f} / {median(rows, 'polls'):.0f}, "
            f"{median(rows, 'scrapes'):.0f} |"
        )
    out += ["", f"| tree | idle N = {large} / N = {small} (target <= 1.2) | a tab open / idle, N = {small} | scraped / idle, N = {small} | watched N = {large} / N = {small} |", "|---|---|---|---|---|"]  # fmt: skip
    for name in trees:
        a, b = seen[(name, large)], seen[(name, small)]
        out.append(
            f"| {name} | {mark(ratio(a, b, 'idle', 'idle'), 1.2)} | "
            f"{ratio(b, b, 'page', 'idle'):.2f}x | {ratio(b, b, 'scraped', 'idle'):.2f}x | "
            f"{ratio(a, b, 'watched', 'watched'):.2f}x |"
        )
    if BASELINE:
        out += ["", "| N | idle: this tree / baseline | watched: this tree / baseline |", "|---|---|---|"]  # fmt: skip
        for n in SIZES:
            a, b = seen[("this tree", n)], seen[("baseline", n)]
            out.append(
                f"| {n} | {ratio(a, b, 'idle', 'idle'):.3f}x | "
                f"{ratio(a, b, 'watched', 'watched'):.3f}x |"
            )
    out.append("")


async def section(out: list[str]) -> None:
    measure(out)


if __name__ == "__main__":
    import asyncio

    report: list[str] = []
    asyncio.run(section(report))
    print("\n".join(report))
