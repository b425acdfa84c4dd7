"""`mcphost demo agents` (what `make demo-agents` runs): the real Claude Code and Codex CLIs in a fleet.

Owns: the guided transcript of a fleet of real agent CLIs against the model stand-in
(mcphost/standin/director.py, served in this process as `mcphost demo model` serves it) and the
reference center. Bundle `party`: `claude-1`, the Claude Code CLI in a tmux pane (relay policy
`lead`: it may `choose`); `codex-1`, the Codex CLI in a tmux pane; `acp-1`, Codex through Zed's
`codex-acp` (`runner = "acp"`). Every agent runs with its CLI's defaults under the supervisor's
fence: no bypass flag, Codex's own sandbox and both CLIs' approvals on. The walk:
1. the operator types `send codex-1: send acp-1: run: echo ran > ran.txt` into claude-1's pane:
   claude-1 calls the center's `get_my_work` and relays the rest to codex-1, which calls
   `get_my_work` and relays `run: ...` to acp-1, which calls `get_my_work` and asks to run the
   command outside its sandbox: a permission the relay holds for a peer's `choose`;
2. the operator types `choose` into claude-1's pane: claude-1 lists the pending decision and
   chooses allow-once; acp-1's command runs and `ran.txt` appears in its workspace;
3. SIGTERM: the supervisor exits 0, and no process, tmux server or cgroup of the fleet is left.
The center's records show each call as its own agent, at its generation. The walk's parts that
are not about real CLIs (the devcenter, the supervisor, the stop and the clean-up) are
`FleetDemo`'s (mcphost/demofleet.py).
Exit 0 when every step held, 1 otherwise (also when a CLI is missing: `make node`).
Must never: use a bypass of either CLI's approvals or sandbox, reach the network (the model is
the loopback stand-in), or leave a process, a tmux server, a cgroup or its directory behind.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from mcphost.demofleet import BUNDLE, FleetDemo, _indent, wait_for, walk_guarded
from mcphost.standin.director import ClaudeDirector, CodexDirector
from mcphost.transcript import Transcript

LEAD, CODER, ACP = "claude-1", "codex-1", "acp-1"
COMMAND = "echo ran > ran.txt"
FIRST = f"send {CODER}: send {ACP}: run: {COMMAND}"
SECOND = "choose"
CLAUDE_PROMPT = "\u276f"  # the mark of Claude Code's input box (U+276F), then what is typed
TURN_WAIT = 90.0  # seconds a real CLI's turn may take on a loaded machine before the step fails
# The relay policies of the demo's operator layer: `lead` may also `choose`.
POLICIES = """\
format-version = 1
default = "member"

[[policies]]
id = "member"
[policies.controls]
list = "home"
look = "home"
send = "home"

[[policies]]
id = "lead"
[policies.controls]
list = "home"
look = "home"
send = "home"
choose = "home"
"""


def _fields(record: dict[str, Any], *names: str) -> str:
    """A `relay.choices.*` record on one line: its event, its choice id and `names`."""
    keys = ("choice_request_id", *names)
    return f"{record.get('event')}  " + "  ".join(f"{k}={record.get(k)}" for k in keys)


def cli_bin() -> Path:
    """Where `make node` installs the CLIs: tools/node_modules/.bin of this checkout."""
    return Path(__file__).resolve().parents[1] / "tools" / "node_modules" / ".bin"


def find_clis(path: str) -> dict[str, str] | str:
    """The CLIs the fleet runs, found on `path`, or what is missing and how to install it."""
    found = {name: shutil.which(name, path=path) for name in ("claude", "codex", "codex-acp")}
    missing = [name for name, where in found.items() if where is None]
    if missing:
        return (
            f"{', '.join(missing)} not found: run `make node` (npm installs them into {cli_bin()})"
        )
    return {name: str(where) for name, where in found.items()}


class AgentsDemo(FleetDemo):
    """The fleet demo's walk with the real CLIs: `claude` and `codex` the running stand-ins
    (mcphost/standin/director.py), `path` the supervisor's PATH, `clis` where each CLI is."""

    def __init__(
        self,
        root: Path,
        out: Transcript,
        path: str,
        clis: dict[str, str],
        claude: ClaudeDirector,
        codex: CodexDirector,
    ) -> None:
        super().__init__(root, 3, out)
        self.models = (claude, codex)
        self.agents = [LEAD, CODER, ACP]
        self.clis = clis
        self.env["PATH"] = path  # the default commands are found on the supervisor's PATH
        operator = root / "operator"
        operator.mkdir()
        (operator / "policies.toml").write_text(POLICIES)
        self.env["AGENTMUX_CONFIGURATION_DIRECTORY"] = str(operator)
        self.groups: dict[str, list[str]] = {}  # agent -> its cgroup directories, while it runs

    def walk(self) -> None:
        self.show_clis_and_model()
        self.start_center()
        self.write_fleet()
        self.supervise()
        self.show_status()
        self.relay_chain()
        self.permission_chosen()
        self.note_groups()
        self.stop()
        self.check_groups()

    def show_clis_and_model(self) -> None:
        from mcphost.demomodel import env_lines

        self.out.step("The CLIs (installed by `make node`) and the model stand-in")
        for name, where in self.clis.items():
            version = ""
            if name != "codex-acp":  # it has no --version
                done = subprocess.run(
                    [where, "--version"], capture_output=True, text=True, env=self.env, timeout=60
                )
                version = f"  ({done.stdout.strip() or done.stderr.strip()})"
                self.check(done.returncode == 0, f"{name} --version runs")
            self.out.say(f"   {name}: {where}{version}")
        claude, codex = self.models
        self.check(
            bool(claude.port and codex.port),
            f"the stand-ins listen on 127.0.0.1:{claude.port} (Messages) and :{codex.port} "
            "(Responses)",
        )
        self.out.say("$ mcphost demo model      # served in this process for the demo; it prints:")
        self.out.say(_indent(env_lines(claude.base_url, codex.base_url)))

    def write_fleet(self) -> None:
        from mcphost.demomodel import claude_env, codex_env
        from mcphost.testing.fleet import fleet_toml

        self.out.step(f"The fleet file: Claude Code, Codex and codex-acp in bundle {BUNDLE!r}")
        claude, codex = self.models
        agents = [
            {"id": LEAD, "client": "claude", "runner": "tmux", "policy": "lead",
             "env": claude_env(claude.base_url)},
            {"id": CODER, "client": "codex", "runner": "tmux",
             "env": codex_env(codex.base_url)},
            {"id": ACP, "client": "codex", "runner": "acp",
             "env": codex_env(codex.base_url)},
        ]  # fmt: skip
        text = fleet_toml(
            self.center,
            self.center.state_dir / "worker-token",
            agents,
            bundle=BUNDLE,
            restart="on-failure",
            stop_grace=10,
        )
        self.fleet.write_text(text)
        self.out.say(f"   {self.fleet}:")
        self.out.say(_indent(text))
        self.out.say(
            "   No command: each agent runs its client's default (`claude --mcp-config ...`,\n"
            "   `codex`, `codex-acp`), fenced, with the CLI's own sandbox and approvals. The\n"
            f"   relay policies ({self.env['AGENTMUX_CONFIGURATION_DIRECTORY']}/policies.toml)"
            f" let {LEAD} `choose`."
        )
        self.check(self.fleet.exists(), "fleet file written")

    def center_calls(self, agent: str) -> list[int | None]:
        """The generations of `agent`'s get_my_work calls the center received."""
        return [generation for who, generation in self.calls() if who == agent]

    def prompt_empty(self, agent: str) -> bool:
        """Claude Code's input box is on `agent`'s pane, empty: a line that is only its mark."""
        return any(row.strip() == CLAUDE_PROMPT for row in self.pane(agent).splitlines())

    def type_into(self, agent: str, line: str) -> None:
        """Type `line` into Claude Code's input box on `agent`'s pane and press Enter, as an
        operator attached to the pane would (once the box is there: keys typed before are lost)."""
        socket = self.state / "relay" / "bundles" / BUNDLE / "tmux.sock"
        self.out.say(f"$ tmux -S {socket} send-keys -t {agent} {shlex.quote(line)} Enter")
        ready = wait_for(partial(self.prompt_empty, agent), TURN_WAIT)
        self.check(bool(ready), f"{agent}'s input box is on its pane")
        typed = self.tmux("send-keys", "-t", f"={agent}:", "-l", line)
        shown = wait_for(lambda: line in " ".join(self.pane(agent).split()))
        self.check(typed.returncode == 0 and bool(shown), f"the line shows in {agent}'s input box")
        entered = self.tmux("send-keys", "-t", f"={agent}:", "Enter")
        self.check(entered.returncode == 0, f"Enter pressed in {agent}'s pane")

    def relay_chain(self) -> None:
        self.out.step(f"The operator gives {LEAD} a task; it relays, and so does {CODER}")
        self.out.say(
            "   The stand-in's script (`mcphost demo model --help`): each agent calls the\n"
            "   center's get_my_work, then `send PEER: ...` relays the rest of the line, and\n"
            "   `run: ...` runs a command (Codex asks to leave its sandbox for it)."
        )
        rows = self.status()
        self.type_into(LEAD, FIRST)
        for agent in self.agents:
            generation = rows[agent]["generation"]
            heard = wait_for(partial(self.center_calls, agent), TURN_WAIT)
            self.check(
                bool(heard) and generation in (heard or []),
                f"the center heard get_my_work as {agent} (generation {generation})",
            )
            self.out.say(
                f"   POST /admin/agent-tools/get_my_work  agent_id={agent}  generation={generation}"
            )
        self.out.say(f"   {LEAD}'s pane:")
        self.out.say(_indent(self.tail(LEAD)))
        self.out.say(f"   {CODER}'s pane:")
        self.out.say(_indent(self.tail(CODER)))

    def tail(self, agent: str, lines: int = 14) -> str:
        kept = [line for line in self.pane(agent).splitlines() if line.strip()]
        return "\n".join(line[:100] for line in kept[-lines:])

    def choices(self, event: str) -> list[dict[str, Any]]:
        """The supervisor's `relay.choices.<event>` records (its log: one JSON object a line)."""
        found = []
        for line in self.supervisor_log.read_text(errors="replace").splitlines():
            if f"relay.choices.{event}" in line:
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        return found

    def permission_chosen(self) -> None:
        self.out.step(f"{ACP} asks permission to run its command; {LEAD} chooses")
        ran = self.state / "agents" / ACP / "workspace" / "ran.txt"
        requested = wait_for(lambda: self.choices("requested"), TURN_WAIT)
        self.check(bool(requested), f"the relay holds {ACP}'s permission request for a peer")
        for record in requested or []:
            self.out.say("   " + _fields(record, "target_session", "requested_kind"))
        row = self.status().get(ACP, {})
        self.out.say(f"   {ACP}: {row.get('state')}, acp {row.get('protocol_state')}")
        self.check(not ran.exists(), f"{COMMAND!r} has not run: it waits for the choice")
        self.type_into(LEAD, SECOND)
        resolved = wait_for(lambda: self.choices("resolved"), TURN_WAIT)
        for record in resolved or []:
            self.out.say("   " + _fields(record, "outcome", "decided_by"))
        self.check(bool(resolved), f"{LEAD}'s choose resolved the request")
        written = wait_for(lambda: ran.exists() and ran.read_text(), TURN_WAIT)
        self.check(
            written == "ran\n", f"{ACP}'s command ran once chosen: {ran.name} in its workspace"
        )
        answered = wait_for(lambda: "choose:" in self.pane(LEAD), TURN_WAIT)
        self.check(bool(answered), f"{LEAD} answered with the choice it made")
        self.out.say(f"   {LEAD}'s pane:")
        self.out.say(_indent(self.tail(LEAD)))

    def note_groups(self) -> None:
        """Each agent's cgroups while it runs (from /proc/<pid>/cgroup: v2's one line, or a
        line per v1 hierarchy), to check after the stop."""
        for agent, row in self.status().items():
            try:
                lines = Path(f"/proc/{row['pid']}/cgroup").read_text().splitlines()
            except (OSError, KeyError, TypeError):
                continue
            for line in lines:
                _, controllers, path = line.split(":", 2)
                group = Path("/sys/fs/cgroup", controllers, path.lstrip("/"))
                if "mcphost-" in path and group.is_dir():
                    self.groups.setdefault(agent, []).append(str(group))

    def check_groups(self) -> None:
        groups = [group for found in self.groups.values() for group in found]
        for agent, found in self.groups.items():
            self.out.say(f"   {agent}'s cgroups while it ran: {', '.join(found)}")
        if not groups:  # no writable cgroup for this supervisor: `ctl status` says so
            self.out.say(
                "   the supervisor made no cgroups here (see the limits line of ctl status)"
            )
        left = [group for group in groups if Path(group).exists()]
        self.check(not left, "no agent's cgroup is left", fatal=False)


def main(argv: list[str]) -> int:
    if argv:
        print("usage: mcphost demo agents\n\n" + (__doc__ or "").split("\n\n")[0], file=sys.stderr)
        return 0 if argv[0] in ("-h", "--help") else 2
    path = os.pathsep.join((str(cli_bin()), os.environ.get("PATH", os.defpath)))
    clis = find_clis(path)
    if isinstance(clis, str):
        print(f"mcphost demo agents: {clis}", file=sys.stderr)
        return 1
    if shutil.which("tmux") is None:
        print("mcphost demo agents: tmux is not installed (the CLIs run in tmux)", file=sys.stderr)
        return 1

    out = Transcript()
    started = time.monotonic()
    # not beneath /tmp: Codex refuses its sandbox's helper links in a CODEX_HOME there
    root = Path(tempfile.mkdtemp(prefix="mcphost-demo-agents-", dir="/var/tmp"))
    with ClaudeDirector().running() as claude, CodexDirector().running() as codex:
        walk_guarded(AgentsDemo(root, out, path, clis, claude, codex), out)
    elapsed = time.monotonic() - started
    verdict = (
        "every step behaved as shown"
        if not out.failures
        else f"{len(out.failures)} unexpected result(s)"
    )
    out.say(f"\nAgents demo finished: {verdict} ({elapsed:.1f}s).")
    return 1 if out.failures else 0
