"""`mcphost demo fleet` (what `make demo-fleet` runs): the main job, end to end, on embedded defaults.

Owns: the guided transcript of a worker's fleet against the reference center. In one temporary
directory it starts the devcenter, shows which agent ids it knows and adds the missing ones,
writes a fleet file (stand-in agents `agent-1..N` in bundle `party`, tmux runners, each holding
its MCP sessions), runs `mcphost supervise` in the background, shows `mcphost ctl status` and
the calls the center received as each agent (agent_id and generation from its request log),
`kill -9`s one agent and shows it restarted at the next generation with its next call at that
generation, has one agent `send` to a peer through its relay tools (a `/send` line typed into
its pane: its stand-in calls the tool on the session it holds) and shows the message in the
peer's tmux pane, then stops the supervisor with SIGTERM and checks that it exited 0 and that no
agent, pump or tmux server is left.
Exit 0 when every step held, 1 otherwise, 2 for a usage error.
Must never: leave a process or the temporary directory behind, also on failure, SIGINT or
SIGTERM (the supervisor gets SIGTERM on the demo's death too); change a supervisor setting
the fleet file does not show.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from mcphost.transcript import Transcript

T = TypeVar("T")
BUNDLE = "party"
DEFAULT_AGENTS = 3
MAX_AGENTS = 9
WAIT = 45.0  # seconds any one condition may take before the step fails (a hang, not a slow box)


class Abort(Exception):
    """A step failed in a way the later steps depend on: stop walking, clean up."""


def wait_for(condition: Callable[[], T], timeout: float = WAIT) -> T | None:
    """Poll `condition` until it returns something truthy (returned), or None after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def _header(entry: dict[str, Any], name: str) -> str | None:
    for key, value in (entry.get("headers") or {}).items():
        if key.lower() == name.lower():
            return str(value)
    return None


def _indent(text: str) -> str:
    return textwrap.indent(text.rstrip("\n"), "   | ", lambda _line: True)


def _shows_usage(row: dict[str, Any]) -> bool:
    """Whether a running agent's status row shows real figures: memory, and at least the three
    processes it runs (the stand-in and its two pumps), from its group or its tree in /proc."""
    usage = row.get("usage") or {}
    return (usage.get("memory_current_bytes") or 0) > 0 and (usage.get("processes") or 0) >= 3


def _send_summary(call: dict[str, Any]) -> str:
    """`send`'s outcome per target from the stand-in's record, or its error, on one line."""
    try:
        text = call["result"]["content"][0]["text"]
        results = json.loads(text)["results"]
        return "; ".join(f"{r['target_session']}: {r['outcome']}" for r in results)
    except (KeyError, IndexError, TypeError, ValueError):
        return json.dumps(call.get("error", call.get("result", "no answer")))[:300]


class FleetDemo:
    def __init__(self, root: Path, count: int, out: Transcript) -> None:
        self.root = root
        self.out = out
        self.agents = [f"agent-{n}" for n in range(1, count + 1)]
        self.state = root / "state"
        self.fleet = root / "fleet.toml"
        self.supervisor_log = root / "supervisor.log"
        self.center: Any = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMUX_")}
        # The demo's own relay, hermetic: no operator layer, no external relay from the caller.

    # -- helpers --------------------------------------------------------------------------------

    def check(self, ok: bool, what: str, fatal: bool = True) -> None:
        self.out.expect(ok, what)
        if not ok and fatal:
            raise Abort(what)

    def command(self, *args: str) -> str:
        """What an operator types (shown), with the state directory as given."""
        return "$ " + shlex.join(["mcphost", *args])

    def mcphost(self, *args: str, show: bool = True) -> subprocess.CompletedProcess[str]:
        if show:
            self.out.say(self.command(*args))
        return subprocess.run(
            [sys.executable, "-m", "mcphost", *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
        )

    def ctl(self, *args: str, show: bool = True) -> subprocess.CompletedProcess[str]:
        return self.mcphost("ctl", "--state", str(self.state), *args, show=show)

    def status(self) -> dict[str, dict[str, Any]]:
        """`ctl status --json`'s rows, asked in this process (a poll per ctl process is wasteful)."""
        from mcphost.supervisor.control.client import NotRunning, request
        from mcphost.supervisor.control.protocol import ControlError

        try:
            reply = request(str(self.state / "control.sock"), "status", timeout=30)
        except (ControlError, NotRunning, OSError):
            return {}
        rows = reply["agents"]  # {"center": ..., "agents": [...]}
        return {row["agent_id"]: row for row in rows}

    def calls(self, tool: str = "get_my_work") -> list[tuple[str, int | None]]:
        """(agent_id, generation) of every `tool` call the center received, oldest first."""
        seen = []
        for entry in self.center.requests(1000):
            if entry.get("route") == f"/admin/agent-tools/{tool}":
                generation = _header(entry, "X-AC-MCP-Generation")
                agent = str((entry.get("body") or {}).get("agent_id"))
                seen.append((agent, int(generation) if generation is not None else None))
        return seen

    # -- the walk -------------------------------------------------------------------------------

    def walk(self) -> None:
        self.start_center()
        self.write_fleet()
        self.supervise()
        self.show_status()
        self.show_center_calls()
        self.kill_and_restart(self.agents[1])
        self.relay_send(self.agents[0], self.agents[1])
        self.stop()

    def start_center(self) -> None:
        from mcphost.testing import DevCenter

        self.out.step("The devcenter: a reference center in a temporary directory")
        self.out.say(
            self.command(
                "devcenter", "--state", f"{self.root}/center/state",
                "--unix", f"{self.root}/center/admin.sock", "--control",
            )
        )  # fmt: skip
        self.center = DevCenter.start(self.root / "center", unix=True, control=True)
        token_file = self.center.state_dir / "worker-token"
        self.out.say(f"   admin API on unix:{self.center.socket_path}; worker w-1's token in")
        self.out.say(f"   {token_file} (0600): only the supervisor reads it.")
        known = self.worker_agents()
        self.out.say(f"   agents bound to worker w-1: {', '.join(known)}")
        self.check(known[:2] == ["agent-1", "agent-2"], "the center knows agent-1 and agent-2")
        missing = [agent for agent in self.agents if agent not in known]
        if missing:
            body = {"worker_id": "w-1", "agent_ids": missing, "projects": ["p-1"]}
            self.out.say(
                f"   adding {', '.join(missing)}: POST /_devcenter/agents {json.dumps(body)}"
            )
            reply = self.center.request("POST", "/_devcenter/agents", body)
            self.check(reply.status == 200, f"the center added {', '.join(missing)}")
        known = self.worker_agents()
        self.out.say(f"   agents bound to worker w-1 now: {', '.join(known)}")
        self.check(set(self.agents) <= set(known), f"the center knows {', '.join(self.agents)}")

    def worker_agents(self) -> list[str]:
        """GET /admin/worker/agents with the worker token: what the center lets w-1 run."""
        reply = self.center.request(
            "GET", "/admin/worker/agents", headers={"Authorization": f"Bearer {self.center.token}"}
        )
        return [row["agent_id"] for row in reply.json().get("agents", [])]

    def write_fleet(self) -> None:
        from mcphost.testing.fleet import fleet_toml, standin

        self.out.step(f"The fleet file: {len(self.agents)} stand-in agents in bundle {BUNDLE!r}")
        agents = [{"id": agent} for agent in self.agents]
        text = fleet_toml(
            self.center,
            self.center.state_dir / "worker-token",
            agents,
            client="command",
            command=standin("--echo", "{agent_id}"),
            bundle=BUNDLE,
            runner="tmux",
            restart="on-failure",
            restart_delay=0.2,
            stop_grace=5,
        )
        self.fleet.write_text(text)
        self.out.say(f"   {self.fleet}:")
        self.out.say(_indent(text))
        self.out.say(
            "   Each agent is the stand-in agent (mcphost/testing/standin_agent.py): it opens every\n"
            "   server of its MCP config (agent-center and agentmux), calls get_my_work and help,\n"
            "   and holds both sessions while it echoes what is typed into its pane. More agents:\n"
            "   bind their ids at the center, add [[agent]] tables, `mcphost ctl reload`."
        )
        self.check(self.fleet.exists(), "fleet file written")

    def supervise(self) -> None:
        from mcphost.supervisor.confine.kernel import pdeathsig_preexec

        self.out.step("mcphost supervise, in the background")
        self.out.say(
            self.command("supervise", "--fleet", str(self.fleet), "--state", str(self.state))
            + f" 2> {self.supervisor_log} &"
        )
        with self.supervisor_log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mcphost", "supervise",
                 "--fleet", str(self.fleet), "--state", str(self.state)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=self.env,
                start_new_session=True,  # Ctrl-C reaches the demo, which stops it in order
                preexec_fn=pdeathsig_preexec(signal.SIGTERM),  # and SIGTERM if the demo dies
            )  # fmt: skip

        def all_up() -> dict[str, dict[str, Any]] | None:
            if self.proc is not None and self.proc.poll() is not None:
                return {"exited": {}}
            rows = self.status()
            up = [
                rows.get(agent, {}).get("state") == "running"
                and rows[agent].get("sessions", 0) >= 2
                for agent in self.agents
            ]
            return rows if rows and all(up) else None

        rows = wait_for(all_up)
        if rows is not None and "exited" in rows:
            tail = self.supervisor_log.read_text(errors="replace")[-2000:]
            self.out.say(_indent(tail))
            self.check(False, f"the supervisor exited with {self.proc and self.proc.returncode}")
        self.check(
            rows is not None,
            f"all {len(self.agents)} agents running, each holding its 2 MCP sessions",
        )

    def show_status(self) -> None:
        self.out.step("mcphost ctl status")
        done = self.ctl("status")
        self.out.say(_indent(done.stdout or done.stderr))
        rows = self.status()
        self.check(
            done.returncode == 0 and all(agent in done.stdout for agent in self.agents),
            "ctl status lists every agent",
        )
        self.check(
            all(rows[a]["state"] == "running" and rows[a]["generation"] >= 1 for a in self.agents),
            "every agent running, at generation 1 or later",
        )
        self.check(
            all(_shows_usage(rows[a]) for a in self.agents),
            "every agent's MEM and PROCS are its own tree's (the agent and its 2 pumps at least)",
            fatal=False,
        )

    def show_center_calls(self) -> None:
        self.out.step(
            "What the center received: each agent's call, as that agent, at its generation"
        )
        rows = self.status()
        wanted = {(agent, rows[agent]["generation"]) for agent in self.agents}
        seen = wait_for(lambda: wanted <= set(self.calls()) and self.calls())
        for agent, generation in seen or self.calls():
            self.out.say(
                f"   POST /admin/agent-tools/get_my_work  agent_id={agent}  generation={generation}"
            )
        self.check(
            seen is not None,
            "one get_my_work per agent, carrying its own agent_id and its generation",
        )
        self.out.say(
            "   The agents' configs hold no token and no center address: the supervisor knows\n"
            "   each pump's agent from the kernel and adds agent_id and the generation itself."
        )

    def kill_and_restart(self, agent: str) -> None:
        self.out.step(f"kill -9 {agent}: restarted at the next generation")
        before = self.status()[agent]
        self.out.say(f"$ kill -9 {before['pid']}      # {agent}, generation {before['generation']}")
        os.kill(before["pid"], signal.SIGKILL)
        generation = before["generation"] + 1

        def restarted() -> dict[str, Any] | None:
            row = self.status().get(agent, {})
            fresh = row.get("generation") == generation and row.get("pid") != before["pid"]
            return row if fresh and row.get("state") == "running" else None

        after = wait_for(restarted)
        self.check(after is not None, f"{agent} running again at generation {generation}")
        assert after is not None
        self.out.say(
            f"   {agent}: pid {before['pid']} -> {after['pid']}, "
            f"generation {before['generation']} -> {after['generation']}, "
            f"restarts {after.get('restarts')}"
        )
        arrived = wait_for(lambda: (agent, generation) in self.calls())
        self.check(
            bool(arrived),
            f"the new process's call reached the center as {agent} at generation {generation}",
        )
        self.out.say(
            f"   POST /admin/agent-tools/get_my_work  agent_id={agent}  generation={generation}"
        )
        done = self.ctl("status", show=False)
        self.out.say(_indent(done.stdout))

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        """tmux on the bundle's server, as an operator would run it (`tmux -S <socket> ...`)."""
        return subprocess.run(
            ["tmux", "-S", "tmux.sock", *args],
            cwd=self.state / "relay" / "bundles" / BUNDLE,  # a short socket path, whatever root is
            capture_output=True,
            text=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            timeout=30,
        )

    def pane(self, agent: str) -> str:
        """The agent's tmux pane now."""
        done = self.tmux("capture-pane", "-p", "-J", "-t", f"={agent}:")
        return done.stdout if done.returncode == 0 else ""

    def relay_send(self, sender: str, target: str) -> None:
        self.out.step(
            f"{sender} sends to {target} with its relay tools; it lands in {target}'s pane"
        )
        message = f"hello from {sender} ({uuid.uuid4().hex[:6]})"
        line = f"/send {target} {message}"
        socket = self.state / "relay" / "bundles" / BUNDLE / "tmux.sock"
        self.out.say(
            f"   Type into {sender}'s pane; its stand-in calls `send` on the agentmux session it\n"
            f"   holds (as a model would), and the relay pastes the message into {target}'s pane:"
        )
        self.out.say(f"$ tmux -S {socket} send-keys -t {sender} {shlex.quote(line)} Enter")
        typed = self.tmux("send-keys", "-t", f"={sender}:", "-l", line)
        entered = self.tmux("send-keys", "-t", f"={sender}:", "Enter")
        self.check(typed.returncode == 0 and entered.returncode == 0, f"typed into {sender}'s pane")
        calls = self.state / "agents" / sender / "workspace" / "calls.jsonl"

        def sent() -> dict[str, Any] | None:
            lines = [json.loads(text) for text in calls.read_text().splitlines() if text.strip()]
            return next((c for c in reversed(lines) if c.get("tool") == "send"), None)

        outcome = wait_for(sent) or {}
        self.out.say(f"   <- send: {_send_summary(outcome)}")
        self.check(outcome.get("ok") is True, "the relay accepted the send")
        envelope = (f"[{target}] got: From: {sender}@{BUNDLE}", f"[{target}] got: {message}")
        landed = wait_for(lambda: all(line in self.pane(target) for line in envelope))
        shown = self.ctl("logs", target, "--lines", "16").stdout
        now = shown.rfind("--- tmux pane of")  # its screen now (earlier runs' screens above it)
        self.out.say(_indent(shown[now:] if now >= 0 else shown or self.pane(target)))
        self.check(bool(landed), f"{target}'s pane shows the message, from {sender}@{BUNDLE}")

    def stop(self) -> None:
        self.out.step("Stop: SIGTERM to the supervisor")
        assert self.proc is not None
        pids = [row["pid"] for row in self.status().values() if row.get("pid")]
        self.out.say(f"$ kill -TERM {self.proc.pid}")
        self.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
        self.check(code == 0, f"the supervisor exited with {code} (0 expected)", fatal=False)
        left = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
        tmux = self.state / "relay" / "bundles" / BUNDLE / "tmux.sock"
        from mcphost.testing.fleet import left_running

        stray = left_running(self.state)
        for line in stray:
            self.out.say(f"   still running: {line}")
        self.check(
            not left and not stray and not tmux.exists(),
            "no agent, pump or tmux server is left",
            fatal=False,
        )

    # -- cleanup, whatever happened ------------------------------------------------------------

    def cleanup(self) -> None:
        from mcphost.testing.fleet import left_running

        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.center is not None:
            self.center.close()
        stray = left_running(self.root)
        for line in stray:  # a supervisor that could not stop its agents: end them here
            self.out.say(f"   killing what was left: {line}")
            try:
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)
        if stray:
            self.out.expect(False, "nothing was left running before the clean-up")


def walk_guarded(demo: FleetDemo, out: Transcript) -> None:
    """Walk `demo` in its root, with SIGINT, SIGTERM and SIGHUP stopping the walk (SIGINT even
    when inherited ignored); report what stopped it, then clean up uninterrupted, whatever
    happened, and show that the root is gone (`mcphost demo fleet` and `demo agents`)."""

    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupted)
    out.say(f"Working in {demo.root}")
    try:
        demo.walk()
    except Abort:
        pass
    except KeyboardInterrupt:
        out.expect(False, "interrupted: stopping everything")
    except Exception as exc:  # a demo reports, it does not crash with things still running
        out.expect(False, f"unexpected {type(exc).__name__}: {exc}")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # the clean-up itself is not interrupted
        demo.cleanup()
    out.step("Clean-up")
    out.expect(not demo.root.exists(), f"{demo.root} removed")


def _usage() -> str:
    return (
        f"usage: mcphost demo fleet [--agents N]   (N from 2 to {MAX_AGENTS}, default "
        f"{DEFAULT_AGENTS})\n\n" + (__doc__ or "").split("\n\n")[0]
    )


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(_usage(), file=sys.stderr)
        return 0
    count = DEFAULT_AGENTS
    if argv:
        if len(argv) != 2 or argv[0] != "--agents" or not argv[1].isdigit():
            print(_usage(), file=sys.stderr)
            return 2
        count = int(argv[1])
        if not 2 <= count <= MAX_AGENTS:
            print(_usage(), file=sys.stderr)
            return 2
    if shutil.which("tmux") is None:
        print("mcphost demo fleet: tmux is not installed (the agents run in tmux)", file=sys.stderr)
        return 1

    out = Transcript()
    started = time.monotonic()
    short = len(tempfile.gettempdir()) <= 40  # Unix socket paths under the state must stay short
    root = Path(tempfile.mkdtemp(prefix="mcphost-demo-fleet-", dir=None if short else "/tmp"))
    walk_guarded(FleetDemo(root, count, out), out)
    elapsed = time.monotonic() - started
    if out.failures:
        out.say(
            f"\nFleet demo finished with {len(out.failures)} unexpected result(s) ({elapsed:.1f}s)."
        )
        return 1
    out.say(
        f"\nFleet demo finished: every step behaved as shown ({elapsed:.1f}s). Nothing is left running."
    )
    return 0
