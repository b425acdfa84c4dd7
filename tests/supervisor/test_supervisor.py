"""The supervisor is whole when it exists: built on what start-up opened (`startup.Ground`), it has
every part (no attribute is None, `[metrics]` included) and has bound nothing until `run()`. Its
start, reload and shutdown as a process: tests/supervisor/test_supervise.py and the other
test_supervise_*.py files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcphost.admin.target import AdminTarget
from mcphost.supervisor.center.link import Center, CenterLink
from mcphost.supervisor.confine.cgroups import Backend, Cgroups
from mcphost.supervisor.confine.kernel import Reaper
from mcphost.supervisor.operator.journal import Journal
from mcphost.supervisor.plan import AgentDefaults, CenterConfig, Fleet, Listen, apply_defaults
from mcphost.supervisor.records import ProcessRecords
from mcphost.supervisor.startup import Ground
from mcphost.supervisor.state import StateStore
from mcphost.supervisor.supervisor import Supervisor


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    defaults = AgentDefaults(client="command", command=("true",))
    return Fleet(
        path=str(tmp_path / "fleet.toml"),
        center=CenterConfig(
            admin_url=AdminTarget(kind="unix", path=str(tmp_path / "admin.sock")),
            pins=(),
            token_file=str(tmp_path / "worker.token"),
        ),
        agents=(apply_defaults(defaults, "agent-1"),),
        defaults=defaults,
        metrics=Listen(path=str(tmp_path / "metrics.sock")),
    )


@pytest.fixture
def ground(tmp_path: Path, fleet: Fleet) -> Iterator[Ground]:
    """What `startup.open_ground` opens, without what acts on this whole process (the reaper
    owning `waitpid`, the descriptor limit, the fence's probe)."""
    state = tmp_path / "state"
    state.mkdir()
    store = StateStore(str(state / "state.sqlite3"))
    lock_fd = os.open(state / "control.sock.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        yield Ground(
            lock_fd=lock_fd,
            store=store,
            records=ProcessRecords(store),
            reaper=Reaper(),
            cgroups=Cgroups(Backend("none", "a test"), str(state)),
            center=Center(CenterLink(fleet.center, "a-token", None), call_timeout=1.0),
        )
    finally:
        store.close()
        os.close(lock_fd)


def test_a_constructed_supervisor_has_every_part_and_has_bound_nothing(
    tmp_path: Path, fleet: Fleet, ground: Ground
) -> None:
    journal = Journal(str(tmp_path / "logs"))
    state = sorted(os.listdir(tmp_path / "state"))
    try:
        supervisor = Supervisor(
            fleet, str(tmp_path / "state"), ground, journal, started_at=0.0, env={}
        )
        missing = [name for name, value in vars(supervisor).items() if value is None]
        assert missing == []
        assert supervisor.listeners.metrics is not None  # `[metrics]` set: built, not served
        assert supervisor.listeners.on_center_call is not None
        assert sorted(os.listdir(tmp_path / "state")) == state  # no socket, no `run/`
        assert not (tmp_path / "metrics.sock").exists()
    finally:
        journal.close()
