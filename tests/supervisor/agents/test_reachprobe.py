"""Unit tests of how `mcphost supervise --check` groups a fleet's agents for its real probes
(mcphost/supervisor/agents/reachprobe.py): one probe answers for every agent whose uid class, fence
(its home aside) and program are the same, so a fleet of N alike agents takes one probe. The
probes themselves run in tests/supervisor/test_supervise_reach.py, through `--check`."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import pytest

from mcphost.supervisor.agents import reachprobe
from mcphost.supervisor.confine import probe as machine
from mcphost.supervisor.plan import AgentDefaults, CenterConfig, Fleet
from tests.supervisor.agents.test_reach import a_fleet as reach_fleet

STATE = "/var/lib/mcphost"
ROOT = os.geteuid() == 0
SUPPORT = machine.Support(landlock_abi=6, userns=True, root=ROOT)
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/root"}


def a_fleet(*agents: dict[str, Any], defaults: AgentDefaults | None = None) -> Fleet:
    """agents/test_reach.py's fleet, its agents running `/usr/bin/true` unless told otherwise."""
    return reach_fleet(
        *agents, defaults=defaults or AgentDefaults(client="command", command=("/usr/bin/true",))
    )


def grouped(fleet: Fleet) -> list[list[str]]:
    members = reachprobe.plan_members(fleet, STATE, ENV, SUPPORT)
    return [[m.plan.agent_id for m in g.members] for g in reachprobe.groups(members)]


def test_a_thousand_alike_agents_take_one_probe() -> None:
    fleet = a_fleet(*({"id": f"agent-{n}"} for n in range(1000)))
    started = time.monotonic()
    found = grouped(fleet)
    assert len(found) == 1 and len(found[0]) == 1000
    assert found[0][:2] == ["agent-0", "agent-1"]  # the fleet's order: agent-0 is probed
    assert time.monotonic() - started < 30  # planning, no process: well under a probe each


def test_the_home_in_a_command_is_generic_but_the_program_and_the_uid_class_are_not() -> None:
    agents: list[dict[str, Any]] = [
        {"id": "a-1", "command": ("{home}/bin/tool",)},
        {"id": "a-10", "command": ("{home}/bin/tool",)},  # a-1's home is a prefix of a-10's
        {"id": "b-1", "command": ("/usr/bin/env",)},
        {"id": "c-1", "command": ("/usr/bin/true", "--other-args")},  # only argv[0] counts
        {"id": "d-1"},
        {"id": "none-1", "sandbox": "none"},  # unfenced: another fence
    ]
    if ROOT:
        agents.append({"id": "root-1", "user": "root"})  # the supervisor's uid: another class
    found = grouped(a_fleet(*agents))
    assert found[:3] == [["a-1", "a-10"], ["b-1"], ["c-1", "d-1"]]
    if ROOT:  # an agent of its own uid unfenced, and root fenced
        assert found[3:] == [["none-1"], ["root-1"]]
    else:  # unfenced as the supervisor's uid: the supervisor itself, nothing to probe
        assert found[3:] == []


def test_a_fleet_given_path_or_another_path_variable_is_another_group() -> None:
    fleet = a_fleet(
        {"id": "a-1", "command": ("tool",)},
        {"id": "a-2", "command": ("tool",), "env": {"PATH": "/opt/tools/bin:/usr/bin"}},
        {"id": "a-3", "command": ("tool",)},
        {"id": "a-4", "env": {"HOME": "/srv/agents/shared"}},
        {"id": "a-5"},
    )
    assert grouped(fleet) == [["a-1", "a-3"], ["a-2"], ["a-4"], ["a-5"]]


def test_a_center_s_fleet_without_agents_yet_is_probed_from_its_defaults() -> None:
    fleet = a_fleet()
    center = Fleet(
        path=fleet.path,
        center=CenterConfig(
            admin_url=fleet.center.admin_url,
            pins=(),
            token_file=fleet.center.token_file,
            fleet="center",
        ),
        agents=(),
        defaults=fleet.defaults,
    )
    members = reachprobe.plan_members(center, STATE, ENV, SUPPORT)
    assert [(m.index, m.plan.agent_id) for m in members] == [(None, "any-agent")]


# -- the probe's spawn: stand-ins, its bound --------------------------------------------------


def test_the_probe_binds_stand_ins_at_the_very_places_and_nothing_from_the_state(
    tmp_path: Path,
) -> None:
    """The fence's command line is the agent's, but every source beneath the state directory
    (the home, the attach sockets) is a stand-in of the probe's own temporary directory, bound
    at the same destination; the home's stand-in holds the workspace the fence starts in."""
    state = tmp_path / "state"
    state.mkdir()
    fleet = a_fleet({"id": "a-1"})
    member = reachprobe.plan_members(fleet, str(state), ENV, SUPPORT)[0]
    assert member.fence is not None
    scratch = reachprobe._Scratch()
    try:
        staged, cwd = reachprobe._staged(member, str(state), scratch)
        assert staged is not None and cwd == "/"
        stand_ins = dict(staged.plan.stand_ins)
        assert member.home.root in stand_ins
        assert os.path.isdir(os.path.join(stand_ins[member.home.root], "workspace"))
        argv = staged.plan.argv(["probe"])
        sources = [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
        assert not [s for s in sources if s.startswith(str(state))], sources
        for where, instead in stand_ins.items():
            assert instead.startswith(scratch.root + "/")
            at = argv.index(instead)
            assert argv[at + 1] == where  # bound at the very place
        assert staged.plan.argv(["probe"])[-1] == "probe"
        assert os.listdir(state) == []  # nothing written there
    finally:
        scratch.close()
    assert not os.path.exists(scratch.root)


FENCE = machine.probe().missing()


@pytest.mark.skipif(FENCE is not None, reason=f"no fence here: {FENCE}")
def test_a_probe_that_does_not_answer_is_killed_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe is bounded: past `TIMEOUT` it is killed with its process group (its fence's
    whole namespace ends with its bubblewrap), and its group gets one line saying so."""
    token = tmp_path / "secrets" / "worker.token"
    token.parent.mkdir()
    token.write_text("t\n")
    fleet = a_fleet({"id": "a-1"}, {"id": "a-2"})
    fleet = dataclasses.replace(
        fleet,
        path=str(token.parent / "fleet.toml"),
        center=dataclasses.replace(fleet.center, token_file=str(token)),
    )
    state = tmp_path / "state"
    state.mkdir()
    outcomes = asyncio.run(reachprobe.run_probes(fleet, str(state), ENV))
    assert [(o.broken, o.failed) for o in outcomes] == [(None, ())]  # one probe, passed
    assert outcomes[0].seconds < reachprobe.TIMEOUT

    monkeypatch.setattr(reachprobe, "TIMEOUT", 1.0)
    monkeypatch.setattr(reachprobe, "PROBE", "import time; time.sleep(60)")
    started = time.monotonic()
    outcomes = asyncio.run(reachprobe.run_probes(fleet, str(state), ENV))
    assert time.monotonic() - started < 10
    assert [o.broken for o in outcomes] == ["the probe did not answer within 1 s"]
    line = reachprobe.problem_line(outcomes[0], fleet)
    assert "(agents: a-1, a-2; " in line and "the probe did not answer within 1 s" in line
    assert os.listdir(state) == []


def test_a_failing_group_names_the_key_that_decides_what_failed() -> None:
    """The program's key when the program failed (the agent's own command, else the default's),
    else whom it runs as: `identity.uids` for agents of their own uids, the `user` key."""
    fleet = a_fleet({"id": "a-1", "command": ("/srv/bin/tool",)}, {"id": "a-2"})
    members = reachprobe.plan_members(fleet, STATE, ENV, SUPPORT)
    program = (
        {"what": "its program", "path": "/srv/bin/tool", "blocked": "/srv", "why": "search"},
    )
    pump = ({"what": "the pump", "path": "/x/attach.py", "blocked": "/x", "why": "search"},)
    first, second = reachprobe.groups(members)
    line = reachprobe.problem_line(reachprobe.Outcome(first, failed=program), fleet)
    assert line.startswith("agent[0].command (agents: a-1; "), line
    assert "cannot start: its program /srv/bin/tool: /srv " in line, line
    line = reachprobe.problem_line(reachprobe.Outcome(second, failed=program), fleet)
    assert line.startswith("defaults.command (agents: a-2; "), line
    line = reachprobe.problem_line(reachprobe.Outcome(second, failed=pump), fleet)
    assert line.startswith("identity.uids (" if ROOT else "agent[1].sandbox ("), line
    assert "cannot start: the pump: /x " in line, line
    if ROOT:  # an agent of its own uid may also run as root
        assert 'user = "root"' in line, line
