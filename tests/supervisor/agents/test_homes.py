"""Per-agent homes on a tmp state dir: modes, symlink refusal, the logs outside the home, the
held workspace (a swap of its path is never followed), the attach-only config (parses, holds no
secret, runs the real pump), an ACP agent's own servers preapproved and its adapter's command,
and the scrubbed environment."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import stat
import sys
import tomllib
from pathlib import Path

import pytest

from configgen import attach_script
from mcphost.supervisor.agents.homes import (
    AttachPoints,
    HomeError,
    agent_argv,
    agent_env,
    hold_home,
    home_paths,
    npm_platform,
    prepare_home,
)
from mcphost.supervisor.plan import AgentDefaults, AgentPlan, plan_from_center

TOKEN = "acat_" + "T0k3n" * 8


def plan(agent_id: str = "agent-7f3a", **changes: object) -> AgentPlan:
    return dataclasses.replace(plan_from_center(AgentDefaults(), agent_id), **changes)  # type: ignore[arg-type]


def points(state: Path, relay: bool = True) -> AttachPoints:
    return AttachPoints(
        interpreter=sys.executable,
        script=attach_script(),
        center_socket=str(state / "run" / "center.sock"),
        relay_socket=str(state / "run" / "relay.sock") if relay else None,
    )


def mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    root = tmp_path / "state"
    root.mkdir(mode=0o700)
    return root


def test_layout_and_modes(state: Path) -> None:
    home = prepare_home(str(state), plan(), points(state))
    assert home == home_paths(str(state), "agent-7f3a", "claude")
    assert home.root == str(state / "agents" / "agent-7f3a")
    # the logs are the supervisor's, outside the home the agent owns
    assert home.logs == str(state / "logs" / "agent-7f3a")
    for directory in (home.root, home.workspace, home.logs, str(state / "agents")):
        assert os.path.isdir(directory) and mode(directory) == 0o700
    assert mode(str(state / "logs")) == 0o700
    assert home.mcp_config == os.path.join(home.root, "mcp.json")
    assert mode(home.mcp_config) == 0o600 and home.codex_home is None
    assert prepare_home(str(state), plan(), points(state)) == home  # idempotent
    # no temp left; `.claude` holds its settings (its own tools preapproved)
    assert sorted(os.listdir(home.root)) == [".claude", "mcp.json", "workspace"]


def test_claude_config_is_attach_only_and_runs_the_real_pump(state: Path) -> None:
    home = prepare_home(str(state), plan(bundle="party"), points(state))
    doc = json.loads(Path(home.mcp_config).read_text())
    servers = doc["mcpServers"]
    assert set(servers) == {"agent-center", "agentmux"}
    for name, sock in (("agent-center", "center.sock"), ("agentmux", "relay.sock")):
        entry = servers[name]
        assert entry["command"] == sys.executable
        assert entry["args"] == ["-I", "-S", attach_script(), str(state / "run" / sock)]
        assert entry["env"] == {"MCPHOST_CONFIGGEN": "1"}
    assert os.path.isfile(servers["agent-center"]["args"][2])


def test_relay_entry_only_with_bundle_and_socket(state: Path) -> None:
    servers = json.loads(
        Path(prepare_home(str(state), plan(), points(state)).mcp_config).read_text()
    )["mcpServers"]
    assert set(servers) == {"agent-center"}
    home = prepare_home(str(state), plan("b", bundle="party"), points(state, relay=False))
    assert set(json.loads(Path(home.mcp_config).read_text())["mcpServers"]) == {"agent-center"}
    # a bundle removed on reload removes the entry (the file is rewritten, not merged)
    prepare_home(str(state), plan("c", bundle="party"), points(state))
    home = prepare_home(str(state), plan("c"), points(state))
    assert set(json.loads(Path(home.mcp_config).read_text())["mcpServers"]) == {"agent-center"}


def test_codex_config_under_codex_home(state: Path) -> None:
    home = prepare_home(str(state), plan(client="codex", bundle="party"), points(state))
    assert home.codex_home == os.path.join(home.root, "codex")
    assert home.mcp_config == os.path.join(home.codex_home, "config.toml")
    assert mode(home.codex_home) == 0o700 and mode(home.mcp_config) == 0o600
    doc = tomllib.loads(Path(home.mcp_config).read_text())
    entry = doc["mcp_servers"]["agent-center"]
    assert entry["command"] == sys.executable and entry["env"] == {"MCPHOST_CONFIGGEN": "1"}
    assert entry["args"][:3] == ["-I", "-S", attach_script()]
    assert "agentmux" in doc["mcp_servers"]
    assert not os.path.exists(os.path.join(home.root, "mcp.json"))


def test_a_codex_agent_s_base_url_reaches_codex_as_its_own_setting(state: Path) -> None:
    """Codex 0.171 ignores OPENAI_BASE_URL: the address a codex agent's `env` gives becomes the
    config's top-level `openai_base_url` (test_fenced_codex.py shows the real Codex use it);
    a claude agent's config, or a codex agent without it, carries no such key."""
    url = "http://127.0.0.1:8788/v1"
    codex = plan(client="codex", bundle="party", env=(("OPENAI_BASE_URL", url),))
    doc = tomllib.loads(Path(prepare_home(str(state), codex, points(state)).mcp_config).read_text())
    assert doc["openai_base_url"] == url
    assert set(doc["mcp_servers"]) == {"agent-center", "agentmux"}
    bare = prepare_home(str(state), plan("b", client="codex"), points(state))
    assert "openai_base_url" not in tomllib.loads(Path(bare.mcp_config).read_text())
    claude = prepare_home(str(state), plan("c", env=(("OPENAI_BASE_URL", url),)), points(state))
    assert url not in Path(claude.mcp_config).read_text()


def test_command_client_gets_claude_shaped_mcp_json(state: Path) -> None:
    home = prepare_home(str(state), plan(client="command", command=("x",)), points(state))
    assert "mcpServers" in json.loads(Path(home.mcp_config).read_text())


def test_no_secret_anywhere_in_the_home(state: Path) -> None:
    for agent in (plan("a", bundle="p"), plan("b", client="codex", bundle="p")):
        home = prepare_home(str(state), agent, points(state))
        for directory, _dirs, files in os.walk(home.root):
            for name in files:
                text = Path(directory, name).read_text()
                for forbidden in (TOKEN, "AC_MCP_", "TOKEN", "tcp://", "unix:", "token"):
                    assert forbidden not in text, (name, forbidden)


def test_wider_modes_are_narrowed(state: Path) -> None:
    home = prepare_home(str(state), plan(), points(state))
    for directory in (home.root, home.workspace, home.logs):
        os.chmod(directory, 0o755)
    os.chmod(home.mcp_config, 0o644)
    prepare_home(str(state), plan(), points(state))
    for directory in (home.root, home.workspace, home.logs):
        assert mode(directory) == 0o700
    assert mode(home.mcp_config) == 0o600


@pytest.mark.parametrize("where", ["root", "workspace", "logs", "codex", "agents"])
def test_a_symlinked_directory_is_refused(state: Path, tmp_path: Path, where: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    agent = plan(client="codex")
    paths = home_paths(str(state), agent.agent_id, agent.client)
    target = {
        "root": paths.root,
        "workspace": paths.workspace,
        "logs": paths.logs,
        "codex": paths.codex_home,
        "agents": os.path.dirname(paths.root),
    }[where]
    assert target is not None
    os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
    os.symlink(elsewhere, target)
    with pytest.raises(HomeError, match="is a symlink"):
        prepare_home(str(state), agent, points(state))
    assert os.listdir(elsewhere) == []  # nothing was written through it


def test_a_symlinked_config_is_refused(state: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    home = prepare_home(str(state), plan(), points(state))
    os.unlink(home.mcp_config)
    os.symlink(victim, home.mcp_config)
    with pytest.raises(HomeError, match="symlink"):
        prepare_home(str(state), plan(), points(state))
    assert victim.read_text() == "keep"


def test_a_file_where_the_home_belongs_is_refused(state: Path) -> None:
    (state / "agents").mkdir(mode=0o700)
    (state / "agents" / "agent-7f3a").write_text("")
    with pytest.raises(HomeError, match="not a directory"):
        prepare_home(str(state), plan(), points(state))


def _nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:  # pragma: no cover - every Linux has it
        pytest.skip("no user nobody")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_a_home_owned_by_a_stranger_is_refused(state: Path) -> None:
    home = prepare_home(str(state), plan(), points(state))
    os.chown(home.root, _nobody().pw_uid, -1)
    with pytest.raises(HomeError, match="belongs to uid"):
        prepare_home(str(state), plan(), points(state))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run an agent as another user")
def test_another_user_owns_what_the_agent_writes(state: Path) -> None:
    nobody = _nobody()
    home = prepare_home(str(state), plan(client="codex", user="nobody"), points(state))
    for path in (home.root, home.workspace, home.codex_home, home.mcp_config):
        assert path is not None and os.lstat(path).st_uid == nobody.pw_uid
    assert os.lstat(home.logs).st_uid == os.geteuid()
    assert mode(str(state / "agents")) == 0o711
    prepare_home(str(state), plan("other"), points(state))  # keeps the traversable mode
    assert mode(str(state / "agents")) == 0o711
    with pytest.raises(HomeError, match="does not exist"):
        prepare_home(str(state), plan("x", user="no-such-user-here"), points(state))


def test_agent_env_scrubs_and_adds(state: Path) -> None:
    base = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "AC_MCP_WORKER_TOKEN": TOKEN,
        "AC_MCP_WORKER_TOKEN_FILE": "/etc/mcphost/worker.token",
        "AC_MCP_ADMIN_URL": "tcp://center.example:8443",
        "MCPHOST_FLEET": "/etc/mcphost/fleet.toml",
        "MCPHOST_CENTER__TOKEN_FILE": "/etc/mcphost/worker.token",
        "AGENTMUX_BUNDLE": "party",
        "NOTIFY_SOCKET": "/run/systemd/notify",
        "LISTEN_FDS": "1",
        "WATCHDOG_USEC": "1000",
        "CODEX_HOME": "/root/.codex",
    }
    agent = plan(env=(("FOO", "bar"),), sandbox="none")
    home = home_paths(str(state), agent.agent_id, agent.client)
    env = agent_env(base, agent, home)
    assert env == {"PATH": "/usr/bin", "HOME": "/root", "FOO": "bar", "CODEX_HOME": "/root/.codex"}
    # Fenced (the default), the supervisor's HOME would be read-only: the agent's home is HOME,
    # unless its fleet entry gives one.
    assert agent_env(base, plan(), home)["HOME"] == home.root
    assert agent_env(base, plan(env=(("HOME", "/srv/a"),)), home)["HOME"] == "/srv/a"
    codex = plan(client="codex")
    codex_home = home_paths(str(state), codex.agent_id, codex.client)
    env = agent_env(base, codex, codex_home)
    assert env["CODEX_HOME"] == codex_home.codex_home
    assert TOKEN not in "".join(f"{k}={v}" for k, v in env.items())
    assert base["AC_MCP_WORKER_TOKEN"] == TOKEN  # the base is not modified


def test_the_held_workspace_is_the_directory_made_not_what_its_path_becomes(
    state: Path, tmp_path: Path
) -> None:
    """W4/V11: the workspace is opened once, beneath the home; when the agent moves it away and
    plants a symlink in its place, the held descriptor (a session's root, a spawn's cwd) is
    still the directory made, and a walk beneath it never reaches what the symlink names."""
    from mcphost.admin.target import parse_target
    from mcphost.binding import AgentBinding
    from mcphost.errors import FileFailure
    from mcphost.host.workspace import HeldRoot, open_for_upload, walker

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret.txt").write_text("not the agent's")
    home, held = hold_home(str(state), plan(), points(state))
    try:
        made = os.stat(home.workspace)
        assert (os.fstat(held.fd).st_dev, os.fstat(held.fd).st_ino) == (made.st_dev, made.st_ino)
        os.rename(home.workspace, home.workspace + ".moved")
        os.symlink(elsewhere, home.workspace)
        assert os.stat(held.cwd).st_ino == made.st_ino  # what a spawn's chdir resolves to
        target = parse_target("unix:/nonexistent/admin.sock")
        binding = AgentBinding(agent_id="agent-7f3a", target=target, agent_root=home.workspace)
        root = HeldRoot(binding, held.dup())
        try:
            assert os.fstat(root.descriptor()).st_ino == made.st_ino
            with walker(binding, "secret.txt", root) as w, pytest.raises(FileFailure) as failure:
                open_for_upload(w)
            assert failure.value.code == "path_not_found"
        finally:
            root.close()
        with pytest.raises(FileFailure) as closed:  # closed: never reopened by its path
            root.descriptor()
        assert closed.value.code == "workspace_root_closed"
    finally:
        held.close()
    # preparing the home again refuses the symlink instead of holding what it names
    with pytest.raises(HomeError, match="is a symlink"):
        hold_home(str(state), plan(), points(state))


def test_a_codex_agent_with_an_api_key_gets_codex_s_api_key_sign_in(state: Path) -> None:
    """Issue 19: Codex's TUI reads its sign-in from CODEX_HOME, not from OPENAI_API_KEY; the
    key the fleet gave that codex agent is written as `codex login --with-api-key` writes it,
    0600 in its own home, and nowhere for any other agent."""
    key = "sk-standin-" + "k" * 20
    codex = plan(client="codex", env=(("OPENAI_API_KEY", key),))
    home = prepare_home(str(state), codex, points(state))
    assert home.codex_home is not None
    auth = os.path.join(home.codex_home, "auth.json")
    assert json.loads(Path(auth).read_text()) == {"auth_mode": "apikey", "OPENAI_API_KEY": key}
    assert mode(auth) == 0o600 and os.lstat(auth).st_uid == os.geteuid()
    # a rotated key is written again; the key never lands in the config
    rotated = dataclasses.replace(codex, env=(("OPENAI_API_KEY", key + "2"),))
    prepare_home(str(state), rotated, points(state))
    assert json.loads(Path(auth).read_text())["OPENAI_API_KEY"] == key + "2"
    assert key not in Path(home.mcp_config).read_text()
    # no key, or not codex: no auth.json
    bare = prepare_home(str(state), plan("b", client="codex"), points(state))
    assert bare.codex_home is not None
    assert not os.path.exists(os.path.join(bare.codex_home, "auth.json"))
    claude = prepare_home(str(state), plan("c", env=(("OPENAI_API_KEY", key),)), points(state))
    assert not os.path.exists(os.path.join(claude.root, "auth.json"))
    # an auth.json the agent planted as a symlink is refused, never followed
    os.unlink(auth)
    target = state / "elsewhere.json"
    os.symlink(target, auth)
    with pytest.raises(HomeError):
        prepare_home(str(state), codex, points(state))
    assert not target.exists()


def test_a_claude_agent_s_own_servers_are_preapproved_in_its_settings(state: Path) -> None:
    """A claude agent (its Claude Code's config in its home): `mcp__<server>` for each of
    its own attach entries in `permissions.allow` of `<home>/.claude/settings.json`, 0600,
    merged into what the agent keeps there; no agent whose settings are not its own gets one."""
    acp = plan(runner="acp", bundle="party")
    home = prepare_home(str(state), acp, points(state))
    settings = os.path.join(home.root, ".claude", "settings.json")
    assert json.loads(Path(settings).read_text()) == {
        "permissions": {"allow": ["mcp__agent-center", "mcp__agentmux"]}
    }
    assert mode(settings) == 0o600 and mode(os.path.dirname(settings)) == 0o700
    # the agent's own settings stay, its rules too, ours once
    own = {"model": "x", "permissions": {"allow": ["Read", "mcp__agentmux"], "deny": ["Bash"]}}
    Path(settings).write_text(json.dumps(own))
    prepare_home(str(state), acp, points(state))
    assert json.loads(Path(settings).read_text()) == {
        "model": "x",
        "permissions": {"allow": ["Read", "mcp__agentmux", "mcp__agent-center"], "deny": ["Bash"]},
    }
    Path(settings).write_text("not json")
    prepare_home(str(state), acp, points(state))
    assert json.loads(Path(settings).read_text())["permissions"]["allow"] == [
        "mcp__agent-center",
        "mcp__agentmux",
    ]
    # a settings file the agent planted as a symlink is refused, never followed
    os.unlink(settings)
    target = state / "elsewhere.json"
    os.symlink(target, settings)
    with pytest.raises(HomeError):
        prepare_home(str(state), acp, points(state))
    assert not target.exists()
    # a tmux agent too: it runs unattended, never stopped at a prompt for its own tools
    tmux = prepare_home(str(state), plan("t", bundle="party"), points(state))
    assert json.loads(Path(tmux.root, ".claude", "settings.json").read_text()) == {
        "permissions": {"allow": ["mcp__agent-center", "mcp__agentmux"]}
    }
    # a HOME of its own, unfenced, or not a claude agent: nothing written
    for other in (
        plan("c", runner="acp", bundle="party", env=(("HOME", "/elsewhere"),)),
        plan("e", client="command", command=("x",), bundle="party"),
        plan("d", runner="acp", bundle="party", sandbox="none"),
    ):
        other_home = prepare_home(str(state), other, points(state))
        assert not os.path.exists(os.path.join(other_home.root, ".claude", "settings.json"))


def test_a_codex_agent_s_own_servers_are_preapproved_in_its_config(state: Path) -> None:
    """ACP or tmux, a codex agent's own entries run without asking (a tmux agent unattended)."""
    for agent in (
        plan(client="codex", runner="acp", bundle="p"),
        plan("b", client="codex", bundle="p"),
    ):
        home = prepare_home(str(state), agent, points(state))
        servers = tomllib.loads(Path(home.mcp_config).read_text())["mcp_servers"]
        assert {name: entry["default_tools_approval_mode"] for name, entry in servers.items()} == {
            "agent-center": "approve",
            "agentmux": "approve",
        }
    command = prepare_home(str(state), plan("c", client="command", command=("x",)), points(state))
    assert "default_tools_approval_mode" not in Path(command.mcp_config).read_text()


def test_the_default_claude_command_preapproves_its_own_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unfenced claude agent's settings are the operator's (never written): the default
    command itself allows exactly the agent's own servers' tools."""
    monkeypatch.setenv("PATH", str(tmp_path))
    for agent, rules in (
        (plan(sandbox="none", command=None), "mcp__agent-center"),
        (plan(bundle="p", command=None), "mcp__agent-center,mcp__agentmux"),
    ):
        home = home_paths(str(tmp_path), agent.agent_id, agent.client)
        assert agent_argv(agent, home) == [
            "claude", "--mcp-config", home.mcp_config, "--strict-mcp-config", "--allowedTools", rules,
        ]  # fmt: skip


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_an_acp_agent_runs_its_client_s_adapter_codex_s_binary_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`runner = "acp"` without a command: the client's ACP adapter found on PATH; for codex
    the platform binary its node wrapper would run (which forwards no signal), beside the
    wrapper or in the package's layout, else the wrapper."""
    scope = tmp_path / "node_modules" / "@zed-industries"
    bin_dir = tmp_path / "node_modules" / ".bin"
    native = f"codex-acp-{npm_platform()}"
    wrapper = _executable(scope / "codex-acp" / "bin" / "codex-acp.js")
    _executable(scope / "claude-code-acp" / "dist" / "index.js")
    bin_dir.mkdir(parents=True)
    (bin_dir / "codex-acp").symlink_to("../@zed-industries/codex-acp/bin/codex-acp.js")
    (bin_dir / "claude-code-acp").symlink_to("../@zed-industries/claude-code-acp/dist/index.js")
    monkeypatch.setenv("PATH", str(bin_dir))
    claude = plan(runner="acp", bundle="p", command=None)
    assert agent_argv(claude, home_paths(str(tmp_path), claude.agent_id, "claude")) == [
        str(bin_dir / "claude-code-acp")
    ]
    codex = plan(client="codex", runner="acp", bundle="p", command=None)
    home = home_paths(str(tmp_path), codex.agent_id, "codex")
    assert agent_argv(codex, home) == [str(bin_dir / "codex-acp")]  # no binary: the wrapper
    nested = _executable(
        wrapper.parents[1] / "node_modules" / scope.name / native / "bin" / "codex-acp"
    )
    assert agent_argv(codex, home) == [str(nested)]  # a global install's layout
    sibling = _executable(scope / native / "bin" / "codex-acp")
    assert agent_argv(codex, home) == [str(sibling)]
    (bin_dir / native).symlink_to(f"../@zed-industries/{native}/bin/codex-acp")
    assert agent_argv(codex, home) == [str(bin_dir / native)]  # npm's own link, beside
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert agent_argv(codex, home) == ["codex-acp"]  # not found: bare, the spawn names it


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a home to another uid needs root")
def test_a_home_of_the_supervisors_uid_is_handed_whole_to_the_agents_own_uid_and_back(
    state: Path, tmp_path: Path
) -> None:
    """A home an agent of the supervisor's own uid used becomes its own uid's on the first
    preparation with one (uids.py), all it holds included, never a symlink's target nor a file
    with a hard link elsewhere; `reclaim_home` gives it back when the agent leaves the fleet."""
    from mcphost.supervisor.agents.homes import reclaim_home

    before = prepare_home(str(state), plan(), points(state))
    workspace = Path(before.workspace)
    (workspace / "notes").mkdir()
    (workspace / "notes" / "a.txt").write_text("mine\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("the host's\n")
    os.link(outside, workspace / "linked.txt")  # a hard link planted while it was root's
    (workspace / "to-outside").symlink_to(outside)
    own = 1879048200
    home = prepare_home(str(state), plan(uid=own), points(state))
    owned = [Path(home.root), workspace, workspace / "notes", workspace / "notes" / "a.txt"]
    owned.append(Path(home.mcp_config))
    assert {p.lstat().st_uid for p in owned} == {own}
    assert (workspace / "to-outside").lstat().st_uid == own  # the link itself
    assert outside.stat().st_uid == 0  # neither its target nor the hard-linked file
    reclaim_home(str(state), "agent-7f3a")
    assert {p.lstat().st_uid for p in owned} == {0}
    reclaim_home(str(state), "never-there")  # nothing to do
