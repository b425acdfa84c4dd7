"""`mcphost ctl` as an operator runs it: the real command against a real control socket.

The supervisor behind the socket is a fake handler (the unit under test is the command: its
arguments, table, JSON, log printing, messages and exit codes); the real supervisor's black-box
tests drive the same command against `mcphost supervise`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from mcphost.supervisor.control.protocol import ControlError, unknown_agents
from mcphost.supervisor.control.server import ControlServer
from mcphost.supervisor.operator.ctlview import COLUMNS
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[3]
NOW = time.time()
AGENTS = [
    {
        "agent_id": "agent-1",
        "state": "running",
        "pid": 4242,
        "generation": 7,
        "restarts": 2,
        "started_at": NOW - 192,
        "last_exit": "signal 9",
        "last_reason": "killed by an operator",
        "sessions": 2,
        "sandbox": "bwrap+landlock7",
    },
    {
        "agent_id": "agent-2",
        "state": "failed",
        "pid": None,
        "generation": 3,
        "restarts": 5,
        "started_at": None,
        "last_exit": "exit 1",
        "last_reason": "5 restarts in 60 s\x1b[31m",
        "sessions": 0,
        "sandbox": "none",
    },
]


CENTER = {
    "state": "pin_mismatch",
    "message": "the center's certificate matches none of the pins in [center] fingerprint\x1b[31m",
    "checked_at": NOW - 3,
    "fleet_key": "[center] fingerprint",
}


FLEET = {"path": "/etc/mcphost/fleet.toml", "agents_from": "file"}


class Handler:
    def __init__(self) -> None:
        self.follow_closed = threading.Event()

    async def status(self) -> Any:
        return {"center": CENTER, "fleet": FLEET, "agents": AGENTS}

    async def start(self, agents: list[str]) -> list[Any]:
        self._known(*agents)
        return [
            {"agent_id": agent, "state": "running", "pid": 99, "generation": 8} for agent in agents
        ]

    async def stop(self, agents: list[str]) -> list[Any]:
        self._known(*agents)
        return [{"agent_id": agent, "state": "stopped"} for agent in agents]

    async def restart(self, agents: list[str]) -> list[Any]:
        self._known(*agents)
        return [{"agent_id": agent, "state": "starting", "generation": 9} for agent in agents]

    async def reload(self, dry_run: bool = False) -> Any:
        if os.path.exists(os.environ.get("CTL_TEST_RELOAD_FAILS", "/nonexistent")):
            raise ControlError("reload_failed", "fleet.toml: agent.id: bad", {})
        return {
            "added": ["agent-3"],
            "removed": [],
            "changed": ["agent-2"],
            "unchanged": ["agent-1"],
        }

    async def logs(self, agent: str, lines: int, follow: bool) -> AsyncIterator[bytes]:
        self._known(agent)
        try:
            yield f"last {lines} lines of {agent}\n".encode()
            yield "héllo\n".encode()
            if follow:
                yield b"following\n"
                await asyncio.Event().wait()
        finally:
            if follow:
                self.follow_closed.set()

    @staticmethod
    def _known(*agents: str) -> None:
        """Every id checked first, refused as the supervisor refuses it."""
        known = [row["agent_id"] for row in AGENTS]
        unknown = [agent for agent in agents if agent not in known]
        if unknown:
            raise unknown_agents(unknown, known, FLEET)


class Running:
    """A ControlServer on `<state>/control.sock`, served by a loop in a thread."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.handler = Handler()
        self.loop = asyncio.new_event_loop()
        self.server = ControlServer(state / "control.sock", self.handler)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.aclose(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def state() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ctl-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def running(state: Path) -> Iterator[Running]:
    server = Running(state)
    try:
        yield server
    finally:
        server.close()


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k != "MCPHOST_STATE"}
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), out.get("PYTHONPATH")) if p)
    return {**out, **extra}


def ctl(*args: str, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcphost", "ctl", *args],
        capture_output=True,
        text=True,
        env=environ or env(),
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


# -- status ----------------------------------------------------------------------------------------


def test_status_table(running: Running) -> None:
    done = ctl("--state", str(running.state), "status")
    assert done.returncode == 0, done.stderr
    center, blank, *lines = done.stdout.splitlines()
    assert center == (
        "center: pin_mismatch ([center] fingerprint): the center's certificate matches none of "
        "the pins in [center] fingerprint?[31m"
    )
    assert blank == ""
    assert lines[0].split() == list(COLUMNS)  # a pipe: every column, whatever the width
    first = lines[1].split()
    assert [*first[:5], first[6], *first[17:19]] == [
        "agent-1", "running", "4242", "7", "2", "2", "bwrap+landlock7", "signal"
    ]  # fmt: skip
    # started 192 s before this module was imported, however long ago that was (3m12s or more)
    assert re.fullmatch(r"([3-9]|\d\d+)m\d\ds|\d+h\d\dm", first[5]), first[5]
    assert lines[1].endswith("signal 9: killed by an operator")
    assert lines[2].split()[:18] == [
        "agent-2",
        "failed",
        "-",
        "3",
        "5",
        "-",
        "0",
        *"------",
        *"----",  # no limits: the fake supervisor has no cgroup backend
        "none",
    ]
    assert "\x1b" not in done.stdout and lines[2].endswith("exit 1: 5 restarts in 60 s?[31m")
    assert done.stderr == ""


def test_status_json_has_the_center_and_the_list(running: Running) -> None:
    done = ctl("--state", str(running.state), "status", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"center": CENTER, "fleet": FLEET, "agents": AGENTS}


def test_status_of_some_agents_only(running: Running) -> None:
    """`status AGENT...` filters; an unknown id close to one of the fleet's (a typo) is named,
    a value like no agent id is only counted (it may be a token), one outside the agent-id
    grammar is refused as usage without being shown."""
    s = str(running.state)
    done = ctl("--state", s, "status", "agent-2", "--json")
    assert done.returncode == 0, done.stderr
    assert [row["agent_id"] for row in json.loads(done.stdout)["agents"]] == ["agent-2"]
    table = ctl("--state", s, "status", "agent-2", "agent-1").stdout
    assert "agent-1" in table and "agent-2" in table
    done = ctl("--state", s, "status", "agnet-1", "acatT0k3nT0k3n")
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == (
        "mcphost ctl: not in the fleet: 'agnet-1' (did you mean 'agent-1'?), 1 value not shown "
        "(like none of the fleet's ids); nothing was done. The fleet file "
        "/etc/mcphost/fleet.toml defines 2 agents: `mcphost ctl status` lists them "
        "(unknown_agent)\n"
    )
    done = ctl("--state", s, "status", "acat_secret/with+slash")
    assert done.returncode == 2 and "not an agent id (value not shown)" in done.stderr
    assert "acat_secret" not in done.stderr


def test_restart_all_restarts_every_agent(running: Running) -> None:
    done = ctl("--state", str(running.state), "restart", "--all")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "agent-1: state starting, generation 9\nagent-2: state starting, generation 9\n"
    )
    for args in (("restart",), ("restart", "agent-1", "--all")):
        done = ctl("--state", str(running.state), *args)
        assert done.returncode == 2 and "AGENTs or --all" in done.stderr, done.stderr


def test_state_from_the_environment_or_after_the_command(running: Running) -> None:
    assert ctl("status", "--json", environ=env(MCPHOST_STATE=str(running.state))).returncode == 0
    done = ctl("status", "--state", str(running.state), environ=env(MCPHOST_STATE="/nowhere"))
    assert done.returncode == 0, done.stderr
    assert "agent-1" in done.stdout


# -- start / stop / restart / reload ---------------------------------------------------------------


def test_agent_commands_print_one_line(running: Running) -> None:
    s = str(running.state)
    assert ctl("--state", s, "start", "agent-1").stdout == (
        "agent-1: state running, pid 99, generation 8\n"
    )
    assert ctl("--state", s, "stop", "agent-2").stdout == "agent-2: state stopped\n"
    assert ctl("--state", s, "restart", "agent-1").stdout == (
        "agent-1: state starting, generation 9\n"
    )
    assert ctl("--state", s, "stop", "agent-2", "agent-1", "agent-2").stdout == (
        "agent-2: state stopped\nagent-1: state stopped\n"
    )
    done = ctl("--state", s, "reload")
    assert done.returncode == 0
    assert done.stdout == (
        "reloaded: 1 added (agent-3); 0 removed; 1 changed (agent-2); 1 unchanged (agent-1)\n"
    )


def test_a_refusal_says_its_message_and_code(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = ctl("--state", str(running.state), "restart", "agent-1", "agnet-2")
    assert done.returncode == 2  # usage: an AGENT the fleet lacks
    assert done.stdout == ""
    assert done.stderr == (
        "mcphost ctl: not in the fleet: 'agnet-2' (did you mean 'agent-2'?); nothing was done. "
        "The fleet file /etc/mcphost/fleet.toml defines 2 agents: `mcphost ctl status` lists "
        "them (unknown_agent)\n"
    )
    flag = running.state / "reload-fails"
    flag.touch()
    # the handler runs in this test process: it reads the flag from our environment
    monkeypatch.setenv("CTL_TEST_RELOAD_FAILS", str(flag))
    done = ctl("--state", str(running.state), "reload")
    assert done.returncode == 1
    assert done.stderr == "mcphost ctl: fleet.toml: agent.id: bad (reload_failed)\n"


# -- logs ------------------------------------------------------------------------------------------


def test_logs_prints_the_text(running: Running) -> None:
    done = ctl("--state", str(running.state), "logs", "agent-1", "-n", "20")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "last 20 lines of agent-1\nhéllo\n"
    assert ctl("--state", str(running.state), "logs", "agent-1").stdout.startswith("last 50 ")
    missing = ctl("--state", str(running.state), "logs", "agent-9")
    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr.endswith("(unknown_agent)\n")


def test_logs_follow_until_ctrl_c(running: Running, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mcphost", "ctl", "--state", str(running.state), "logs",
             "agent-1", "--follow"],
            stdout=sink,
            stderr=subprocess.PIPE,
            env=env(),
        )  # fmt: skip
        try:
            until(lambda: b"following" in out.read_bytes(), 30, "the followed line")
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.stderr is not None and proc.stderr.read() == b""
    assert out.read_text() == "last 50 lines of agent-1\nhéllo\nfollowing\n"
    assert running.handler.follow_closed.wait(10)  # the supervisor stopped following


# -- not running, usage ----------------------------------------------------------------------------


def test_no_supervisor_exits_3_naming_the_socket(state: Path) -> None:
    done = ctl("--state", str(state), "status")
    assert done.returncode == 3
    assert str(state / "control.sock") in done.stderr
    assert f"mcphost supervise --state {state}" in done.stderr
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(state / "control.sock"))
    stale.close()
    done = ctl("--state", str(state), "restart", "agent-1")
    assert done.returncode == 3 and "refused" in done.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "required: COMMAND"),
        (("status",), "give --state DIR"),
        (("--state", "/x", "logs", "a", "-n", "-4"), "expected 0 to 100000"),
        (("--state", "/x", "start"), "required: AGENT"),
        (("--state", "/x", "status", "--token", "acat_secret"), "unrecognized arguments: --token"),
        (("--state", "/x", "status", "--js"), "unrecognized arguments: --js"),
        (("--state", "/x", "acat_secret"), "invalid choice (value not shown"),
        (("--sta", "/x", "status"), "invalid choice (value not shown"),
        # the choices, cleanly, whatever the value holds; the closest one when one is close
        (
            ("--state", "/x", "x (choose from acat_secret"),
            "invalid choice (value not shown; choose from status, top, start, stop, restart, reload, "
            "logs, exec)\n",
        ),
        (("--state", "/x", "stauts"), "(value not shown; did you mean 'status'? choose from sta"),
    ],
)
def test_usage_errors_exit_2_without_echoing(args: tuple[str, ...], says: str) -> None:
    done = ctl(*args)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert "acat_secret" not in done.stderr and done.stdout == ""


def test_ctl_imports_nothing_heavy(state: Path) -> None:
    code = (
        "import sys\n"
        "from mcphost.cli import main\n"
        f"code = main(['ctl', '--state', {str(state)!r}, 'status'])\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
        "{'asyncio', 'pydantic', 'pydantic_settings', 'aiohttp', 'logging', 'mcp'})\n"
        "print(code, heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env(), timeout=60
    )
    assert done.stdout == "3 []\n", done.stderr


def test_ctl_loads_the_clients_side_of_the_control_socket_only(state: Path) -> None:
    """`mcphost ctl` imports the wire and the client, never the server (asyncio's side)."""
    code = (
        "import sys\n"
        "from mcphost.cli import main\n"
        f"code = main(['ctl', '--state', {str(state)!r}, 'status'])\n"
        "print(code, sorted(m for m in sys.modules if m.startswith('mcphost.supervisor.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env(), timeout=60
    )
    loaded = [
        "mcphost.supervisor.control",
        "mcphost.supervisor.control.client",
        "mcphost.supervisor.control.protocol",
        "mcphost.supervisor.operator",  # the wing's head: a docstring, no import
        "mcphost.supervisor.operator.ctl",
        "mcphost.supervisor.operator.ctlview",  # what ctl prints (pure)
        "mcphost.supervisor.refusals",
        "mcphost.supervisor.values",  # reload behaviours a reply names, the one size formatter (stdlib)
    ]
    assert done.stdout == f"3 {loaded}\n", done.stderr


# -- exec ------------------------------------------------------------------------------------------


def test_exec_without_a_command_is_a_usage_error(state: Path) -> None:
    for args in (("exec", "agent-1"), ("exec", "agent-1", "--")):
        done = ctl("--state", str(state), *args)
        assert done.returncode == 2 and "exec needs a command" in done.stderr, done.stderr


def test_exec_imports_nothing_heavy_and_says_when_no_supervisor_runs(state: Path) -> None:
    code = (
        "import sys\n"
        "from mcphost.cli import main\n"
        f"code = main(['ctl', '--state', {str(state)!r}, 'exec', 'agent-1', '--', 'true'])\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
        "{'asyncio', 'pydantic', 'pydantic_settings', 'aiohttp', 'logging', 'mcp'})\n"
        "print(code, heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env(), timeout=60
    )
    assert done.stdout == "3 []\n", done.stderr
    assert "no supervisor is running" in done.stderr


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["exec", "a", "--", "x", "-y", "--", "z"], ["x", "-y", "--", "z"]),
        (["exec", "a", "x", "--", "q"], ["x", "--", "q"]),
        (["exec", "--state", "s", "a", "--", "--state"], ["--state"]),
        (["exec", "a", "c", "-v"], ["c", "-v"]),
    ],
)
def test_exec_takes_the_command_verbatim(argv: list[str], command: list[str]) -> None:
    from mcphost.supervisor.operator.ctl import _parse

    args = _parse(argv)
    assert (args.command, args.agent, args.argv) == ("exec", "a", command)


def test_logs_escape_and_raw_are_exclusive(state: Path) -> None:
    done = ctl("--state", str(state), "logs", "agent-1", "--raw", "--escape")
    assert done.returncode == 2 and "not allowed with argument" in done.stderr, done.stderr
