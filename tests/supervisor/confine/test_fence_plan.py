"""Unit tests of the fence's pure plan (mcphost/supervisor/confine/fence.py `plan`, `FencePlan.argv`,
`resolve`), and of that plan as `for_agent` fills it from what a machine offers (probe.py
`Support`: confine/test_probe.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcphost.gate import Switch
from mcphost.supervisor.confine import fence
from mcphost.supervisor.confine.fence import FencePlan, plan
from mcphost.supervisor.confine.probe import Support, nobody_uid

STATE = "/var/lib/mcphost"
HOME = f"{STATE}/agents/a1"
WORK = f"{HOME}/workspace"
SOCKETS = (f"{STATE}/run/center.sock", f"{STATE}/run/relay.sock")


def planned(**kw: object) -> FencePlan:
    args: dict[str, object] = {
        "state_dir": STATE,
        "home": HOME,
        "workspace": WORK,
        "sockets": SOCKETS,
        "secrets": (),
    }
    args.update(kw)
    return plan(**args)  # type: ignore[arg-type]


def pairs(argv: list[str], flag: str) -> list[str]:
    """The first operand of every `flag` in a bwrap command line."""
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def test_the_state_and_run_are_covered_and_only_the_home_and_attach_sockets_come_back() -> None:
    got = planned(secrets=("/etc/mcphost/token", "/etc/mcphost/fleet.toml"))
    assert set(got.covers) == {STATE, "/run", "/etc/mcphost", fence.CGROUPS}
    assert set(got.keeps) == {HOME, *SOCKETS}
    assert got.chdir == WORK
    assert got.private == ("/tmp", "/var/tmp", "/dev/shm")


def test_a_secrets_directory_is_hidden_whole_so_a_file_renamed_into_it_never_shows() -> None:
    # a rotation renames a new file over token_file: the whole directory is covered, not the
    # inode of the file that was there when the agent started
    got = planned(secrets=("/srv/worker/token",))
    assert "/srv/worker" in got.covers
    argv = got.argv(["true"])
    assert "/srv/worker" in pairs(argv, "--tmpfs") and "/srv/worker" in pairs(argv, "--remount-ro")
    assert not got.visible("/srv/worker/token") and not got.visible("/srv/worker/new-token")


def test_a_system_directory_holding_a_secret_comes_back_entry_by_entry_without_it() -> None:
    got = planned(
        secrets=("/etc/worker.token",),
        siblings={"/etc": ("passwd", "worker.token", "ssl")},
    )
    assert "/etc" in got.covers
    assert {"/etc/passwd", "/etc/ssl"} <= set(got.readonly)
    assert "/etc/worker.token" not in got.readonly and not got.visible("/etc/worker.token")
    assert got.visible("/etc/passwd")


def test_the_resolver_directory_under_run_comes_back_read_only() -> None:
    got = planned(resolver="/run/systemd/resolve")
    assert "/run/systemd/resolve" in got.readonly
    assert not got.visible("/run/dbus/system_bus_socket")
    assert "/etc" not in planned(resolver="/etc").readonly


def test_a_state_under_tmp_is_hidden_by_the_private_tmp_and_the_home_comes_back() -> None:
    state = "/tmp/sv"
    got = plan(
        state_dir=state,
        home=f"{state}/agents/a1",
        workspace=f"{state}/agents/a1/workspace",
        sockets=(f"{state}/run/center.sock",),
        secrets=("/tmp/base/token", f"{state}/token"),
        given=("/tmp/homes/claude", f"{state}/agents/other"),  # the latter: not the agent's
    )
    assert state not in got.covers and "/tmp/base" not in got.covers  # /tmp is private
    assert set(got.keeps) == {f"{state}/agents/a1", f"{state}/run/center.sock", "/tmp/homes/claude"}
    assert f"{state}/agents/other" not in got.sources()
    argv = got.argv(["true"])
    # the private tmpfs first, then what comes back: a bind made before it would be hidden
    assert argv.index("/tmp") < argv.index(f"{state}/agents/a1")


def test_fleet_given_paths_inside_the_home_are_not_bound_again() -> None:
    # CLAUDE_CONFIG_DIR inside HOME: one bind of HOME, so a symlink the agent puts at
    # CLAUDE_CONFIG_DIR is never a bind source
    got = planned(given=("/srv/a1", "/srv/a1/.claude", f"{HOME}/.claude"))
    assert got.given == ("/srv/a1",)
    assert "/srv/a1/.claude" not in got.sources() and f"{HOME}/.claude" not in got.sources()


def test_a_bound_symlink_is_refused_before_bubblewrap_could_follow_it(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "given").symlink_to("/")
    got = planned(given=(str(tmp_path / "given"),))
    with pytest.raises(OSError, match="symlink"):
        fence.check_sources(got)
    fine = planned(given=(str(tmp_path / "real"),))
    fence.check_sources(fine)


def test_the_command_line_drops_every_capability_and_runs_in_its_own_namespaces() -> None:
    argv = planned().argv(["claude", "-p", "hi"], bwrap="/usr/bin/bwrap")
    assert argv[0] == "/usr/bin/bwrap" and argv[-3:] == ["claude", "-p", "hi"]
    for flag in ("--unshare-pid", "--unshare-ipc", "--cap-drop"):
        assert flag in argv
    assert pairs(argv, "--cap-drop") == ["ALL"] and "--cap-add" not in argv
    assert pairs(argv, "--ro-bind")[0] == "/" and pairs(argv, "--dev") == ["/dev"]
    assert pairs(argv, "--proc") == ["/proc"] and pairs(argv, "--chdir") == [WORK]
    assert set(pairs(argv, "--unsetenv")) >= {"TMUX", "TMUX_PANE", "DBUS_SESSION_BUS_ADDRESS"}
    assert "--unshare-user" not in argv
    sizes = pairs(argv, "--size")
    assert sizes.count(str(fence.DEFAULT_TMP_SIZE)) == 3  # /tmp, /var/tmp, /dev/shm bounded


def test_a_uid_0_agent_is_mapped_and_a_user_agent_is_switched_inside() -> None:
    mapped = planned(map_uid=65534).argv(["x"])
    assert pairs(mapped, "--unshare-user") == ["--uid"] and pairs(mapped, "--uid") == ["65534"]
    switched = planned(switch=Switch(1001, 1002, (1002, 27))).argv(["x"], setpriv="/sp")
    assert set(pairs(switched, "--cap-add")) == {"CAP_SETUID", "CAP_SETGID", "CAP_DAC_READ_SEARCH"}
    tail = switched[switched.index("--") + 1 :]
    assert tail[0] == "/sp" and "--reuid=1001" in tail and "--groups=1002,27" in tail
    assert tail[-1] == "x"


def test_the_tmp_size_is_the_fleets() -> None:
    argv = planned(tmp_size=8 << 20).argv(["x"])
    assert pairs(argv, "--size").count(str(8 << 20)) == 3


def test_the_plan_round_trips_through_json() -> None:
    got = planned(secrets=("/t/x",), switch=Switch(5, 6, (6,)), map_uid=None)
    assert FencePlan.from_json(got.to_json()) == got


def test_the_program_is_found_as_the_fenced_agent_will_find_it(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden-bin"
    hidden.mkdir()
    tool = hidden / "mytool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    got = planned(secrets=(str(hidden / "token"),))  # its directory is hidden
    assert fence.resolve(got, "sh", "/usr/bin:/bin") in ("/usr/bin/sh", "/bin/sh")
    with pytest.raises(FileNotFoundError, match="hidden by the fence") as caught:
        fence.resolve(got, "mytool", f"{hidden}:/usr/bin")
    assert str(hidden) in str(caught.value)
    with pytest.raises(FileNotFoundError, match="not there inside"):
        fence.resolve(got, str(tool), "/usr/bin")
    assert fence.resolve(got, "./run.sh", "/usr/bin") == "./run.sh"  # the workspace's own
    assert fence.resolve(planned(), "/bin/sh", "") == "/bin/sh"


def test_the_operators_home_is_hidden_and_what_the_agent_needs_from_it_comes_back() -> None:
    # the supervisor's user's sign-ins, keys and history; its interpreter (pyenv) and a
    # fleet-given HOME beneath it come back
    got = planned(
        operator_home="/root",
        runtime=("/root/.pyenv/versions/3.11.7",),
        given=("/root/agents/a1",),
    )
    assert "/root" in got.covers
    assert not got.visible("/root/.ssh/id_ed25519") and not got.visible("/root/.claude.json")
    assert "/root/.pyenv/versions/3.11.7" in got.readonly
    assert "/root/agents/a1" in got.keeps
    assert "/home" not in planned(operator_home="/home").covers  # a system directory: never


def test_a_root_agent_sees_root_only_files_as_empty_devices() -> None:
    root = planned(root_agent=True, root_only=("/etc/shadow", "/etc/ssh/ssh_host_ed25519_key"))
    argv = root.argv(["x"])
    assert root.blanks == ("/etc/shadow", "/etc/ssh/ssh_host_ed25519_key")
    assert pairs(argv, "--ro-bind-try") == ["/dev/null", "/dev/null"]
    assert argv[argv.index("/etc/shadow") - 2] == "--ro-bind-try"
    assert planned(root_agent=False, root_only=("/etc/shadow",)).blanks == ()


V1_OWN = tuple(
    f"/sys/fs/cgroup/{c}/system.slice/mcphost-0123456789ab/agent-a1" for c in ("memory", "pids")
)
V2_OWN = ("/sys/fs/cgroup/system.slice/mcphost.service/mcphost-0123456789ab/agent-a1",)


@pytest.mark.parametrize("own", [V1_OWN, V2_OWN], ids=["v1", "v2"])
def test_the_cgroups_are_hidden_and_only_the_agent_s_own_groups_come_back_read_only(
    own: tuple[str, ...],
) -> None:
    # issue 32: /sys is bound whole, so every agent listed its peers' groups and read their
    # memory, process and CPU figures
    got = planned(cgroups=own)
    assert fence.CGROUPS in got.covers
    assert set(own) <= set(got.readonly) and not set(own) & set(got.keeps)
    for group in own:
        peer = os.path.join(os.path.dirname(group), "agent-peer")
        assert got.visible(f"{group}/memory.current")
        assert not got.visible(peer) and not got.visible(f"{peer}/cgroup.procs")
        # the host's groups: the parent of the instance (the supervisor's) and the root
        assert not got.visible(f"{os.path.dirname(os.path.dirname(group))}/cgroup.procs")
    assert not got.visible("/sys/fs/cgroup/cgroup.procs")
    argv = got.argv(["agent"])
    assert fence.CGROUPS in pairs(argv, "--tmpfs") and fence.CGROUPS in pairs(argv, "--remount-ro")
    assert set(own) <= set(pairs(argv, "--ro-bind")) and not set(own) & set(pairs(argv, "--bind"))
    # the parents of the groups are made inside the cover, listing nothing
    parent = os.path.dirname(own[0])
    assert got.made(parent) == fence.MOUNT_PARENT_MODE


def test_without_groups_of_its_own_an_agent_sees_no_cgroup_at_all() -> None:
    got = planned()
    assert fence.CGROUPS in got.covers
    assert not any(p.startswith(fence.CGROUPS) for p in got.readonly)
    assert not got.visible("/sys/fs/cgroup/memory/memory.usage_in_bytes")
    assert got.visible("/sys/kernel/mm")  # the rest of /sys stays as it was
    # a path outside the hierarchies is never bound back as a group
    assert "/etc/passwd" not in planned(cgroups=("/etc/passwd",)).readonly


def test_every_directory_the_operator_s_sign_in_is_read_from_is_hidden_whole() -> None:
    # issue 32: CLAUDE_CONFIG_DIR and CODEX_HOME outside the operator's home were readable
    got = planned(operator_home="/root", signin=("/srv/ops/claude", "/srv/ops/codex"))
    assert {"/root", "/srv/ops/claude", "/srv/ops/codex"} <= set(got.covers)
    for secret in ("claude/.credentials.json", "claude/.claude.json", "codex/auth.json"):
        assert not got.visible(f"/srv/ops/{secret}")
    assert not got.visible("/srv/ops/claude/renamed-in-later")  # the whole directory
    assert got.visible("/srv/ops/other")
    # a system directory is never hidden whole (nor a relative one planned at all)
    assert "/home" not in planned(signin=("/home",)).covers
    assert not {"claude", "/"} & set(planned(signin=("claude", "/")).covers)


EPERM = "unshare: Operation not permitted"
SWITCH = Switch(uid=1234, gid=1234, groups=())


@pytest.mark.parametrize(
    ("support", "switch", "mapped"),
    [
        pytest.param(Support(7, True, root=True), None, True, id="root-userns"),
        pytest.param(Support(7, False, EPERM, root=True), None, False, id="root-no-userns"),
        pytest.param(Support(0, True, root=True), SWITCH, False, id="root-user-switch"),
        pytest.param(
            Support(0, False, EPERM, root=True), SWITCH, False, id="root-user-switch-no-userns"
        ),
        pytest.param(Support(7, True, root=False), None, False, id="unprivileged"),
    ],
)
def test_a_uid0_agent_gets_a_user_namespace_of_its_own_only_where_one_can_be_made(
    support: Support, switch: Switch | None, mapped: bool
) -> None:
    """Root's agent without `user =` is seen as nobody inside (so its own sandbox can map its
    uid); without user namespaces it stays uid 0 with no capability, and bubblewrap is given no
    `--unshare-user` it could not honour. Everything else about the fence is the same."""
    state, home = "/var/lib/mcphost", "/var/lib/mcphost/agents/a1"
    got = fence.for_agent(
        state_dir=state,
        home=home,
        workspace=f"{home}/workspace",
        sockets=(f"{state}/run/center.sock",),
        secrets=("/etc/mcphost/worker.token",),
        env={},
        switch=switch,
        pump="/opt/mcphost/mcphost/attach.py",
        support=support,
    )
    assert got.plan.map_uid == (nobody_uid() if mapped else None)
    assert support.agent_map_uid(switch) == got.plan.map_uid
    argv = got.plan.argv(["agent"], bwrap="bwrap", setpriv="setpriv")
    assert ("--unshare-user" in argv) is mapped
    # a `user =` agent: switched before bubblewrap where an unprivileged user may make user
    # namespaces (its bubblewrap then runs as that user), else by setpriv inside root's
    inside = switch is not None and not support.unprivileged_userns()
    assert ("setpriv" in argv) is inside
    assert got.switch_outside is (switch is not None and support.unprivileged_userns())
    assert got.level == got.name == support.level() and got.abi == support.landlock_abi
    assert {state, "/etc/mcphost", "/run"} <= set(got.plan.covers), got.plan.covers


def vendor_home(root: Path) -> Path:
    """An operator's home with the agents' programs where their vendors put them: Claude Code's
    native installer (`~/.local/bin/claude` -> a version file), an npm user prefix holding
    Codex's package (a node script whose `#!` asks for `node` on PATH, nvm's node under the
    home), Codex's standalone binary, and one copied into the Codex sign-in directory."""
    home = root / "home"
    versions = home / ".local" / "share" / "claude" / "versions"
    versions.mkdir(parents=True)
    (versions / "2.1.0").write_text("ELF")
    (versions / "2.1.0").chmod(0o755)
    (home / ".local" / "bin").mkdir()
    (home / ".local" / "bin" / "claude").symlink_to(versions / "2.1.0")
    package = home / ".npm-global" / "lib" / "node_modules" / "@openai" / "codex"
    (package / "bin").mkdir(parents=True)
    (package / "bin" / "codex.js").write_text("#!/usr/bin/env node\n")
    (package / "bin" / "codex.js").chmod(0o755)
    (package / "package.json").write_text('{"name": "@openai/codex"}\n')
    (home / ".npm-global" / "bin").mkdir()
    (home / ".npm-global" / "bin" / "codex").symlink_to(
        "../lib/node_modules/@openai/codex/bin/codex.js"
    )
    node = home / ".nvm" / "versions" / "node" / "v22" / "bin"
    node.mkdir(parents=True)
    (node / "node").write_text("ELF")
    (node / "node").chmod(0o755)
    (home / "bin").mkdir()
    (home / "bin" / "codex").write_text("ELF")
    (home / "bin" / "codex").chmod(0o755)
    (home / ".codex" / "bin").mkdir(parents=True)
    (home / ".codex" / "bin" / "codex").write_text("ELF")
    (home / ".codex" / "bin" / "codex").chmod(0o755)
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text("key")
    return home


def test_each_vendor_s_install_comes_to_one_tree(tmp_path: Path) -> None:
    home = vendor_home(tmp_path)
    node_bin = home / ".nvm" / "versions" / "node" / "v22" / "bin"
    path = f"{home}/.local/bin:{home}/.npm-global/bin:{node_bin}:/usr/bin:/bin"
    native = home / ".local" / "share" / "claude" / "versions" / "2.1.0"
    assert fence.install_trees("claude", path) == (str(native),)
    assert fence.install_trees(str(home / ".local/bin/claude"), "") == (str(native),)
    package = home / ".npm-global" / "lib" / "node_modules" / "@openai" / "codex"
    env = "/usr/bin/env" if os.path.exists("/usr/bin/env") else "/bin/env"
    assert fence.install_trees("codex", path) == (str(package), env, str(node_bin / "node"))
    assert fence.install_trees(str(home / "bin" / "codex"), "") == (str(home / "bin" / "codex"),)
    assert fence.install_trees("no-such-program", path) == ()


def test_no_link_an_agent_could_plant_is_followed_to_an_install_tree(tmp_path: Path) -> None:
    """A link found where agents write (the state directory, a fleet-given path, /tmp), or
    passed on the way, leads nowhere: `<agent home>/bin/claude` -> `~/.ssh/id_ed25519` must
    not bring the key into the fence; nor does a link to a file that is not executable."""
    home = vendor_home(tmp_path)
    state = tmp_path / "state"
    planted = state / "agents" / "a1" / "bin"
    planted.mkdir(parents=True)
    (planted / "claude").symlink_to(home / ".ssh" / "id_ed25519")
    (planted / "codex").symlink_to(home / "bin" / "codex")  # executable: still the agent's link
    untrusted = (str(state),)
    for name in ("claude", "codex"):
        assert fence.install_trees(name, str(planted), untrusted=untrusted) == ()
        assert fence.install_trees(str(planted / name), "", untrusted=untrusted) == ()
    # an operator's link that passes through an agent's directory: not followed either
    (home / ".local" / "bin" / "via-agent").symlink_to(planted / "codex")
    assert fence.install_trees(str(home / ".local/bin/via-agent"), "", untrusted=untrusted) == ()
    # the operator's own link to a file that is not executable (a key): nothing
    (home / ".local" / "bin" / "key").symlink_to(home / ".ssh" / "id_ed25519")
    assert fence.install_trees(str(home / ".local/bin/key"), "") == ()


def test_an_install_tree_comes_back_read_only_from_the_operator_s_home_and_nothing_else(
    tmp_path: Path,
) -> None:
    home = vendor_home(tmp_path)
    native = str(home / ".local" / "share" / "claude" / "versions" / "2.1.0")
    package = str(home / ".npm-global" / "lib" / "node_modules" / "@openai" / "codex")
    inside_signin = str(home / ".codex" / "bin" / "codex")
    got = planned(
        operator_home=str(home),
        signin=(str(home), str(home / ".claude"), str(home / ".codex")),
        secrets=(str(home / "fleet" / "token"),),
        programs=(native, package, inside_signin, str(home), str(home / "fleet"), "/usr/bin/env"),
    )
    assert {native, package} == set(got.readonly) - {p for p in got.readonly if "home" not in p}
    assert not set(got.keeps) & {native, package}  # read-only, never writable
    for hidden in (".ssh/id_ed25519", ".claude/.credentials.json", ".codex/auth.json", ".bashrc"):
        assert not got.visible(str(home / hidden)), hidden
    assert not got.visible(inside_signin)  # within a sign-in directory: never
    assert not got.visible(str(home / "fleet" / "token"))
    assert not got.visible(str(home / ".local/share/claude/versions/2.0.9"))  # not its version
    # the agent execs the version file the hidden link leads to
    assert fence.resolve(got, "claude", f"{home}/.local/bin:/usr/bin") == native
    assert fence.resolve(got, str(home / ".local/bin/claude"), "/usr/bin") == native
    # a hidden link to a file visible anyway is not followed (a virtualenv's python would run
    # as the bare system one)
    (home / "venv-python").symlink_to("/bin/sh")
    with pytest.raises(FileNotFoundError):
        fence.resolve(got, str(home / "venv-python"), "/usr/bin")
    # outside an operator's home, a hidden place stays hidden (here: beside a secret)
    elsewhere = planned(secrets=("/srv/ops/token",), programs=("/srv/ops/claude",))
    assert not elsewhere.visible("/srv/ops/claude")
