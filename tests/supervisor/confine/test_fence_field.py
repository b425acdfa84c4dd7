"""Black-box: the ways around the fence that outside testing found (issue 25, part 1), each
reproduced from a fenced agent of a real `mcphost supervise`:

- the operator rotates the token as docs/supervisor.md says (a new file renamed over
  `token_file`) and saves the fleet file with an editor that renames: a running agent never
  reads either (the fence hides their whole directory, not the inode of the file);
- `[center] runtime_socket` stays out of reach;
- an agent that swaps its `workspace` for a symlink to `../..` and its fleet-given
  `CLAUDE_CONFIG_DIR` (inside its fleet-given `HOME`) for a symlink to `/`, then exits, is
  restarted into the same fence: it starts in the directory the supervisor made (never through
  the link), what lies above it is the covered state, and nothing outside its home becomes
  writable; as a process and as a tmux pane (whose tmux server never opens the workspace path).

The secrets live in a directory beside the project (which every agent sees), not under /tmp
(every fenced agent's /tmp is its own, which would hide them anyway).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcphost.supervisor.confine import probe as machine
from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import REPO, Supervised, fleet_toml, give_to, inline
from tests.waiting import until

# deep (make test-slow): supervisors with agents that attack their fence across restarts.
pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(
        machine.probe().missing() is not None, reason=f"no fence here: {machine.probe().missing()}"
    ),
]

# Watches paths forever: each one read (a file) or connected to (a socket); the outcomes as
# JSON in the workspace, rewritten whole every 50 ms.
WATCH = """
import json, os, socket, sys, time
while True:
    seen = {}
    for path in sys.argv[1:]:
        try:
            if path.endswith(".sock"):
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.connect(path)
                seen[path] = "reached"
            else:
                with open(path, "rb") as handle:
                    seen[path] = handle.read().decode(errors="replace")
        except OSError as exc:
            seen[path] = type(exc).__name__
    with open("watch.tmp", "w") as out:
        json.dump(seen, out)
    os.replace("watch.tmp", "watch.json")
    time.sleep(0.05)
"""


@pytest.fixture
def beside_project() -> Iterator[Path]:
    """A directory beside the project: visible to every agent unless the fence hides it."""
    folder = Path(tempfile.mkdtemp(prefix="fence-field-", dir=REPO))
    folder.chmod(0o755)  # passable by an agent's own uid: what hides a path is the fence
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _watched(sv: Supervised, agent: str) -> dict[str, str] | None:
    try:
        return dict(json.loads((sv.workspace(agent) / "watch.json").read_text()))
    except (OSError, ValueError):
        return None


def test_a_rotated_token_a_renamed_fleet_file_and_the_runtime_socket_stay_hidden(
    tmp_path: Path, center: DevCenter, beside_project: Path
) -> None:
    secrets = beside_project / "etc"
    secrets.mkdir()
    token = secrets / "worker.token"
    token.write_text(center.token)
    token.chmod(0o600)
    runtime = socket.socket(socket.AF_UNIX)
    runtime_path = secrets / "runtime.sock"
    runtime.bind(str(runtime_path))
    runtime.listen(8)
    sv = Supervised(tmp_path, center)
    fleet = secrets / "fleet.toml"
    sv.fleet = fleet
    watched = [str(token), str(fleet), str(runtime_path), str(secrets / "fresh.token")]
    agents = [{"id": "watcher", "command": inline(WATCH, *watched)}]
    fleet.write_text(fleet_toml(center, token, agents, {"runtime_socket": str(runtime_path)}))
    try:
        sv.start()
        sv.wait_running("watcher")
        first = until(lambda: _watched(sv, "watcher"), 60, "the agent's first look")
        assert set(first.values()) == {"FileNotFoundError"}, first
        # the rotation docs/supervisor.md gives, and an editor's save of the fleet file
        fresh = secrets / "fresh.token"
        fresh.write_text("rotated-" + center.token)
        fresh.chmod(0o600)
        os.link(fresh, secrets / ".next.token")
        os.rename(secrets / ".next.token", token)
        saved = secrets / ".fleet.toml.swp"
        saved.write_text(fleet.read_text() + "\n# saved by an editor\n")
        os.rename(saved, fleet)
        (sv.workspace("watcher") / "watch.json").unlink()
        after = until(lambda: _watched(sv, "watcher"), 60, "a look after the rotation")
        assert set(after.values()) == {"FileNotFoundError"}, after
        # the control: the files are there for the operator, and so is the socket
        assert token.read_text().startswith("rotated-") and "saved by" in fleet.read_text()
        with socket.socket(socket.AF_UNIX) as probe:
            probe.connect(str(runtime_path))
    finally:
        sv.close()
        runtime.close()


# The swapper: its first run swaps its workspace for a symlink to ../.. and its fleet-given
# CLAUDE_CONFIG_DIR for a symlink to /, then exits 1 (restart = "on-failure" brings it back);
# its second run, whatever its working directory turned out to be, tries what the attack did.
SWAP = """
import json, os, sys
home, config = os.environ["HOME"], os.environ["CLAUDE_CONFIG_DIR"]
workspace = sys.argv[1]
mark = os.path.join(home, "swapped")
if not os.path.exists(mark):
    open(mark, "w").close()
    os.rename(workspace, workspace + ".real")
    os.symlink("../..", workspace)
    os.rmdir(config)
    os.symlink("/", config)
    sys.exit(1)
def attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return type(exc).__name__
def write(path):
    with open(path, "w") as handle:
        handle.write("planted")
def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        return type(exc).__name__
seen = {
    "cwd": os.getcwd(),
    "read_state_db": attempt(lambda: open("state.sqlite3", "rb").read(1)),
    "read_state_db_below": attempt(lambda: open("../../../state.sqlite3", "rb").read(1)),
    "state_listing": listing("../../.."),
    "plant_via_config": attempt(lambda: write(os.path.join(config, "etc", "mcphost-planted"))),
    "plant_in_root": attempt(lambda: write("/mcphost-planted")),
}
with open(os.path.join(home, "swap.tmp"), "w") as out:
    json.dump(seen, out)
os.replace(os.path.join(home, "swap.tmp"), os.path.join(home, "swap.json"))
import time
while True:
    time.sleep(3600)
"""


@pytest.mark.parametrize("runner", ["process", "tmux"])
def test_a_swapped_workspace_and_config_dir_lead_nowhere_after_a_restart(
    tmp_path: Path, center: DevCenter, beside_project: Path, runner: str
) -> None:
    home = beside_project / "swapper-home"
    (home / ".claude").mkdir(parents=True)
    give_to(home, "swapper")  # a fleet-given HOME the agent writes: its uid's
    sv = Supervised(tmp_path, center)
    workspace = sv.state / "agents" / "swapper" / "workspace"
    agent = {
        "id": "swapper",
        "runner": runner,
        "command": inline(SWAP, str(workspace)),
        "env": {"HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / ".claude")},
    }
    sv.write_fleet([agent], restart_delay=0.1)
    try:
        sv.start()
        seen = until(
            lambda: (home / "swap.json").exists() and json.loads((home / "swap.json").read_text()),
            90,
            "the second run's attempts",
        )
        assert sv.status()["swapper"]["generation"] >= 2
        # it starts in the directory the supervisor made and holds (moved, not the symlink),
        # and what lies above it is the fenced view: the covered state
        assert seen["cwd"] == f"{workspace}.real", seen
        assert seen["read_state_db"] == "FileNotFoundError", seen
        assert seen["read_state_db_below"] == "FileNotFoundError", seen
        # only its home and attach sockets, or nothing where the fence's own directory (0711,
        # root's bubblewrap made it) refuses an agent of its own uid a listing
        assert seen["state_listing"] in (["agents", "run"], "PermissionError"), seen
        assert seen["plant_via_config"] in ("OSError", "PermissionError"), seen  # read-only /
        assert seen["plant_in_root"] in ("OSError", "PermissionError"), seen
        assert not Path("/etc/mcphost-planted").exists() and not Path("/mcphost-planted").exists()
        assert (sv.state / "state.sqlite3").exists()  # the control: it is there for us
    finally:
        sv.close()
        for planted in (Path("/etc/mcphost-planted"), Path("/mcphost-planted")):
            planted.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def center(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCenter]:
    with DevCenter.start(tmp_path_factory.mktemp("center")) as running:
        yield running
