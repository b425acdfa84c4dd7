"""`mcphost supervise` against a fleet of standalone hosts (issue 12), measured in the same run.

Every agent is a driver agent: this file run as `python -I -S bench/supervisor.py agent
<mcp-config> <fifo> <calls>` (standard library only, the same program in both arms). Its start-up
is the stand-in agent's (`mcphost/testing/standin_agent.py`, copied here): launch the config's
`agent-center` server exactly as the config says; `initialize`, `notifications/initialized`,
`tools/list`, one `get_my_work`; append the record to `calls.jsonl`; write `ready`. It then
holds the session at a FIFO barrier, for the throughput burst. Both arms:
- supervised: one `mcphost supervise` with N agents (fleet `client = "command"`); it writes the
  attach configs itself, inside the clock;
- standalone: the same N agents spawned by this process, each with a configgen config whose
  `agent-center` entry runs `mcphost host` (`AC_MCP_*` env, the worker token file; written
  before the clock starts).

1. Fleet start-up, N = 1, 10, 100: wall from the first spawn (the supervisor's, or the first
   agent's) until every agent's call is recorded; PSS (`smaps_rollup`) and CPU (utime + stime,
   read while alive) of the serving side: the supervisor and its pumps, or the N hosts. The
   agents themselves are the same in both arms and reported apart. Arms alternate (order
   swapped each round); ratios are medians of per-round ratios. The standalone arm runs at the
   largest N that fits in MemAvailable (the report says so when it is smaller).
2. Per-call latency: one agent inside the supervised fleet (so the ancestry check admits its
   pump) launches both its attach entry and a standalone host config, and makes sequential
   `get_my_work` calls on the two in turn, the order swapped every pair.
3. Throughput: in the N = 100 rounds of 1, once the start-up figures are read, the barrier
   opens and every agent makes BENCH_SV_BURST_CALLS sequential calls on its session; calls/s =
   all calls / (last end - first start), with the CPU seconds per 1000 calls of the serving
   side, the center and the agents.

The supervised arm runs its agents unfenced (`sandbox = "none"`), as the standalone arm's are:
this section measures the serving path, section 10 (bench/fence.py) the fence's cost. Fenced,
the agents could not reach the burst's barrier FIFO (in the supervisor's state directory) or,
for the latency agent, the worker token its standalone host reads: the fence hides both.
Every call must succeed: any failed call fails the bench with the agent's record.
Run alone with `python -m bench.supervisor`; `make bench` runs it as section 9 (a few minutes:
the N = 100 standalone fleet dominates).
Env: BENCH_SV_SIZES (1,10,100), BENCH_SV_ROUNDS (rounds per size, 5,3,1), BENCH_SV_CALLS (400),
BENCH_SV_BURST_AGENTS (100), BENCH_SV_BURST_CALLS (30).

Module-level imports are standard library only: the agents run this file with `-I -S`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
THIS = str(Path(__file__).resolve())
SIZES = [int(n) for n in os.environ.get("BENCH_SV_SIZES", "1,10,100").split(",")]
ROUNDS = [int(n) for n in os.environ.get("BENCH_SV_ROUNDS", "5,3,1").split(",")]
CALLS = int(os.environ.get("BENCH_SV_CALLS", "400"))
BURST_AGENTS = int(os.environ.get("BENCH_SV_BURST_AGENTS", "100"))
BURST_CALLS = int(os.environ.get("BENCH_SV_BURST_CALLS", "30"))
# the supervised arm's `[defaults]` (module docstring): unfenced, and as root where the bench is
# root (an agent of its own uid cannot run an interpreter under a 0700 home)
UNFENCED = ('sandbox = "none"', *(('user = "root"',) if os.geteuid() == 0 else ()))
HOST_MB = 90  # a standalone host (~57 MB PSS alone) plus its stand-in, with a margin
TICK = os.sysconf("SC_CLK_TCK")
PROTOCOL = "2025-06-18"

# -- the driver agents (standard library only; run as `python -I -S bench/supervisor.py`) ------


class Wire:
    """One MCP server launched from a config entry exactly as the entry says; JSON-RPC lines."""

    def __init__(self, entry: dict[str, Any], log: str) -> None:
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [entry["command"], *entry.get("args", [])],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env={**os.environ, **entry.get("env", {})},
            )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.next_id = 0

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.stdin.write(json.dumps(message).encode() + b"\n")
        self.stdin.flush()
        while line := self.stdout.readline():
            reply = json.loads(line)
            if reply.get("id") == self.next_id:
                return dict(reply)
        raise ConnectionError(f"{self.proc.args} closed stdout")

    def open(self) -> list[str]:
        info = {"name": "bench-driver", "version": "1"}
        reply = self.request(
            "initialize", {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": info}
        )
        if "error" in reply:
            raise ConnectionError(json.dumps(reply["error"]))
        self.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        self.stdin.flush()
        return [tool["name"] for tool in self.request("tools/list", {})["result"]["tools"]]

    def call(self) -> bool:
        reply = self.request("tools/call", {"name": "get_my_work", "arguments": {}})
        return "result" in reply and not reply["result"].get("isError")


def center_entry(config: str) -> dict[str, Any]:
    with open(config, encoding="utf-8") as handle:
        return dict(json.load(handle)["mcpServers"]["agent-center"])


def hold() -> None:
    while True:
        signal.pause()


def drive_latency(attach_config: str, host_config: str, calls: int) -> None:
    """Both paths from one process, in turn: pump + supervisor, standalone host."""
    wires = {
        "supervised": Wire(center_entry(attach_config), "pump.stderr.log"),
        "standalone": Wire(center_entry(host_config), "host.stderr.log"),
    }
    for wire in wires.values():
        wire.open()
    samples: dict[str, list[float]] = {name: [] for name in wires}
    # CPU of each path over the same interleaved calls: the supervisor is this agent's parent
    serving = {
        "supervised": [os.getppid(), wires["supervised"].proc.pid],
        "standalone": [wires["standalone"].proc.pid],
    }
    cpu: dict[str, float] = {}
    failed = 0
    order = list(wires)
    for n in range(50 + calls):
        if n == 50:
            cpu = {name: sum(map(cpu_seconds, pids)) for name, pids in serving.items()}
        for name in order if n % 2 else order[::-1]:
            started = time.perf_counter()
            failed += not wires[name].call()
            if n >= 50:
                samples[name].append(time.perf_counter() - started)
    cpu = {name: sum(map(cpu_seconds, pids)) - cpu[name] for name, pids in serving.items()}
    result = {"samples": samples, "failed": failed, "cpu": cpu}
    Path("latency.json").write_text(json.dumps(result))
    Path("ready.tmp").write_text(str(os.getpid()))
    os.rename("ready.tmp", "ready")  # whole: the bench reads the pid once `ready` exists


def drive_agent(config: str, fifo: str, calls: int) -> None:
    """The stand-in's start-up, then an optional burst.

    Like `mcphost/testing/standin_agent.py`: launch the config's `agent-center` server exactly as
    the config says; `initialize`, `notifications/initialized`, `tools/list`, one `get_my_work`;
    append the same record to `./calls.jsonl` and write `./ready`. Then block at the FIFO
    barrier; once the bench opens it, make `calls` sequential calls, write `./burst.json`, and
    hold the session until SIGTERM (so the servers' CPU can still be read).
    """
    line: dict[str, Any] = {"server": "agent-center", "agent_pid": os.getpid()}
    try:
        wire = Wire(center_entry(config), "server.stderr.log")
        line["tools"] = wire.open()
        reply = wire.request("tools/call", {"name": "get_my_work", "arguments": {}})
        line["ok"] = "result" in reply and not reply["result"].get("isError")
        line["result" if "result" in reply else "error"] = reply.get("result", reply.get("error"))
    except (ConnectionError, OSError, ValueError, KeyError) as exc:
        line["ok"], line["error"] = False, str(exc)[-2000:]
    with open("calls.jsonl", "a", encoding="utf-8") as record:
        record.write(json.dumps(line) + "\n")
    Path("ready.tmp").write_text(str(os.getpid()))
    os.rename("ready.tmp", "ready")  # whole: the bench reads the pid once `ready` exists
    with open(fifo, "rb") as barrier:  # every driver blocks here until the bench opens it
        barrier.read()
    latencies, failed = [], 0
    first = time.monotonic()
    for _ in range(calls):
        started = time.perf_counter()
        failed += not wire.call()
        latencies.append(time.perf_counter() - started)
    last = time.monotonic()
    result = {"first": first, "last": last, "latencies": latencies, "failed": failed}
    Path("burst.tmp").write_text(json.dumps(result))
    os.rename("burst.tmp", "burst.json")
    hold()


def drive(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if argv[0] == "latency":
        drive_latency(argv[1], argv[2], int(argv[3]))
    elif argv[0] == "agent":
        drive_agent(argv[1], argv[2], int(argv[3]))
    else:
        print(f"usage: {THIS} [latency|burst ...]", file=sys.stderr)
        return 2
    return 0


# -- /proc accounting -------------------------------------------------------------------------


def proc_stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rpartition(")")[2].split()


def cpu_seconds(pid: int) -> float:
    fields = proc_stat(pid)  # after the command: state is [0]; utime, stime are [11], [12]
    return (int(fields[11]) + int(fields[12])) / TICK


def pss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no Pss in /proc/{pid}/smaps_rollup")


def children_of(parents: set[int]) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {pid: [] for pid in parents}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(proc_stat(int(entry))[1])
            except (OSError, IndexError):
                continue
            if ppid in found:
                found[ppid].append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        return proc_stat(pid)[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: list[int], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in left:  # should not happen; never leave a process behind
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def avail_mb() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


def fits(n: int) -> int:
    """The largest fleet of standalone hosts that fits in memory now (at most `n`)."""
    return max(1, min(n, (avail_mb() - 2048) // HOST_MB))


def wait_files(paths: list[Path], timeout: float, check: Any = None) -> float:
    """Poll until every path exists; returns perf_counter() at the moment the last appeared."""
    pending = list(paths)
    deadline = time.monotonic() + timeout
    while pending:
        pending = [path for path in pending if not path.exists()]
        if not pending:
            break
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} agents not ready after {timeout} s: {pending[:3]}")
        time.sleep(0.005)
    return time.perf_counter()


# -- the two arms -----------------------------------------------------------------------------


class Arm:
    """N agents, served either by one supervisor or by N standalone hosts."""

    def __init__(
        self,
        center: Any,
        base: Path,
        ids: list[str],
        supervised: bool,
        tree: str = str(ROOT),
        defaults: tuple[str, ...] = (),
    ) -> None:
        """`tree`: the directory whose mcphost the supervisor runs (BENCH_BASELINE's, for
        bench/before_after.py); `defaults`: extra `[defaults]` lines of its fleet file."""
        self.center, self.ids, self.supervised = center, ids, supervised
        self.tree, self.defaults = tree, defaults
        # Unix socket paths must stay short: `base` is directly under /tmp.
        self.dir = Path(tempfile.mkdtemp(prefix="mcphost-bsv-" if supervised else "bsa-", dir=base))
        self.supervisor: subprocess.Popen[bytes] | None = None
        self.agents: list[subprocess.Popen[bytes]] = []
        self.token_file = str(center.state_dir / "worker-token")

    def workspace(self, agent_id: str) -> Path:
        if self.supervised:
            return self.dir / "agents" / agent_id / "workspace"
        return self.dir / agent_id / "workspace"

    def host_config(self, agent_id: str, workspace: Path, path: Path) -> None:
        from configgen import AgentConfig, CenterBinding, write_config

        workspace.mkdir(parents=True, mode=0o700, exist_ok=True)
        binding = CenterBinding(
            agent_id=agent_id,
            admin_url=self.center.admin_url("unix"),
            token_file=self.token_file,
            agent_root=str(workspace),
            tier_tools=True,  # as the fleet's default
        )
        write_config(str(path), "claude", AgentConfig(center=binding))

    def prepare(self, command: list[str]) -> None:
        """`command` uses `{mcp_config}`; written as a fleet file or as N host configs."""
        if self.supervised:
            lines = [
                "[center]",
                f"admin_url = {json.dumps(self.center.admin_url('unix'))}",
                f"token_file = {json.dumps(self.token_file)}",
                "",
                "[defaults]",
                'client = "command"',
                'restart = "never"',
                "stop_grace = 5",
                *self.defaults,
            ]
            for agent_id in self.ids:
                lines += ["", "[[agent]]", f'id = "{agent_id}"', f"command = {json.dumps(command)}"]
            (self.dir / "fleet.toml").write_text("\n".join(lines) + "\n")
        else:
            for agent_id in self.ids:
                config = self.dir / agent_id / "mcp.json"
                self.host_config(agent_id, self.workspace(agent_id), config)

    def start(self, command: list[str]) -> float:
        """Spawn; returns the perf_counter() of the first spawn."""
        started = time.perf_counter()
        if self.supervised:
            env = {**os.environ, "PYTHONPATH": self.tree}
            with open(self.dir / "supervisor.stderr.log", "ab") as err:
                fleet = str(self.dir / "fleet.toml")
                self.supervisor = subprocess.Popen(
                    [PY, "-m", "mcphost", "supervise", "--fleet", fleet, "--state", str(self.dir)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=env,
                    cwd=self.tree,  # `-m` puts the working directory first on sys.path
                )
            return started
        for agent_id in self.ids:
            config = str(self.dir / agent_id / "mcp.json")
            self.agents.append(
                subprocess.Popen(
                    [part.replace("{mcp_config}", config) for part in command],
                    cwd=self.workspace(agent_id),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        return started

    def check_alive(self) -> None:
        if self.supervisor is not None and self.supervisor.poll() is not None:
            tail = (self.dir / "supervisor.stderr.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the supervisor exited {self.supervisor.returncode}:\n{tail}")

    def wait_ready(self, timeout: float = 180) -> float:
        readies = [self.workspace(agent_id) / "ready" for agent_id in self.ids]
        return wait_files(readies, timeout, self.check_alive)

    def agent_pids(self) -> list[int]:
        return [int((self.workspace(a) / "ready").read_text()) for a in self.ids]

    def servers(self) -> list[int]:
        """The processes that serve the agents: the supervisor and the pumps, or the hosts."""
        agents = self.agent_pids()
        children = children_of(set(agents))
        for pid in agents:
            if len(children[pid]) != 1:
                raise RuntimeError(f"agent {pid} has children {children[pid]}, expected one")
        served = [children[pid][0] for pid in agents]
        return ([self.supervisor.pid] if self.supervisor else []) + served

    def stop(self) -> None:
        leftovers = []
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            leftovers = self.servers() + self.agent_pids()
        if self.supervisor is not None:
            self.supervisor.send_signal(signal.SIGTERM)
            try:
                code = self.supervisor.wait(60)
            except subprocess.TimeoutExpired:
                self.supervisor.kill()
                code = self.supervisor.wait()
            if code != 0:
                raise RuntimeError(f"the supervisor exited {code} on SIGTERM")
        for agent in self.agents:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGTERM)
        for agent in self.agents:
            agent.wait(60)
        wait_gone(leftovers)


def check_calls(arm: Arm) -> None:
    """Every agent recorded exactly one successful `get_my_work` on `agent-center`."""
    bad = []
    for agent_id in arm.ids:
        path = arm.workspace(agent_id) / "calls.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if len(lines) != 1 or not lines[0].get("ok") or lines[0].get("server") != "agent-center":
            bad.append((agent_id, lines))
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(arm.ids)} agents' calls failed: {bad[:2]}"[:3000])


# -- 1. fleet start-up ------------------------------------------------------------------------


def fleet_round(
    center: Any, base: Path, n: int, supervised: bool, burst: bool, **options: Any
) -> dict[str, Any]:
    """Start N driver agents; when every call is recorded, read the serving side's PSS and
    CPU; with `burst`, release the barrier and time N x BURST_CALLS calls. `options`: `Arm`'s
    `tree` and `defaults`."""
    prefix = "sv" if supervised else "sa"
    ids = [f"{prefix}-{i:03d}" for i in range(1, n + 1)]
    if supervised:  # unfenced, as the standalone arm's agents: see the module docstring
        options.setdefault("defaults", UNFENCED)
    arm = Arm(center, base, ids, supervised, **options)
    fifo = str(arm.dir / "go")
    os.mkfifo(fifo)
    command = [PY, "-I", "-S", THIS, "agent", "{mcp_config}", fifo, str(BURST_CALLS)]
    try:
        arm.prepare(command)
        started = arm.start(command)
        done = arm.wait_ready()
        check_calls(arm)
        servers, agents = arm.servers(), arm.agent_pids()
        pss = [pss_mb(pid) for pid in servers]
        cpu = [cpu_seconds(pid) for pid in servers]
        figures: dict[str, Any] = {
            "n": n,
            "wall": done - started,
            "pss": sum(pss),
            "cpu": sum(cpu),
            "first_pss": pss[0],  # the supervisor, when supervised
            "first_cpu": cpu[0],
            "agents_pss": sum(pss_mb(pid) for pid in agents),
            "agents_cpu": sum(cpu_seconds(pid) for pid in agents),
        }
        if burst:
            figures["burst"] = run_burst(center, arm, fifo, servers, agents)
        return figures
    finally:
        arm.stop()


def run_burst(
    center: Any, arm: Arm, fifo: str, servers: list[int], drivers: list[int]
) -> dict[str, Any]:
    watched = {
        "serving": servers,
        "supervisor": servers[:1] if arm.supervised else [],
        "center": [center.pid],
        "drivers": drivers,
    }
    before = {k: sum(cpu_seconds(p) for p in pids) for k, pids in watched.items()}
    with open(fifo, "wb"):  # releases every driver blocked at the barrier
        pass
    results = [arm.workspace(a) / "burst.json" for a in arm.ids]
    wait_files(results, 300, arm.check_alive)
    after = {k: sum(cpu_seconds(p) for p in pids) for k, pids in watched.items()}
    records = [json.loads(path.read_text()) for path in results]
    calls = len(arm.ids) * BURST_CALLS
    failed = sum(record["failed"] for record in records)
    if failed:
        raise RuntimeError(f"{failed} of {calls} burst calls failed")
    wall = max(r["last"] for r in records) - min(r["first"] for r in records)
    return {
        "n": len(arm.ids),
        "rate": calls / wall,
        "latencies": [x for r in records for x in r["latencies"]],
        "cpu": {k: (after[k] - before[k]) * 1000 / calls for k in watched},
    }


def section_startup(center: Any, base: Path, out: list[str]) -> dict[bool, list[dict[str, Any]]]:
    """Section 1; returns the burst figures of the N = BURST_AGENTS rounds, by arm."""
    from bench.harness import Stats

    bursts: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    out += [
        "### Fleet start-up: N agents, each launches its config's center server and makes one "
        "`get_my_work` (the stand-in agent's sequence)",
        "",
        "| N | arm | wall until every call is recorded | PSS, serving side | CPU, serving side "
        "| the agents themselves PSS / CPU |",
        "|---|---|---|---|---|---|",
    ]
    ratios_rows = []
    for n, rounds in zip(SIZES, ROUNDS + [ROUNDS[-1]] * len(SIZES), strict=False):
        standalone_n = fits(n)
        runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        if n == SIZES[0]:  # untimed warm-up of both arms: page cache, bytecode, the center
            fleet_round(center, base, n, True, burst=False)
            fleet_round(center, base, n, False, burst=False)
        for r in range(rounds):
            for supervised in (True, False) if r % 2 == 0 else (False, True):
                size = n if supervised else standalone_n
                figures = fleet_round(center, base, size, supervised, burst=n == BURST_AGENTS)
                runs[supervised].append(figures)
                if "burst" in figures:
                    bursts[supervised].append(figures["burst"])
        for supervised, label in ((True, "supervised"), (False, "standalone hosts")):
            rs = runs[supervised]
            size = int(rs[0]["n"])
            wall = Stats.of([r["wall"] for r in rs])
            pss, cpu = (statistics.median(r[k] for r in rs) for k in ("pss", "cpu"))
            if supervised:
                sup_pss, sup_cpu = (
                    statistics.median(r[k] for r in rs) for k in ("first_pss", "first_cpu")
                )
                pss_text = f"{pss:.1f} MB (supervisor {sup_pss:.1f} + pumps {pss - sup_pss:.1f})"
                cpu_text = f"{cpu:.2f} s (supervisor {sup_cpu:.2f} + pumps {cpu - sup_cpu:.2f})"
            else:
                pss_text, cpu_text = f"{pss:.1f} MB", f"{cpu:.2f} s"
            out.append(
                f"| {size} | {label} | {wall.fmt('s', 1)} | {pss_text} | {cpu_text} | "
                f"{statistics.median(r['agents_pss'] for r in rs):.0f} MB / "
                f"{statistics.median(r['agents_cpu'] for r in rs):.2f} s |"
            )
        if standalone_n == n:
            pairs = list(zip(runs[True], runs[False], strict=True))
            ratios_rows.append(
                (
                    n,
                    *(
                        statistics.median(s[k] / b[k] for s, b in pairs)
                        for k in ("wall", "pss", "cpu")
                    ),
                )
            )
        else:
            out.append(
                f"| {n} | (standalone arm ran at N = {standalone_n}: "
                f"{avail_mb()} MB available) | | | | |"
            )
    out += [
        "",
        "| N | wall supervised ÷ standalone | PSS ÷ | CPU ÷ |",
        "|---|---|---|---|",
    ]
    out += [f"| {n} | {w:.3f}× | {p:.3f}× | {c:.3f}× |" for n, w, p, c in ratios_rows]
    out += [
        "",
        "Serving side: the supervisor and its N pumps, or the N standalone hosts "
        "(`smaps_rollup` PSS; utime + stime, read while alive). Ratios: medians of per-round "
        "ratios (arms alternate). Targets at N = 100: PSS ≤ 0.15×, wall ≤ 0.1×.",
        "",
    ]
    return bursts


# -- 2. per-call latency ----------------------------------------------------------------------


def section_latency(center: Any, base: Path, out: list[str]) -> None:
    from bench.harness import Stats

    arm = Arm(center, base, ["lat-sv"], supervised=True, defaults=UNFENCED)
    host_config = arm.dir / "lat-sa.json"
    arm.host_config("lat-sa", arm.dir / "lat-sa" / "workspace", host_config)
    command = [PY, "-I", "-S", THIS, "latency", "{mcp_config}", str(host_config), str(CALLS)]
    arm.prepare(command)
    try:
        arm.start(command)
        arm.wait_ready(timeout=300)
        result = json.loads((arm.workspace("lat-sv") / "latency.json").read_text())
    finally:
        arm.stop()
    if result["failed"]:
        raise RuntimeError(f"{result['failed']} latency calls failed")
    sv, sa = result["samples"]["supervised"], result["samples"]["standalone"]
    pairs = [s - a for s, a in zip(sv, sa, strict=True)]

    def p90(xs: list[float]) -> float:
        return statistics.quantiles(xs, n=10)[-1]

    s_sv, s_sa = Stats.of(sv), Stats.of(sa)
    cpu_sv, cpu_sa = (result["cpu"][k] * 1e3 / CALLS for k in ("supervised", "standalone"))
    out += [
        f"### Per call: `get_my_work` from one agent, same client code on both paths ({CALLS} sequential calls on each path, "
        "in turn, after 50 each)",
        "",
        "| path | p50 | p90 | p99 | serving CPU per call |",
        "|---|---|---|---|---|",
        f"| standalone host (stdio) | {s_sa.median * 1e3:.3f} ms | {p90(sa) * 1e3:.3f} ms | "
        f"{s_sa.p99 * 1e3:.3f} ms | {cpu_sa:.2f} ms |",
        f"| pump + supervisor | {s_sv.median * 1e3:.3f} ms | {p90(sv) * 1e3:.3f} ms | "
        f"{s_sv.p99 * 1e3:.3f} ms | {cpu_sv:.2f} ms |",
        f"| supervised − standalone: p50 difference / median of per-pair differences | "
        f"{(s_sv.median - s_sa.median) * 1e3:+.3f} ms / {statistics.median(pairs) * 1e3:+.3f} ms "
        f"| {(p90(sv) - p90(sa)) * 1e3:+.3f} ms | | {cpu_sv - cpu_sa:+.2f} ms |",
        "",
        "Target: ≤ +0.3 ms p50.",
        "",
    ]


# -- 3. throughput ----------------------------------------------------------------------------


def section_throughput(
    center: Any, base: Path, bursts: dict[bool, list[dict[str, Any]]], out: list[str]
) -> None:
    """Section 3, from the N = BURST_AGENTS fleets of section 1 (or a fleet pair of its own)."""
    from bench.harness import Stats

    if not bursts[True]:
        bursts[True].append(fleet_round(center, base, BURST_AGENTS, True, True)["burst"])
        standalone_n = fits(BURST_AGENTS)
        bursts[False].append(fleet_round(center, base, standalone_n, False, True)["burst"])
    # one burst per arm and round: the median round by calls/s
    rows = [sorted(bursts[a], key=lambda b: b["rate"])[len(bursts[a]) // 2] for a in (True, False)]
    out += [
        f"### Throughput: {BURST_AGENTS} agents with one session each, released at once, "
        f"{BURST_CALLS} sequential `get_my_work` each",
        "",
        "| arm | agents | calls/s | latency under load p50 / p99 | CPU-s per 1000 calls: "
        "serving side (supervisor) / center / agents |",
        "|---|---|---|---|---|",
    ]
    for label, row in zip(("supervised", "standalone hosts"), rows, strict=True):
        lat = Stats.of(row["latencies"])
        cpu = row["cpu"]
        out.append(
            f"| {label} | {row['n']} | {row['rate']:.0f} | {lat.median * 1e3:.1f} / "
            f"{lat.p99 * 1e3:.1f} ms | {cpu['serving']:.2f}"
            + (f" ({cpu['supervisor']:.2f})" if label == "supervised" else "")
            + f" / {cpu['center']:.2f} / "
            f"{cpu['drivers']:.2f} |"
        )
    sv, sa = rows
    same = sv["n"] == sa["n"]
    out += [
        "",
        f"Supervised ÷ standalone: calls/s {sv['rate'] / sa['rate']:.2f}×"
        + ("" if same else f" (standalone at N = {sa['n']}: memory)")
        + f", serving CPU per call {sv['cpu']['serving'] / sa['cpu']['serving']:.2f}×.",
        "",
    ]


async def section(out: list[str]) -> None:
    from mcphost.testing import DevCenter

    loadavg = os.getloadavg()
    out += [
        "## 9. Supervisor: one `mcphost supervise` against N standalone hosts (issue 12)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {os.cpu_count()} CPUs · "
        f"load average at start {loadavg[0]:.2f} {loadavg[1]:.2f} {loadavg[2]:.2f} · "
        f"{avail_mb()} MB available",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="mcphost-bench-sv-", dir="/tmp") as tmp:
        base = Path(tmp)
        with DevCenter.start(base / "center", unix=True, control=True) as center:
            most = max([*SIZES, BURST_AGENTS])
            ids = [f"{p}-{i:03d}" for p in ("sv", "sa") for i in range(1, most + 1)]
            body = {"worker_id": "w-1", "agent_ids": [*ids, "lat-sv", "lat-sa"]}
            reply = center.request("POST", "/_devcenter/agents", body)
            if reply.status != 200:
                raise RuntimeError(
                    f"binding the agents failed: {reply.status} {reply.body[:300]!r}"
                )
            bursts = section_startup(center, base, out)
            section_latency(center, base, out)
            section_throughput(center, base, bursts, out)
    loadavg = os.getloadavg()
    out += [f"Load average at the end: {loadavg[0]:.2f} {loadavg[1]:.2f} {loadavg[2]:.2f}.", ""]


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(drive(sys.argv[1:]))
    import asyncio

    report: list[str] = []
    asyncio.run(section(report))
    print("\n".join(report))
