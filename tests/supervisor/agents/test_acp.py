"""`AcpRunner` (mcphost/supervisor/agents/acp.py): the persisted session id, how the supervisor
builds the runner, and real runs of the stand-in ACP agent (mcphost/testing/acp_agent.py).

The runs are in a fresh interpreter each (`isolated`, confine/test_kernel.py: the runner needs the
supervisor's SIGCHLD reaper, which pytest's own process must not install), unfenced; waits are
on conditions (`until_async`), never sleeps. The black-box runs under a real `mcphost supervise`
are test_supervise_acp.py.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from configgen.clients import acp_servers
from mcphost.supervisor.agents import acp, runner
from mcphost.supervisor.agents.acp import (
    ACP_DIR,
    AcpRunner,
    read_session_id,
    write_session_id,
)
from mcphost.supervisor.agents.homes import attach_config, config_bytes, home_paths
from mcphost.supervisor.agents.reach import attach_points
from mcphost.supervisor.agents.runner import Collaborators
from mcphost.supervisor.agents.states import AgentState
from mcphost.supervisor.confine import kernel
from mcphost.supervisor.plan import AgentDefaults, apply_defaults
from mcphost.supervisor.state import StateStore
from tests.supervisor.confine.test_kernel import isolated, until_async
from tests.thorough import examples

ACP_AGENT = [sys.executable, "-m", "mcphost.testing.acp_agent"]

# -- the persisted session id --------------------------------------------------------------


def test_a_written_id_reads_back_from_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "state" / ACP_DIR / "B.json"
    assert read_session_id(str(path)) is None  # absent: nothing to load
    write_session_id(str(path), "sess-1")
    assert read_session_id(str(path)) == "sess-1"
    assert json.loads(path.read_text()) == {"schema_version": 2, "acp_session_id": "sess-1"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    write_session_id(str(path), "sess-2")  # replaced whole
    assert read_session_id(str(path)) == "sess-2"


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        b'"sess-1"',
        b'{"schema_version": 1, "acp_session_id": "sess-1"}',
        b'{"acp_session_id": "sess-1"}',
        b'{"schema_version": 2, "acp_session_id": ""}',
        b'{"schema_version": 2, "acp_session_id": 7}',
        b'{"schema_version": 2}',
        b"\xff\xfe",
    ],
)
def test_an_unreadable_id_file_is_removed_and_absent(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "B.json"
    path.write_bytes(body)
    assert read_session_id(str(path)) is None
    assert not path.exists()  # agentmux's rule: deleted, then treated as absent


@examples(full=200, quick=20)  # each example fsyncs a file
@given(st.text(min_size=1, max_size=200))
def test_any_id_round_trips(session_id: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, ACP_DIR, "x.json")
        try:
            write_session_id(path, session_id)
        except UnicodeEncodeError:  # a lone surrogate: no JSON file can hold it as UTF-8
            return
        assert read_session_id(path) == session_id


# -- how the supervisor builds it ----------------------------------------------------------


@dataclass(frozen=True)
class Site:
    state_dir: str


def test_hosted_gives_the_agent_its_attach_entries_and_nothing_else(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    defaults = AgentDefaults(client="command", runner="acp", bundle="party")
    plan = apply_defaults(defaults, "B", {"command": ("my-acp", "--stdio")})
    home = home_paths(state, "B", plan.client)
    store = StateStore(os.path.join(state, "state.sqlite3"))
    env = {"PATH": "/usr/bin", "HOME": str(home.root)}
    given_ = Collaborators(
        store=store,
        reaper=kernel.Reaper(),
        on_spawn=lambda *a: None,
        on_exit=lambda *a: None,
        argv=["my-acp", "--stdio"],
        env=env,
    )
    try:
        runner = AcpRunner.hosted(plan, home, given_, Site(state))
        assert isinstance(runner, AcpRunner)
        # the process: the plan's argv and env as given, its stdio piped (stderr to its log)
        assert runner._argv == ["my-acp", "--stdio"] and runner._env == env
        assert runner.STDIO == (-1, -1, -1)
        # its MCP servers: its own attach entries (the center host and the relay tools through
        # the pump), exactly the entries of the client config the agent's home holds
        attach = attach_points(state)
        assert runner._mcp_servers == acp_servers(attach_config(plan, attach))
        own = json.loads(config_bytes(plan, attach))["mcpServers"]
        assert {s["name"] for s in runner._mcp_servers} == set(own) == {"agent-center", "agentmux"}
        for server in runner._mcp_servers:
            entry = own[server["name"]]
            assert (server["command"], server["args"]) == (entry["command"], entry["args"])
            assert {e["name"]: e["value"] for e in server["env"]} == entry.get("env", {})
        # the id lives in the supervisor's state, where the agent cannot write
        assert runner.session_file == os.path.join(state, ACP_DIR, "B.json")
        assert runner.target_session == "B@party"
        assert runner._workspace() == os.path.realpath(home.workspace)
        status = runner.status()
        assert (status.state, status.protocol_state, status.state_reason_code) == (
            AgentState.STOPPED,
            None,
            None,
        )
        assert runner.idle_state() == ("unavailable", "runtime_acp_worker_unavailable")
        assert runner.stopped
    finally:
        store.close()


# -- real runs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    agent_id: str = "B"
    restart: str = "always"
    restart_delay: float = 0.01
    restart_max_delay: float = 0.04
    max_restarts: int = 100
    restart_window: float = 60.0
    stop_grace: float = 2.0
    log_max_bytes: int = 1 << 20
    log_keep: int = 2
    user: str | None = None
    uid: int | None = None


@dataclass(frozen=True)
class Home:
    workspace: str
    logs: str


@dataclass
class Rig:
    """An `AcpRunner` of the stand-in agent with `flags`, its own store and reaper, recording
    the events it emits and the sessions it hands over."""

    directory: str
    flags: tuple[str, ...] = ()
    argv: list[str] | None = None
    plan: Plan = field(default_factory=Plan)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    sessions: list[object] = field(default_factory=list)

    def __post_init__(self) -> None:
        kernel.set_child_subreaper()
        self.store = StateStore(os.path.join(self.directory, "state.sqlite3"))
        self.reaper = kernel.Reaper()
        self.reaper.install()
        workspace = os.path.join(self.directory, "workspace")
        os.makedirs(workspace, exist_ok=True)
        self.history = os.path.join(self.directory, "history.jsonl")
        self.session_file = os.path.join(self.directory, ACP_DIR, "B.json")

        def record(event: str, level: str = "info", **fields: Any) -> None:
            self.events.append((event, fields))

        runner.emit = acp.emit = record
        self.env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(sys.path)}
        given = Collaborators(
            store=self.store,
            reaper=self.reaper,
            on_spawn=lambda *a: None,
            on_exit=lambda *a: None,
            argv=self.argv or [*ACP_AGENT, "--history", self.history, *self.flags],
            env=self.env,
        )
        self.runner = AcpRunner(
            self.plan,
            Home(workspace, os.path.join(self.directory, "logs")),
            given,
            session_file=self.session_file,
            mcp_servers=[],
            workspace=lambda: workspace,
            target_session="B@party",
        )
        self.runner.on_session = lambda runner, session: self.sessions.append(session)

    def named(self, event: str) -> list[dict[str, Any]]:
        return [f for e, f in self.events if e == event]

    def available(self) -> bool:
        status = self.runner.status()
        return status.state == AgentState.RUNNING and status.protocol_state == "available"

    async def close(self) -> None:
        await self.runner.aclose()
        self.reaper.uninstall()
        self.store.close()


async def _runs_loads_and_stops(directory: str) -> dict[str, Any]:
    rig = Rig(directory)
    out: dict[str, Any] = {}
    await rig.runner.start()
    await until_async(rig.available, "the first run available")
    session = rig.runner.session
    assert session is not None
    out["member"] = (rig.runner.endpoint() is rig.runner, rig.runner.ready())
    first_id = read_session_id(rig.session_file)
    pid = rig.runner.status().pid
    with open(f"/proc/{pid}/environ", "rb") as handle:  # nothing added to the plan's env
        out["env_as_given"] = (
            dict(item.split("=", 1) for item in handle.read().decode().split("\0") if item)
            == rig.env
        )
    assert await session.prompt("hello there") is True
    await until_async(lambda: session.turn_done.is_set(), "the turn")
    out["first_ready"] = rig.named("supervisor.acp_ready")[-1]["loaded"]
    await rig.runner.stop()
    stopped = rig.runner.status()
    out["stopped"] = (stopped.state, stopped.protocol_state, stopped.state_reason_code)
    out["idle"] = rig.runner.idle_state()
    out["ready_stopped"] = rig.runner.ready()
    out["handed"] = [s is not None for s in rig.sessions]
    await rig.runner.start()
    await until_async(rig.available, "the second run available")
    again = rig.runner.session
    assert again is not None and again is not session
    out["same_id"] = read_session_id(rig.session_file) == first_id == again.session_id
    out["second_ready"] = rig.named("supervisor.acp_ready")[-1]["loaded"]
    lines = [line for e in again.entries.window(100)[0] for line in e.get("lines", [])]
    out["replayed"] = "echo: hello there" in lines
    await rig.close()
    out["closed"] = rig.runner.session is None and rig.sessions[-1] is None
    return out


def test_a_run_persists_its_session_and_the_next_run_loads_it(tmp_path: Path) -> None:
    assert isolated(_runs_loads_and_stops, str(tmp_path)) == {
        "env_as_given": True,
        "member": (True, True),
        "ready_stopped": False,
        "first_ready": False,
        "stopped": ("stopped", "unavailable", "runtime_acp_worker_unavailable"),
        "idle": ("unavailable", "runtime_acp_worker_unavailable"),
        "handed": [True, False],
        "same_id": True,
        "second_ready": True,
        "replayed": True,
        "closed": True,
    }


async def _stale_file_starts_a_new_session(directory: str) -> dict[str, Any]:
    rig = Rig(directory)
    os.makedirs(os.path.dirname(rig.session_file))
    with open(rig.session_file, "w") as handle:
        json.dump({"schema_version": 1, "acp_session_id": "old"}, handle)
    await rig.runner.start()
    await until_async(rig.available, "available")
    session_id = read_session_id(rig.session_file)
    await rig.close()
    return {"new": session_id not in (None, "old"), "loaded": rig.named("supervisor.acp_ready")}


def test_a_stale_id_file_is_dropped_for_a_new_session(tmp_path: Path) -> None:
    out = isolated(_stale_file_starts_a_new_session, str(tmp_path))
    assert out["new"] and [e["loaded"] for e in out["loaded"]] == [False], out


async def _failures(directory: str, case: str) -> dict[str, Any]:
    plan = Plan(restart_delay=0.2, restart_max_delay=0.2)  # a backoff long enough to see
    if case == "no-prompt":
        rig = Rig(directory, ("--no-prompt",), plan=plan)
    elif case == "load-fails":
        rig = Rig(directory, plan=plan)
        write_session_id(rig.session_file, "sess-nobody-made")  # the agent has no history of it
    else:
        rig = Rig(directory, argv=[os.path.join(directory, "no-such-agent")], plan=plan)
    await rig.runner.start()
    if case == "no-prompt":
        await until_async(lambda: rig.runner.status().state == AgentState.FAILED, "failed")
    else:
        await until_async(
            lambda: (s := rig.runner.status()).restarts >= 2 and s.state == AgentState.BACKOFF,
            "two restarts, then backoff",
        )
    status = rig.runner.status()
    idle = rig.runner.idle_state()
    await rig.close()
    return {
        "state": status.state,
        "restarts": min(status.restarts, 2),
        "protocol": (status.protocol_state, status.state_reason_code),
        "reason": (status.last_reason or "").split(":")[0],
        "idle": idle,
        "persisted": read_session_id(rig.session_file),
    }


def test_an_agent_that_cannot_prompt_fails_at_once(tmp_path: Path) -> None:
    out = isolated(_failures, str(tmp_path), "no-prompt")
    assert out == {
        "state": "failed",
        "restarts": 0,
        "protocol": ("unavailable", "validation_missing_acp_capability"),
        "reason": "validation_missing_acp_capability",
        "idle": ("unavailable", "validation_missing_acp_capability"),
        "persisted": out["persisted"],  # its session/new came first: an id, never used
    }


def test_a_load_that_fails_is_restarted_without_a_new_session(tmp_path: Path) -> None:
    out = isolated(_failures, str(tmp_path), "load-fails")
    code = "runtime_acp_session_load_failed"
    assert out["restarts"] == 2 and out["reason"] == code, out
    assert out["protocol"] == ("unavailable", code) and out["idle"] == ("recovering", code), out
    assert out["persisted"] == "sess-nobody-made"  # no fallback: the id stays for the next try


def test_an_agent_that_cannot_be_spawned_is_a_startup_failure(tmp_path: Path) -> None:
    out = isolated(_failures, str(tmp_path), "spawn-fails")
    code = "runtime_startup_failed"
    assert out["restarts"] == 2 and out["protocol"] == ("unavailable", code), out
    assert out["idle"] == ("recovering", code), out  # between two tries


# An ACP agent that closes its stdout at the first prompt and lives on (until a signal).
HANGUP_AGENT = """\
import json, os, signal, sys
for line in sys.stdin:
    message = json.loads(line)
    method = message.get("method")
    if method == "initialize":
        capabilities = {"loadSession": False, "promptCapabilities": {}}
        result = {"protocolVersion": 1, "agentCapabilities": capabilities, "authMethods": []}
    elif method == "session/new":
        result = {"sessionId": "sess-hangup"}
    elif method == "session/prompt":
        sys.stdout.flush()
        os.close(1)
        signal.pause()
    else:
        continue
    reply = {"jsonrpc": "2.0", "id": message["id"], "result": result}
    sys.stdout.write(json.dumps(reply) + "\\n")
    sys.stdout.flush()
"""


async def _connection_lost(directory: str) -> dict[str, Any]:
    rig = Rig(directory, argv=[sys.executable, "-c", HANGUP_AGENT])
    await rig.runner.start()
    await until_async(rig.available, "available")
    first = rig.runner.status()
    session = rig.runner.session
    assert session is not None
    assert await session.prompt("hello") is True  # written; then the agent hangs up
    await until_async(
        lambda: rig.runner.status().generation != first.generation and rig.available(),
        "the agent ended and restarted",
    )
    lost = rig.named("supervisor.acp_connection_lost")
    reason = rig.runner.status().last_reason or ""
    await rig.close()
    return {"lost": [(e["generation"], e["code"]) for e in lost], "reason": reason}


def test_an_agent_whose_connection_fails_while_it_lives_is_restarted(tmp_path: Path) -> None:
    out = isolated(_connection_lost, str(tmp_path))
    assert out["lost"] == [(1, "transport_unavailable")], out
    assert out["reason"].startswith("killed by SIGTERM, after its ACP connection failed"), out
