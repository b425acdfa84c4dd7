"""Black-box: the state directory belongs to one supervisor, and a restart cleans up after a
crash, through real `mcphost supervise` processes.

- A second `mcphost supervise` on a live state directory is refused before it changes anything:
  exit 3 (`control_in_use`), one stderr line naming the state directory and the running
  supervisor's pid; the modes of `<state>`, `run/` and `agents/` stay what the running one set
  (0711 for a `user = "nobody"` agent), and that agent still attaches and calls.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import Supervised, standin
from tests.supervisor.test_supervise_user import ROOT, nobody, run_as
from tests.waiting import until


def modes(state: Path) -> dict[str, int]:
    return {name: stat.S_IMODE(os.stat(state / name).st_mode) for name in (".", "run", "agents")}


@pytest.mark.skipif(not ROOT, reason="running an agent as another user needs a root supervisor")
@pytest.mark.skipif(nobody() is None, reason="no user nobody on this machine")
def test_a_second_supervisor_on_a_live_state_is_refused_before_it_changes_anything(
    supervised: Supervised, center: DevCenter, tmp_path: Path
) -> None:
    user = nobody()
    assert user is not None
    python = run_as(supervised, user)
    supervised.write_fleet(
        [{"id": "agent-1", "user": "nobody", "command": [python, *standin("--hold")[1:]]}]
    )
    supervised.start()
    supervised.wait_running("agent-1")
    until(lambda: supervised.calls("agent-1"), 60, "the agent's first call")
    before = modes(supervised.state)
    assert before == {".": 0o711, "run": 0o711, "agents": 0o711}, before

    # The second one: same state directory, a fleet without `user` (it would want 0700).
    (tmp_path / "second").mkdir()
    second = Supervised(tmp_path / "second", center)
    os.rmdir(second.state)
    second.state = supervised.state
    second.write_fleet([{"id": "agent-2", "command": standin("--hold")}])
    done = second.run_to_exit()

    assert done.returncode == 3, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == "", done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert supervised.proc is not None
    assert str(supervised.state) in lines[0], lines[0]
    assert f"pid {supervised.proc.pid}" in lines[0] and "control_in_use" in lines[0], lines[0]
    assert modes(supervised.state) == before
    assert not (supervised.state / "agents" / "agent-2").exists()

    # The running supervisor's agent still works: a fresh attach from inside it (as nobody,
    # through the 0711 directories) reaches the center.
    calls = len(supervised.calls("agent-1"))
    config = supervised.state / "agents" / "agent-1" / "mcp.json"
    supervised.ctl("exec", "agent-1", "--", python, standin()[1], str(config))
    latest = supervised.calls("agent-1")[calls:]
    assert latest and all(call["ok"] for call in latest), latest
    assert supervised.status()["agent-1"]["state"] == "running"
