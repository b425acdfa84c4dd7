"""Black-box: `mcphost demo fleet` (what `make demo-fleet` runs) as a real process.

It must walk the main job (the devcenter, `mcphost supervise` with a tmux bundle of stand-in
agents, `ctl status`, the center's records of calls per agent and generation, a kill -9 and
the restart at the next generation, a relay `send` landing in a peer's pane, a clean stop),
print `ok` for every step and no `FAIL`, exit 0, and leave nothing behind: no process whose
argv or working directory is in its temporary directory or whose environment carries this
test's marker, and no temporary directory. Interrupted (SIGINT, as Ctrl-C) while its fleet
runs, it must stop everything just the same and exit 1.
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

from mcphost.testing.fleet import left_running
from tests.waiting import until

# deep (make test-slow): `mcphost demo fleet` twice, whole (~4 s of CPU each).
pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

STEPS = (
    "The devcenter",
    "The fleet file",
    "mcphost supervise",
    "mcphost ctl status",
    "What the center received",
    "kill -9 agent-2",
    "agent-1 sends to agent-2",
    "Stop: SIGTERM",
    "Clean-up",
)


def demo_env(marker: str) -> dict[str, str]:
    # The marker is not an MCPHOST_*, AC_MCP_* or AGENTMUX_* variable: agents inherit it.
    return {**os.environ, "DEMO_TEST_MARKER": marker}


def steps_of(out: str) -> dict[str, str]:
    """Each `== title` of the transcript and the text under it."""
    parts = re.split(r"^== ", out, flags=re.M)[1:]
    return {
        part.split("\n", 1)[0]: part.split("\n", 1)[1] if "\n" in part else "" for part in parts
    }


def working_dir(out: str) -> Path:
    match = re.search(r"^Working in (\S+)$", out, flags=re.M)
    assert match, out
    return Path(match.group(1))


def test_the_fleet_demo_walks_the_main_job_and_leaves_nothing_running() -> None:
    marker = f"demo-fleet-{uuid.uuid4().hex}"
    done = subprocess.run(
        [sys.executable, "-m", "mcphost", "demo", "fleet"],
        capture_output=True,
        text=True,
        env=demo_env(marker),
        timeout=600,
    )
    out = done.stdout
    assert done.returncode == 0, (out, done.stderr[-3000:])
    steps = steps_of(out)
    for title in STEPS:
        matching = [body for name, body in steps.items() if name.startswith(title)]
        assert matching, (title, list(steps))
        assert re.search(r"^   ok  ", matching[0], flags=re.M), (title, matching[0])
    assert "FAIL" not in out, out
    # what the steps claim, visible in the transcript
    for agent in ("agent-1", "agent-2", "agent-3"):
        assert f"agent_id={agent}  generation=1" in out, out
    assert "agent_id=agent-2  generation=2" in out, out
    assert "agent-2@party: queued" in out, out
    assert "[agent-2] got: From: agent-1@party" in out, out
    root = working_dir(out)
    assert not root.exists()
    assert left_running(root, marker) == []


def test_an_interrupted_fleet_demo_stops_everything(tmp_path: Path) -> None:
    marker = f"demo-fleet-{uuid.uuid4().hex}"
    log = tmp_path / "demo.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mcphost", "demo", "fleet"],
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
