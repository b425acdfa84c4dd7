"""Black-box: `mcphost demo agents` (what `make demo-agents` runs) as a real process.

The real Claude Code CLI, the real Codex CLI and codex-acp (`make node`) under a real `mcphost
supervise`, against the model stand-in and the reference center. The demo must exit 0 with every
step `ok` and no `FAIL`, and its transcript must show what it claims:
- the center heard `get_my_work` as each agent itself (claude-1, codex-1, acp-1), at generation 1:
  the agents' own tool calls, relayed from one to the next (the operator typed only into claude-1);
- the relay held acp-1's permission request, acp-1's command had not run, and the request was
  resolved `selected` by claude-1@party's `choose`, after which the command ran;
- the supervisor exited 0, no process, tmux server or cgroup of the fleet was left, and its
  directory is gone; and nothing this test marked is still running afterwards.
Skipped where the CLIs (`make node`), tmux or a fence are missing.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from mcphost.demoagents import cli_bin, find_clis
from mcphost.supervisor.confine import probe as machine
from mcphost.testing.fleet import left_running
from tests.core.test_demofleet import demo_env, steps_of, working_dir
from tests.waiting import until

PATH = os.pathsep.join((str(cli_bin()), os.environ.get("PATH", os.defpath)))

# deep (make test-slow): three real agent CLIs under a supervisor (~15 s, ~7 CPU-s).
pytestmark = [
    pytest.mark.deep,
    pytest.mark.timeout(600),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
    pytest.mark.skipif(isinstance(find_clis(PATH), str), reason=str(find_clis(PATH))),
    pytest.mark.skipif(
        machine.probe().missing() is not None, reason=f"no fence here: {machine.probe().missing()}"
    ),
]

STEPS = (
    "The CLIs",
    "The devcenter",
    "The fleet file",
    "mcphost supervise",
    "mcphost ctl status",
    "The operator gives claude-1 a task",
    "acp-1 asks permission",
    "Stop: SIGTERM",
    "Clean-up",
)


def records(text: str, event: str) -> list[dict[str, str]]:
    """The transcript's `relay.choices.<event>` lines, as their fields."""
    return [
        dict(field.split("=", 1) for field in line.split()[1:])
        for line in text.splitlines()
        if line.split()[:1] == [f"relay.choices.{event}"]
    ]


def test_real_agents_call_the_center_relay_and_a_peer_chooses_a_permission() -> None:
    marker = f"demo-agents-{uuid.uuid4().hex}"
    done = subprocess.run(
        [sys.executable, "-m", "mcphost", "demo", "agents"],
        capture_output=True,
        text=True,
        env=demo_env(marker),
        timeout=600,
    )
    out = done.stdout
    assert done.returncode == 0, (out, done.stderr[-3000:])
    assert "FAIL" not in out, out
    steps = steps_of(out)
    for title in STEPS:
        matching = [body for name, body in steps.items() if name.startswith(title)]
        assert matching, (title, list(steps))
        assert re.search(r"^   ok  ", matching[0], flags=re.M), (title, matching[0])
    for agent in ("claude-1", "codex-1", "acp-1"):
        assert f"agent_id={agent}  generation=1" in out, out
    (requested,) = records(out, "requested")
    (resolved,) = records(out, "resolved")
    assert requested["target_session"] == "acp-1@party", requested
    assert resolved["choice_request_id"] == requested["choice_request_id"], (requested, resolved)
    assert (resolved["outcome"], resolved["decided_by"]) == ("selected", "claude-1@party")
    assert "ok  'echo ran > ran.txt' has not run: it waits for the choice" in out, out
    assert "ok  acp-1's command ran once chosen" in out, out
    assert "ok  the supervisor exited with 0" in out, out
    assert "ok  no agent, pump or tmux server is left" in out, out
    # each agent's cgroups, where the supervisor makes them, are gone after the stop
    grouped = re.search(r"claude-1's cgroups while it ran: /sys/fs/cgroup/\S+agent-claude-1", out)
    if "limits: none" in out:  # ctl status: no writable cgroup for this supervisor
        assert "the supervisor made no cgroups here" in out, out
    else:
        assert grouped, out
    assert "ok  no agent's cgroup is left" in out, out
    root = working_dir(out)
    assert not root.exists()
    assert left_running(root, marker) == []


def test_an_interrupted_agents_demo_stops_everything(tmp_path: Path) -> None:
    marker = f"demo-agents-{uuid.uuid4().hex}"
    log = tmp_path / "demo.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mcphost", "demo", "agents"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=demo_env(marker),
        )
    try:
        until(lambda: "ok  all 3 agents running" in log.read_text() or proc.poll() is not None, 300)
        assert proc.poll() is None, log.read_text()
        root = working_dir(log.read_text())
        assert left_running(root, marker), "the fleet should be running now"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=300) == 1, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "FAIL interrupted: stopping everything" in text, text
    assert f"ok  {root} removed" in text, text
    assert not root.exists()
    assert left_running(root, marker) == []
