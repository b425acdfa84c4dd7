"""contrib/: the systemd unit and the sample fleet file are usable as shipped."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from mcphost.supervisor import plan
from mcphost.supervisor.fleet import (
    SECTIONS,
    AgentSection,
    CenterSection,
    IdentitySection,
    MetricsSection,
    PageSection,
    load_fleet,
    reload_of,
)
from mcphost.supervisor.uids import DEFAULT_RANGE
from mcphost.supervisor.values import Reload

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


def file_keys(text: str) -> dict[str, dict[str, object]]:
    """Per section (`center`, `defaults`, `agent`: every [[agent]] table together), the keys
    the sample sets or shows commented out (`# key = value` at the start of a line), each with
    the value shown (parsed as TOML)."""
    out: dict[str, dict[str, object]] = {}
    section = ""
    for line in text.splitlines():
        # a table, or one shown commented out (`# [page]`, `# [metrics]`: off unless given)
        header = re.fullmatch(r"(?:# )?\[\[?([a-z]+)\]\]?\s*(#.*)?", line)
        if header:
            section = header.group(1)
            out.setdefault(section, {})
            continue
        entry = re.match(r"(?:# )?([a-z_]+) = ", line)
        if entry and section:
            body = line.removeprefix("# ")
            try:
                value = tomllib.loads(body)[entry.group(1)]
            except tomllib.TOMLDecodeError:  # a value continued on the next lines
                value = ...
            out[section][entry.group(1)] = value
    return out


def test_the_sample_fleet_file_lists_every_key_with_its_default() -> None:
    """Issue 19: contrib/fleet.toml shows every key of the fleet model, set or commented out,
    with its default; a key without a default value is commented out."""
    keys = file_keys((CONTRIB / "fleet.toml").read_text())
    assert set(keys) == {"center", "defaults", "agent", "page", "metrics", "identity"}
    assert set(keys["identity"]) == set(IdentitySection.model_fields)
    assert keys["identity"]["uids"] == IdentitySection.model_fields["uids"].default
    assert keys["identity"]["uids"] == str(DEFAULT_RANGE)
    assert set(keys["page"]) == set(PageSection.model_fields)
    assert set(keys["metrics"]) == set(MetricsSection.model_fields)
    assert set(keys["center"]) == set(CenterSection.model_fields)
    assert set(keys["defaults"]) == set(plan.AgentDefaults.__dataclass_fields__)
    assert set(keys["defaults"]) == set(AgentSection.model_fields) - {"id"}
    assert "id" in keys["agent"] and set(keys["agent"]) <= set(AgentSection.model_fields)
    text = (CONTRIB / "fleet.toml").read_text()
    uncommented = tomllib.loads(text)
    for name, field in CenterSection.model_fields.items():
        if not field.is_required() and field.default is not None:
            assert uncommented["center"][name] == keys["center"][name] == field.default, name
    # (fingerprint has no default but is set: the sample's tcp:// center needs its pin)
    assert "runtime_socket" not in uncommented["center"]
    defaults = plan.AgentDefaults()
    for name, shown in keys["defaults"].items():
        default = getattr(defaults, name)
        if default is None or default == ():
            assert name not in uncommented["defaults"], f"{name} has no default: comment it out"
        else:
            assert uncommented["defaults"][name] == shown == default, name


# How the sample's `# Reload:` lines say each behaviour the fleet model declares (values.Reload).
PHRASES = {
    Reload.LIVE: "applied live",
    Reload.REFENCES: "applied live; running fenced agents restart when a path the fence hides moves",
    Reload.RESTARTS_AGENT: "restarts the agents it changes",
    Reload.STARTS_STOPS: "an added agent starts, a removed one stops",
    Reload.RESTART_SUPERVISOR: "needs a supervisor restart",
    Reload.REFUSED: "refused: restart the supervisor to change it",
}


def reload_lines(text: str) -> dict[str, dict[str, str]]:
    """Per table, each key the sample's `# Reload: KEYS: WHAT` lines name, with WHAT
    ("every other key": each key of the table the lines do not name)."""
    out: dict[str, dict[str, str]] = {}
    section = ""
    for line in text.splitlines():
        header = re.fullmatch(r"(?:# )?\[\[?([a-z]+)\]\]?\s*(#.*)?", line)
        if header:
            section = header.group(1)
            continue
        if line.startswith("# Reload: "):
            keys, _, what = line.removeprefix("# Reload: ").partition(": ")
            for key in keys.split(", "):
                assert key not in out.setdefault(section, {}), (section, key)
                out[section][key] = what
    return out


def test_the_sample_fleet_file_says_what_a_reload_does_as_the_model_declares() -> None:
    """Issue 34: the sample once said a [center] change needs a restart (it applies live). Its
    `# Reload:` lines name every key of every table with the behaviour its field declares."""
    text = (CONTRIB / "fleet.toml").read_text()
    assert "takes effect only at the next start" not in text
    said = reload_lines(text)
    assert set(said) == set(SECTIONS)
    for section, model in SECTIONS.items():
        lines = dict(said[section])
        rest = lines.pop("every other key", None)
        for key in model.model_fields:
            if section == "agent" and key != "id":
                continue  # the keys of [defaults], said there
            what = lines.pop(key, rest)
            declared, toggled = reload_of(section, key), reload_of(section, key, toggled=True)
            expected = PHRASES[declared]
            if toggled != declared:
                expected += f" (set or taken out: {PHRASES[toggled]})"
            assert what == expected, (section, key, what)
        assert not lines, (section, lines)  # no key the table does not have


def test_the_sample_fleet_file_loads() -> None:
    fleet = load_fleet(str(CONTRIB / "fleet.toml"), env={})
    assert [a.agent_id for a in fleet.agents] == ["agent-7f3a", "agent-9c01", "agent-codex-1"]
    # the default agents get a terminal; the one with a -p command runs as a process
    assert [a.runner for a in fleet.agents] == ["tmux", "process", "tmux"]
    unit = directives(UNIT.read_text())
    grace = max(a.stop_grace for a in fleet.agents)
    assert float(unit["TimeoutStopSec"][0]) >= grace + 10


def test_the_unit_runs_the_supervisor_as_documented() -> None:
    unit = directives(UNIT.read_text())
    assert unit["ExecStart"] == [
        "/opt/mcphost/bin/mcphost supervise --fleet /etc/mcphost/fleet.toml --state /var/lib/mcphost"
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
    unit.write_text(UNIT.read_text().replace("/opt/mcphost/bin/mcphost", str(script)))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "mcphost-supervisor.service" not in done.stderr, done.stderr


def test_contrib_installs_from_the_source_not_from_a_registry() -> None:
    """No package registry serves mcphost: `pip install mcphost` would fail (or install
    someone else's package); contrib/ says to install the checkout."""
    for path in (CONTRIB / "README.md", UNIT):
        text = path.read_text()
        assert not re.search(r"pip install mcphost\b", text), path
        assert "checkout of the source" in text, path
