"""Run a real `mcphost supervise` process against a real reference center, for black-box tests.

Owns: writing a fleet file, starting and stopping the supervisor process, `ctl` calls through
the real `mcphost ctl` command, reading what stand-in agents recorded in their workspaces, and
an agent's relay tools driven from inside its tree (`RelayDriver`).
Must never: reach into the supervisor's memory or database; everything goes through the
process, its sockets, its files and the center.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import mcphost
from mcphost.testing.devcenter import DevCenter
from mcphost.testing.fleet import STANDIN as STANDIN  # re-exported for the tests
from mcphost.testing.fleet import fleet_toml as base_fleet_toml
from mcphost.testing.fleet import standin as standin
from mcphost.testing.fleet import toml_value as toml_value
from tests.waiting import until

REPO = str(Path(mcphost.__file__).resolve().parent.parent)
# Every state directory a `Supervised` made in this test process (they live under /tmp, outside
# pytest's tmp_path, to keep socket paths short): tests may read them after a stop, so they are
# removed only when the session ends.
STATE_DIRS: list[Path] = []
# The test suite's fleet defaults: fast restarts, a short stop grace.
TEST_DEFAULTS: dict[str, Any] = {
    "client": "command",
    "restart_delay": 0.05,
    "restart_max_delay": 0.2,
    "stop_grace": 5,
}


# An unfenced agent of a root supervisor runs as a uid of its own (uids.py), which may not run
# this checkout's interpreter (under a 0700 home here: /root/.pyenv); the tests that need an
# unfenced tree for another reason run it as root, as the fleet must then say.
AS_ROOT: dict[str, Any] = {"user": "root"} if os.geteuid() == 0 else {}
UNFENCED: dict[str, Any] = {"sandbox": "none", **AS_ROOT}


def own_uid(agent_id: str) -> int:
    """The uid a root supervisor gives `agent_id` in a new state (uids.py: the first free uid
    from its candidate), for a test that must prepare a directory the agent writes (a
    fleet-given `HOME`) before the supervisor starts."""
    from mcphost.supervisor.uids import DEFAULT_RANGE, allocate

    return allocate([agent_id], {}, DEFAULT_RANGE)[agent_id]


def give_to(path: Path, agent_id: str) -> None:
    """Hand `path` and all it holds to `agent_id`'s own uid (a root supervisor's agent), as an
    operator gives an agent a directory of its own; nothing to do under an unprivileged one."""
    if os.geteuid() != 0:
        return
    uid = own_uid(agent_id)
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.lchown(os.path.join(root, name), uid, uid)
    os.lchown(path, uid, uid)


def fleet_toml(
    center: DevCenter,
    token_file: Path,
    agents: Iterable[dict[str, Any]],
    center_keys: dict[str, Any] | None = None,
    **defaults: Any,
) -> str:
    return base_fleet_toml(center, token_file, agents, center_keys, **{**TEST_DEFAULTS, **defaults})


def inline(script: str, *args: str) -> list[str]:
    """A fleet command running `script` inline (`python -c`): a fenced agent sees a private
    /tmp, so a script the test wrote there would not be found. Braces are doubled, since a
    fleet command is a placeholder template."""
    return [sys.executable, "-c", script.replace("{", "{{").replace("}", "}}"), *args]


class Supervised:
    """One supervisor process with its fleet file and state directory."""

    def __init__(self, base: Path, center: DevCenter, state_parent: str | None = None) -> None:
        self.base = base
        self.center = center
        # Unix socket paths must stay short: keep the state directory under /tmp (or under a
        # short `state_parent`: a fenced agent's /tmp is private, so a state directory there is
        # hidden by that and never covered of its own, and Codex refuses to put its helpers in a
        # home beneath the temporary directory).
        self.state = Path(tempfile.mkdtemp(prefix="mcphost-sv-", dir=state_parent))
        STATE_DIRS.append(self.state)  # removed when this test process ends (tests/conftest.py)
        self.fleet = base / "fleet.toml"
        self.token_file = base / "worker.token"
        self.token_file.write_text(center.token + "\n")
        self.token_file.chmod(0o600)
        self.stderr_path = base / "supervisor.stderr.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.python = sys.executable  # the supervisor's interpreter (its pumps' too)
        self.standin_script = STANDIN  # the stand-in agent (the copy's, after `use_tree`)
        self.cwd: str | None = None  # the supervisor's (`-m` puts it first on sys.path)
        self.extra_env: dict[str, str] = {}  # added to the supervisor's (and ctl's) environment
        self._stderr_from = 0  # where the current run's stderr starts (a restart appends)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
        env["MCPHOST_LOG_LEVEL"] = "debug"
        env.update(self.extra_env)
        return env

    def standin(self, *flags: str) -> list[str]:
        """The stand-in agent's command as this supervisor's agents run it: its interpreter
        and its project (`use_tree`)."""
        return [self.python, self.standin_script, "{mcp_config}", *flags]

    def use_tree(self, root: Path) -> None:
        """Run the supervisor (so its pump) and the stand-in from the packages under `root`
        (`package_copy`), ahead of the current interpreter's site-packages."""
        site = sysconfig.get_paths()["purelib"]
        self.extra_env["PYTHONPATH"] = os.pathsep.join((str(root), site))
        self.cwd = str(root)  # not the checkout's: `python -m` would import from there first
        self.standin_script = str(root / "mcphost" / "testing" / "standin_agent.py")

    def write_fleet(
        self,
        agents: Iterable[dict[str, Any]],
        center_keys: dict[str, Any] | None = None,
        **defaults: Any,
    ) -> None:
        self.fleet.write_text(
            fleet_toml(self.center, self.token_file, agents, center_keys, **defaults)
        )

    def argv(self) -> list[str]:
        """`mcphost supervise` on this fleet file and state directory."""
        return [
            self.python, "-m", "mcphost", "supervise",
            "--fleet", str(self.fleet), "--state", str(self.state),
        ]  # fmt: skip

    def run_to_exit(self, **popen: Any) -> subprocess.CompletedProcess[str]:
        """Run the supervisor to its exit (for start-up refusals): its status and output."""
        return subprocess.run(  # type: ignore[no-any-return]
            self.argv(),
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=60,
            cwd=self.cwd,
            **popen,
        )

    def start(self) -> Supervised:
        """Start the supervisor (again, on the same state directory, after `terminate`)."""
        self._stderr_from = self.stderr_path.stat().st_size if self.stderr_path.exists() else 0
        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                env=self.env(),
                cwd=self.cwd,
            )
        until(lambda: self.ready() or self.proc_exited(), 60, "the supervisor to be ready")
        assert self.proc.poll() is None, self.stderr()
        return self

    def proc_exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def ready(self) -> bool:
        return any(e.get("event") == "supervisor.ready" for e in self.events(this_run=True))

    def events(self, this_run: bool = False) -> list[dict[str, Any]]:
        """The supervisor's event records (all runs; `this_run`: since the last `start`)."""
        out = []
        text = self.stderr()
        if this_run and self.stderr_path.exists():
            text = self.stderr_path.read_bytes()[self._stderr_from :].decode(errors="replace")
        for line in text.splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "mcphost", "ctl", "--state", str(self.state), *args],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=60,
        )
        if check:
            assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
        return done

    def status(self) -> dict[str, dict[str, Any]]:
        """`ctl status --json`'s rows by agent, asked over the control socket by the client code
        `mcphost ctl` runs, in this process (operator/test_ctl.py covers the command itself): polling
        with a process per poll cost more CPU than the supervisors being polled."""
        from mcphost.supervisor.control.client import request

        result = request(str(self.state / "control.sock"), "status", timeout=60)
        rows = result["agents"]
        return {row["agent_id"]: row for row in rows}

    def center_health(self) -> dict[str, Any]:
        """`ctl status --json`'s `center` object (the center's health)."""
        from mcphost.supervisor.control.client import request

        return dict(request(str(self.state / "control.sock"), "status", timeout=60)["center"])

    def workspace(self, agent_id: str) -> Path:
        return self.state / "agents" / agent_id / "workspace"

    def calls(self, agent_id: str) -> list[dict[str, Any]]:
        path = self.workspace(agent_id) / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def wait_running(self, agent_id: str, generation: int | None = None) -> dict[str, Any]:
        def running() -> dict[str, Any] | None:
            row = self.status().get(agent_id)
            wanted = generation is None or (row or {}).get("generation") == generation
            if row and row["state"] == "running" and row["pid"] and wanted:
                return row
            return None

        return until(running, 60, f"{agent_id} running")

    def terminate(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.terminate()


def group_dirs(sv: Supervised, agent_id: str) -> dict[str, str]:
    """The agent's group per controller ("" on v2; on v1 the cpuacct group too where that
    hierarchy is mounted), found as the supervisor's docs name it:
    `<its own group>/mcphost-<instance>/agent-<id>`."""
    from mcphost.supervisor.confine import cgroups

    assert sv.proc is not None
    own = Path(f"/proc/{sv.proc.pid}/cgroup").read_text()
    mounts = Path("/proc/self/mountinfo").read_text()
    unified, v1 = cgroups.parse_proc_cgroup(own)
    v2_mount, v1_mounts = cgroups.parse_mountinfo(mounts)
    instance = cgroups.instance_name(str(sv.state))
    leaf = cgroups.group_name(agent_id)
    if cgroups.detect().kind == "v2":
        assert v2_mount is not None and unified is not None
        base = cgroups.located(v2_mount, unified.removesuffix("/supervisor"))
        return {"": os.path.join(str(base), instance, leaf)}
    out = {}
    for c in (*cgroups.V1_CONTROLLERS, *cgroups.V1_ACCOUNTING):
        if c in v1_mounts and c in v1:
            base = cgroups.located(v1_mounts[c], v1[c])
            out[c] = os.path.join(str(base), instance, leaf)
    return out


def package_copy(parent: Path) -> Path:
    """A copy of the packages a supervisor, its pumps and the stand-in agent run (`mcphost/`,
    `configgen/`) under `parent`, without caches: its root, for `Supervised.use_tree`."""
    root = parent / "tree"
    for name in ("mcphost", "configgen"):
        shutil.copytree(
            Path(REPO) / name, root / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    return root


_REACHABLE_TREE: Path | None = None


def tree_for(uid: int, gids: frozenset[int]) -> Path | None:
    """None when `uid` can read the checkout's pump and stand-in; else the root of a copy of
    the packages (`package_copy`, made once per test process) in a world-readable directory
    under /tmp that it can: a checkout in a private directory (a clone under /root, 0700) is
    fine for the supervisor (root), but not for an agent's `user`."""
    global _REACHABLE_TREE
    from mcphost.supervisor.agents.reach import READ, unreachable

    wanted = (str(Path(REPO) / "mcphost" / "attach.py"), STANDIN)
    if all(unreachable(path, uid, gids, READ) is None for path in wanted):
        return None
    if _REACHABLE_TREE is None:
        parent = Path(tempfile.mkdtemp(prefix="mcphost-tree-"))
        STATE_DIRS.append(parent)  # removed when this test process ends (tests/conftest.py)
        _REACHABLE_TREE = package_copy(parent)
        for directory, _, _ in os.walk(parent):
            os.chmod(directory, 0o755)
    return _REACHABLE_TREE


def descendants_alive(pids: Iterable[int]) -> list[int]:
    """Which of `pids` still exist as something other than a zombie."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                state = handle.read().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def inner(pid: int) -> int:
    """The agent's own process under the pid `ctl status` shows: for a fenced agent that is
    bubblewrap, whose PID-namespace init runs the agent, so the first descendant that is not
    bubblewrap; `pid` itself for an unfenced one (or while the tree is still forming)."""
    current = pid
    for _ in range(4):
        try:
            comm = Path(f"/proc/{current}/comm").read_text().strip()
        except OSError:
            return current
        if comm != "bwrap":
            return current
        kids = [
            int(k)
            for task in os.listdir(f"/proc/{current}/task")
            for k in Path(f"/proc/{current}/task/{task}/children").read_text().split()
        ]
        if not kids:
            return current
        current = min(kids)
    return current


def ignores(pid: int, signum: int) -> bool:
    """Whether process `pid` has set `signum` to be ignored (its `SigIgn` in /proc), e.g. once a
    stubborn agent is past installing its handlers."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        pass
    return False


def fenced_turn(sv: Supervised, agent: str) -> str:
    """Start `sv` and wait for `agent`'s one turn (a `restart = "never"` process agent) to end,
    after checking that it runs fenced; the agent's log."""
    sv.start()
    row = until(lambda: sv.status()[agent], 60, "the agent's row")
    assert row["sandbox"].startswith("bwrap"), row
    until(lambda: sv.status()[agent]["state"] in ("stopped", "failed"), 300, "the turn")
    return sv.ctl("logs", agent, "--lines", "200", check=False).stdout


def center_heard(center: DevCenter, agent: str, tool: str) -> list[dict[str, Any]]:
    """The center's recorded calls of `tool` made as `agent`."""
    return [
        r
        for r in center.requests(500)
        if r["route"].endswith(f"/{tool}") and r["body"]["agent_id"] == agent
    ]


def payload(result: dict[str, Any]) -> dict[str, Any]:
    """A tool result's structured content (or its text parsed as JSON)."""
    structured = result.get("structuredContent")
    if isinstance(structured, dict):
        return structured
    texts = [c.get("text", "") for c in result.get("content", []) if c.get("type") == "text"]
    return dict(json.loads(texts[0])) if texts else {}


# Runs inside an agent (ctl exec): the SDK client on the agent's own `agentmux` attach entry (its
# MCP config, argv[1]); each line of stdin is one tool call {"tool", "args"}, answered by one
# line of stdout: the result, or the relay's refusal (a JSON-RPC error).
RELAY_DRIVER = """\
import asyncio, json, sys
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError as McpError

async def main():
    entry = json.load(open(sys.argv[1]))["mcpServers"]["agentmux"]
    params = StdioServerParameters(
        command=entry["command"], args=entry.get("args", []), env=entry.get("env")
    )
    loop = asyncio.get_running_loop()
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            while line := await loop.run_in_executor(None, sys.stdin.readline):
                op = json.loads(line)
                try:
                    result = await session.call_tool(op["tool"], op.get("args", {}))
                    out = result.model_dump(mode="json", by_alias=True)
                except McpError as exc:
                    out = {"isError": True, "error": exc.error.model_dump()}
                print(json.dumps(out), flush=True)

asyncio.run(main())
"""


# The operator's policies.toml of a bundle with ACP members: everyone lists, looks and sends at
# home; a member with policy "lead" also decides the ACP members' permission choices.
CHOOSING_POLICIES = """\
format-version = 1
default = "default"

[[policies]]
id = "default"
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


class RelayDriver:
    """`agent`'s relay tools, called from inside its tree: one `ctl exec <agent>` process (the
    official MCP SDK client on the agent's own `agentmux` attach entry, from its `mcp.json`)
    for as many calls as the test makes, so every call goes pump -> supervisor -> relay."""

    def __init__(self, sv: Supervised, agent: str) -> None:
        config = sv.state / "agents" / agent / "mcp.json"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mcphost", "ctl", "--state", str(sv.state), "exec", agent,
             "--", sys.executable, "-c", RELAY_DRIVER, str(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=sv.env(),
        )  # fmt: skip

    def call(self, tool: str, **args: Any) -> dict[str, Any]:
        """One tool call: its result as the SDK dumps it (`isError` and `error` on a refusal)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"tool": tool, "args": args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the driver ended: {self.proc.wait()}"
        result: dict[str, Any] = json.loads(line)
        return result

    def ok(self, tool: str, **args: Any) -> dict[str, Any]:
        """The call's structured result; it must not be an error."""
        result = self.call(tool, **args)
        assert not result.get("isError"), result
        return payload(result)

    def close(self) -> int:
        """End the driver (its stdin closed); its exit status (`ctl exec`'s)."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=60)
