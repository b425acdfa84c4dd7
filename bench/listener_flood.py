"""An agent floods the page and `/metrics` with half-sent requests: what the supervisor spends.

Two arms in the same run, on the same machine: this checkout's supervisor, and (with
`BENCH_BASELINE=<dir>`, a checkout or export of another commit) that one's. Each arm starts one
supervisor as systemd would (soft `RLIMIT_NOFILE` 1024, through `prlimit`) with `[page]` and
`[metrics]` on loopback ports and one agent, `mcphost/testing/flood_agent.py`, opening
BENCH_FLOOD_CONNECTIONS (3000) half-sent requests to each port and opening again every one the
supervisor closes (`--again`: the pressure never lets up). After BENCH_FLOOD_WARMUP_S (5) s it
measures for BENCH_FLOOD_WINDOW_S (20) s: the agent's connection attempts, the supervisor's CPU time (utime + stime of
/proc/<pid>/stat), the bytes and lines it wrote to its log, and its open descriptors at the end;
and whether `ctl status` answered within 10 s then.
Run: `python -m bench.listener_flood` (optionally `BENCH_BASELINE=/tmp/base`). Not part of
`make bench`.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mcphost.testing import DevCenter
from mcphost.testing.fleet import fleet_toml

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CONNECTIONS = int(os.environ.get("BENCH_FLOOD_CONNECTIONS", "3000"))
WARMUP = float(os.environ.get("BENCH_FLOOD_WARMUP_S", "5"))
WINDOW = float(os.environ.get("BENCH_FLOOD_WINDOW_S", "20"))
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def opened(state: Path) -> int:
    """Connections the flooding agent has opened so far (its report; 0: none yet)."""
    try:
        report = json.loads((state / "agents" / "hostile" / "workspace" / "flood.json").read_text())
    except (OSError, ValueError):
        return 0
    return sum(report["opened"].values()) + sum(report["failed"].values())


def arm(repo: Path, center: DevCenter, base: Path) -> dict[str, Any]:
    base.mkdir()
    token = base / "token"
    token.write_text(center.token + "\n")
    token.chmod(0o600)
    page, metrics = free_port(), free_port()
    flood = str(repo / "mcphost" / "testing" / "flood_agent.py")
    command = [PY, "-I", flood, "{workspace}/flood.json", str(CONNECTIONS), "--again"]
    agents = [{"id": "hostile", "command": [*command, str(page), str(metrics)]}]
    text = fleet_toml(center, token, agents, client="command", restart_delay=0.05)
    text += f'\n[page]\nlisten = "127.0.0.1:{page}"\n\n[metrics]\nlisten = "127.0.0.1:{metrics}"\n'
    (base / "fleet.toml").write_text(text)
    state = Path(tempfile.mkdtemp(prefix="mcphost-flood-"))
    log = base / "supervisor.log"
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    argv = ["prlimit", f"--nofile=1024:{hard}", "--", PY, "-m", "mcphost", "supervise"]
    argv += ["--fleet", str(base / "fleet.toml"), "--state", str(state)]
    with log.open("wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=repo)
    try:
        time.sleep(WARMUP)
        size, cpu, tried = log.stat().st_size, cpu_seconds(proc.pid), opened(state)
        lines = log.read_bytes().count(b"\n")
        time.sleep(WINDOW)
        cpu = cpu_seconds(proc.pid) - cpu
        tried = opened(state) - tried
        grown = log.stat().st_size - size
        lines = log.read_bytes().count(b"\n") - lines
        fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        try:
            ctl = subprocess.run(
                [PY, "-m", "mcphost", "ctl", "--state", str(state), "status"],
                env=env, cwd=repo, capture_output=True, timeout=10,
            )  # fmt: skip
            answered = ctl.returncode == 0
        except subprocess.TimeoutExpired:
            answered = False
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {
        "connects_per_s": round(tried / WINDOW),
        "cpu_share": round(cpu / WINDOW, 3),
        "log_bytes_per_s": round(grown / WINDOW),
        "log_lines_per_s": round(lines / WINDOW, 1),
        "descriptors": fds,
        "ctl_status_answered": answered,
    }


def main() -> None:
    baseline = os.environ.get("BENCH_BASELINE")
    with tempfile.TemporaryDirectory(prefix="bench-flood-") as tmp:
        base = Path(tmp)
        with DevCenter.start(base / "center", unix=True) as center:
            out = {"this": arm(ROOT, center, base / "this")}
            if baseline:
                out["baseline"] = arm(Path(baseline), center, base / "baseline")
    if "baseline" in out:
        this, before = out["this"], out["baseline"]
        out["ratio_cpu_baseline_over_this"] = round(
            before["cpu_share"] / max(this["cpu_share"], 1e-3), 1
        )
        out["ratio_log_baseline_over_this"] = round(
            before["log_bytes_per_s"] / max(this["log_bytes_per_s"], 1), 1
        )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
