"""Lifecycle and fault timings: the figures the test suite used to assert as wall-time bounds.

The tests (tests/hardening/test_lifecycle.py, test_faults.py, tests/blackbox/test_process.py)
prove each behaviour by its condition (the answer arrives, the process exits 0, the code is
`admin_unavailable`, the fast calls are answered before the slow one), which holds however busy
the machine is. How long each takes is a measurement, so it lives here, as medians next to the
bound SECURITY.md used to quote.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import RawMcp, Stats
from mcphost.testing import DevCenter

RUNS = int(os.environ.get("BENCH_LIFECYCLE_RUNS", "5"))
HOST = [sys.executable, "-m", "mcphost.cli", "host"]
WORK = "/admin/agent-tools/get_my_work"


def _count(center: DevCenter) -> int:
    return sum(1 for entry in center.requests(1000) if entry.get("route") == WORK)


async def _arrived(center: DevCenter, before: int) -> None:
    while _count(center) <= before:
        await asyncio.sleep(0.005)


async def _exit_with_call_in_flight(center: DevCenter, how: str) -> float:
    """Seconds from EOF / the signal to the host's exit, with a call held by the center."""
    server = RawMcp(HOST, center.binding_env("unix"))
    await server.start()
    assert server.proc is not None and server.proc.stdin is not None
    before = _count(center)
    pending = asyncio.ensure_future(
        server.request("tools/call", {"name": "get_my_work", "arguments": {}})
    )
    await _arrived(center, before)
    started = time.perf_counter()
    if how == "eof":
        server.proc.stdin.close()
    else:
        server.proc.send_signal(getattr(signal, how))
    await server.proc.wait()
    took = time.perf_counter() - started
    await asyncio.gather(pending, return_exceptions=True)  # the answer (EOF) or stdout closed
    await server.close()
    return took


async def _dead_center_noticed(center: DevCenter) -> float:
    """Seconds from SIGKILL of the center to the host's `admin_unavailable` for the call."""
    server = RawMcp(HOST, center.binding_env("unix"))
    await server.start()
    await server.request("tools/call", {"name": "get_my_work", "arguments": {}})  # warm pool
    center.set_faults(delay_ms={"get_my_work": 60_000})
    before = _count(center)
    pending = asyncio.ensure_future(
        server.request("tools/call", {"name": "get_my_work", "arguments": {}})
    )
    await _arrived(center, before)
    assert center.pid is not None
    started = time.perf_counter()
    os.kill(center.pid, signal.SIGKILL)
    answer = await pending
    took = time.perf_counter() - started
    assert "admin_unavailable" in str(answer), answer
    await server.close()
    center.restart()
    return took


async def _fast_calls_beside_a_slow_one(center: DevCenter) -> float:
    """Seconds for 30 calls on a host whose center holds another call for 6 s."""
    env = {**center.binding_env("unix"), "MCPHOST_CALL_TIMEOUT_SECONDS": "3"}
    server = RawMcp(HOST, env)
    await server.start()
    with center.faults(delay_ms={"get_task": 6000}):
        slow = asyncio.ensure_future(
            server.request("tools/call", {"name": "get_task", "arguments": {"task_id": "t-1"}})
        )
        started = time.perf_counter()
        await asyncio.gather(*(server.call("get_my_work", {}) for _ in range(30)))
        took = time.perf_counter() - started
        await slow
    await server.close()
    return took


async def section(out: list[str]) -> None:
    rows: list[tuple[str, str, list[float]]] = []
    with (
        tempfile.TemporaryDirectory(prefix="mcphost-bench-life-") as tmp,
        DevCenter.start(Path(tmp), unix=True, control=True) as center,
    ):
        with center.faults(delay_ms={"get_my_work": 200}):
            eof = [await _exit_with_call_in_flight(center, "eof") for _ in range(RUNS)]
        rows.append(("EOF with a call in flight (200 ms at the center) → exit 0", "1.5 s", eof))
        with center.faults(delay_ms={"get_my_work": 5000}):
            for sig in ("SIGTERM", "SIGINT", "SIGHUP"):
                took = [await _exit_with_call_in_flight(center, sig) for _ in range(RUNS)]
                rows.append(
                    (f"{sig} with a call in flight (5 s at the center) → exit 0", "1.2 s", took)
                )
        dead = [await _dead_center_noticed(center) for _ in range(RUNS)]
        rows.append(("center SIGKILLed mid-call → `admin_unavailable`", "2 s", dead))
        fast = [await _fast_calls_beside_a_slow_one(center) for _ in range(max(1, RUNS // 2))]
        rows.append(("30 calls while one call waits on a 6 s center", "1.5 s", fast))
    out += [
        f"## 7. Lifecycle and faults ({RUNS} runs each; the suite proves these by condition)",
        "",
        "| what | median (IQR) | bound the suite used to assert |",
        "|---|---|---|",
    ]
    out += [
        f"| {label} | {Stats.of(samples).fmt()} | < {bound} |" for label, bound, samples in rows
    ]
    out.append("")


if __name__ == "__main__":
    report: list[str] = []
    asyncio.run(section(report))
    print("\n".join(report))
