"""The metrics endpoint's cost (issue #27 part 3): the supervisor with `[metrics]` on and off, N = 100.

Rounds alternate the two arms (order swapped each round), each a fresh `mcphost supervise` of
N driver agents (bench/supervisor.py's `Arm` and driver: each attaches, makes one
`get_my_work`, then waits at a FIFO barrier; unfenced, as section 9's):
- the supervisor's PSS and CPU once every agent's call is recorded (start-up), then its CPU per
  1000 calls during the burst (every agent makes BENCH_SV_BURST_CALLS calls on its session:
  with metrics on, each is also counted and timed for `/metrics`);
- with metrics on, after the burst: BENCH_METRICS_SCRAPES sequential scrapes of `/metrics`
  over its Unix socket, timed from the request to the last byte, and the supervisor's CPU per
  scrape; the exposition's size and series count.
Ratios are on / off, medians of per-round ratios (target <= 1.05).
Run alone with `python -m bench.metrics` (metrics alone, on / off). `make bench` does not run it:
its section 13 (bench/operations.py) measures the same fleet with metrics and the fleet page
together on and off, and times the scrape with this module's `scrape`; one N = 100 run of each
arm is enough for a `make bench`.
Env: BENCH_METRICS_N (100), BENCH_METRICS_ROUNDS (2), BENCH_METRICS_SCRAPES (50).
"""

from __future__ import annotations

import http.client
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.supervisor import (
    BURST_CALLS,
    PY,
    THIS,
    UNFENCED,
    Arm,
    avail_mb,
    check_calls,
    cpu_seconds,
    pss_mb,
    run_burst,
)

N = int(os.environ.get("BENCH_METRICS_N", "100"))
ROUNDS = int(os.environ.get("BENCH_METRICS_ROUNDS", "2"))
SCRAPES = int(os.environ.get("BENCH_METRICS_SCRAPES", "50"))


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=60)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.unix_path)


def scrape(path: str) -> tuple[float, bytes]:
    """One `GET /metrics`: seconds from the request to the last byte, and the body."""
    conn = _UnixHTTP(path)
    try:
        started = time.perf_counter()
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read()
        took = time.perf_counter() - started
    finally:
        conn.close()
    if response.status != 200:
        raise RuntimeError(f"/metrics answered {response.status}: {body[:300]!r}")
    return took, body


def one_round(center: Any, base: Path, on: bool) -> dict[str, Any]:
    ids = [f"sv-{i:03d}" for i in range(1, N + 1)]
    arm = Arm(center, base, ids, True, defaults=UNFENCED)
    sock = str(arm.dir / "metrics.sock")
    if on:
        arm.defaults = (*UNFENCED, "", "[metrics]", f'listen = "unix:{sock}"')
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
        figures: dict[str, Any] = {"pss": pss_mb(supervisor), "cpu": cpu_seconds(supervisor)}
        burst = run_burst(center, arm, fifo, servers, agents)
        figures["burst_cpu"] = burst["cpu"]["supervisor"]  # CPU-s per 1000 calls
        figures["pss_after"] = pss_mb(supervisor)
        if on:
            before = cpu_seconds(supervisor)
            times, body = [], b""
            for _ in range(SCRAPES):
                took, body = scrape(sock)
                times.append(took)
            figures["scrape_cpu"] = (cpu_seconds(supervisor) - before) / SCRAPES
            figures["scrapes"] = times
            figures["bytes"] = len(body)
            figures["series"] = sum(
                1 for line in body.decode().splitlines() if line and not line.startswith("#")
            )
        return figures
    finally:
        arm.stop()


def _ratio(on: list[dict[str, Any]], off: list[dict[str, Any]], key: str) -> str:
    ratios = [a[key] / b[key] for a, b in zip(on, off, strict=True) if b[key]]
    return f"{statistics.median(ratios):.3f}x" if ratios else "n/a"


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(row[key] for row in rows)


async def section(out: list[str]) -> None:
    from bench.harness import Stats
    from mcphost.testing import DevCenter

    seen: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="mcphost-bench-m-", dir="/tmp") as tmp:
        base = Path(tmp)
        with DevCenter.start(base / "center", unix=True, control=True) as center:
            ids = [f"sv-{i:03d}" for i in range(1, N + 1)]
            reply = center.request(
                "POST", "/_devcenter/agents", {"worker_id": "w-1", "agent_ids": ids}
            )
            if reply.status != 200:
                raise RuntimeError(f"binding the agents failed: {reply.status}")
            for index in range(ROUNDS):
                for on in (True, False) if index % 2 == 0 else (False, True):
                    seen[on].append(one_round(center, base, on))
    on, off = seen[True], seen[False]
    scrapes = Stats.of([t for row in on for t in row["scrapes"]])
    out += [
        f"## 12. Metrics: the supervisor with `[metrics]` on and off, N = {N} "
        f"({ROUNDS} rounds each, alternating; {os.cpu_count()} CPUs, {avail_mb()} MB available)",
        "",
        "| figure (the supervisor process) | metrics off | metrics on | on / off (median of "
        "per-round ratios; target <= 1.05) |",
        "|---|---|---|---|",
        f"| PSS once every agent's call is recorded | {_median(off, 'pss'):.1f} MB | "
        f"{_median(on, 'pss'):.1f} MB | {_ratio(on, off, 'pss')} |",
        f"| PSS after the burst | {_median(off, 'pss_after'):.1f} MB | "
        f"{_median(on, 'pss_after'):.1f} MB | {_ratio(on, off, 'pss_after')} |",
        f"| CPU for the fleet's start-up | {_median(off, 'cpu'):.2f} s | "
        f"{_median(on, 'cpu'):.2f} s | {_ratio(on, off, 'cpu')} |",
        f"| CPU per 1000 center calls (burst: {N} x {BURST_CALLS}) | "
        f"{_median(off, 'burst_cpu'):.3f} s | {_median(on, 'burst_cpu'):.3f} s | "
        f"{_ratio(on, off, 'burst_cpu')} |",
        "",
        f"Scrape at N = {N} ({SCRAPES} sequential scrapes per round over the Unix socket, "
        f"request to last byte): {scrapes.fmt()}, p99 {scrapes.p99 * 1e3:.2f} ms; the "
        f"supervisor's CPU per scrape {_median(on, 'scrape_cpu') * 1e3:.2f} ms; "
        f"{int(_median(on, 'bytes'))} bytes, {int(_median(on, 'series'))} series.",
        "",
    ]


if __name__ == "__main__":
    import asyncio

    report: list[str] = []
    asyncio.run(section(report))
    print("\n".join(report))
