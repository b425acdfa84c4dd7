"""One greedy agent against a real `mcphost supervise`: what it costs the supervisor and others.

Two arms in the same run, on the same machine: this checkout's supervisor, and (with
`BENCH_BASELINE=<dir>`, a checkout or export of another commit) that one's. Each arm starts one
supervisor with two holding agents against one reference center (this checkout's), then:
1. Memory: agent-1 (`mcphost/testing/greedy_agent.py` through `ctl exec`) opens its 32 center
   sessions and sends each BENCH_SHARES_FLOOD_MB MiB of 64 KiB `tools/list` requests without
   reading. Reported: the supervisor's peak RSS growth over its warmed-up baseline (VmHWM after
   `clear_refs`) once it has stopped reading (no read, no CPU for a second) or after 60 s, and
   how many of the 32 floods the supervisor took whole.
2. Latency: agent-1 keeps BENCH_SHARES_SLOW_CALLS `get_task` calls in flight, each held by the
   center for BENCH_SHARES_SLOW_MS; agent-2 makes BENCH_SHARES_CALLS sequential `get_my_work`
   calls. Reported: agent-2's latency (median, max) idle and under that load, and how many of
   agent-1's calls the center held at once.
Run: `python -m bench.shares` (optionally `BENCH_BASELINE=/tmp/base`). Not part of `make bench`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import RawMcp, Stats
from mcphost.testing import DevCenter

ROOT = Path(__file__).resolve().parent.parent
GREEDY = str(ROOT / "mcphost" / "testing" / "greedy_agent.py")
PY = sys.executable
FLOOD_MB = int(os.environ.get("BENCH_SHARES_FLOOD_MB", "24"))
SLOW_CALLS = int(os.environ.get("BENCH_SHARES_SLOW_CALLS", "128"))
SLOW_MS = int(os.environ.get("BENCH_SHARES_SLOW_MS", "5000"))
CALLS = int(os.environ.get("BENCH_SHARES_CALLS", "10"))
HOLD = [PY, "-c", "import signal; signal.pause()"]


def kib(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {name} for {pid}")


def activity(pid: int) -> tuple[int, int]:
    io = Path(f"/proc/{pid}/io").read_text().split()
    rchar = int(io[io.index("rchar:") + 1])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return rchar, int(fields[11]) + int(fields[12])


class Arm:
    """One supervisor (from `repo`) with agent-1 and agent-2, holding, against `center`."""

    def __init__(self, repo: Path, center: DevCenter, base: Path) -> None:
        self.repo = repo
        self.center = center
        self.state = Path(tempfile.mkdtemp(prefix="mh-bsh-"))
        self.env = {
            **os.environ,
            "PYTHONPATH": str(repo),
            "MCPHOST_CALL_TIMEOUT_SECONDS": "3600",
        }
        token = base / "worker.token"
        token.write_text(center.token + "\n")
        token.chmod(0o600)
        fleet = base / "fleet.toml"
        agents = "".join(
            f'\n[[agent]]\nid = "{a}"\ncommand = {json.dumps(HOLD)}\n'
            for a in ("agent-1", "agent-2")
        )
        fleet.write_text(
            f"[center]\nadmin_url = {json.dumps(center.admin_url('unix'))}\n"
            f"token_file = {json.dumps(str(token))}\n\n[defaults]\n"
            f'client = "command"\nstop_grace = 5\n{agents}'
        )
        self.proc = subprocess.Popen(
            [PY, "-m", "mcphost", "supervise", "--fleet", str(fleet), "--state", str(self.state)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env,
            cwd=repo,
        )
        self.wait(lambda: (self.state / "run" / "center.sock").exists(), "the center socket")
        time.sleep(1)  # the agents' first spawn (identity roots) lands right after the socket

    def wait(self, condition: Any, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"{self.repo}: {what} not met")
            time.sleep(0.05)

    def exec_argv(self, agent: str, *argv: str) -> list[str]:
        return [PY, "-m", "mcphost", "ctl", "--state", str(self.state), "exec", agent, "--", *argv]

    def greedy(self, *args: str) -> subprocess.Popen[bytes]:
        """agent-1's greedy client, attached (retried while its last one's sessions close)."""
        sock = str(self.state / "run" / "center.sock")
        argv = self.exec_argv("agent-1", PY, "-I", GREEDY, sock, *args)
        for _ in range(600):
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=self.env, cwd=self.repo)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() == b"ready":
                return proc
            stop(proc)
            time.sleep(0.1)
        raise RuntimeError(f"the greedy agent did not attach: {line!r}")

    async def agent_2(self) -> RawMcp:
        sock = str(self.state / "run" / "center.sock")
        attach = str(self.repo / "mcphost" / "attach.py")
        client = RawMcp(self.exec_argv("agent-2", PY, "-I", "-S", attach, sock))
        client.env = {**client.env, **self.env}
        for _ in range(100):  # agent-2 may not be registered yet
            try:
                await client.start()
                return client
            except RuntimeError:
                await client.close()
                await asyncio.sleep(0.1)
                client = RawMcp(client.argv, client.env)
        raise RuntimeError("agent-2 could not attach")

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()


async def latency(client: RawMcp) -> Stats:
    samples = []
    for _ in range(CALLS):
        started = time.perf_counter()
        await client.call("get_my_work", {})
        samples.append(time.perf_counter() - started)
    return Stats.of(samples)


async def measure(arm: Arm) -> dict[str, Any]:
    pid = arm.proc.pid
    out: dict[str, Any] = {}
    other = await arm.agent_2()
    try:
        for _ in range(20):
            await other.call("get_my_work", {})
        out["idle"] = await latency(other)
        # 1. memory
        baseline = kib(pid, "VmRSS")
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        flood = arm.greedy("32", "flood", str(FLOOD_MB * 1024 * 1024))
        last, quiet, deadline = None, 0, time.monotonic() + 60
        while quiet < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
            sample = activity(pid)
            quiet = quiet + 1 if sample == last else 0
            last = sample
        out["flood_grown_mb"] = (kib(pid, "VmHWM") - baseline) / 1024
        out["flood_settled"] = quiet >= 10
        stop(flood)
        assert flood.stdout is not None
        out["floods_taken"] = flood.stdout.read().count(b"sent ")
        # 2. latency under slow calls
        route = "/admin/agent-tools/get_task"
        seen = len([e for e in arm.center.requests(1000) if e["route"] == route])
        arm.center.set_faults(delay_ms={"get_task": SLOW_MS})
        slow = arm.greedy("2", "keep", str(SLOW_CALLS))
        time.sleep(1)  # agent-1's calls are with the supervisor, as many at the center as allowed
        held = len([e for e in arm.center.requests(1000) if e["route"] == route]) - seen
        out["loaded"] = await latency(other)
        out["agent1_at_center"] = held
        stop(slow)
        arm.center.clear_faults()
    finally:
        await other.close()
    return out


def row(name: str, result: dict[str, Any]) -> str:
    idle, loaded = result["idle"], result["loaded"]
    return (
        f"| {name} | {result['flood_grown_mb']:.0f} MiB"
        f"{'' if result['flood_settled'] else ' (still reading at 60 s)'} | "
        f"{result['floods_taken']}/32 | {idle.median * 1000:.1f} ms | "
        f"{loaded.median * 1000:.1f} ms (max {loaded.high * 1000:.1f}) | "
        f"{result['agent1_at_center']} |"
    )


async def main() -> None:
    arms = [("this checkout", ROOT)]
    if os.environ.get("BENCH_BASELINE"):
        arms.append(("baseline", Path(os.environ["BENCH_BASELINE"]).resolve()))
    lines = [
        f"flood: 32 sessions x {FLOOD_MB} MiB unread; load: {SLOW_CALLS} get_task calls in "
        f"flight held {SLOW_MS} ms each; agent-2: {CALLS} sequential get_my_work",
        "",
        "| supervisor | RSS growth under flood | floods taken whole | agent-2 idle (median) "
        "| agent-2 under load (median) | agent-1 calls at the center |",
        "|---|---|---|---|---|---|",
    ]
    base = Path(tempfile.mkdtemp(prefix="mh-bsh-"))
    with DevCenter.start(base / "center", unix=True, control=True) as center:
        for name, repo in arms:
            arm_dir = base / name.replace(" ", "-")
            arm_dir.mkdir()
            arm = Arm(repo, center, arm_dir)
            try:
                lines.append(row(name, await measure(arm)))
            finally:
                with contextlib.suppress(Exception):
                    arm.close()
    print("\n".join(lines))


if __name__ == "__main__":
    asyncio.run(main())
