"""contrib/: the systemd unit and the sample fleet file are usable as shipped."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mcphost.supervisor.fleet import load_fleet

ROOT = Path(__file__).resolve().parents[2]
CONTRIB = ROOT / "contrib"
UNIT = CONTRIB / "systemd" / "mcphost-supervisor.service"


def directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if re.match(r"[A-Za-z]+=", line):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_the_sample_fleet_file_loads() -> None:
    fleet = load_fleet(str(CONTRIB / "fleet.toml"), env={})
    assert [a.agent_id for a in fleet.agents] == ["agent-7f3a", "agent-9c01", "agent-codex-1"]
    unit = directives(UNIT.read_text())
    grace = max(a.stop_grace for a in fleet.agents)
    assert float(unit["TimeoutStopSec"][0]) >= grace + 10


def test_the_unit_runs_the_supervisor_as_documented() -> None:
    unit = directives(UNIT.read_text())
    assert unit["ExecStart"] == [
        "/usr/local/bin/mcphost supervise --fleet /etc/mcphost/fleet.toml --state /var/lib/mcphost"
    ]
    assert unit["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert unit["KillMode"] == ["mixed"]
    assert unit["StateDirectory"] == ["mcphost"] and unit["Restart"] == ["on-failure"]
    assert unit["LoadCredential"] == ["worker.token:/etc/mcphost/worker.token"]
    assert "MCPHOST_CENTER__TOKEN_FILE=%d/worker.token" in unit["Environment"]
    # every program the unit runs is an absolute path (systemd's rule)
    for line in (*unit["ExecStart"], *unit["ExecReload"]):
        assert line.startswith("/")


def test_nothing_refers_to_the_removed_worker_daemon() -> None:
    for path in CONTRIB.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert "worker_daemon" not in text and "mcphost-agent@" not in text, path


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_accepts_the_unit_with_a_venv_exec_start(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "mcphost"
    if not script.exists():
        pytest.skip("the mcphost script is not installed next to this python")
    unit = tmp_path / "mcphost-supervisor.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/mcphost", str(script)))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "mcphost-supervisor.service" not in done.stderr, done.stderr
