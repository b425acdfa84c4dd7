"""Black-box: `mcphost demo fleet` (what `make demo-fleet` runs) as a real process.

It must walk the main job (the devcenter, `mcphost supervise` with a tmux bundle of stand-in
agents, `ctl status`, the center's records of calls per agent and generation, a kill -9 and
the restart at the next generation, a relay `send` landing in a peer's pane, a clean stop),
print `ok` for every step and no `FAIL`, exit 0, and leave nothing behind: no process whose
argv or working directory is in its temporary directory or whose environment carries this
test's marker, and no temporary directory. Interrupted (SIGINT, as Ctrl-C) while its fleet
runs, it must stop everything just the same and exit 1. On a kernel without user namespaces
(tests/kernelsim.py `no-userns`, for the demo and everything it starts) it must walk the same
with the supervisor as root, its agents fenced at the level `bwrap... (no nesting)`.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from mcphost.supervisor.confine import probe as machine
from mcphost.testing.fleet import left_running
from tests import kernelsim
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


def simulated(kernel: str | None) -> None:
    """Skip where `kernel` (a kernelsim mode) cannot run the demo: it needs a root supervisor
    (without user namespaces an unprivileged one fences nothing: it refuses) and bubblewrap."""
    if kernel is None:
        return
    if platform.machine() not in kernelsim.ARCHES:
        pytest.skip("kernelsim: x86_64 and aarch64 only")
    if os.geteuid() != 0:
        pytest.skip("without user namespaces only a root supervisor fences")
    if machine.probe().missing() is not None:
        pytest.skip(f"no fence here: {machine.probe().missing()}")


@pytest.mark.parametrize("kernel", [None, "no-userns"], ids=["this-kernel", "no-userns"])
def test_the_fleet_demo_walks_the_main_job_and_leaves_nothing_running(kernel: str | None) -> None:
    simulated(kernel)
    marker = f"demo-fleet-{uuid.uuid4().hex}"
    demo = [sys.executable, "-m", "mcphost", "demo", "fleet"]
    done = subprocess.run(
        kernelsim.argv(kernel, demo) if kernel else demo,
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
    status = next(body for name, body in steps.items() if name.startswith("mcphost ctl status"))
    (row,) = [line for line in status.splitlines() if line.split()[1:3] == ["agent-1", "running"]]
    flat = kernel == "no-userns" or not machine.probe().userns  # agents cannot nest sandboxes
    assert ("(no nesting)" in row) is flat, status
    # each running agent's usage is its tree's, read once its sessions are up (issue 34: every
    # row showed 0B and 0 processes, a figure read while the pane was still in its gate)
    (header,) = [line for line in status.splitlines() if line.split()[1:3] == ["AGENT", "STATE"]]
    names = header.split()[1:]
    for agent in ("agent-1", "agent-2", "agent-3"):
        (line,) = [line for line in status.splitlines() if line.split()[1:2] == [agent]]
        cells = dict(zip(names, line.split()[1:], strict=False))
        assert cells["MEM"] != "0B" and int(cells["PROCS"]) >= 3, status
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
