"""Black-box: a real `mcphost supervise` runs stand-in agents against the real reference center.

Each agent is `mcphost/testing/standin_agent.py`: it launches the servers of the MCP config the
supervisor generated for it, exactly as the config says (the pump, `python3 -I -S attach.py`),
and makes one call each. What the tests check is what the issue promises an operator: each
agent reaches the center as itself, nothing outside the fleet attaches, the token is nowhere an
agent can read it, a killed agent comes back with the next generation and its old sessions end,
reload adds, removes and leaves alone, and SIGTERM leaves nothing behind.

The tests that only need a running supervisor share one (`fleet`): each has agents of its own in
the shared fleet, reads only its agents' calls, files and processes, and leaves the fleet as it
found it. A test about the supervisor process itself (its start-up refusal, its SIGTERM) starts
its own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import UNFENCED, Supervised, descendants_alive, standin
from tests.waiting import until

ATTACH = str(Path(__file__).resolve().parents[2] / "mcphost" / "attach.py")


def agent_calls(center: DevCenter, tool: str = "get_my_work") -> list[dict]:
    return [r for r in center.requests(200) if r["route"].endswith(f"/{tool}")]


def generation_of(entry: dict) -> str | None:
    return {k.lower(): v for k, v in entry["headers"].items()}.get("x-ac-mcp-generation")


@dataclass
class Fleet:
    """The shared supervisor, the agents it started with, and where the unsafe home points."""

    sv: Supervised
    base: list[dict[str, Any]]
    outside: Path

    def reload(self, *extra: dict[str, Any]) -> None:
        """Reload the base fleet plus `extra` agents."""
        self.sv.write_fleet([*self.base, *extra])
        assert self.sv.ctl("reload").returncode == 0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, center: DevCenter) -> Iterator[Fleet]:
    """One `mcphost supervise` for the tests that only need a running supervisor.

    A fresh supervisor per test would prove nothing more: the center, the fleet file's defaults
    and the environment are the same, and each test has agents of its own: `agent-1` and
    `agent-2` (held sessions, never restarted: the tests that read them only read), `killed-1`
    (killed by its test, with a lingering session), `printer` (prints and ends, never
    restarted) and `unsafe-home` (its workspace a symlink planted before the start). At the
    module's end SIGTERM must stop it with exit 0 and no traceback.
    """
    base = tmp_path_factory.mktemp("shared-supervisor")
    sv = Supervised(base, center)
    outside = base / "outside"
    outside.mkdir()
    home = sv.state / "agents" / "unsafe-home"
    home.mkdir(parents=True)
    (home / "workspace").symlink_to(outside)
    agents: list[dict[str, Any]] = [
        {"id": "agent-1", "command": standin("--hold")},
        {"id": "agent-2", "command": standin("--hold")},
        # unfenced: its lingerer must outlive it (a fenced agent's would end with its namespace:
        # test_supervise_state.py)
        {"id": "killed-1", "command": standin("--hold", "--linger"), **UNFENCED},
        {
            "id": "printer",
            "command": [sys.executable, "-c", "print('hello from printer')"],
            "restart": "never",
        },
        {"id": "unsafe-home", "command": standin("--hold")},
    ]
    sv.write_fleet(agents)
    try:
        sv.start()
        yield Fleet(sv, agents, outside)
        assert sv.terminate() == 0, sv.stderr()[-3000:]
        assert "Traceback" not in sv.stderr(), sv.stderr()[-3000:]
    finally:
        sv.close()
        shutil.rmtree(sv.state, ignore_errors=True)


def test_supervise_without_arguments_names_the_flags() -> None:
    """Not only the variables: `--fleet` and `--state` are what an operator types."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCPHOST_")}
    done = subprocess.run(
        [sys.executable, "-m", "mcphost", "supervise"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--fleet FILE" in done.stderr and "--state DIR" in done.stderr, done.stderr


def test_each_agent_reaches_the_center_as_itself(fleet: Fleet, center: DevCenter):
    supervised = fleet.sv
    for agent in ("agent-1", "agent-2"):
        until(lambda a=agent: supervised.calls(a), 60, f"{agent}'s call")
        (call,) = supervised.calls(agent)
        assert call["ok"], call
        assert "get_my_work" in call["tools"]
    seen = {(r["body"]["agent_id"], generation_of(r)) for r in agent_calls(center)}
    status = supervised.status()
    for agent in ("agent-1", "agent-2"):
        assert (agent, str(status[agent]["generation"])) in seen
        assert status[agent]["sessions"] >= 1


def test_a_process_outside_the_fleet_cannot_attach(fleet: Fleet):
    supervised = fleet.sv
    supervised.wait_running("agent-1")
    done = subprocess.run(
        [sys.executable, "-I", "-S", ATTACH, str(supervised.state / "run" / "center.sock")],
        input=b"",
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 3
    assert b"not_in_fleet" in done.stderr
    assert done.stdout == b""


def test_the_token_is_nowhere_an_agent_can_read_it(fleet: Fleet, center: DevCenter):
    supervised = fleet.sv
    row = supervised.wait_running("agent-1")
    until(lambda: supervised.calls("agent-1"), 60, "the agent's call")
    token = center.token.encode()
    home = supervised.state / "agents" / "agent-1"
    for path in home.rglob("*"):
        if path.is_file():
            assert token not in path.read_bytes(), path
            assert str(supervised.token_file).encode() not in path.read_bytes(), path
    # the agent and every process of its tree (the pumps included)
    tree = [row["pid"], *children_of(row["pid"])]
    assert len(tree) >= 2, tree
    for pid in tree:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert token not in environ and token not in cmdline, pid
        assert b"AC_MCP_WORKER_TOKEN" not in environ
    # the supervisor is not dumpable: a same-user process cannot read its environment or memory
    # (root can; tests/supervisor/confine/test_kernel.py proves it between two unprivileged processes)
    assert supervised.proc is not None
    if os.geteuid() != 0:
        with pytest.raises(PermissionError):
            Path(f"/proc/{supervised.proc.pid}/environ").read_bytes()


def children_of(pid: int) -> list[int]:
    out: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out += [int(entry), *children_of(int(entry))]
    return out


def test_a_killed_agent_restarts_with_the_next_generation(fleet: Fleet, center: DevCenter):
    supervised = fleet.sv
    first = supervised.wait_running("killed-1")
    workspace = supervised.workspace("killed-1")
    until(lambda: (workspace / "lingerer.pid").exists(), 60, "the lingering session")
    until(lambda: supervised.calls("killed-1"), 60, "the first generation's call")
    os.kill(first["pid"], signal.SIGKILL)
    second = supervised.wait_running("killed-1", generation=first["generation"] + 1)
    assert second["pid"] != first["pid"]
    assert second["restarts"] >= 1
    # the lingering process attached under the old generation: its session is closed
    until(lambda: (workspace / "lingerer.closed").exists(), 60, "the old session to close")
    until(lambda: len(supervised.calls("killed-1")) >= 2, 60, "the new generation's call")
    generations = {
        generation_of(r) for r in agent_calls(center) if r["body"]["agent_id"] == "killed-1"
    }
    assert str(second["generation"]) in generations


def test_reload_adds_removes_and_leaves_alone(fleet: Fleet):
    supervised = fleet.sv
    fleet.reload(
        {"id": "reload-kept", "command": standin("--hold")},
        {"id": "reload-gone", "command": standin("--hold")},
    )
    kept = supervised.wait_running("reload-kept")
    gone = supervised.wait_running("reload-gone")
    before = supervised.status()
    try:
        fleet.reload(
            {"id": "reload-kept", "command": standin("--hold")},
            {"id": "reload-added", "command": standin("--hold")},
        )
        supervised.wait_running("reload-added")
        status = supervised.status()
        assert "reload-gone" not in status
        for agent in ("reload-kept", *(a["id"] for a in fleet.base)):
            assert (status[agent]["pid"], status[agent]["generation"]) == (
                before[agent]["pid"],
                before[agent]["generation"],
            ), agent
        assert (status["reload-kept"]["pid"], status["reload-kept"]["generation"]) == (
            kept["pid"],
            kept["generation"],
        )
        until(lambda: not descendants_alive([gone["pid"]]), 60, "reload-gone to stop")
    finally:
        fleet.reload()  # the fleet as the module started it
    until(lambda: not {"reload-kept", "reload-added"} & set(supervised.status()), 60, "cleanup")


def test_a_bad_reload_changes_nothing(fleet: Fleet):
    supervised = fleet.sv
    before = supervised.wait_running("agent-1")
    good = supervised.fleet.read_text()
    supervised.fleet.write_text(good + '\n[[agent]]\nid = "a b"\n')
    try:
        done = supervised.ctl("reload", check=False)
    finally:
        supervised.fleet.write_text(good)
    assert done.returncode == 1
    assert "reload_failed" in done.stderr and "agent" in done.stderr
    after = supervised.status()["agent-1"]
    assert (after["pid"], after["generation"]) == (before["pid"], before["generation"])


def test_a_bad_fleet_file_is_refused_at_start(supervised: Supervised):
    supervised.write_fleet([{"id": "agent-1", "command": standin()}], restart="sometimes")
    done = supervised.run_to_exit()
    assert done.returncode == 2
    assert str(supervised.fleet) in done.stderr and "restart" in done.stderr
    assert done.stdout == ""


def test_sigterm_stops_everything_and_exits_0(supervised: Supervised):
    supervised.write_fleet(
        [
            {"id": "agent-1", "command": standin("--hold", "--linger")},
            {"id": "agent-2", "command": standin("--hold")},
        ]
    )
    supervised.start()
    rows = [supervised.wait_running(a) for a in ("agent-1", "agent-2")]
    lingerer = supervised.workspace("agent-1") / "lingerer.pid"
    until(lingerer.exists, 60, "the lingering process")
    assert supervised.proc is not None
    tree = {supervised.proc.pid}
    for row in rows:
        tree |= {row["pid"], *children_of(row["pid"])}
    # the lingerer wrote its pid as its own PID namespace numbers it: the tree walked from the
    # agent's root (bubblewrap) holds it
    assert supervised.terminate() == 0
    until(lambda: not descendants_alive(tree), 60, "every process of the fleet to be gone")
    stopped = [e for e in supervised.events() if e.get("event") == "supervisor.stopped"]
    assert stopped, supervised.stderr()[-3000:]


def test_ctl_status_table_and_logs(fleet: Fleet):
    supervised = fleet.sv
    until(lambda: supervised.status()["printer"]["state"] == "stopped", 60, "the agent to end")
    table = supervised.ctl("status").stdout
    (row,) = [line for line in table.splitlines() if "printer" in line]
    assert "stopped" in row, table
    logs = supervised.ctl("logs", "printer").stdout
    assert "hello from printer" in logs
    missing = supervised.ctl("restart", "agent-9", check=False)
    assert missing.returncode == 2 and "unknown_agent" in missing.stderr
    json.loads(supervised.ctl("status", "--json").stdout)


def test_every_ctl_verb_refuses_an_agent_the_fleet_lacks(fleet: Fleet):
    """start, stop, restart, logs, exec and status given a valid id the fleet lacks: refused
    with `unknown_agent`, exit 2, a message naming the typo's closest id, the fleet file and
    how many agents it defines (a value like no id of the fleet, a token perhaps, not shown),
    and nothing done: not to the agents named with it (all are checked first), not to any
    other."""
    supervised = fleet.sv
    rows = {a: supervised.wait_running(a) for a in ("agent-1", "agent-2")}
    token = "acat_" + "Zq9x" * 11  # the center's token shape passes the agent-id grammar
    known = len(fleet.base)  # unsafe-home included: in the fleet, though never started
    for args in (
        ("start", "agnet-1"),
        ("stop", "agnet-1"),
        ("restart", "agnet-1"),
        ("stop", "agent-1", "agnet-1"),
        ("restart", "agent-2", "agent-1", "agnet-1"),
        ("logs", "agnet-1"),
        ("exec", "agnet-1", "--", "true"),
        ("status", "agnet-1"),
    ):
        done = supervised.ctl(*args, check=False)
        assert (done.returncode, done.stdout) == (2, ""), (args, done.stdout, done.stderr)
        assert done.stderr == (
            "mcphost ctl: not in the fleet: 'agnet-1' (did you mean 'agent-1'?); nothing was "
            f"done. The fleet file {supervised.fleet} defines {known} agents: `mcphost ctl "
            "status` lists them (unknown_agent)\n"
        ), args
    hidden = supervised.ctl("restart", "agent-1", token, check=False)
    assert hidden.returncode == 2 and "1 value not shown" in hidden.stderr, hidden.stderr
    assert token not in hidden.stdout + hidden.stderr
    after = supervised.status()
    for agent, row in rows.items():
        assert (after[agent]["pid"], after[agent]["generation"]) == (
            row["pid"],
            row["generation"],
        ), agent
    unstarted = supervised.ctl("restart", "unsafe-home", check=False)
    assert unstarted.returncode == 1, unstarted.stderr
    assert "agent unsafe-home is in the fleet but could not be set up" in unstarted.stderr
    assert unstarted.stderr.endswith("(agent_not_running)\n")


def test_ctl_acts_on_several_agents_in_one_command(fleet: Fleet):
    """`stop A B` / `restart A B`: a line per agent, each done; with an id the fleet lacks
    among them, none is."""
    supervised = fleet.sv
    pair = ("several-1", "several-2")
    fleet.reload(*({"id": a, "command": standin("--hold")} for a in pair))
    try:
        first = {a: supervised.wait_running(a) for a in pair}
        refused = supervised.ctl("stop", *pair, "several-9", check=False)
        assert refused.returncode == 2 and "'several-9'" in refused.stderr, refused.stderr
        assert {a: supervised.status()[a]["state"] for a in pair} == dict.fromkeys(pair, "running")
        done = supervised.ctl("restart", *pair)
        assert [line.split(":")[0] for line in done.stdout.splitlines()] == list(pair)
        for agent in pair:
            supervised.wait_running(agent, generation=first[agent]["generation"] + 1)
        supervised.ctl("stop", *pair)
        assert {a: supervised.status()[a]["state"] for a in pair} == dict.fromkeys(pair, "stopped")
    finally:
        fleet.reload()  # the fleet as the module started it
    until(lambda: not set(pair) & set(supervised.status()), 60, "cleanup")


def test_an_unsafe_home_fails_that_agent_only(fleet: Fleet):
    """A symlink planted where an agent's workspace belongs (before the start, by `fleet`):
    that agent is `failed` with the reason, nothing is written through the link, and the rest
    of the fleet runs."""
    supervised = fleet.sv
    supervised.wait_running("agent-1")
    row = supervised.status()["unsafe-home"]
    assert row["state"] == "failed" and row["pid"] is None, row
    assert "home" in row["last_reason"], row
    assert list(fleet.outside.iterdir()) == []
