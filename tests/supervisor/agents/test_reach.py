"""Unit tests of what the supervisor works out at load about what its agents will reach
(mcphost/supervisor/agents/reach.py): the state directory's room for its sockets, and each fenced
agent's program as it will look for it (fence.py's `resolve` and `FencePlan.hidden_by`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from mcphost.admin.target import AdminTarget
from mcphost.supervisor.agents import reach
from mcphost.supervisor.confine import fence
from mcphost.supervisor.plan import AgentDefaults, CenterConfig, Fleet, apply_defaults
from mcphost.unixsock import SUN_PATH_MAX, fits

ROOM = SUN_PATH_MAX - len("/run/center.sock")  # the longest socket reached by its path


def test_the_state_directory_may_be_as_long_as_its_longest_socket_allows() -> None:
    at_limit = "/" + "s" * (ROOM - 1)
    assert len(at_limit) == ROOM
    assert reach.state_problem(at_limit) is None
    assert all(fits(path) for path in reach.socket_paths(at_limit))
    longest = max(reach.socket_paths(at_limit), key=len)
    assert longest == f"{at_limit}/run/center.sock" and len(longest) == SUN_PATH_MAX


def test_one_byte_more_names_the_limit_and_the_socket() -> None:
    too_long = "/" + "s" * ROOM
    problem = reach.state_problem(too_long)
    assert problem is not None
    assert f"at most {ROOM} bytes (it has {ROOM + 1})" in problem
    assert f"<state>/run/center.sock fits the {SUN_PATH_MAX} bytes" in problem
    assert f"(it would have {SUN_PATH_MAX + 1})" in problem


def test_bytes_count_not_characters() -> None:
    state = "/" + "é" * (ROOM // 2 + 1)  # two bytes each
    assert len(state) <= ROOM < len(os.fsencode(state))
    assert reach.state_problem(state) is not None


def test_an_empty_or_relative_state_is_refused() -> None:
    for state in ("", "relative/state"):
        assert reach.state_problem(state) == "an absolute path: the supervisor's state directory"


def test_the_sockets_the_supervisor_binds_are_the_ones_checked() -> None:
    points = reach.attach_points("/var/lib/mcphost")
    assert set(reach.socket_paths("/var/lib/mcphost")) == {
        "/var/lib/mcphost/control.sock",
        points.center_socket,
        points.relay_socket,
    }


# -- the program a fenced agent will find ---------------------------------------------------------

STATE = "/var/lib/mcphost"
HOME = f"{STATE}/agents/a1"


def a_plan() -> fence.FencePlan:
    return fence.plan(
        state_dir=STATE,
        home=HOME,
        workspace=f"{HOME}/workspace",
        sockets=(f"{STATE}/run/center.sock",),
        secrets=("/etc/mcphost/worker.token",),
    )


def test_hidden_by_names_the_cover_or_private_directory_that_hides_a_path() -> None:
    planned = a_plan()
    assert planned.hidden_by("/tmp/tools/bin/tool") == "/tmp"
    assert planned.hidden_by(f"{STATE}/agents/a2/bin/tool") == STATE
    assert planned.hidden_by("/etc/mcphost/other") == "/etc/mcphost"
    assert planned.hidden_by(f"{HOME}/bin/tool") is None  # its home comes back
    assert planned.hidden_by("/usr/bin/env") is None


def executable(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    program = directory / name
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    return program


@pytest.fixture
def hidden_bin() -> Any:
    """A directory of programs under /tmp (the fence gives every agent a private /tmp)."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="mcphost-reach-", dir="/tmp"))
    yield base / "bin"
    shutil.rmtree(base)


def test_resolve_names_the_path_entries_the_fence_hides(hidden_bin: Path) -> None:
    executable(hidden_bin, "mytool")
    executable(hidden_bin, "env")  # also in /usr/bin, which the fence shows
    planned = a_plan()
    with pytest.raises(FileNotFoundError) as caught:
        fence.resolve(planned, "mytool", f"{hidden_bin}:/usr/bin")
    assert caught.value.strerror == (
        f"mytool is not on the agent's PATH inside its fence (PATH={hidden_bin}:/usr/bin; "
        f"hidden by the fence: {hidden_bin})"
    )
    assert fence.resolve(planned, "env", f"{hidden_bin}:/usr/bin") == "/usr/bin/env"
    with pytest.raises(FileNotFoundError) as caught:
        fence.resolve(planned, str(hidden_bin / "mytool"), "/usr/bin")
    assert "(hidden by the fence: /tmp)" in caught.value.strerror


def a_fleet(*agents: dict[str, Any], defaults: AgentDefaults | None = None) -> Fleet:
    defaults = defaults or AgentDefaults(client="command")
    return Fleet(
        path="/etc/mcphost/fleet.toml",
        center=CenterConfig(
            admin_url=AdminTarget(kind="unix", path="/run/center/admin.sock"),
            pins=(),
            token_file="/etc/mcphost/worker.token",
        ),
        agents=tuple(apply_defaults(defaults, a.pop("id"), a) for a in agents),
        defaults=defaults,
    )


def test_each_fenced_agent_that_will_not_find_its_program_is_one_line(hidden_bin: Path) -> None:
    executable(hidden_bin, "mytool")
    hidden_path = {"PATH": f"{hidden_bin}:/usr/bin:/bin"}
    fleet = a_fleet(
        {"id": "on-path", "command": ("mytool", "--flag"), "env": hidden_path},
        {"id": "by-path", "command": (str(hidden_bin / "mytool"),)},
        {"id": "unfenced", "command": ("mytool",), "env": hidden_path, "sandbox": "none"},
        {"id": "found", "command": ("env",), "env": hidden_path},
        {"id": "defaulted"},
        defaults=AgentDefaults(client="command", command=(str(hidden_bin / "deftool"),)),
    )
    lines = reach.program_problems(fleet, STATE, {"PATH": "/usr/bin:/bin"})
    assert len(lines) == 3, lines
    on_path, by_path, defaulted = lines
    assert on_path.startswith("agent[0].command (on-path): mytool is not on the agent's PATH")
    assert f"hidden by the fence: {hidden_bin}" in on_path
    assert by_path.startswith(f"agent[1].command (by-path): {hidden_bin}/mytool is not there")
    assert "(hidden by the fence: /tmp)" in by_path
    assert defaulted.startswith("defaults.command (defaulted): ")


def test_a_program_under_var_tmp_is_named_and_the_fix_names_every_private_directory() -> None:
    # A newcomer's npm prefix under /var/tmp: hidden like /tmp, and the line must say so.
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="mcphost-reach-", dir="/var/tmp"))
    try:
        executable(base / "bin", "mytool")
        fleet = a_fleet({"id": "a1", "command": (str(base / "bin" / "mytool"),)})
        (line,) = reach.program_problems(fleet, STATE, {"PATH": "/usr/bin:/bin"})
        assert "(hidden by the fence: /var/tmp)" in line, line
        assert "not under /tmp, /var/tmp, /dev/shm, /run or the state directory" in line, line
    finally:
        shutil.rmtree(base)


def test_the_agents_path_is_the_supervisors_when_its_env_gives_none(hidden_bin: Path) -> None:
    executable(hidden_bin, "mytool")
    fleet = a_fleet({"id": "a1", "command": ("mytool",)})
    assert reach.program_problems(fleet, STATE, {"PATH": "/usr/bin:/bin"}) != []
    lines = reach.program_problems(fleet, STATE, {"PATH": f"{hidden_bin}:/usr/bin"})
    assert len(lines) == 1 and f"hidden by the fence: {hidden_bin}" in lines[0], lines
    fleet = a_fleet({"id": "a1", "command": ("env",)})
    assert reach.program_problems(fleet, STATE, {"PATH": f"{hidden_bin}:/usr/bin"}) == []


def test_the_supervisor_s_sign_in_and_the_agent_s_own_groups_reach_its_fence() -> None:
    """The fence hides what `signin.sources` names for the supervisor's environment (issue 32:
    the operator's CLAUDE_CONFIG_DIR and CODEX_HOME outside their home were readable), and
    shows the agent's own cgroups read-only."""
    fleet = a_fleet({"id": "a1", "command": ("env",)})
    env = {"HOME": "/root", "CLAUDE_CONFIG_DIR": "/srv/ops/claude", "CODEX_HOME": "/srv/ops/codex"}
    own = ("/sys/fs/cgroup/memory/mcphost-0123456789ab/agent-a1",)
    got = reach.agent_fence(fleet, STATE, fleet.agents[0], env=env, cgroups=own)
    assert got is not None
    assert {"/root", "/srv/ops/claude", "/srv/ops/codex"} <= set(got.plan.covers)
    assert own[0] in got.plan.readonly
    for hidden in ("/srv/ops/claude/.credentials.json", "/srv/ops/codex/auth.json"):
        assert not got.plan.visible(hidden)


def test_a_vendor_s_install_under_the_operator_s_home_is_found_and_one_in_its_sign_in_is_named(
    tmp_path: Path,
) -> None:
    """Claude Code's native install under the operator's home comes back into the fence (no
    line); Codex's binary put in `~/.codex` (its sign-in directory) never does, and `--check`'s
    line ends with the one command that puts it where every agent sees it."""
    home = tmp_path / "operator"
    versions = home / ".local" / "share" / "claude" / "versions"
    version = executable(versions, "2.1.0")
    (home / ".local" / "bin").mkdir(parents=True)
    (home / ".local" / "bin" / "claude").symlink_to(version)
    codex = executable(home / ".codex" / "bin", "codex")
    env = {"HOME": str(home), "PATH": f"{home}/.local/bin:{home}/.codex/bin:/usr/bin:/bin"}
    fleet = a_fleet(
        {"id": "claude", "command": ("claude",)}, {"id": "codex", "command": ("codex",)}
    )
    lines = reach.program_problems(fleet, STATE, env)
    assert len(lines) == 1, lines
    assert lines[0].startswith("agent[1].command (codex): codex is not on the agent's PATH")
    assert lines[0].endswith(f"e.g. as root: install -m 0755 {codex} /usr/local/bin/codex"), lines
    got = reach.agent_fence(fleet, STATE, fleet.agents[0], env=env)
    assert got is not None and str(version) in got.plan.readonly
    assert fence.resolve(got.plan, "claude", env["PATH"]) == str(version)


def test_a_link_the_agent_plants_in_its_home_brings_nothing_of_the_operator_s_home(
    tmp_path: Path,
) -> None:
    """The agent writes its home (and its fleet-given HOME): a `claude` it links there to an
    executable of the operator's home, found first on its PATH, is not followed; the operator's
    own install, found by a PATH of the operator's, is."""
    home = tmp_path / "operator"
    tool = executable(home / "tools", "secret-tool")
    state = tmp_path / "state"
    given = tmp_path / "given-home"
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    for bin_dir in (state / "agents" / "a1" / "bin", given / "bin"):
        bin_dir.mkdir(parents=True)
        (bin_dir / "claude").symlink_to(tool)
        agent_env = {"PATH": f"{bin_dir}:/usr/bin", "HOME": str(given)}
        fleet = a_fleet({"id": "a1", "command": ("claude",), "env": agent_env})
        got = reach.agent_fence(fleet, str(state), fleet.agents[0], env=env)
        assert got is not None and not got.plan.visible(str(tool)), bin_dir
    (home / "bin").mkdir()
    (home / "bin" / "claude").symlink_to(tool)
    fleet = a_fleet({"id": "a1", "command": ("claude",), "env": {"PATH": f"{home}/bin:/usr/bin"}})
    got = reach.agent_fence(fleet, str(state), fleet.agents[0], env=env)
    assert got is not None and got.plan.visible(str(tool))


def test_a_default_agent_s_client_program_in_a_sign_in_directory_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claude Code's old local install (`~/.claude/local/claude`) lies in its sign-in
    directory, which no agent sees: a default claude agent (no `command`) is named by its
    `client` key, with the fix; the native install is not; no claude at all is the spawn's."""
    home = tmp_path / "operator"
    local = executable(home / ".claude" / "local", "claude")
    native = executable(home / ".local" / "share" / "claude" / "versions", "2.1.0")
    env = {"HOME": str(home), "PATH": f"{local.parent}:/usr/bin:/bin"}
    monkeypatch.setenv("PATH", env["PATH"])  # a default agent's program: the supervisor's PATH
    fleet = a_fleet({"id": "a1", "client": "claude"})
    lines = reach.program_problems(fleet, STATE, env)
    assert len(lines) == 1 and lines[0].startswith("agent[0].client (a1): "), lines
    assert f"{local} is not there inside the agent's fence" in lines[0], lines
    assert lines[0].endswith(f"install -m 0755 {local} /usr/local/bin/claude"), lines
    (home / ".local" / "bin").mkdir()
    (home / ".local" / "bin" / "claude").symlink_to(native)
    env["PATH"] = f"{home}/.local/bin:/usr/bin:/bin"
    monkeypatch.setenv("PATH", env["PATH"])
    assert reach.program_problems(fleet, STATE, env) == []
    env["PATH"] = "/nonexistent"
    monkeypatch.setenv("PATH", env["PATH"])
    assert reach.program_problems(fleet, STATE, env) == []


# -- what a user can reach ------------------------------------------------------------------------

OTHER = 65534  # a uid that owns nothing here (nobody's)
NO_GROUPS: frozenset[int] = frozenset({65534})


@pytest.fixture
def tree() -> Any:
    """A fresh directory under /tmp, world-searchable; removed after the test."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="mcphost-walk-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base)


def test_a_private_directory_on_the_way_stops_another_user(tree: Path) -> None:
    private = tree / "private"
    program = executable(private / "bin", "python")
    private.chmod(0o700)
    stop = reach.unreachable(str(program), OTHER, NO_GROUPS, reach.SEARCH)
    assert stop == reach.Blocked(
        str(private), f"(mode 0700, owner uid {os.getuid()}) is not searchable by uid {OTHER}"
    )
    assert reach.unreachable(str(program), os.getuid(), NO_GROUPS, reach.SEARCH) is None


def test_the_file_itself_must_be_readable_or_executable(tree: Path) -> None:
    script = tree / "attach.py"
    script.write_text("")
    script.chmod(0o600)
    stop = reach.unreachable(str(script), OTHER, NO_GROUPS, reach.READ)
    assert stop is not None and stop.why.endswith(f"is not readable by uid {OTHER}")
    script.chmod(0o644)
    assert reach.unreachable(str(script), OTHER, NO_GROUPS, reach.READ) is None
    stop = reach.unreachable(str(script), OTHER, NO_GROUPS, reach.SEARCH)
    assert stop is not None and stop.why.endswith(f"is not executable by uid {OTHER}")


def test_the_group_class_lets_a_member_through(tree: Path) -> None:
    shared = tree / "shared"
    script = shared / "attach.py"
    shared.mkdir()
    script.write_text("")
    script.chmod(0o644)
    shared.chmod(0o710)
    group = os.stat(shared).st_gid
    assert reach.unreachable(str(script), OTHER, frozenset({group}), reach.READ) is None
    if group not in NO_GROUPS:
        assert reach.unreachable(str(script), OTHER, NO_GROUPS, reach.READ) is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another uid needs root")
def test_the_owner_class_decides_for_the_owner(tree: Path) -> None:
    mine = tree / "mine"
    script = mine / "attach.py"
    mine.mkdir()
    script.write_text("")
    script.chmod(0o644)
    os.chown(mine, OTHER, 0)
    mine.chmod(0o075)  # everyone but its owner
    stop = reach.unreachable(str(script), OTHER, frozenset({0}), reach.READ)
    assert stop is not None and stop.path == str(mine), stop


def test_symlinks_are_followed_to_where_they_lead(tree: Path) -> None:
    private = tree / "private"
    target = executable(private / "bin", "python3")
    private.chmod(0o700)
    (tree / "venv").mkdir()
    link = tree / "venv" / "python"
    link.symlink_to(os.path.relpath(target, link.parent))
    stop = reach.unreachable(str(link), OTHER, NO_GROUPS, reach.SEARCH)
    assert stop is not None and stop.path == str(private), stop
    gone = tree / "venv" / "dangling"
    gone.symlink_to(tree / "nowhere" / "python")
    stop = reach.unreachable(str(gone), OTHER, NO_GROUPS, reach.SEARCH)
    assert stop == reach.Blocked(str(tree / "nowhere"), "does not exist")


def test_inside_the_fence_its_own_directories_decide_and_what_it_hides_is_not_there(
    tree: Path,
) -> None:
    """A project under a private directory in /tmp, bound back by the fence: inside, /tmp is a
    private tmpfs (1777), and the directories the fence makes on the way to the bound project
    are its own (0711: any uid passes), whatever the host's are; a bound directory's own mode
    still decides; what the fence does not bind back is not there at all."""
    private = tree / "private"
    script = private / "project" / "mcphost" / "attach.py"
    script.parent.mkdir(parents=True)
    script.write_text("")
    script.chmod(0o644)
    view = fence.plan(
        state_dir=STATE,
        home=HOME,
        workspace=f"{HOME}/workspace",
        sockets=(f"{STATE}/run/center.sock",),
        secrets=(),
        runtime=(str(private / "project"),),
    )
    assert view.made("/tmp") == 0o1777 and view.made(STATE) == 0o755
    made = fence.MOUNT_PARENT_MODE
    assert view.made(str(tree)) == made and view.made(str(private)) == made
    assert view.made(f"{STATE}/run") == made and view.made(f"{STATE}/agents") == made
    assert view.made(str(private / "project")) is None and view.made("/usr") is None
    assert view.made(f"{STATE}/logs") is None  # under the cover, but nothing is bound there

    assert reach.unreachable(str(script), OTHER, NO_GROUPS, reach.READ) is None  # the host's
    # the fence's own directories (0711) let any uid through to what comes back
    assert reach.unreachable(str(script), OTHER, NO_GROUPS, reach.READ, view) is None
    assert reach.unreachable(f"{STATE}/run", OTHER, NO_GROUPS, reach.SEARCH, view) is None
    (private / "project").chmod(0o700)  # a bound directory is the host's: its mode decides
    stop = reach.unreachable(str(script), OTHER, NO_GROUPS, reach.READ, view)
    assert stop is not None and stop.path == str(private / "project"), stop
    stop = reach.unreachable("/tmp/not-bound/elsewhere.py", OTHER, NO_GROUPS, reach.READ, view)
    assert stop == reach.Blocked("/tmp/not-bound", "is hidden by the fence (under /tmp)")


@pytest.mark.skipif(os.geteuid() != 0, reason="a user = agent needs a root supervisor")
def test_check_reach_names_each_key_its_agents_the_user_and_the_path(tree: Path) -> None:
    import pwd

    from mcphost.settings import SettingError

    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody on this machine")
    private = tree / "private"
    script = private / "attach.py"
    private.mkdir()
    script.write_text("")
    script.chmod(0o644)
    private.chmod(0o700)

    def needs(state: str, fenced: bool) -> tuple[reach.Need, ...]:
        return (("the pump " + str(script), str(script), reach.READ),)

    fleet = a_fleet(
        {"id": "a1", "command": ("env",), "user": "root"},
        {"id": "a2", "command": ("env",)},
        {"id": "a3", "command": ("env",)},
        {"id": "a4", "command": ("env",), "sandbox": "auto"},
        defaults=AgentDefaults(client="command", sandbox="none", user="nobody"),
    )
    with pytest.raises(SettingError) as caught:
        reach.check_reach(fleet, STATE, needs)
    lines = caught.value.lines()
    assert len(lines) == 1, lines  # one key: defaults.user (a1's user is the supervisor's)
    assert lines[0].startswith(
        f"{fleet.path}: defaults.user is 'nobody' (uid 65534; agents: a2, a3, a4), who cannot "
    )
    blocked = f"{private} (mode 0700, owner uid 0) is not searchable by uid 65534"
    assert f"{blocked}, on the way to the pump {script}" in lines[0]
    # a4 is fenced: its /tmp is private, and the fence binds back only the supervisor's own
    assert f"{tree} is hidden by the fence (under /tmp), on the way to the pump" in lines[0]

    private.chmod(0o755)
    with pytest.raises(SettingError) as caught:
        reach.check_reach(fleet, STATE, needs)
    assert "(uid 65534; agents: a4)" in caught.value.lines()[0]
    fleet = a_fleet(
        *({"id": f"a{i}", "command": ("env",)} for i in (2, 3)), defaults=fleet.defaults
    )
    reach.check_reach(fleet, STATE, needs)


@pytest.mark.skipif(os.geteuid() != 0, reason="a user = agent needs a root supervisor")
def test_check_reach_asks_what_the_attach_entries_need_once_per_kind_not_per_agent() -> None:
    """The needs (the interpreter, its standard library, the pump, the sockets) are the same for
    every fenced agent and for every unfenced one: asked once each, however many agents."""
    import pwd

    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody on this machine")
    asked: list[bool] = []

    def needs(state: str, fenced: bool) -> tuple[reach.Need, ...]:
        asked.append(fenced)
        return (("the root", "/", reach.SEARCH),)

    fleet = a_fleet(
        *({"id": f"a{i}", "command": ("env",)} for i in range(20)),
        *({"id": f"f{i}", "command": ("env",), "sandbox": "auto"} for i in range(20)),
        defaults=AgentDefaults(client="command", sandbox="none", user="nobody"),
    )
    reach.check_reach(fleet, STATE, needs)
    assert sorted(asked) == [False, True], asked
