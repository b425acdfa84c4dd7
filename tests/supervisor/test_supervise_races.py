"""Black-box: control operations racing reloads, and reloads that must change all or nothing.

A real `mcphost supervise` (supervise_harness.py), the real `mcphost ctl`, and agents found by
scanning /proc for a marker in their argv (never through the supervisor's word alone):
- `ctl restart A` racing a reload that changes A's command leaves exactly one A, running the
  new command, that `ctl stop A` ends (issue #18: the discarded runner used to start a hidden
  second A with the old command, restarted for ever);
- a name that cannot become a path is refused at start (exit 2, one line naming the key) and
  at reload (`reload_failed`, nothing changed), and a reload whose relay configuration cannot
  be written changes nothing: the same process, the same generation (at start: exit 2).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.supervisor.supervise_harness import Supervised, ignores, inner
from tests.waiting import until

# Ignores SIGTERM: every stop of it lasts the whole `stop_grace`, a window another operation
# can be made to land in (the test waits for the `stopping` state, not for a time).
STUBBORN = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "while True:\n"
    "    time.sleep(60)\n"
)
GRACE = 0.5
ROUNDS = 8


def agent(marker: str, version: int, **keys: Any) -> dict[str, Any]:
    command = [sys.executable, "-c", STUBBORN, marker, f"v{version}"]
    return {"id": "A", "command": command, "stop_grace": GRACE, **keys}


def marked(marker: str) -> dict[int, list[str]]:
    """Every live process tree with `marker` in its argv, by its root (bubblewrap, whose init
    and agent carry the same argv, counts once): pid -> argv."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path("/proc", entry, "cmdline").read_bytes()
        except OSError:
            continue
        argv = [part.decode(errors="replace") for part in raw.split(b"\0") if part]
        if marker in argv:
            found[int(entry)] = argv
    parents = {pid: _ppid(pid) for pid in found}
    return {pid: argv for pid, argv in found.items() if parents[pid] not in found}


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def race(
    sv: Supervised,
    interleaved: bool,
    agent_id: str = "A",
    meanwhile: Callable[[], object] = lambda: None,
) -> list[str]:
    """`ctl restart <agent_id>` and `ctl reload` at once (`meanwhile` runs just before the
    reload); `interleaved`: the reload lands while the restart is stopping the agent (or just
    after, should the poll miss that window). The stderr of each that failed."""
    row = sv.wait_running(agent_id)
    until(lambda: ignores(inner(row["pid"]), signal.SIGTERM), 60, f"{agent_id} to ignore SIGTERM")
    restarts: list[Any] = []
    thread = threading.Thread(
        target=lambda: restarts.append(sv.ctl("restart", agent_id, check=False))
    )
    thread.start()
    if interleaved:
        until(
            lambda: (
                (now := sv.status().get(agent_id, {})).get("state") == "stopping"
                or now.get("generation") != row["generation"]
            ),
            60,
            f"the restart to be stopping {agent_id}",
        )
    meanwhile()
    reload = sv.ctl("reload", check=False)
    thread.join()
    return [done.stderr for done in (reload, *restarts) if done.returncode != 0]


def test_ctl_restart_racing_a_reload_leaves_exactly_one_agent(supervised: Supervised) -> None:
    sv = supervised
    marker = f"mcphost-race-{uuid.uuid4().hex}"
    sv.write_fleet([agent(marker, 0)])
    sv.start()
    sv.wait_running("A")
    failed: list[str] = []
    for version in range(1, ROUNDS + 1):
        sv.write_fleet([agent(marker, version)])
        failed += race(sv, interleaved=bool(version % 2))
    processes = marked(marker)
    assert len(processes) == 1, processes
    ((pid, argv),) = processes.items()
    assert argv[-1] == f"v{ROUNDS}"  # the last configuration
    row = sv.status()["A"]
    assert (row["state"], row["pid"]) == ("running", pid)
    sv.ctl("stop", "A")
    assert marked(marker) == {}
    assert failed == []  # each restart waited for the reload (or it for the restart)


def test_a_bundle_name_too_long_for_a_path_is_refused_at_start(supervised: Supervised) -> None:
    supervised.write_fleet([agent("x", 0, bundle="b" * 300)])
    done = supervised.run_to_exit()
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert f"{supervised.fleet}: agent[0].bundle is 'bbb" in lines[0]
    assert "at most 128 characters" in lines[0]


@pytest.fixture
def running_a(supervised: Supervised) -> tuple[Supervised, str, dict[str, Any]]:
    marker = f"mcphost-reload-{uuid.uuid4().hex}"
    supervised.write_fleet([agent(marker, 1, bundle="party")])
    supervised.start()
    return supervised, marker, supervised.wait_running("A")


def assert_unchanged(sv: Supervised, marker: str, before: dict[str, Any]) -> None:
    after = sv.status()["A"]
    assert (after["state"], after["pid"], after["generation"]) == (
        "running",
        before["pid"],
        before["generation"],
    )
    assert list(marked(marker)) == [before["pid"]]


def test_a_reload_with_a_bundle_name_too_long_changes_nothing(
    running_a: tuple[Supervised, str, dict[str, Any]],
) -> None:
    sv, marker, before = running_a
    sv.write_fleet([agent(marker, 2, bundle="b" * 300)])
    done = sv.ctl("reload", check=False)
    assert done.returncode == 1
    assert "reload_failed" in done.stderr and "agent[0].bundle" in done.stderr, done.stderr
    assert_unchanged(sv, marker, before)


def test_a_reload_whose_relay_configuration_cannot_be_written_changes_nothing(
    running_a: tuple[Supervised, str, dict[str, Any]],
) -> None:
    sv, marker, before = running_a
    coders = sv.state / "relay" / "config" / "coders.toml"
    until(coders.is_file, 60, "the relay configuration")
    coders.unlink()
    coders.mkdir()  # where the file goes: the write (a rename onto it) fails with EISDIR
    sv.write_fleet([agent(marker, 2, bundle="party")])
    done = sv.ctl("reload", check=False)
    assert done.returncode == 1
    assert "reload_failed" in done.stderr and "nothing was stopped" in done.stderr, done.stderr
    assert_unchanged(sv, marker, before)
    coders.rmdir()  # fixed: the same reload applies
    assert sv.ctl("reload").returncode == 0
    row = sv.wait_running("A", generation=before["generation"] + 1)
    assert marked(marker) == {row["pid"]: marked(marker)[row["pid"]]}
    assert marked(marker)[row["pid"]][-1] == "v2"


def test_a_relay_configuration_that_cannot_be_written_stops_the_start(
    supervised: Supervised,
) -> None:
    marker = f"mcphost-start-{uuid.uuid4().hex}"
    coders = supervised.state / "relay" / "config" / "coders.toml"
    coders.mkdir(mode=0o700, parents=True)  # where the file goes
    supervised.write_fleet([agent(marker, 1, bundle="party")])
    done = supervised.run_to_exit()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("mcphost supervise:")]
    assert len(said) == 1 and "relay's configuration could not be written" in said[0], said
    assert str(coders) in said[0]
    assert marked(marker) == {}  # nothing was started
