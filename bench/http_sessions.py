"""Sessions without a process (issue 35): N agents over HTTP against N agents over pumps, one run.

Each round runs one real `mcphost supervise` (as root: every agent a uid of its own, fenced, the
default fleet) with N stand-in agents (`mcphost/testing/standin_agent.py --hold`: `initialize`,
`tools/list`, one `get_my_work` on the center, then the session held open), the two arms by
turns, the order swapped each round; the arms differ by one key, `[defaults] mcp_transport`
("pump" or "http"). Once every agent has recorded its answered call:
- serving memory: PSS (`smaps_rollup`) of the supervisor plus, for the pump arm, every pump
  (each agent's `attach.py` process); the HTTP arm has no process per session;
- the supervisor's own PSS; the serving side's CPU (utime + stime of the supervisor and the
  pumps) and the supervisor's alone; the wall from the supervisor's spawn to every answer.
Ratios are http / pump per round, then median (min-max).
Run: `python -m bench.http_sessions` as root. Env: BENCH_HTTP_N (100), BENCH_HTTP_ROUNDS (3).
Not part of `make bench`: bench/scale.py drives N = 1000 with the same key.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.supervisor import cpu_seconds, pss_mb, wait_files

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
STANDIN = str(ROOT / "mcphost" / "testing" / "standin_agent.py")
N = int(os.environ.get("BENCH_HTTP_N", "100"))
ROUNDS = int(os.environ.get("BENCH_HTTP_ROUNDS", "3"))


def descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        kids = [p for p, parent in parents.items() if parent == pid]
        out += kids
        frontier += kids
    return out


def pumps(supervisor: int) -> list[int]:
    found = []
    for pid in descendants(supervisor):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(b"mcphost/attach.py") for arg in argv):
            found.append(pid)
    return found


def one_round(center: Any, base: Path, transport: str) -> dict[str, float]:
    state = Path(tempfile.mkdtemp(prefix=f"mcphost-bh-{transport[0]}-", dir=str(ROOT)))
    ids = [f"a{i:04d}" for i in range(N)]
    token = base / "worker.token"
    token.write_text(center.token + "\n")
    token.chmod(0o600)
    lines = [
        "[center]",
        f"admin_url = {json.dumps(center.admin_url('unix'))}",
        f"token_file = {json.dumps(str(token))}",
        "",
        "[defaults]",
        'client = "command"',
        'restart = "never"',
        "stop_grace = 5",
        f'mcp_transport = "{transport}"',
    ]
    command = [PY, STANDIN, "{mcp_config}", "--only", "agent-center", "--hold"]
    for agent in ids:
        lines += ["", "[[agent]]", f'id = "{agent}"', f"command = {json.dumps(command)}"]
    fleet = base / f"fleet-{transport}.toml"
    fleet.write_text("\n".join(lines) + "\n")
    err = open(base / f"supervisor-{transport}.log", "ab")  # noqa: SIM115 (closed below)
    started = time.perf_counter()
    sup = subprocess.Popen(
        [PY, "-m", "mcphost", "supervise", "--fleet", str(fleet), "--state", str(state)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=err,
        cwd=str(ROOT),
    )
    try:
        readies = [state / "agents" / a / "workspace" / "ready" for a in ids]
        done = wait_files(readies, 600, lambda: None)
        for agent in ids:
            calls = (state / "agents" / agent / "workspace" / "calls.jsonl").read_text()
            record = json.loads(calls.splitlines()[0])
            if not record.get("ok"):
                raise RuntimeError(f"{agent}: {record}"[:2000])
        pumped = pumps(sup.pid)
        supervisor = pss_mb(sup.pid)
        serving = supervisor + sum(pss_mb(p) for p in pumped)
        cpu = cpu_seconds(sup.pid) + sum(cpu_seconds(p) for p in pumped)
        return {
            "cpu": cpu,
            "supervisor_cpu": cpu_seconds(sup.pid),
            "wall": done - started,
            "supervisor": supervisor,
            "serving": serving,
            "pumps": len(pumped),
        }
    finally:
        sup.send_signal(signal.SIGTERM)
        sup.wait(120)
        err.close()
        shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    from mcphost.testing import DevCenter

    if os.geteuid() != 0:
        raise SystemExit("run as root: HTTP sessions need agents of their own uids")
    base = Path(tempfile.mkdtemp(prefix="bh-"))
    rows: dict[str, list[dict[str, float]]] = {"pump": [], "http": []}
    with DevCenter.start(base / "center", unix=True) as center:
        center.bind("w-1", *(f"a{i:04d}" for i in range(N)))
        for r in range(ROUNDS):
            order = ("pump", "http") if r % 2 == 0 else ("http", "pump")
            for transport in order:
                rows[transport].append(one_round(center, base, transport))
                print(transport, rows[transport][-1], file=sys.stderr, flush=True)
    shutil.rmtree(base, ignore_errors=True)
    out = [f"N = {N}, {ROUNDS} rounds, fenced agents of their own uids (root supervisor)", ""]
    out += ["| figure | pump | http | http / pump, median (min-max) |", "|---|---|---|---|"]
    for key, unit in (
        ("serving", "MB"),
        ("supervisor", "MB"),
        ("cpu", "s"),
        ("supervisor_cpu", "s"),
        ("wall", "s"),
    ):
        ratios = [h[key] / p[key] for h, p in zip(rows["http"], rows["pump"], strict=True)]
        pump = statistics.median(p[key] for p in rows["pump"])
        http = statistics.median(h[key] for h in rows["http"])
        out.append(
            f"| {key} | {pump:.1f} {unit} | {http:.1f} {unit} | {statistics.median(ratios):.3f}x "
            f"({min(ratios):.3f}-{max(ratios):.3f}) |"
        )
    pumps_seen = [int(p["pumps"]) for p in rows["pump"]] + [int(h["pumps"]) for h in rows["http"]]
    out.append("")
    out.append(f"pump processes seen per round (pump arms, then http arms): {pumps_seen}")
    print("\n".join(out))


if __name__ == "__main__":
    main()
