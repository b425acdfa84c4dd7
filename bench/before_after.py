"""Before → after: the current tree against `BENCH_BASELINE`, interleaved in one run (issue #20).

`BENCH_BASELINE=<dir>` holds an older export (`git archive <rev> mcphost configgen | tar -x -C
<dir>`: configgen too, since the supervisor writes its attach configs with it). Each figure runs
both trees by turns, in the same run, so the load of a shared machine falls on both alike;
every ratio is after ÷ before (below 1 is faster or smaller).

1. Standalone host (`mcphost host`): start-up (spawn → `initialize` reply) and peak RSS after
   one call, the two trees spawned by turns; per-call `tools/call get_task` over Unix and TLS,
   both hosts open at once, calls in chunks of 10 by turns (order swapped every chunk).
2. Supervised relay and center calls: two `mcphost supervise` run at once, one per tree, each
   with its own reference center and a bundle `party` of two tmux agents: A, a driver (this
   file, `-I -S`, standard library only) on its own attach entries (`agentmux` and
   `agent-center`), and B, an echo stand-in. The bench opens A's batches by turns (a `go-<k>`
   file: one op, `count` calls; order swapped every round): `help` (answered by the relay
   tools, no relay), `look` at B, `send` to B (answered `queued`; the deliveries are awaited
   untimed after the batch, by `look` until the batch's last marker is echoed), `get_my_work`
   (pump → supervisor → center). After each round: each supervisor's PSS (`smaps_rollup`).
3. Supervisor memory with N `client = "command"` agents (bench/supervisor.py's fleet rounds:
   each agent makes one `get_my_work`): PSS of the supervisor, and of the supervisor and its
   pumps, the trees by turns; ratios are medians of per-pair ratios.

The current tree runs its agents unfenced (`sandbox = "none"`): the baseline has no fence (no
`sandbox` key at all), so this compares the same work; bench/fence.py measures the fence.
Skipped (one line in the report) without BENCH_BASELINE.
Alone: `BENCH_BASELINE=/tmp/base python -m bench.before_after` (~10 min).
Env: BENCH_BA_ROUNDS (relay rounds, 15), BENCH_BA_BATCH (calls per op and round, 20),
BENCH_BA_SIZES (fleet sizes, 10,100), BENCH_BA_FLEET_ROUNDS (pairs per size, 4,2),
BENCH_BA_RUNS (host start-ups per tree, 20).

Module-level imports are standard library only: agent A runs this file with `-I -S`.
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

UNFENCED: dict[str, Any] = {"sandbox": "none", **({"user": "root"} if os.geteuid() == 0 else {})}
PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
THIS = str(Path(__file__).resolve())
BASELINE = os.environ.get("BENCH_BASELINE", "")
ROUNDS = int(os.environ.get("BENCH_BA_ROUNDS", "15"))
BATCH = int(os.environ.get("BENCH_BA_BATCH", "20"))
SIZES = [int(n) for n in os.environ.get("BENCH_BA_SIZES", "10,100").split(",")]
FLEET_ROUNDS = [int(n) for n in os.environ.get("BENCH_BA_FLEET_ROUNDS", "4,2").split(",")]
RUNS = int(os.environ.get("BENCH_BA_RUNS", "20"))
CALLS = int(os.environ.get("BENCH_CALLS", "300"))
OPS = ("help", "look", "send", "get_my_work")
GUARD = 120.0
ECHO = Path(__file__).with_name("peers") / "echo_prompt.py"
POLICIES = """\
format-version = 1
default = "default"

[[policies]]
id = "default"
[policies.controls]
list = "home"
look = "home"
send = "home"
"""

# -- agent A: the driver (standard library only; run as `python -I -S before_after.py driver`) --


def tool(wire: Any, name: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    reply: dict[str, Any] = wire.request("tools/call", {"name": name, "arguments": arguments})
    return "result" in reply and not reply["result"].get("isError"), reply


def text_of(reply: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for c in reply.get("result", {}).get("content", []))


def drive(config: str, ctl: Path) -> None:
    """Open both attach entries, wait for the bundle to be ready, then serve `go-<k>` batches:
    each names an op and a count; the seconds each call took go to `done-<k>.json`."""
    sys.path.insert(0, str(ROOT))
    from bench.supervisor import Wire

    entries = json.loads(Path(config).read_text())["mcpServers"]
    relay = Wire(entries["agentmux"], str(ctl / "relay.stderr.log"))
    center = Wire(entries["agent-center"], str(ctl / "center.stderr.log"))
    relay.open()
    center.open()
    deadline = time.monotonic() + GUARD
    while True:  # every member ready, and B's stand-in has printed its prompt
        ok, listed = tool(relay, "list", {"command": "principals"})
        principals = json.loads(text_of(listed))["bundles"][0]["principals"] if ok else []
        if principals and all(p["ready"] for p in principals):
            ok, looked = tool(relay, "look", {"target_session": "B@party"})
            if ok and ">" in text_of(looked):
                break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the bundle never became ready: {listed}")
        time.sleep(0.05)
    (ctl / "ready").write_text(str(os.getpid()))
    calls = {
        "help": lambda i, k: tool(relay, "help", {}),
        "look": lambda i, k: tool(relay, "look", {"target_session": "B@party"}),
        "send": lambda i, k: tool(relay, "send", {"message": f"b{k} m{i} end", "targets": ["B"]}),
        "get_my_work": lambda i, k: tool(center, "get_my_work", {}),
    }
    for k in range(1 << 30):
        go = ctl / f"go-{k}"
        while not go.exists():
            if (ctl / "stop").exists():
                return
            time.sleep(0.002)
        op, count = go.read_text().split()
        samples, failed = [], []
        for i in range(int(count)):
            started = time.perf_counter()
            ok, reply = calls[op](i, k)
            samples.append(time.perf_counter() - started)
            if not ok:
                failed.append(reply)
        if op == "send":  # untimed: the batch delivered before the next (B's pane echoes it)
            last = f"echo: b{k} m{int(count) - 1} end"
            deadline = time.monotonic() + GUARD
            while last not in text_of(tool(relay, "look", {"target_session": "B@party"})[1]):
                if time.monotonic() > deadline:
                    failed.append({"undelivered": last})
                    break
                time.sleep(0.02)
        (ctl / "done.tmp").write_text(json.dumps({"samples": samples, "failed": failed[:3]}))
        os.rename(ctl / "done.tmp", ctl / f"done-{k}.json")


# -- the bench side ---------------------------------------------------------------------------


def pss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no Pss for {pid}")


def wait_for(path: Path, timeout: float, alive: Any) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear in {timeout} s")
        time.sleep(0.002)


class Party:
    """One `mcphost supervise` of one tree, its own center, the bundle `party` (A and B)."""

    def __init__(self, name: str, tree: str, stack: contextlib.ExitStack) -> None:
        from mcphost.testing import DevCenter
        from mcphost.testing.fleet import fleet_toml

        self.name = name
        # short: the supervisor's sockets live under it
        self.dir = Path(tempfile.mkdtemp(prefix=f"bba-{name[:4]}-", dir="/tmp"))
        stack.callback(self.close)
        self.center = stack.enter_context(DevCenter.start(self.dir / "c", unix=True, control=True))
        reply = self.center.request(
            "POST", "/_devcenter/agents", {"worker_id": "w-1", "agent_ids": ["A", "B"]}
        )
        if reply.status != 200:
            raise RuntimeError(f"binding A and B failed: {reply.status} {reply.body[:300]!r}")
        self.ctl = self.dir / "ctl"
        self.ctl.mkdir()
        operator = self.dir / "operator"
        operator.mkdir()
        (operator / "policies.toml").write_text(POLICIES)
        token = self.dir / "worker.token"
        token.write_text(self.center.token + "\n")
        token.chmod(0o600)
        defaults: dict[str, Any] = {
            "client": "command",
            "bundle": "party",
            "runner": "tmux",
            "restart": "never",
            "stop_grace": 5,
        }
        # the same work on both sides, whatever each tree's defaults: unfenced, and as root where
        # the bench is root (an agent of its own uid cannot run an interpreter under a 0700 home)
        defaults.update(UNFENCED)
        agents = [
            {"id": "A", "command": [PY, "-I", "-S", THIS, "driver", "{mcp_config}", str(self.ctl)]},
            {"id": "B", "command": [PY, "-u", str(ECHO)]},
        ]
        self.fleet = self.dir / "fleet.toml"
        self.fleet.write_text(fleet_toml(self.center, token, agents, **defaults))
        env = {
            **os.environ,
            "PYTHONPATH": tree,
            "AGENTMUX_CONFIGURATION_DIRECTORY": str(operator),
            "MCPHOST_LOG_LEVEL": "warning",
        }
        env.pop("AGENTMUX_STATE_DIRECTORY", None)
        with open(self.dir / "supervisor.stderr.log", "ab") as err:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [PY, "-m", "mcphost", "supervise", "--fleet", str(self.fleet), "--state",
                 str(self.dir / "s")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
                cwd=tree,  # `-m` puts the working directory first on sys.path: the tree's
            )  # fmt: skip
        self.batch = 0

    def alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = (self.dir / "supervisor.stderr.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(
                f"{self.name}: the supervisor exited {self.proc.returncode}:\n{tail}"
            )

    def wait_ready(self) -> None:
        wait_for(self.ctl / "ready", 180, self.alive)

    def run(self, op: str, count: int) -> list[float]:
        k, self.batch = self.batch, self.batch + 1
        (self.ctl / "go.tmp").write_text(f"{op} {count}")
        os.rename(self.ctl / "go.tmp", self.ctl / f"go-{k}")
        done = self.ctl / f"done-{k}.json"
        wait_for(done, 300, self.alive)
        result = json.loads(done.read_text())
        if result["failed"]:
            raise RuntimeError(f"{self.name}: {op} failed: {json.dumps(result['failed'])[:2000]}")
        return list(result["samples"])

    def pss(self) -> float:
        assert self.proc is not None
        return pss_mb(self.proc.pid)

    def close(self) -> None:
        (self.ctl / "stop").write_text("")
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)  # the center has stopped (LIFO)


def fmt(samples: list[float], unit: str = "ms", scale: float = 1000.0) -> str:
    """Median with its IQR, or with the whole range below 4 samples (no quartiles then)."""
    ordered = sorted(samples)
    if len(ordered) >= 4:
        low, _, high = statistics.quantiles(ordered, n=4)
        spread = "IQR"
    else:
        low, high, spread = ordered[0], ordered[-1], "range"
    m = statistics.median(ordered)
    gap = "" if unit == "×" else " "
    return f"{m * scale:.3f}{gap}{unit} ({spread} {low * scale:.3f}–{high * scale:.3f})"


def ratio_row(label: str, before: list[float], after: list[float], unit: str = "ms",
              scale: float = 1000.0, per_pair: list[float] | None = None) -> str:  # fmt: skip
    extra = ""
    if per_pair:
        extra = f" · per-pair ratio {fmt(per_pair, '×', 1.0)}"
    return (
        f"| {label} | {fmt(before, unit, scale)} | {fmt(after, unit, scale)} | "
        f"{statistics.median(after) / statistics.median(before):.3f}×{extra} | "
        f"{len(before)} / {len(after)} |"
    )


async def host_figures(out: list[str]) -> None:
    """1. The standalone host: start-up and peak RSS, per-call Unix and TLS, by turns."""
    from bench.__main__ import mcp_caller, server_argv
    from bench.harness import RawMcp, peak_rss_mb
    from mcphost.testing import DevCenter

    with (
        tempfile.TemporaryDirectory(prefix="bba-host-") as tmp,
        DevCenter.start(Path(tmp), unix=True, tcp=True, control=True) as center,
    ):
        reply = center.call(
            "create_task", {"project_id": "p-1", "title": "bench", "assignee": center.agent_id}
        )
        task_id = reply.json()["task_id"]
        kinds = {"before": "host-baseline", "after": "host"}
        start: dict[str, list[float]] = {"before": [], "after": []}
        rss: dict[str, list[float]] = {"before": [], "after": []}
        for run in range(RUNS):
            for side in ("before", "after") if run % 2 == 0 else ("after", "before"):
                server = RawMcp(server_argv(kinds[side]), center.binding_env("unix"))
                start[side].append(await server.start())
                await server.call("get_task", {"task_id": task_id})
                rss[side].append(peak_rss_mb(server.pid))
                await server.close()
        rows = [
            ratio_row(
                "host start-up (spawn → `initialize` reply)", start["before"], start["after"]
            ),
            ratio_row("host peak RSS after one call", rss["before"], rss["after"], "MB", 1.0),
        ]
        for transport in ("unix", "tcp"):
            servers, calls = {}, {}
            for side, kind in kinds.items():
                servers[side], calls[side] = await mcp_caller(
                    kind, center.binding_env(transport), {"task_id": task_id}
                )
            samples: dict[str, list[float]] = {"before": [], "after": []}
            for side in calls:  # warm-up
                for _ in range(20):
                    await calls[side]()
            for chunk in range(CALLS // 10):
                for side in ("before", "after") if chunk % 2 == 0 else ("after", "before"):
                    for _ in range(10):
                        started = time.perf_counter()
                        await calls[side]()
                        samples[side].append(time.perf_counter() - started)
            for server in servers.values():
                await server.close()
            name = "Unix" if transport == "unix" else "TLS"
            rows.append(
                ratio_row(
                    f"host per call `get_task` ({name}), p50", samples["before"], samples["after"]
                )
            )
    out += [
        "### Standalone host (`mcphost host`), trees by turns",
        "",
        "| figure | before (median, IQR) | after (median, IQR) | after ÷ before | n |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]


def relay_figures(out: list[str]) -> None:
    """2. The supervised relay tools and center calls, two supervisors at once, by turns."""
    samples: dict[str, dict[str, list[float]]] = {s: {op: [] for op in OPS} for s in ("b", "a")}
    medians: dict[str, dict[str, list[float]]] = {s: {op: [] for op in OPS} for s in ("b", "a")}
    pss: dict[str, list[float]] = {"b": [], "a": []}
    with contextlib.ExitStack() as stack:
        parties = {"b": Party("before", BASELINE, stack), "a": Party("after", str(ROOT), stack)}
        for party in parties.values():
            party.wait_ready()
        for party in parties.values():  # warm-up, untimed
            for op in OPS:
                party.run(op, 10)
        for r in range(ROUNDS):
            for op in OPS:
                for side in ("b", "a") if (r + OPS.index(op)) % 2 == 0 else ("a", "b"):
                    got = parties[side].run(op, BATCH)
                    samples[side][op] += got
                    medians[side][op].append(statistics.median(got))
            for side, party in parties.items():
                pss[side].append(party.pss())
    labels = {
        "help": "`help` (relay tools, no relay)",
        "look": "`look` B (the relay: capture-pane)",
        "send": "`send` B (answered `queued`)",
        "get_my_work": "`get_my_work` (pump → supervisor → center)",
    }
    rows = []
    for op in OPS:
        pairs = [a / b for a, b in zip(medians["a"][op], medians["b"][op], strict=True)]
        rows.append(ratio_row(labels[op], samples["b"][op], samples["a"][op], per_pair=pairs))
    pairs = [a / b for a, b in zip(pss["a"], pss["b"], strict=True)]
    rows.append(
        ratio_row("supervisor PSS with the bundle (after each round)", pss["b"], pss["a"], "MB",
                  1.0, per_pair=pairs)
    )  # fmt: skip
    out += [
        f"### Supervised relay tools and center calls from agent A: {ROUNDS} rounds × {BATCH} "
        "calls per op and tree, batches by turns",
        "",
        "| figure | before (median, IQR) | after (median, IQR) | after ÷ before | n |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]


def fleet_figures(out: list[str]) -> None:
    """3. Supervisor memory with N command agents, trees by turns."""
    from bench.supervisor import fleet_round
    from mcphost.testing import DevCenter

    rows = []
    from bench.supervisor import UNFENCED as UNFENCED_LINES

    # the same work on both sides: unfenced (and as root where the bench is root), each tree
    trees = {"b": {"tree": BASELINE}, "a": {"tree": str(ROOT)}}
    for options in trees.values():
        options["defaults"] = UNFENCED_LINES
    ids = [f"sv-{i:03d}" for i in range(1, max(SIZES) + 1)]
    with contextlib.ExitStack() as stack:
        base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bba-fl-", dir="/tmp")))
        centers = {}
        # a center per tree: the baseline numbers its hosts' generations from 1 in every run,
        # so a center that has seen the current tree's would fence it (`stale_generation`)
        for side in trees:
            center = stack.enter_context(
                DevCenter.start(base / f"center-{side}", unix=True, control=True)
            )
            body = {"worker_id": "w-1", "agent_ids": ids}
            reply = center.request("POST", "/_devcenter/agents", body)
            if reply.status != 200:
                raise RuntimeError(f"binding the agents failed: {reply.status}")
            centers[side] = center
        for side in trees:  # warm-up
            fleet_round(centers[side], base, SIZES[0], True, False, **trees[side])
        for n, rounds in zip(SIZES, FLEET_ROUNDS, strict=False):
            got: dict[str, list[dict[str, Any]]] = {"b": [], "a": []}
            for r in range(rounds):
                for side in ("b", "a") if r % 2 == 0 else ("a", "b"):
                    got[side].append(
                        fleet_round(centers[side], base, n, True, False, **trees[side])
                    )
            for key, label in (("first_pss", "supervisor PSS"), ("pss", "supervisor + pumps PSS"),
                               ("wall", "fleet start-up wall")):  # fmt: skip
                before = [g[key] for g in got["b"]]
                after = [g[key] for g in got["a"]]
                pairs = [a / b for a, b in zip(after, before, strict=True)]
                unit = "s" if key == "wall" else "MB"
                rows.append(
                    ratio_row(f"N = {n}: {label}", before, after, unit, 1.0, per_pair=pairs)
                )
    out += [
        '### Supervisor with N `client = "command"` agents (each one `get_my_work`), trees by '
        "turns",
        "",
        "| figure | before (median, IQR) | after (median, IQR) | after ÷ before | n |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]


async def section(out: list[str]) -> None:
    if not BASELINE:
        out += ["## 11. Before → after: skipped (no BENCH_BASELINE)", ""]
        return
    load = os.getloadavg()
    out += [
        f"## 11. Before → after: `{BASELINE}` (before) against this tree (after), by turns",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {os.cpu_count()} CPUs · load "
        f"average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} · ratios after ÷ before",
        "",
    ]
    await host_figures(out)
    relay_figures(out)
    fleet_figures(out)
    load = os.getloadavg()
    out += [f"Load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.", ""]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "driver":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        drive(sys.argv[2], Path(sys.argv[3]))
        sys.exit(0)
    import asyncio

    report: list[str] = []
    asyncio.run(section(report))
    print("\n".join(report))
