"""`make bench`: start-up, per-call latency (Unix and TLS), peers, concurrency, files, relay
(tools, real relay, an ACP member against a tmux member), lifecycle, attach, supervisor, fence,
operations, and the supervisor idle and watched (bench/idle.py).

Prints one markdown report and writes it to bench/results/latest.md. Every figure is a median
with its interquartile range, next to a baseline measured in the same run, and a ratio.

`BENCH_BASELINE=<dir holding another mcphost package>` adds that host (e.g. an export of an
older commit: `git archive <rev> mcphost configgen | tar -x -C <dir>`) to the start-up and
per-call tables, with before/after ratios, and runs section 11 (bench/before_after.py): host
start-up and per-call (Unix, TLS), the supervised relay tools' `send` / `look` and center calls,
and the supervisor's memory with N agents, each tree by turns in the same run; and adds that
tree's supervisor as a third arm to section 13 (bench/operations.py: metrics and the fleet page
on and off at N = 100, the scrape, spawn time with cgroups against without).

Section 14 (bench/scale.py) runs N = 100 and 1000 fenced agents under one supervisor (bare, over
pumps, over HTTP where the installed mcphost has it) against per-process hosts at N = 100,
extrapolated; BENCH_SCALE_* (its docstring) narrow it.
"""

from __future__ import annotations

import asyncio
import os
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.harness import RawMcp, Stats, peak_rss_mb, time_calls
from mcphost.testing import DevCenter

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "latest.md"
STARTUP_RUNS = int(os.environ.get("BENCH_STARTUP_RUNS", "10"))
CALLS = int(os.environ.get("BENCH_CALLS", "300"))
PY = sys.executable
BASELINE = os.environ.get("BENCH_BASELINE", "")

Report = list[str]


def server_argv(kind: str) -> list[str]:
    return {
        "host": [PY, "-m", "mcphost.cli", "host"],
        "sdk-hello": [PY, "-m", "bench.peers.hello_sdk"],
        "floor": [PY, "-m", "bench.peers.floor"],
        "naive-bridge": [PY, "-m", "bench.peers.naive_bridge"],
        "openapi-peer": [PY, "-m", "bench.peers.openapi_peer"],
        "host-baseline": [
            PY,
            "-c",
            f"import sys; sys.path.insert(0, {BASELINE!r}); "
            "from mcphost.cli import main; sys.exit(main(['host']))",
        ],
    }[kind]


async def startup(
    kind: str, env: dict[str, str], call: tuple[str, dict[str, Any]] | None
) -> tuple[Stats, Stats]:
    """Spawn -> initialize reply, and peak RSS (after one call when `call` is given)."""
    times, rss = [], []
    for _ in range(STARTUP_RUNS):
        server = RawMcp(server_argv(kind), env)
        times.append(await server.start())
        if call is not None:
            await server.call(*call)
        rss.append(peak_rss_mb(server.pid) / 1000)
        await server.close()
    return Stats.of(times), Stats.of(rss)


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}×" if base else "n/a"


async def section_startup(center: DevCenter, task_id: str, out: Report) -> None:
    env = center.binding_env("unix")
    rows = [
        ("python floor (reads one line, answers)", "floor", None),
        ("SDK hello-world MCPServer", "sdk-hello", None),
        ("mcphost host", "host", None),
        ("mcphost host, after one tools/call", "host", ("get_task", {"task_id": task_id})),
        (
            "naive MCPServer bridge, after one call",
            "naive-bridge",
            ("get_task", {"task_id": task_id}),
        ),
        (
            "FastMCP from_openapi peer, after one call",
            "openapi-peer",
            ("get_task", {"agent_id": center.agent_id, "task_id": task_id}),
        ),
    ]
    if BASELINE:
        rows[3:3] = [
            ("baseline host (BENCH_BASELINE)", "host-baseline", None),
            (
                "baseline host, after one tools/call",
                "host-baseline",
                ("get_task", {"task_id": task_id}),
            ),
        ]
    measured = {}
    for label, kind, call in rows:
        measured[label] = await startup(kind, env, call)
    sdk_time, sdk_rss = measured["SDK hello-world MCPServer"]
    out += [
        "## 1. Start-up (spawn → first `initialize` reply) and peak RSS, with peers (3)",
        "",
        "| server | start-up | vs SDK hello | peak RSS | vs SDK hello |",
        "|---|---|---|---|---|",
    ]
    for label, (t, r) in measured.items():
        out.append(
            f"| {label} | {t.fmt()} | {ratio(t.median, sdk_time.median)} | "
            f"{r.median * 1000:.1f} MB | {ratio(r.median, sdk_rss.median)} |"
        )
    out.append("")
    if BASELINE:
        out += ["| before → after (baseline host → host) | start-up | peak RSS |", "|---|---|---|"]
        for suffix in ("", ", after one tools/call"):
            old_t, old_r = measured[f"baseline host{suffix or ' (BENCH_BASELINE)'}"]
            new_t, new_r = measured[f"mcphost host{suffix}"]
            out.append(
                f"| host{suffix} | {ratio(new_t.median, old_t.median)} | "
                f"{ratio(new_r.median, old_r.median)} |"
            )
        out.append("")


async def section_imports(out: Report) -> None:
    """The performance pass in figures: what the host's import path costs, and what it avoids."""
    import subprocess

    rows = [
        ("interpreter only (`pass`)", "pass"),
        ("host import path (aiohttp deferred to first call)", "import mcphost.host.server"),
        ("host import path + aiohttp eagerly", "import mcphost.host.server, aiohttp"),
        ("SDK server (`import mcp.server`)", "import mcp.server"),
    ]
    measured = []
    for label, statement in rows:
        samples = []
        for _ in range(STARTUP_RUNS):
            started = time.perf_counter()
            subprocess.run([PY, "-c", statement], check=True)
            samples.append(time.perf_counter() - started)
        measured.append((label, Stats.of(samples)))
    base = measured[-1][1]
    out += [
        "## 1b. Import cost (wall time of `python -c <imports>`)",
        "",
        "| imports | time | vs `import mcp.server` |",
        "|---|---|---|",
    ]
    out += [f"| {label} | {st.fmt()} | {ratio(st.median, base.median)} |" for label, st in measured]
    out.append("")


async def direct_post(
    center: DevCenter, transport: str, task_id: str
) -> Callable[[], Awaitable[None]]:
    import aiohttp

    from mcphost.admin.pinning import parse_pin

    headers = {"Authorization": f"Bearer {center.token}"}
    if transport == "unix":
        session = aiohttp.ClientSession(
            base_url="http://localhost",
            connector=aiohttp.UnixConnector(path=str(center.socket_path)),
            headers=headers,
        )
    else:
        host, port = center.tcp_address or ("", 0)
        session = aiohttp.ClientSession(
            base_url=f"https://{host}:{port}",
            connector=aiohttp.TCPConnector(ssl=aiohttp.Fingerprint(parse_pin(center.fingerprint))),
            headers=headers,
        )
    body = {"agent_id": center.agent_id, "task_id": task_id}

    async def call() -> None:
        async with session.post("/admin/agent-tools/get_task", json=body) as response:
            await response.read()
            assert response.status == 200

    call.session = session  # type: ignore[attr-defined]
    return call


async def mcp_caller(
    kind: str, env: dict[str, str], args: dict[str, Any]
) -> tuple[RawMcp, Callable[[], Awaitable[None]]]:
    server = RawMcp(server_argv(kind), env)
    await server.start()

    async def call() -> None:
        await server.call("get_task", args)

    return server, call


async def section_calls(center: DevCenter, task_id: str, out: Report) -> None:
    out += [
        f"## 2. Per call: `tools/call get_task` → center, with peers (3) ({CALLS} sequential calls after warm-up)",
        "",
        "| path | p50 | p99 | p50 vs direct POST |",
        "|---|---|---|---|",
    ]
    args = {"task_id": task_id}
    for transport in ("unix", "tcp"):
        direct = await direct_post(center, transport, task_id)
        base = await time_calls(direct, CALLS)
        await direct.session.close()  # type: ignore[attr-defined]
        rows = [(f"direct aiohttp POST ({transport})", base)]
        candidates = [("host", args)]
        if BASELINE:
            candidates.append(("host-baseline", args))
        if transport == "unix":
            candidates += [
                ("naive-bridge", args),
                ("openapi-peer", {"agent_id": center.agent_id, "task_id": task_id}),
            ]
        for kind, call_args in candidates:
            server, call = await mcp_caller(kind, center.binding_env(transport), call_args)
            rows.append((f"{kind} over stdio ({transport})", await time_calls(call, CALLS)))
            await server.close()
        for label, stats in rows:
            out.append(
                f"| {label} | {stats.median * 1000:.2f} ms | {stats.p99 * 1000:.2f} ms | "
                f"{ratio(stats.median, base.median)} |"
            )
        host = rows[1][1]
        out.append(
            f"| host's added time ({transport}): host p50 − direct p50 | "
            f"{(host.median - base.median) * 1000:.2f} ms | | |"
        )
    out.append("")


async def section_concurrency(center: DevCenter, task_id: str, out: Report) -> None:
    out += [
        "## 4. Concurrency: 64 concurrent calls, center delays each by 50 ms",
        "",
        "| server | single call | 64 concurrent (wall) | wall vs 50 ms | wall vs single |",
        "|---|---|---|---|---|",
    ]
    with center.faults(delay_ms={"get_task": 50}):
        for kind in ("host", "naive-bridge"):
            server, call = await mcp_caller(kind, center.binding_env("unix"), {"task_id": task_id})
            single = await time_calls(call, 10, warmup=2)
            walls = []
            for _ in range(5):
                started = time.perf_counter()
                await asyncio.gather(*(call() for _ in range(64)))
                walls.append(time.perf_counter() - started)
            await server.close()
            wall = Stats.of(walls)
            out.append(
                f"| {kind} | {single.median * 1000:.1f} ms | {wall.fmt()} | "
                f"{ratio(wall.median, 0.050)} | {ratio(wall.median, single.median)} |"
            )
    out.append("")


async def main() -> None:
    out: Report = [
        "# mcphost benchmarks",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · Python {platform.python_version()}"
        f" · {os.cpu_count()} CPUs · medians with IQR; ratios against a baseline from the same run",
        "",
    ]
    with (
        tempfile.TemporaryDirectory(prefix="mcphost-bench-") as tmp,
        DevCenter.start(Path(tmp), unix=True, tcp=True, control=True) as center,
    ):
        reply = center.call(
            "create_task", {"project_id": "p-1", "title": "bench", "assignee": center.agent_id}
        )
        task_id = reply.json()["task_id"]
        await section_startup(center, task_id, out)
        await section_imports(out)
        await section_calls(center, task_id, out)
        await section_concurrency(center, task_id, out)
    for extra in (
        "bench.files",
        "bench.relay",
        "bench.relay_real",
        "bench.acp",
        "bench.lifecycle",
        "bench.attach",
        "bench.supervisor",
        "bench.fence",
        "bench.operations",  # section 13, bench/cgroups.py's figure included
        "bench.idle",  # section 14: the supervisor idle and watched at N = 100 and 500
        "bench.before_after",
        "bench.scale",  # section 14: N = 1000 fenced agents (issue 35), the longest section
    ):
        try:
            module = __import__(extra, fromlist=["section"])
        except ImportError:
            continue
        await module.section(out)
    text = "\n".join(out) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    asyncio.run(main())
