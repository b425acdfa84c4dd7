"""The fence's cost (issues 21 and 25): spawn time and memory per agent, `sandbox = "auto"`
(bubblewrap: `bwrap ... -- <agent argv>`) against `sandbox = "none"`, measured in the same run.

Every agent is the stand-in (`mcphost/testing/standin_agent.py --hold`, a Python client: it
launches its attach entry from the MCP config the supervisor wrote, `initialize`, `tools/list`,
one `get_my_work`, records it in `calls.jsonl`, then holds the session open), under one real
`mcphost supervise` against the reference center. Only the agent's `sandbox` key differs.

Every supervisor here runs as `python -m bench.fence supervise ...`: `mcphost supervise` with one
event added at the top of `AgentRunner._spawn` (`bench.spawn_begin`), so a spawn is timed from
before the fence is wrapped and the child forked, not from `agent_spawned` (emitted once Popen
has returned, after bubblewrap's exec). Both arms run the same wrapper.

1. Spawn, by turns: one supervisor with two agents, `p-none` and `p-auto`; the bench restarts
   them in turn over the control socket (ABBA: the order swaps every pair), each once the other
   is holding its session again. Per restart, from the supervisor's own event timestamps:
   `bench.spawn_begin` to `supervisor.session.started` (the agent's attach session reaching the
   supervisor: fork, the fence, exec, the agent's start, the pump's start and connect), and to
   the first call recorded (`calls.jsonl`'s new line: plus `initialize`, `tools/list` and one
   center call). Ratios are per pair (fenced ÷ unfenced), then min/median/max. And per process
   of the new tree (`/proc/<pid>/schedstat`): time on a CPU and time runnable but waiting for
   one. The pairs run once on the machine as it is, then again with BENCH_FENCE_HOGS busy loops
   added (processes that only spin, each in a session of its own): the fence's two extra
   processes wait their turn at each hand-over, so its cost grows with the load.
2. Fleets, N = 10 and 50 (BENCH_FENCE_SIZES): per round, one supervisor with N fenced agents and
   one with N unfenced ones, the order swapped each round. Memory: PSS (`smaps_rollup`) summed
   over each agent's whole process tree (fenced: bubblewrap's outer process and its PID
   namespace's init, the agent, its pump; unfenced: the agent and its pump), read once every
   agent has made its call, ÷ N; with the share of each role. Also the fleet's wall (supervisor
   start to the last first call) and the CPU of each agent's tree (schedstat); no per-agent
   spawn time (the supervisor starts a fleet in batches, so it would time the batching).
   Ratios are per round, then min/median/max.
3. Where the spawn time goes: fork + exec of `/bin/true` from a child subreaper, unfenced (the
   supervisor's child setup without a fence) and through a real agent's fence
   (`fence.for_agent`, `kernel.child_setup`: wrap, keyring, Landlock, bwrap), and through
   bubblewrap with its options added step by step; and the stand-in's own start-up, fenced and
   not; BENCH_FENCE_EXECS each, interleaved; wall and CPU (the whole tree's).

What PSS does not see: the kernel's side of a fenced agent (its namespaces, mount table copy,
the empty tmpfs superblocks, two more kernel stacks and page tables). Section 3's last rows hold
BENCH_FENCE_HELD idle `sleep` trees each way and read the kernel's counters (`/proc/meminfo`
Slab, KernelStack, PageTables) around them: an estimate, noisier than PSS.

Targets (issue 25): spawn <= 1.2x, PSS per agent <= 1.05x.
Run alone with `python -m bench.fence`; `make bench` runs it as section 10.
Env: BENCH_FENCE_PAIRS (40), BENCH_FENCE_HOGS (busy loops per set of pairs, 0,4),
BENCH_FENCE_SIZES (10,50), BENCH_FENCE_ROUNDS (rounds per size, 5,3), BENCH_FENCE_EXECS (100),
BENCH_FENCE_HELD (50; 0 skips the kernel estimate).
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.supervisor import avail_mb, children_of, pss_mb, wait_gone

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
PAIRS = int(os.environ.get("BENCH_FENCE_PAIRS", "40"))
HOGS = [int(n) for n in os.environ.get("BENCH_FENCE_HOGS", "0,4").split(",")]
SIZES = [int(n) for n in os.environ.get("BENCH_FENCE_SIZES", "10,50").split(",")]
ROUNDS = [int(n) for n in os.environ.get("BENCH_FENCE_ROUNDS", "5,3").split(",")]
EXECS = int(os.environ.get("BENCH_FENCE_EXECS", "100"))
HELD = int(os.environ.get("BENCH_FENCE_HELD", "50"))
ARMS = ("none", "auto")
ROLES = ("bwrap", "agent", "pump")
WAIT = 300.0  # seconds for any one thing the bench waits on


# -- the supervisor, with its spawns timed from the start ---------------------------------------


def supervise(argv: list[str]) -> int:
    """`mcphost supervise ARGV` with `bench.spawn_begin` emitted as each spawn begins; with
    BENCH_NO_CGROUPS set, with the cgroup backend `none` (bench/operations.py's arm without
    groups: the supervisor's own fallback, agents in no group of their own)."""
    from mcphost import events
    from mcphost.cli import main
    from mcphost.supervisor.agents import runner
    from mcphost.supervisor.confine import cgroups

    if os.environ.get("BENCH_NO_CGROUPS"):

        def no_groups(state_dir: str) -> cgroups.Cgroups:
            return cgroups.Cgroups(cgroups.Backend("none", "bench: groups off"), state_dir)

        cgroups.open_cgroups = no_groups

    original = runner.AgentRunner._spawn

    def timed(self: runner.AgentRunner) -> Any:
        events.emit("bench.spawn_begin", agent_id=self.agent_id)
        return original(self)

    runner.AgentRunner._spawn = timed  # type: ignore[method-assign]
    return main(["supervise", *argv])


class Events:
    """The supervisor's event records (its stderr, JSON lines), read as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self._offset = 0
        self._partial = b""

    def poll(self) -> list[dict[str, Any]]:
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.startswith(b"{"):
                self.records.append(json.loads(line))
        return self.records

    def spawns(self, agent: str, since: int = 0) -> dict[str, Any] | None:
        """The first spawn of `agent` at or after record `since` whose session has started:
        {begin, spawned, attached (timestamps), pid, generation}; None while it has not."""
        found: dict[str, Any] = {}
        for record in self.records[since:]:
            if record.get("agent_id") != agent:
                continue
            event = record["event"]
            if event == "bench.spawn_begin" and "begin" not in found:
                found["begin"] = record["ts"]
            elif event == "supervisor.agent_spawned" and "begin" in found and "pid" not in found:
                found.update(spawned=record["ts"], pid=record["pid"], gen=record["generation"])
            elif (
                event == "supervisor.session.started"
                and "pid" in found
                and record["generation"] == found["gen"]
            ):
                found["attached"] = record["ts"]
                return found
        return None


class Supervisor:
    """One `mcphost supervise` (through `supervise`) with `agents`, against `center`."""

    def __init__(
        self,
        center: Any,
        base: Path,
        agents: list[dict[str, Any]],
        label: str,
        env: dict[str, str] | None = None,
    ) -> None:
        """`env`: added to the supervisor's environment (BENCH_NO_CGROUPS: `supervise`)."""
        from mcphost.testing.fleet import fleet_toml

        self.work = Path(tempfile.mkdtemp(prefix=f"fence-{label}-", dir=base))
        self.work.chmod(0o755)  # a worker's /var/lib/mcphost: the agents' own uids pass through
        self.state = self.work / "state"  # apart from the token and fleet (etc/), as on a
        etc = self.work / "etc"  # worker: /var/lib/mcphost and /etc/mcphost, two covers
        etc.mkdir()
        token = etc / "worker.token"
        token.write_text(center.token + "\n")
        token.chmod(0o600)
        fleet = etc / "fleet.toml"
        fleet.write_text(
            fleet_toml(center, token, agents, client="command", restart="never", stop_grace=5)
        )
        self.ids = [a["id"] for a in agents]
        self.events = Events(self.work / "supervisor.err")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MCPHOST_LOG_LEVEL": "info", **(env or {})}
        argv = [PY, "-m", "bench.fence", "supervise", "--fleet", str(fleet)]
        with self.events.path.open("wb") as err:
            self.started = time.time()
            self.proc = subprocess.Popen(
                [*argv, "--state", str(self.state)],
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                env=env,
                cwd=ROOT,
            )

    def calls(self, agent: str) -> Path:
        return self.state / "agents" / agent / "workspace" / "calls.jsonl"

    def recorded(self, agent: str) -> int:
        """How many first calls `agent`'s generations have recorded (lines of calls.jsonl)."""
        try:
            return self.calls(agent).read_bytes().count(b"\n")
        except FileNotFoundError:
            return 0

    def wait(self, what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT
        while not done():
            if self.proc.poll() is not None:
                tail = self.events.path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the supervisor exited while waiting for {what}: {tail}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not after {WAIT:.0f} s")
            time.sleep(0.002)

    def started_all(self, since: int = 0, calls: int = 1) -> dict[str, dict[str, Any]]:
        """Wait until each agent's spawn since record `since` has its session and its call
        (`calls` lines in calls.jsonl); each spawn's figures, with `called` (the mtime)."""
        found: dict[str, dict[str, Any]] = {}

        def done() -> bool:
            self.events.poll()
            for agent in self.ids:
                if agent not in found:
                    spawn = self.events.spawns(agent, since)
                    if spawn is not None and self.recorded(agent) >= calls:
                        spawn["called"] = self.calls(agent).stat().st_mtime
                        found[agent] = spawn
            return len(found) == len(self.ids)

        self.wait(f"{len(self.ids)} agents' first calls", done)
        for agent in found:
            check_call(self.calls(agent), agent)
        return found

    def restart(self, agent: str) -> dict[str, Any]:
        """Restart `agent` over the control socket; its new spawn's figures."""
        from mcphost.supervisor.control.client import request

        since = len(self.events.poll())
        calls = self.recorded(agent) + 1
        request(str(self.state / "control.sock"), "restart", agent=agent, timeout=WAIT)
        ids, self.ids = self.ids, [agent]
        try:
            return self.started_all(since, calls)[agent]
        finally:
            self.ids = ids

    def stop(self) -> None:
        tree = descendants(self.proc.pid)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        wait_gone(tree)


def check_call(calls: Path, agent: str) -> None:
    last = json.loads(calls.read_text().splitlines()[-1])
    if not last.get("ok"):
        raise RuntimeError(f"{agent}'s call failed: {json.dumps(last)[:500]}")


def descendants(root: int) -> list[int]:
    found, frontier = [], {root}
    while frontier:
        kids = [pid for pids in children_of(frontier).values() for pid in pids]
        found += kids
        frontier = set(kids)
    return found


def role(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        argv = handle.read().split(b"\0")
    if os.path.basename(argv[0]) == b"bwrap":
        return "bwrap"
    return "pump" if any(arg.endswith(b"/attach.py") for arg in argv) else "agent"


def tree_pss(pid: int) -> tuple[dict[str, float], int, float]:
    """PSS (MB) of `pid`'s whole tree by role, how many processes it has, and their CPU
    seconds so far (`/proc/<pid>/schedstat`)."""
    found = dict.fromkeys(ROLES, 0.0)
    tree = [pid, *descendants(pid)]
    for member in tree:
        found[role(member)] += pss_mb(member)
    return found, len(tree), sum(ran for ran, _ in tree_sched(pid).values()) / 1000


def spread(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    """The median, then the lowest and highest in brackets."""
    return (
        fmt.format(statistics.median(values))
        + f" ({fmt.format(min(values))}–{fmt.format(max(values))})"
    )


def ratio_cell(ratios: Sequence[float]) -> str:
    return f"**{statistics.median(ratios):.2f}×** ({min(ratios):.2f}–{max(ratios):.2f})"


# -- 1. spawn, by turns ------------------------------------------------------------------------


TREE_ROLES = ("bwrap (outer)", "bwrap (init)", "agent", "pump")


def tree_sched(pid: int) -> dict[str, tuple[float, float]]:
    """Per role of `pid`'s tree, from `/proc/<pid>/schedstat`: (ms on a CPU, ms runnable but
    waiting for one), each since that process began."""
    found: dict[str, tuple[float, float]] = {}
    for index, member in enumerate([pid, *descendants(pid)]):
        name = role(member)
        if name == "bwrap":
            name = "bwrap (outer)" if index == 0 else "bwrap (init)"
        with open(f"/proc/{member}/schedstat") as handle:
            ran, waited = (int(v) / 1e6 for v in handle.read().split()[:2])
        before = found.get(name, (0.0, 0.0))
        found[name] = (before[0] + ran, before[1] + waited)
    return found


def busy_loops(count: int) -> list[subprocess.Popen[bytes]]:
    """`count` processes that only spin, each in a session of its own (so each is an
    autogroup of its own, as another user's work would be)."""
    return [
        subprocess.Popen([PY, "-c", "while True: pass"], start_new_session=True)
        for _ in range(count)
    ]


def spawn_pairs(sv: Supervisor) -> dict[str, list[dict[str, Any]]]:
    seen: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for index in range(PAIRS + 1):
        for arm in ARMS if index % 2 == 0 else ARMS[::-1]:
            spawn = sv.restart(f"p-{arm}")
            spawn["sched"] = tree_sched(spawn["pid"])
            if index > 0:  # the first pair warms both up
                seen[arm].append(spawn)
    return seen


def section_spawn(center: Any, base: Path, out: list[str]) -> dict[int, list[float]]:
    from mcphost.testing.fleet import standin

    agents = [{"id": f"p-{arm}", "command": standin("--hold"), "sandbox": arm} for arm in ARMS]
    sv = Supervisor(center, base, agents, "pairs")
    levels: dict[int, dict[str, list[dict[str, Any]]]] = {}
    states: dict[int, str] = {}
    try:
        first = sv.started_all()
        with open(f"/proc/{first['p-auto']['pid']}/cmdline", "rb") as handle:
            real = [arg.decode() for arg in handle.read().split(b"\0")[:-1]]
        for hogs in HOGS:
            loops = busy_loops(hogs)
            try:
                time.sleep(1.0 if hogs else 0.0)
                states[hogs] = machine_line("at the start")
                levels[hogs] = spawn_pairs(sv)
            finally:
                for loop in loops:
                    loop.kill()
                    loop.wait()
    finally:
        sv.stop()
    out += [
        f"### 10.1 Spawn, fenced and unfenced by turns ({PAIRS} pairs of restarts, one "
        "supervisor, ABBA)",
        "",
        f"The fenced agent's bubblewrap: {mounts(real)}, PID, IPC, cgroup"
        + (", user" if "--unshare-user" in real else "")
        + " namespaces; its tree: bwrap, bwrap's PID-namespace init, the agent, its pump. "
        "Each set of pairs runs on the machine as it is, then with busy loops added (each a "
        "process that only spins, in a session of its own), to show how the fence's cost "
        "grows when the CPUs are oversubscribed.",
        "",
    ]
    rows = [
        ("spawn → its attach session at the supervisor", "begin", "attached"),
        ("spawn → first call recorded", "begin", "called"),
        ("of which: wrap, fork, pre-exec, exec (before `agent_spawned`)", "begin", "spawned"),
        ("of which: `agent_spawned` → attach session", "spawned", "attached"),
    ]
    headline: dict[int, list[float]] = {}
    for hogs, seen in levels.items():
        out += [
            f"**{hogs} busy loops added** ({states[hogs]}):",
            "",
            "| interval | unfenced, median (min–max) | fenced | fenced ÷ unfenced per pair, "
            "median (min–max) | fenced − unfenced, median |",
            "|---|---|---|---|---|",
        ]
        for label, start, end in rows:
            times = {arm: [(s[end] - s[start]) * 1000 for s in seen[arm]] for arm in ARMS}
            pairs = list(zip(times["auto"], times["none"], strict=True))
            ratios = [f / p for f, p in pairs]
            headline.setdefault(hogs, ratios)
            out.append(
                f"| {label} | {spread(times['none'], '{:.1f}')} ms | "
                f"{spread(times['auto'], '{:.1f}')} ms | {ratio_cell(ratios)} | "
                f"{statistics.median(f - p for f, p in pairs):+.1f} ms |"
            )
        out += [
            "",
            "Where the spawn's time went, per process of the tree (`/proc/<pid>/schedstat` once "
            "the first call is recorded; medians): on a CPU / runnable but waiting for one, ms.",
            "",
            "| process | unfenced: on CPU | waiting | fenced: on CPU | waiting |",
            "|---|---|---|---|---|",
        ]
        totals = {arm: [0.0, 0.0] for arm in ARMS}
        for name in TREE_ROLES:
            cells = []
            for arm in ARMS:
                if name not in seen[arm][0]["sched"]:
                    cells += ["–", "–"]
                    continue
                for at in (0, 1):
                    value = statistics.median(s["sched"][name][at] for s in seen[arm])
                    totals[arm][at] += value
                    cells.append(f"{value:.1f}")
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out += [
            "| sum of the medians | "
            + " | ".join(f"{totals[arm][at]:.1f}" for arm in ARMS for at in (0, 1))
            + " |",
            "",
        ]
    return headline


# -- 2. fleets: memory per agent ----------------------------------------------------------------


def run_fleet(center: Any, base: Path, n: int, sandbox: str) -> dict[str, Any]:
    """One supervisor with `n` stand-ins under `sandbox`: its wall, PSS by role and CPU."""
    from mcphost.testing.fleet import standin

    agents = [
        {"id": f"f-{i:03d}", "command": standin("--hold"), "sandbox": sandbox} for i in range(n)
    ]
    sv = Supervisor(center, base, agents, f"{sandbox}-{n}")
    try:
        spawns = sv.started_all()
        wall = max(s["called"] for s in spawns.values()) - sv.started
        roles = dict.fromkeys(ROLES, 0.0)
        processes, cpu = 0, 0.0
        for spawn in spawns.values():
            found, count, seconds = tree_pss(spawn["pid"])
            processes += count
            cpu += seconds
            for name, mb in found.items():
                roles[name] += mb
        return {
            "wall": wall,
            "pss": sum(roles.values()) / n,
            "roles": {name: mb / n for name, mb in roles.items()},
            "processes": processes / n,
            "cpu": cpu / n,
            "supervisor": pss_mb(sv.proc.pid),
        }
    finally:
        sv.stop()


def section_fleets(center: Any, base: Path, out: list[str]) -> dict[int, list[float]]:
    out += [
        "### 10.2 Fleets: PSS per agent (its whole process tree), wall and CPU, N agents "
        "fenced against N unfenced (rounds alternate, order swapped each round)",
        "",
        "No per-agent spawn time here: when a fleet starts, the supervisor spawns its agents in "
        "batches and takes their sessions in bursts, the same in both arms, so a per-agent "
        "figure measures where an agent fell in a batch; 10.1 times spawns one at a time.",
        "",
        "| N | rounds | PSS per agent, unfenced | fenced | ratio per round | fleet wall, "
        "unfenced | fenced | ratio | CPU per agent's tree, unfenced | fenced | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    breakdown: list[str] = []
    headline: dict[int, list[float]] = {}
    for n, rounds in zip(SIZES, ROUNDS + [1] * len(SIZES), strict=False):
        seen: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
        for index in range(rounds):
            for arm in ARMS if index % 2 == 0 else ARMS[::-1]:
                seen[arm].append(run_fleet(center, base, n, arm))
        cells = [str(n), str(rounds)]
        for key, fmt, unit, scale in (
            ("pss", "{:.2f}", "MB", 1),
            ("wall", "{:.2f}", "s", 1),
            ("cpu", "{:.0f}", "ms", 1000),
        ):
            plain = [r[key] * scale for r in seen["none"]]
            fenced = [r[key] * scale for r in seen["auto"]]
            ratios = [f / p for f, p in zip(fenced, plain, strict=True)]
            if key == "pss":
                headline[n] = ratios
            cells += [f"{spread(plain, fmt)} {unit}", f"{spread(fenced, fmt)} {unit}"]
            cells.append(ratio_cell(ratios))
        out.append("| " + " | ".join(cells) + " |")
        for arm in ARMS:
            runs = seen[arm]
            parts = [
                f"{name} {statistics.median(r['roles'][name] for r in runs):.2f}" for name in ROLES
            ]
            breakdown.append(
                f"| {n} | {'fenced' if arm == 'auto' else 'unfenced'} | "
                f"{statistics.median(r['processes'] for r in runs):.0f} | "
                + " | ".join(p.split()[1] for p in parts)
                + f" | {statistics.median(r['supervisor'] for r in runs):.1f} |"
            )
    out += [
        "",
        "PSS per agent by role (MB, medians over rounds), and the supervisor's own PSS:",
        "",
        "| N | arm | processes per agent | bwrap (outer + PID-namespace init) | agent | pump "
        "| supervisor |",
        "|---|---|---|---|---|---|---|",
        *breakdown,
        "",
    ]
    return headline


# -- 3. where the time goes: /bin/true through each part of the fence --------------------------


def agent_fence(base: Path) -> Any:
    """A real agent's fence, as the supervisor plans it (`for_agent`), laid out as in 10.1 and
    10.2 (and on a worker): state, token and fleet, and the center's socket in three
    directories, each covered; the home and the two attach sockets bound back."""
    from mcphost.supervisor.confine import fence

    lab = base / "exec"
    state, etc, center = lab / "state", lab / "etc", lab / "center"
    home = state / "agents" / "x"
    (home / "workspace").mkdir(parents=True)
    for folder in (state / "run", etc, center):
        folder.mkdir(exist_ok=True)
    sockets = (str(state / "run" / "center.sock"), str(state / "run" / "relay.sock"))
    secrets = (str(etc / "worker.token"), str(etc / "fleet.toml"), str(center / "admin.sock"))
    for path in (*sockets, *secrets):
        Path(path).touch()
    return fence.for_agent(
        state_dir=str(state),
        home=str(home),
        workspace=str(home / "workspace"),
        sockets=sockets,
        secrets=secrets,
        env={"PATH": os.environ.get("PATH", os.defpath)},
        switch=None,
        pump=str(ROOT / "mcphost" / "attach.py"),
    )


def options_of(argv: list[str]) -> tuple[list[str], list[str]]:
    """A bubblewrap command line's options and the program it runs (after `--`)."""
    cut = argv.index("--")
    return argv[1:cut], argv[cut + 1 :]


def mounts(argv: list[str]) -> str:
    """What a bubblewrap command line mounts, in words."""
    options, program = options_of(argv)
    tmpfs = options.count("--tmpfs")
    tries = options.count("--ro-bind-try")
    binds = options.count("--bind") + options.count("--ro-bind") + tries - 1  # not `/`
    text = (
        f"`/` read-only, {tmpfs} tmpfs ({tmpfs - 3} covers, 3 private), {binds} binds "
        f"({tries} of them `/dev/null` over root-only files), "
        f"{options.count('--remount-ro')} `--remount-ro`, {options.count('--dir')} `--dir`"
    )
    if len(program) > 1 and os.path.basename(program[0]) in ("env", "setpriv"):
        text += f", then `{os.path.basename(program[0])}` before the agent"
    return text


def bwrap_steps(full: list[str]) -> list[tuple[str, list[str]]]:
    """bubblewrap's command line grown option by option up to the agent's own (`full`, whose
    program ends in `/bin/true`): what each step adds."""
    options, program = options_of(full)

    def taken(*names: str, width: int = 1) -> list[str]:
        """Each of `names` present in the options, with its `width` - 1 arguments."""
        found: list[str] = []
        for name in names:
            if name in options:
                at = options.index(name)
                found += options[at : at + width]
        return found

    private: list[str] = []
    for at, arg in enumerate(options):
        if arg == "--tmpfs" and options[at + 1] in ("/tmp", "/var/tmp", "/dev/shm"):
            private += options[at - 4 : at + 2]
    user = taken("--unshare-user") + taken("--uid", "--gid", width=2)
    namespaces = taken("--unshare-ipc", "--unshare-cgroup-try", "--die-with-parent")
    namespaces += taken("--cap-drop", width=2)
    devproc = ["--dev", "/dev", "--proc", "/proc"]
    if "/proc/sys" in options:
        devproc += ["--ro-bind", "/proc/sys", "/proc/sys"]
    base = [full[0], "--ro-bind", "/", "/"]
    grown = [
        ("bwrap --ro-bind / / (a mount namespace)", base),
        ("+ --unshare-pid (its init: one more process)", [*base, "--unshare-pid"]),
        (
            "+ --unshare-user --uid --gid (uid 0 seen as nobody)"
            if user
            else "+ no user namespace",
            [*base, "--unshare-pid", *user],
        ),
        ("+ " + " ".join(a for a in namespaces if a.startswith("--")), namespaces),
        ("+ --dev /dev --proc /proc" + (" --ro-bind /proc/sys" if devproc[4:] else ""), devproc),
        ("+ 3 private tmpfs (/tmp, /var/tmp, /dev/shm)", private),
    ]
    steps, last = [], base
    for label, added in grown:
        last = added if added[:1] == [full[0]] else [*last, *added]
        steps.append((label, [*last, "--", "/bin/true"]))
    steps.append(
        (
            "the agent's whole fence (+ covers, binds, `--dir`, `--remount-ro`, `--chdir`)",
            [full[0], *options, "--", "/bin/true"],
        )
    )
    if program[:-1]:
        steps.append((f"+ `{' '.join(program[:-1])}` before the program", full))
    return steps


def exec_samples(base: Path) -> dict[str, Any]:
    """Run in a process of its own (`python -m bench.fence exec DIR`), a child subreaper: the
    runs of 10.3, each as (wall ms, CPU ms). bubblewrap's outer process exits once its PID
    namespace's init reports the command's status, before the init is reaped, so the init (and
    all it reaped) comes back here to be reaped and counted in RUSAGE_CHILDREN."""
    import resource

    from mcphost.supervisor.confine import kernel

    kernel.set_child_subreaper()
    fenced = agent_fence(base)
    env = {"PATH": os.environ.get("PATH", os.defpath)}
    enter = kernel.pdeathsig_preexec(signal.SIGTERM, fence=fenced)
    standin = [PY, str(ROOT / "mcphost" / "testing" / "standin_agent.py"), str(base / "none")]

    def setup(argv: list[str], fence: Any) -> Callable[[], Any]:
        def run() -> Any:
            child = kernel.child_setup(argv, cwd="/", env=env, creds=None, fence=fence)
            return subprocess.run(
                child.argv, cwd=child.cwd, preexec_fn=child.preexec, stderr=subprocess.DEVNULL
            )

        return run

    def step(argv: list[str]) -> Callable[[], Any]:
        return lambda: subprocess.run(argv, preexec_fn=enter, check=True)

    full = kernel.child_setup(["/bin/true"], cwd="/", env=env, creds=None, fence=fenced).argv
    variants = [("true", setup(["/bin/true"], None))]
    variants += [(label, step(argv)) for label, argv in bwrap_steps(full)]
    variants += [
        ("true fenced", setup(["/bin/true"], fenced)),
        ("standin", setup(standin, None)),
        ("standin fenced", setup(standin, fenced)),
    ]
    samples: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in variants}
    for index in range(EXECS + 3):
        for label, run in variants if index % 2 == 0 else variants[::-1]:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            run()
            wall = (time.perf_counter() - start) * 1000
            with contextlib.suppress(ChildProcessError):
                while True:  # the orphaned init, once it has reaped the command
                    os.waitpid(-1, 0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000
            if index >= 3:
                samples[label].append((wall, cpu))
    return {"argv": full, "samples": samples}


def section_exec(base: Path, out: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [PY, "-m", "bench.fence", "exec", str(base)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the exec runs failed: {done.stderr[-3000:]}")
    result = json.loads(done.stdout)
    full, samples = result["argv"], result["samples"]
    labels = {
        "true": "/bin/true, unfenced (`child_setup` without a fence)",
        "true fenced": "/bin/true fenced (`child_setup`: wrap, keyring, Landlock, bwrap)",
        "standin": "the stand-in's start-up (Python, its imports; to its config), unfenced",
        "standin fenced": "the same, fenced",
    }
    out += [
        f"### 10.3 Where the spawn time goes: fork + exec of `/bin/true` ({EXECS} each, "
        "interleaved), and of the stand-in agent",
        "",
        f"The agent's fence here is planned as in 10.1 ({mounts(full)}); each bubblewrap row "
        "runs with the fenced child's pre-exec step (keyring, no_new_privs, Landlock). CPU: "
        "user + system time of the whole tree (RUSAGE_CHILDREN, with bubblewrap's orphaned "
        "init reaped too), which the machine's load does not inflate.",
        "",
        "| how | wall, median (min–max) | step | CPU, median (min–max) | step |",
        "|---|---|---|---|---|",
    ]
    previous = (0.0, 0.0)
    for key, runs in samples.items():
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        if key == "true":
            steps = ("", "")
            first = (wall, cpu)
        elif key == "true fenced":
            steps = (f"{wall - first[0]:+.2f} ms in all", f"{cpu - first[1]:+.2f} ms in all")
        elif key == "standin":
            steps = ("", "")
        elif key == "standin fenced":
            steps = (f"{wall - previous[0]:+.2f} ms", f"{cpu - previous[1]:+.2f} ms")
        else:
            steps = (f"{wall - previous[0]:+.2f} ms", f"{cpu - previous[1]:+.2f} ms")
        out.append(
            f"| {labels.get(key, key)} | {spread([r[0] for r in runs])} ms | {steps[0]} | "
            f"{spread([r[1] for r in runs])} ms | {steps[1]} |"
        )
        previous = (wall, cpu)
    from mcphost.supervisor.confine import probe as machine

    probes = []
    for _ in range(20):
        start = time.perf_counter()
        machine._probe_userns(machine.probe().bwrap)
        probes.append((time.perf_counter() - start) * 1000)
    out += [
        "",
        "The user-namespace probe (`probe.probe`: a forked child tries a user and a mount "
        "namespace and a tmpfs) runs once per supervisor start, fenced agents or not, never per "
        "spawn: "
        f"{spread(probes)} ms (20 runs).",
        "",
    ]
    if HELD > 0:
        from mcphost.supervisor.confine import kernel

        enter = kernel.pdeathsig_preexec(signal.SIGTERM, fence=agent_fence(base / "held"))
        section_held(full, enter, out)


def kernel_kb() -> dict[str, int]:
    wanted = ("Slab", "KernelStack", "PageTables", "Shmem", "MemAvailable")
    found = {}
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            name, value = line.split(":", 1)
            if name in wanted:
                found[name] = int(value.split()[0])
    return found


def section_held(full: list[str], enter: Callable[[], None], out: list[str]) -> None:
    """HELD idle `sleep` trees at once, fenced and not, in turns: the kernel's counters."""
    sleep = ["/bin/sleep", "600"]
    argv = {"none": sleep, "auto": [*full[:-1], *sleep]}
    deltas: dict[str, list[dict[str, int]]] = {arm: [] for arm in ARMS}
    pss: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for index in range(4):
        for arm in ARMS if index % 2 == 0 else ARMS[::-1]:
            before = kernel_kb()
            preexec = enter if arm == "auto" else None
            procs = [
                subprocess.Popen(argv[arm], preexec_fn=preexec, start_new_session=True)
                for _ in range(HELD)
            ]
            members = 3 if arm == "auto" else 1  # bwrap, its init, sleep
            deadline = time.monotonic() + WAIT
            while True:
                trees = [[p.pid, *descendants(p.pid)] for p in procs]
                if all(len(tree) == members for tree in trees):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the held trees did not start")
                time.sleep(0.01)
            time.sleep(0.2)
            after = kernel_kb()
            pss[arm].append(sum(pss_mb(m) for tree in trees for m in tree) / HELD)
            deltas[arm].append({k: after[k] - before[k] for k in after})
            for p in procs:  # the group: bwrap's outer process alone would leave the rest
                os.killpg(p.pid, signal.SIGTERM)
            for p in procs:
                p.wait()
            wait_gone([m for tree in trees for m in tree])
            time.sleep(0.5)
    out += [
        f"Kernel memory of {HELD} idle trees held at once (`/bin/sleep`, alone or in the "
        "agent's fence), 4 rounds in turns: per tree, the growth of `/proc/meminfo` counters "
        "while they are up, medians (min–max), kB:",
        "",
        "| counter | unfenced | fenced | fenced − unfenced |",
        "|---|---|---|---|",
    ]
    for key in ("Slab", "KernelStack", "PageTables", "Shmem"):
        plain = [d[key] / HELD for d in deltas["none"]]
        fenced_kb = [d[key] / HELD for d in deltas["auto"]]
        out.append(
            f"| {key} | {spread(plain, '{:.0f}')} | {spread(fenced_kb, '{:.0f}')} | "
            f"{statistics.median(fenced_kb) - statistics.median(plain):+.0f} |"
        )
    lost = {arm: [-d["MemAvailable"] / HELD for d in deltas[arm]] for arm in ARMS}
    out += [
        f"| MemAvailable lost | {spread(lost['none'], '{:.0f}')} | "
        f"{spread(lost['auto'], '{:.0f}')} | "
        f"{statistics.median(lost['auto']) - statistics.median(lost['none']):+.0f} |",
        f"| PSS of the tree (for scale) | {spread([m * 1024 for m in pss['none']], '{:.0f}')} | "
        f"{spread([m * 1024 for m in pss['auto']], '{:.0f}')} | |",
        "",
    ]


def bench_dir() -> str:
    """Where the bench's directories go: under /var/lib, as a worker's state
    (`/var/lib/mcphost`), so that the fence covers them as it would there (under /tmp they
    would sit inside the agent's private /tmp, and nothing would need covering); under the
    user's ~/.cache where /var/lib is not writable."""
    if os.access("/var/lib", os.W_OK):
        return "/var/lib"
    cache = Path.home() / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    return str(cache)


# -- the section ---------------------------------------------------------------------------------


def machine_line(when: str) -> str:
    load = os.getloadavg()
    try:
        pressure = Path("/proc/pressure/cpu").read_text().split()[1]
    except (OSError, IndexError):
        pressure = "n/a"
    return (
        f"{when}: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} · load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} · CPU pressure {pressure} · "
        f"{avail_mb()} MB available"
    )


async def section(out: list[str]) -> None:
    from mcphost.supervisor.confine import probe as machine
    from mcphost.testing import DevCenter

    support = machine.probe()
    missing = support.missing()
    out += [
        "## 10. The fence: spawn time and memory per agent, fenced ÷ unfenced (issues 21, 25)",
        "",
    ]
    if missing is not None:
        out += [f"Skipped: this machine lacks {missing}.", ""]
        return
    bwrap_version = subprocess.run(
        [support.bwrap or "bwrap", "--version"], capture_output=True, text=True
    ).stdout.strip()
    out += [
        f"{os.cpu_count()} CPUs · kernel {os.uname().release} · {bwrap_version} · fence level "
        f"{support.level()} · supervisor uid {os.geteuid()}",
        "",
        machine_line("Start"),
        "",
        "Targets: spawn ≤ 1.2×, PSS per agent ≤ 1.05×. Every ratio is fenced ÷ unfenced, taken "
        "pair by pair (10.1) or round by round (10.2), then median (min–max).",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="mcphost-bench-fence-", dir=bench_dir()) as tmp:
        base = Path(tmp)
        with DevCenter.start(base / "center", unix=True, control=True) as center:
            ids = [f"f-{i:03d}" for i in range(max(SIZES))] + [f"p-{arm}" for arm in ARMS]
            reply = center.request(
                "POST", "/_devcenter/agents", {"worker_id": "w-1", "agent_ids": ids}
            )
            if reply.status != 200:
                raise RuntimeError(
                    f"binding the agents failed: {reply.status} {reply.body[:300]!r}"
                )
            spawn = section_spawn(center, base, out)
            memory = section_fleets(center, base, out)
        section_exec(base, out)
    verdicts = [
        f"spawn with {hogs} busy loops added {statistics.median(ratios):.2f}× "
        f"({'meets' if statistics.median(ratios) <= 1.2 else 'misses'} ≤ 1.2×)"
        for hogs, ratios in spawn.items()
    ]
    for n, ratios in memory.items():
        verdicts.append(
            f"PSS per agent at N = {n} {statistics.median(ratios):.2f}× "
            f"({'meets' if statistics.median(ratios) <= 1.05 else 'misses'} ≤ 1.05×)"
        )
    out += [machine_line("End"), "", "Against the targets (medians): " + "; ".join(verdicts), ""]


if __name__ == "__main__":
    if sys.argv[1:2] == ["supervise"]:
        sys.exit(supervise(sys.argv[2:]))
    if sys.argv[1:2] == ["exec"]:
        print(json.dumps(exec_samples(Path(sys.argv[2]))))
        sys.exit(0)
    import asyncio

    report: list[str] = []
    asyncio.run(section(report))
    print("\n".join(report))
