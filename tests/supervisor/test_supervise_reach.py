"""Black-box: what `mcphost supervise` and `mcphost supervise --check` say at load about what the
fleet's agents will reach (mcphost/supervisor/agents/reach.py), through the real processes.

- A state directory too long for its sockets: one stderr line naming it and the limit, exit 2,
  from `--check` and from `supervise` alike, and nothing created; the longest one allowed runs
  an agent that attaches to both surfaces.
- An agent whose program the fence will hide (a PATH entry under /tmp, a path under /tmp): one
  `--check` line per agent naming its key, its id, the program and what hides it (exit 1);
  `supervise` still runs the fleet, and each such agent's spawn fails with the same words as
  one clean line in `ctl status` (a process agent and a tmux pane alike), while the others run.
- An agent whose arguments name paths the fence hides (a script beside the fleet file, an
  `--option=` value under /tmp): one `--check` line per argument with the code
  `argument_hidden_by_fence`, its position, the path and what hides it (exit 1); a visible
  path and a path the host does not have are not named.
- A `user =` agent whose user cannot start its attach entries (the pump in a 0700 directory):
  `--check` and `supervise` refuse the fleet (exit 2, one line naming the key, the agent, the
  user and the directory), and a reload that adds it changes nothing; once the directory lets
  that user through, a reload starts it (the first agent of another user: the state directory
  and the attach sockets open to it then, as at a start) and it calls the center.
- `--check`'s real probe, as each agent's own uid and in its fence (reachprobe.py): an unfenced
  agent whose program lies in a 0700 directory (its pump reachable, so the path rule passes it)
  is one line naming the key, the group's agents, the uid, the directory and the fix (exit 1),
  its fenced sibling passes, and nothing is written in the state directory; a supervisor and
  program installed under a 0700 directory pass fenced (one probe for 20 agents), are named in
  the fence when the program is not executable by the uid, and are refused unfenced.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcphost.supervisor.confine import probe as machine
from mcphost.supervisor.uids import DEFAULT_RANGE
from mcphost.testing.devcenter import DevCenter
from mcphost.unixsock import SUN_PATH_MAX
from tests.supervisor.supervise_harness import (
    REPO,
    STATE_DIRS,
    Supervised,
    package_copy,
    standin,
    tree_for,
)
from tests.waiting import until

# <state>/run/center.sock: the longest socket reached by its path as it is
LONGEST_SUFFIX = len("/run/center.sock")


def state_of_length(length: int) -> Path:
    """A path of exactly `length` bytes (not created) in a fresh directory under /tmp, removed
    when the test process ends."""
    base = Path(tempfile.mkdtemp(prefix="mcphost-len-"))
    STATE_DIRS.append(base)
    pad = length - len(str(base)) - 1
    assert pad > 0, (base, length)
    return base / ("s" * pad)


def check(sv: Supervised) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*sv.argv(), "--check"],
        capture_output=True,
        text=True,
        env=sv.env(),
        timeout=120,
        cwd=sv.cwd,
    )


def test_a_state_directory_too_long_for_its_sockets_is_refused_in_one_line(
    supervised: Supervised,
) -> None:
    limit = SUN_PATH_MAX - LONGEST_SUFFIX
    supervised.state = state_of_length(limit + 1)
    supervised.write_fleet([{"id": "agent-1", "command": standin("--hold")}])
    for done in (check(supervised), supervised.run_to_exit()):
        assert done.returncode == 2, (done.returncode, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert str(supervised.state) in lines[0] and "--state" in lines[0], lines[0]
        assert f"at most {limit} bytes" in lines[0] and f"{SUN_PATH_MAX} bytes" in lines[0]
        assert "Traceback" not in done.stderr and "Unclosed" not in done.stderr
        assert done.stdout == ""
        assert not supervised.state.exists()  # nothing was created


def test_the_longest_state_directory_allowed_runs_an_agent_on_both_surfaces(
    supervised: Supervised, center: DevCenter
) -> None:
    supervised.state = state_of_length(SUN_PATH_MAX - LONGEST_SUFFIX)
    supervised.write_fleet([{"id": "agent-1", "bundle": "long", "command": standin("--hold")}])
    done = check(supervised)
    assert "--state" not in done.stderr, done.stderr
    supervised.start()
    supervised.wait_running("agent-1")
    calls = until(
        lambda: len(supervised.calls("agent-1")) >= 2 and supervised.calls("agent-1"),
        60,
        "a call on each surface",
    )
    assert {call["server"] for call in calls} == {"agent-center", "agentmux"}, calls
    assert all(call["ok"] for call in calls), calls
    assert len(os.fsencode(supervised.state / "run" / "center.sock")) == SUN_PATH_MAX


@pytest.fixture
def hidden_bin() -> Iterator[Path]:
    """A directory holding `mytool` (exits 0) under /tmp, which every fenced agent sees private."""
    base = Path(tempfile.mkdtemp(prefix="mcphost-bin-"))
    tool = base / "bin" / "mytool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    base.chmod(0o755)
    yield tool.parent
    shutil.rmtree(base)


def test_an_agent_that_will_not_find_its_program_is_named_by_check_and_by_its_spawn(
    supervised: Supervised, hidden_bin: Path
) -> None:
    path = {"PATH": f"{hidden_bin}:/usr/bin:/bin"}
    agents = [
        {"id": "on-path", "command": ["mytool"], "env": path},
        {"id": "by-path", "command": [str(hidden_bin / "mytool")]},
        {"id": "fine", "command": standin("--hold")},
    ]
    tmux = shutil.which("tmux") is not None
    if tmux:
        agents.append({"id": "pane", "runner": "tmux", "command": ["mytool"], "env": path})
    supervised.write_fleet(agents, max_restarts=1)

    done = check(supervised)
    assert done.returncode == 1, done.stderr
    problems = [line for line in done.stderr.splitlines() if "--check:" not in line]
    assert len(problems) == len(agents) - 1, done.stderr
    on_path, by_path = problems[:2]
    assert "agent[0].command (on-path): mytool is not on the agent's PATH" in on_path
    assert f"hidden by the fence: {hidden_bin}" in on_path
    assert f"agent[1].command (by-path): {hidden_bin}/mytool is not there" in by_path
    assert "hidden by the fence: /tmp" in by_path
    if tmux:
        assert problems[2].startswith("mcphost supervise: agent[3].command (pane): mytool ")

    supervised.start()
    supervised.wait_running("fine")
    hidden = [a["id"] for a in agents if a["id"] != "fine"]
    rows = until(
        lambda: all(supervised.status()[a]["last_reason"] for a in hidden) and supervised.status(),
        60,
        "each hidden program's spawn to fail",
    )
    for agent in hidden:
        reason = rows[agent]["last_reason"]
        assert "\n" not in reason and "Errno" not in reason and "'mytool'" not in reason, reason
        program = str(hidden_bin / "mytool") if agent == "by-path" else "mytool"
        assert reason.startswith(f"cannot run {program}: "), reason
        assert "hidden by the fence: " in reason and "[ENOENT]" in reason, reason
    assert rows["fine"]["state"] == "running"


@pytest.fixture
def fleet_dir() -> Iterator[Path]:
    """A directory for the fleet file outside /tmp (which the fence makes private whole), as an
    operator's /srv/fleet is."""
    if not os.access("/srv", os.W_OK):
        pytest.skip("/srv is not writable here")
    base = Path(tempfile.mkdtemp(prefix="mcphost-fleet-", dir="/srv"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base)


def test_check_names_each_argument_that_is_a_path_the_fence_hides(
    supervised: Supervised, fleet_dir: Path
) -> None:
    supervised.fleet = fleet_dir / "fleet.toml"
    script = fleet_dir / "agent.py"  # beside the fleet file: the "can't open file"
    script.write_text("print('hello')\n")
    data = supervised.base / "notes.json"  # beside the token, under /tmp
    data.write_text("{}")
    python = sys.executable  # the supervisor's own environment, which the fence shows
    agents = [
        {"id": "beside", "command": [python, str(script)]},
        {"id": "option", "command": [python, "-c", "pass", f"--data={data}", "/usr/bin/env"]},
        {"id": "absent", "command": [python, "-c", "pass", str(fleet_dir / "not-there.py")]},
    ]
    supervised.write_fleet(agents)

    done = check(supervised)
    assert done.returncode == 1, done.stderr
    problems = [line for line in done.stderr.splitlines() if "--check:" not in line]
    assert len(problems) == 2, done.stderr
    beside, option = problems
    assert beside.startswith(
        f"mcphost supervise: agent[0].command (beside): argument_hidden_by_fence: argument 1 "
        f"{script} is hidden by the fence (under {fleet_dir}, the fleet file's directory"
    ), beside
    assert "move it where the agent can see it" in beside
    assert f"argument 3 {data} is hidden by the fence (under /tmp, each agent has a" in option
    assert "/usr/bin/env" not in option  # visible inside: not named


ROOT = os.geteuid() == 0


@pytest.mark.skipif(not ROOT, reason="running an agent as another user needs a root supervisor")
def test_a_user_that_cannot_start_the_pump_is_refused_at_load_and_at_reload(
    supervised: Supervised,
) -> None:
    from tests.supervisor.test_supervise_user import nobody, python_for

    user = nobody()
    if user is None:
        pytest.skip("no user nobody on this machine")
    python = python_for(user)
    if python is None:
        pytest.skip("no interpreter of this version that nobody can run")
    private = Path(tempfile.mkdtemp(prefix="mcphost-private-"))  # 0700, root's
    STATE_DIRS.append(private)
    supervised.python = python
    supervised.use_tree(package_copy(private))  # so the pump is private/tree/mcphost/attach.py
    own = {"id": "agent-1", "command": supervised.standin("--hold")}
    other = {"id": "agent-2", "user": "nobody", "sandbox": "none"}
    other["command"] = supervised.standin("--hold")
    supervised.write_fleet([own, other])

    for done in (check(supervised), supervised.run_to_exit()):
        assert done.returncode == 2, (done.returncode, done.stderr)
        lines = [line for line in done.stderr.splitlines() if "--check:" not in line]
        assert len(lines) == 1, done.stderr
        assert f"agent[1].user is 'nobody' (uid {user.pw_uid}; agents: agent-2)" in lines[0]
        blocked = f"{private} (mode 0700, owner uid 0) is not searchable by uid {user.pw_uid}"
        assert blocked in lines[0] and "on the way to the pump " in lines[0], lines[0]
        assert "Traceback" not in done.stderr and done.stdout == ""
    assert not (supervised.state / "control.sock").exists()

    supervised.write_fleet([own])
    supervised.start()
    before = supervised.wait_running("agent-1")
    supervised.write_fleet([own, other])
    done = supervised.ctl("reload", check=False)
    assert done.returncode != 0 and "agent[1].user" in done.stderr, done.stderr
    assert blocked in done.stderr, done.stderr
    rows = supervised.status()
    assert "agent-2" not in rows
    assert (rows["agent-1"]["pid"], rows["agent-1"]["generation"]) == (
        before["pid"],
        before["generation"],
    )

    # Let through, the reload starts it: the first agent of another user, so the state
    # directory and the attach sockets are opened to it as a start with it would have.
    private.chmod(0o755)
    supervised.ctl("reload")
    supervised.wait_running("agent-2")
    call = until(lambda: supervised.calls("agent-2"), 60, "agent-2's call")[0]
    assert call["ok"], call
    modes = {d: stat.S_IMODE(os.stat(supervised.state / d).st_mode) for d in (".", "run")}
    assert modes == {".": 0o711, "run": 0o711}, modes


def _tool(parent: Path) -> Path:
    """`parent/bin/mytool`, a program that exits 0."""
    tool = parent / "bin" / "mytool"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    tool.parent.chmod(0o755)
    return tool


def _problems(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if "--check:" not in line]


def _probes(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if "--check: probes: " in line]
    assert len(lines) == 1, done.stderr
    return lines[0]


OWN_UID = DEFAULT_RANGE.first  # what `--check` probes the agents of their own uids as


@pytest.mark.skipif(not ROOT, reason="agents run as uids of their own under a root supervisor")
@pytest.mark.skipif(
    machine.probe().missing() is not None, reason=f"no fence here: {machine.probe().missing()}"
)
def test_check_probes_as_the_agent_s_uid_and_names_a_program_it_cannot_reach(
    supervised: Supervised,
) -> None:
    """An unfenced agent of its own uid whose program lies in a 0700 directory (its pump and
    interpreter reachable, so the path rule passes it) is named by `--check` in one line, from a
    real probe as that uid: the key, both agents of the group, the uid, the path and the fix;
    its fenced sibling's probe passes. Two groups, two probes."""
    from tests.supervisor.test_supervise_user import python_for_ids

    python = python_for_ids(OWN_UID, OWN_UID)
    if python is None:
        pytest.skip("no interpreter of this version that an agent's own uid can run")
    if python != supervised.python:
        site = sysconfig.get_paths()["purelib"]
        supervised.python = python
        supervised.extra_env["PYTHONPATH"] = os.pathsep.join((REPO, site))
    tree = tree_for(OWN_UID, frozenset({OWN_UID}))
    if tree is not None:
        supervised.use_tree(tree)
    private = Path(tempfile.mkdtemp(prefix="mcphost-private-"))  # 0700, root's
    STATE_DIRS.append(private)
    tool = _tool(private)
    unfenced = {"sandbox": "none", "command": [str(tool)]}
    agents = [
        {"id": "own-1", **unfenced},
        {"id": "own-2", **unfenced},
        {"id": "fenced-1", "command": supervised.standin("--hold")},
    ]
    supervised.write_fleet(agents)

    done = check(supervised)
    assert done.returncode == 1, done.stderr
    problems = _problems(done)
    assert len(problems) == 1, done.stderr
    line = problems[0]
    assert line.startswith("mcphost supervise: agent[0].command (agents: own-1, own-2; "), line
    assert f"uid {OWN_UID}" in line and "probed unfenced as that uid" in line, line
    assert f"its program {tool}: " in line, line
    assert f"{private} (mode 0700, owner uid 0) is not searchable by uid {OWN_UID}" in line
    assert "under a path every uid can reach (e.g. a virtualenv under /opt" in line, line
    assert 'fence the agent (sandbox = "auto"' in line and 'user = "root"' in line, line
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert "probes: 2 for 3 agent(s)" in _probes(done)
    assert sorted(os.listdir(supervised.state)) == []  # nothing written in the state


@pytest.mark.skipif(not ROOT, reason="agents run as uids of their own under a root supervisor")
@pytest.mark.skipif(
    machine.probe().missing() is not None, reason=f"no fence here: {machine.probe().missing()}"
)
def test_an_install_under_a_0700_home_works_fenced_and_is_refused_unfenced_in_one_line(
    supervised: Supervised,
) -> None:
    """The supervisor and the agents' program installed in a 0700 directory: fenced, the fence
    brings the supervisor's programs back, and the probe (one for 20 agents) passes as the
    agents' uid; unfenced, `--check` refuses it in one line naming the path and the fix. A
    program the fence shows but the uid may not execute (0700, root's), which no path rule
    of reach.py looks at, is named by the probe run in the fence."""
    private = Path(tempfile.mkdtemp(prefix="mcphost-private-"))  # 0700, root's
    STATE_DIRS.append(private)
    tree = package_copy(private)
    supervised.use_tree(tree)  # the pump is private/tree/mcphost/attach.py
    tool = _tool(tree)  # beneath the project the fence brings back
    fenced = [{"id": f"agent-{n}", "command": [str(tool)]} for n in range(20)]
    supervised.write_fleet(fenced)
    done = check(supervised)
    assert done.returncode == 0, done.stderr
    assert _problems(done) == [], done.stderr
    assert "probes: 1 for 20 agent(s)" in _probes(done)

    tool.chmod(0o700)
    done = check(supervised)
    assert done.returncode == 1, done.stderr
    problems = _problems(done)
    assert len(problems) == 1, done.stderr
    assert problems[0].startswith("mcphost supervise: agent[0].command (agents: agent-0, ")
    assert "agent-19; " in problems[0] and "probed in its fence as that uid" in problems[0]
    assert f"{tool} (mode 0700, owner uid 0) is not executable by uid {OWN_UID}" in problems[0]
    tool.chmod(0o755)

    supervised.write_fleet([{**fenced[0], "sandbox": "none"}])
    done = check(supervised)
    assert done.returncode == 2, done.stderr
    problems = _problems(done)
    assert len(problems) == 1, done.stderr
    assert f"{private} (mode 0700, owner uid 0) is not searchable by uid {OWN_UID}" in problems[0]
    assert "a virtualenv under /opt" in problems[0] and "fence these agents" in problems[0]
