"""Black-box: under a root supervisor no agent is root; each runs as a uid of its own.

One real `mcphost supervise`, run as root with the default fleet (no `user =`, fenced), runs two
process agents and one in a tmux pane. Each runs as a uid of its own from `[identity] uids`
(uids.py): `ctl status --json` and `/proc` agree, the uids differ, none is 0, and they stay the
same across a restart and a supervisor restart (the state keeps them), with the home owned by
it. Then the attacks that uid 0 outside the fence allowed, made from inside an agent (`ctl
exec`, which runs as the agent, in its fence) fail on the kernel's permissions:
- a nested user, cgroup and mount namespace mounts every cgroup hierarchy again and can neither
  open its own limits (`pids.max`, `memory.limit_in_bytes` / `memory.max`) nor a host-wide file
  (`blkio.throttle.write_bps_device`) for writing, nor create a group where it has none of its
  own (on v1 the freezer, blkio, devices... hierarchies show the host's root group);
- a root-only (0600) file the fence shows is refused (EACCES).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcphost.supervisor.confine import probe as machine
from mcphost.supervisor.uids import DEFAULT_RANGE
from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import REPO, Supervised, descendants_alive, inline, inner
from tests.waiting import until

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0, reason="agents get uids of their own from a root supervisor"
    ),
    pytest.mark.skipif(
        machine.probe().missing() is not None, reason=f"no fence here: {machine.probe().missing()}"
    ),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is missing"),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is missing"),
]

HOLD = [sys.executable, "-c", "import signal; signal.pause()"]
AGENTS = ("agent-1", "agent-2", "pane-1")

# From inside the agent, in `unshare -U -r -C -m` (root in a user namespace of its own, a cgroup
# and a mount namespace): mount each hierarchy of /proc/self/cgroup again and try what an agent
# that is uid 0 outside could do there. Opening for writing writes nothing; a group made is
# removed at once (and reported).
REMOUNT = r"""
import ctypes, errno, json, os, tempfile
libc = ctypes.CDLL(None, use_errno=True)
WANTED = ("pids.max", "memory.limit_in_bytes", "memory.max", "blkio.throttle.write_bps_device",
          "cgroup.procs")
out = {}
for line in open("/proc/self/cgroup"):
    _, controllers, _ = line.rstrip("\n").split(":", 2)
    name = controllers or "unified"
    target = tempfile.mkdtemp()
    if not controllers:
        fstype, options = b"cgroup2", None
    else:
        fstype = b"cgroup"
        options = (("none," + controllers) if controllers.startswith("name=") else controllers).encode()
    if libc.mount(b"cgroup", target.encode(), fstype, 0, options) != 0:
        out[name] = {"mount": errno.errorcode[ctypes.get_errno()]}
        continue
    seen = {}
    for file in WANTED:
        path = os.path.join(target, file)
        if not os.path.exists(path):
            continue
        try:
            os.close(os.open(path, os.O_WRONLY))
            seen[file] = "opened"
        except OSError as exc:
            seen[file] = errno.errorcode[exc.errno]
    try:
        os.mkdir(os.path.join(target, "mcphost-escape"))
        os.rmdir(os.path.join(target, "mcphost-escape"))
        seen["mkdir"] = "made"
    except OSError as exc:
        seen["mkdir"] = errno.errorcode[exc.errno]
    out[name] = seen
print(json.dumps(out))
"""

READ = r"""
import errno, json, sys
try:
    open(sys.argv[1], "rb").close()
    print(json.dumps("read"))
except OSError as exc:
    print(json.dumps(errno.errorcode[exc.errno]))
"""


@pytest.fixture(scope="module")
def sv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervised]:
    base = tmp_path_factory.mktemp("uids")
    with DevCenter.start(base / "center") as center:
        running = Supervised(base, center, state_parent=REPO)
        running.write_fleet(
            [
                {"id": "agent-1", "command": HOLD},
                {"id": "agent-2", "command": HOLD},
                {"id": "pane-1", "command": HOLD, "runner": "tmux", "bundle": "party"},
            ]
        )
        try:
            running.start()
            for agent in AGENTS:
                running.wait_running(agent)
            yield running
        finally:
            running.close()


def ctl_exec(sv: Supervised, agent: str, *argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mcphost", "ctl", "--state", str(sv.state), "exec", agent]
    return subprocess.run(
        [*command, "--", *argv], capture_output=True, text=True, env=sv.env(), timeout=120
    )


def uid_of(pid: int) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return [int(v) for v in line.split()[1:]]
    raise AssertionError(f"no Uid: in /proc/{pid}/status")


def tree(pid: int) -> list[int]:
    """`pid` and every descendant of it, from /proc/<pid>/task/*/children."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                text = Path(f"/proc/{current}/task/{task}/children").read_text()
                pending += [int(k) for k in text.split()]
        except OSError:
            continue
    return found


def test_no_agent_is_root_and_each_runs_as_a_uid_of_its_own(sv: Supervised) -> None:
    rows = sv.status()
    uids = {agent: rows[agent]["uid"] for agent in AGENTS}
    assert all(uid in DEFAULT_RANGE for uid in uids.values()), uids
    assert len(set(uids.values())) == len(AGENTS), uids
    assert {rows[a]["identity"] for a in AGENTS} == {"own"}
    for agent in AGENTS:
        pid = rows[agent]["pid"]

        def program(pid: int = pid) -> int | None:
            """The agent's program, below the fence's bubblewrap (once it runs)."""
            own = inner(pid)
            argv = Path(f"/proc/{own}/cmdline").read_bytes().split(b"\0")[:-1]
            # past a pane's gate, bubblewrap, setpriv and env: the agent's own program
            return own if argv == [a.encode() for a in HOLD] else None

        own = until(program, 30, f"{agent}'s program below bubblewrap")
        # the program and all it started run as the row's uid, real, effective, saved and fs
        for pid in tree(own):
            if descendants_alive([pid]):
                assert set(uid_of(pid)) == {uids[agent]}, (agent, pid, uid_of(pid))
        home = sv.state / "agents" / agent
        assert home.stat().st_uid == uids[agent]
        assert (home / "workspace").stat().st_uid == uids[agent]
    # what `ctl exec` runs is the agent's too
    done = ctl_exec(sv, "agent-1", sys.executable, "-c", "import os; print(os.getuid())")
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == uids["agent-1"]


def test_an_agent_keeps_its_uid_across_a_restart_and_a_supervisor_restart(sv: Supervised) -> None:
    before = {agent: sv.status()[agent] for agent in AGENTS}
    sv.ctl("restart", "agent-2")
    row = sv.wait_running("agent-2", generation=before["agent-2"]["generation"] + 1)
    assert row["uid"] == before["agent-2"]["uid"]
    before["agent-2"] = row
    assert sv.terminate() == 0
    sv.start()
    for agent in AGENTS:
        again = sv.wait_running(agent, generation=before[agent]["generation"] + 1)
        assert again["uid"] == before[agent]["uid"], agent


def test_an_agent_cannot_shed_its_limits_nor_write_the_hosts_cgroups(sv: Supervised) -> None:
    """The attack of a uid-0 agent: a nested user + cgroup + mount namespace, every hierarchy
    mounted again; as its own uid, each file it may not write stays closed and no group is made
    (EACCES on the kernel's permissions), whether the hierarchy shows its own group or the
    host's root."""
    done = ctl_exec(sv, "agent-1", "unshare", "-U", "-r", "-C", "-m", sys.executable, "-c", REMOUNT)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    mounted = {name: out for name, out in seen.items() if "mount" not in out}
    assert mounted, seen  # the attack could be tried: at least one hierarchy mounted again
    for name, out in mounted.items():
        assert out["mkdir"] != "made", (name, out)
        opened = [file for file, result in out.items() if result == "opened"]
        assert opened == [], (name, out)


def test_an_agent_cannot_read_a_root_only_file_the_fence_shows(sv: Supervised) -> None:
    folder = Path(tempfile.mkdtemp(prefix="mcphost-rootonly-", dir=REPO))
    try:
        folder.chmod(0o755)
        secret = folder / "secret"
        secret.write_text("root's\n")
        secret.chmod(0o600)
        done = ctl_exec(sv, "agent-1", *inline(READ), str(secret))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == "EACCES"
    finally:
        shutil.rmtree(folder)


def test_an_agent_that_leaves_the_fleet_gives_back_its_uid_and_its_home(sv: Supervised) -> None:
    """Last in this file: a reload without pane-1 releases its uid (the state no longer holds
    it) and hands its home back to the supervisor, so whoever gets that uid next reaches
    nothing of it."""
    uid = sv.status()["pane-1"]["uid"]
    sv.write_fleet([{"id": "agent-1", "command": HOLD}, {"id": "agent-2", "command": HOLD}])
    sv.ctl("reload")
    until(lambda: "pane-1" not in sv.status(), 60, "pane-1 gone")
    home = sv.state / "agents" / "pane-1"
    assert home.stat().st_uid == 0
    assert (home / "workspace").stat().st_uid == 0
    with sqlite3.connect(sv.state / "state.sqlite3") as db:
        kept = dict(db.execute("SELECT agent_id, uid FROM uids").fetchall())
    assert "pane-1" not in kept and uid not in kept.values()
    assert set(kept) == {"agent-1", "agent-2"}


def test_a_changed_uid_range_moves_each_agent_and_its_home_to_a_new_uid(sv: Supervised) -> None:
    """After the test above (agent-1 and agent-2 left): a reload with another `[identity] uids`
    restarts each agent as a uid of the new range, its home handed over whole to it."""
    before = sv.status()
    moved = "1879113728-1879113827"  # just above the default range
    sv.fleet.write_text(sv.fleet.read_text() + f'\n[identity]\nuids = "{moved}"\n')
    sv.ctl("reload")
    for agent in ("agent-1", "agent-2"):
        row = sv.wait_running(agent, generation=before[agent]["generation"] + 1)
        assert 1879113728 <= row["uid"] <= 1879113827, row
        home = sv.state / "agents" / agent
        assert home.stat().st_uid == row["uid"]
        assert (home / "workspace").stat().st_uid == row["uid"]
