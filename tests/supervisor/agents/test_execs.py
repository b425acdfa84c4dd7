"""Black-box: `mcphost ctl exec AGENT -- CMD` runs CMD as the agent, against a real supervisor.

One real `mcphost supervise` (module scope) runs agent-1, a holding stand-in, and agent-2, which
exits at once and stays stopped, against the real reference center. What the tests prove is
what an operator is promised: a command run through `ctl exec` is inside the agent's tree, so
the pumps it launches (driven here by the official MCP SDK client, and by the real Claude Code
`claude mcp list`) reach the center as that agent at its current generation, while the same
pump from the test process is refused; ctl exits with the command's status and forwards
signals; killing ctl ends the command; a new generation closes the old exec's session; an agent
that is not running is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import Supervised, descendants_alive
from tests.supervisor.test_supervise_state import tagged
from tests.waiting import until

# deep (make test-slow): ctl exec, including Claude Code's mcp list.
pytestmark = pytest.mark.deep

ATTACH = str(Path(__file__).resolve().parents[3] / "mcphost" / "attach.py")
CLAUDE = Path(__file__).resolve().parents[3] / "tools" / "node_modules" / ".bin" / "claude"
HOLD = [sys.executable, "-c", "import signal; signal.pause()"]


@pytest.fixture(scope="module")
def sv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervised]:
    base = tmp_path_factory.mktemp("exec")
    with DevCenter.start(base / "center") as center:
        running = Supervised(base, center)
        running.write_fleet(
            [
                {"id": "agent-1", "command": HOLD},
                {"id": "agent-2", "command": [sys.executable, "-c", "pass"], "restart": "never"},
            ]
        )
        try:
            running.start()
            running.wait_running("agent-1")
            yield running
        finally:
            running.close()


def ctl_exec(sv: Supervised, agent: str, *argv: str) -> list[str]:
    return [
        sys.executable, "-m", "mcphost", "ctl", "--state", str(sv.state), "exec", agent, "--",
        *argv,
    ]  # fmt: skip


def pump(sv: Supervised) -> list[str]:
    return [sys.executable, "-I", "-S", ATTACH, str(sv.state / "run" / "center.sock")]


def generation_of(entry: dict[str, Any]) -> str | None:
    return {k.lower(): v for k, v in entry["headers"].items()}.get("x-ac-mcp-generation")


@pytest.mark.anyio
async def test_an_sdk_client_reaches_the_center_as_the_agent(sv: Supervised) -> None:
    generation = sv.wait_running("agent-1")["generation"]
    before = len(sv.center.requests(500))
    args = ctl_exec(sv, "agent-1", *pump(sv))
    params = StdioServerParameters(command=args[0], args=args[1:], env=sv.env())
    async with Client(params, mode="legacy") as client:
        result = await client.call_tool("get_my_work", {})
        assert not result.is_error, result
        assert "tasks" in json.loads(result.content[0].text)
        assert sv.status()["agent-1"]["sessions"] >= 1
    calls = [r for r in sv.center.requests(500)[before:] if r["route"].endswith("/get_my_work")]
    assert calls, "the call reached the center"
    assert {(r["body"]["agent_id"], generation_of(r)) for r in calls} == {
        ("agent-1", str(generation))
    }


def test_the_same_pump_without_exec_is_refused(sv: Supervised) -> None:
    done = subprocess.run(pump(sv), input=b"", capture_output=True, timeout=60)
    assert done.returncode == 3 and b"not_in_fleet" in done.stderr, done.stderr


def test_the_command_runs_in_the_agents_workspace_and_environment(sv: Supervised) -> None:
    script = "import os, sys; print(os.getcwd()); print(sorted(k for k in os.environ))"
    done = subprocess.run(
        ctl_exec(sv, "agent-1", sys.executable, "-c", script),
        capture_output=True,
        text=True,
        env={**sv.env(), "MCPHOST_SECRET_PROBE": "x"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    cwd, names = done.stdout.splitlines()
    assert cwd == str(sv.workspace("agent-1"))
    # the agent's environment (the supervisor's, filtered), not the caller's
    assert "MCPHOST_SECRET_PROBE" not in names and "MCPHOST_LOG_LEVEL" not in names


@pytest.mark.parametrize(
    ("argv", "status", "says"),
    [
        (["sh", "-c", "exit 7"], 7, ""),
        (["sh", "-c", "kill -TERM $$"], 128 + signal.SIGTERM, ""),
        (["no-such-command-here"], 127, "exec_failed"),
    ],
)
def test_the_exit_status_is_ctls(sv: Supervised, argv: list[str], status: int, says: str) -> None:
    done = subprocess.run(
        ctl_exec(sv, "agent-1", *argv), capture_output=True, text=True, env=sv.env(), timeout=60
    )
    assert done.returncode == status, done.stderr
    assert says in done.stderr


def test_an_agent_that_is_not_running_is_refused(sv: Supervised) -> None:
    until(lambda: sv.status()["agent-2"]["state"] == "stopped", 60, "agent-2 to stop")
    done = subprocess.run(
        ctl_exec(sv, "agent-2", "true"), capture_output=True, text=True, env=sv.env(), timeout=60
    )
    assert done.returncode == 1
    assert "agent_not_running" in done.stderr and "ctl start agent-2" in done.stderr
    unknown = subprocess.run(
        ctl_exec(sv, "agent-9", "true"), capture_output=True, text=True, env=sv.env(), timeout=60
    )
    assert unknown.returncode == 2 and "unknown_agent" in unknown.stderr


def test_sigint_to_ctl_reaches_the_command(sv: Supervised) -> None:
    ready = sv.workspace("agent-1") / "ready"  # where the (fenced) command may write
    script = f'trap "exit 42" INT; touch {ready}; while :; do sleep 0.05; done'
    proc = subprocess.Popen(ctl_exec(sv, "agent-1", "sh", "-c", script), env=sv.env())
    try:
        until(ready.exists, 60, "the command to start")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 42
    finally:
        proc.kill()
        proc.wait()


def test_killing_ctl_ends_the_command(sv: Supervised) -> None:
    pid_file = sv.workspace("agent-1") / "pid"  # where the (fenced) command may write
    tag = f"mcphost-exec-{uuid.uuid4().hex}"
    script = f"import os, signal; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
    script += "signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.pause()"
    command = ctl_exec(sv, "agent-1", sys.executable, "-c", script, tag)
    proc = subprocess.Popen(command, env=sv.env())
    try:
        until(lambda: pid_file.exists() and pid_file.read_text(), 60, "the command to start")
        found = [
            p
            for p in tagged(tag)
            if p != proc.pid and "bwrap" not in Path(f"/proc/{p}/comm").read_text()
        ]
        (pid,) = found
        proc.kill()  # SIGKILL: ctl forwards nothing; its connection closes
        proc.wait(timeout=60)
        # it ignores SIGTERM: gone means the supervisor went on to SIGKILL after the grace
        until(lambda: not descendants_alive([pid]), 60, "the exec'd command to end")
    finally:
        proc.kill()
        proc.wait()


def test_a_new_generation_closes_the_old_exec_session(sv: Supervised) -> None:
    first = sv.wait_running("agent-1")
    proc = subprocess.Popen(
        ctl_exec(sv, "agent-1", *pump(sv)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=sv.env(),
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        hello = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "test_exec", "version": "0"},
            },
        }
        proc.stdin.write(json.dumps(hello).encode() + b"\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        assert answer["id"] == 1 and "result" in answer, answer
        started = [e for e in sv.events() if e.get("event") == "supervisor.exec_spawned"][-1]
        assert started["generation"] == first["generation"]
        sv.ctl("restart", "agent-1")
        sv.wait_running("agent-1", generation=first["generation"] + 1)
        assert proc.stdout.read() == b"", "the old generation's session was closed"
        proc.wait(timeout=60)  # ctl ends with the pump (which exits 0 on SIGTERM or EOF)
    finally:
        proc.kill()
        proc.wait()
    ended = [e for e in sv.events() if e.get("event") == "supervisor.exec_exited"]
    assert any(e["pid"] == started["pid"] for e in ended), "the pump was ended, not left"


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed: Claude Code not run")
def test_claude_mcp_list_shows_the_agents_servers_connected(sv: Supervised) -> None:
    """The recipe in docs/supervisor.md: add the agent's attach entry to Claude Code's *local*
    scope (keyed by the workspace, which is exec's cwd) from the generated mcp.json, then run
    `claude mcp list` as the agent. (`claude mcp list` takes no --mcp-config; a project
    `.mcp.json` shows "Pending approval" and is not connected to.)"""
    if not CLAUDE.exists():
        pytest.fail(f"{CLAUDE} missing: run `make node` (make test does it)")
    home = sv.workspace("agent-1") / "claude-home"
    (home / ".claude").mkdir(parents=True)
    uid = sv.status()["agent-1"]["uid"]  # made by the test: the agent's, as its workspace is
    for path in (home, home / ".claude"):
        os.chown(path, uid, uid)
    # Claude Code's config lives where the agent's HOME says; here a fresh directory the
    # (fenced) agent may write, in its workspace, set by `env`
    claude = [
        "env",
        f"HOME={home}",
        f"CLAUDE_CONFIG_DIR={home / '.claude'}",
        "DISABLE_AUTOUPDATER=1",
        "DISABLE_TELEMETRY=1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
        str(CLAUDE),
    ]
    config = json.loads((sv.state / "agents" / "agent-1" / "mcp.json").read_text())
    entry = json.dumps(config["mcpServers"]["agent-center"])
    added = subprocess.run(
        ctl_exec(sv, "agent-1", *claude, "mcp", "add-json", "-s", "local", "agent-center", "-"),
        input=entry,
        capture_output=True,
        text=True,
        env=sv.env(),
        timeout=120,
    )
    assert added.returncode == 0, added.stderr
    listed = subprocess.run(
        ctl_exec(sv, "agent-1", *claude, "mcp", "list"),
        capture_output=True,
        text=True,
        env=sv.env(),
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    (line,) = [ln for ln in listed.stdout.splitlines() if ln.startswith("agent-center:")]
    assert "Connected" in line and "✔" in line, listed.stdout
    # the same check from outside the agent (the test process's own tree) is refused
    outside = subprocess.run(
        [*claude, "mcp", "list"],
        cwd=sv.workspace("agent-1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    (line,) = [ln for ln in outside.stdout.splitlines() if ln.startswith("agent-center:")]
    assert "Connected" not in line, outside.stdout
