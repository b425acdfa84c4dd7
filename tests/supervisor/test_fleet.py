"""The fleet file: the issue's example loads, every default is applied, reload equality holds, and
every bad file is refused naming the file and key, the value and what is expected."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from mcphost.admin.target import AdminTarget
from mcphost.settings import SettingError
from mcphost.supervisor.agents.homes import agent_argv, home_paths
from mcphost.supervisor.fleet import load_fleet
from mcphost.supervisor.plan import (
    BUNDLE_NAME_MAX,
    AgentDefaults,
    fleet_with_agents,
    plan_from_center,
)
from mcphost.supervisor.values import LISTEN_EXPECTED, Listen

PIN = "sha256:" + ":".join(["AB"] * 32)
CENTER = f"""
[center]
admin_url = "tcp://center.example:8443"
fingerprint = "{PIN}"
token_file = "/etc/mcphost/worker.token"
"""
ISSUE_EXAMPLE = (
    CENTER
    + """
[defaults]
client = "claude"
restart = "on-failure"
tier_tools = true

[[agent]]
id = "agent-7f3a"
command = ["claude", "--mcp-config", "{mcp_config}", "--strict-mcp-config", "-p", "Check your work queue."]
bundle = "party"
"""
)


def write(tmp_path: Path, text: str, name: str = "fleet.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def problems(path: str, **kwargs: object) -> list[str]:
    with pytest.raises(SettingError) as info:
        load_fleet(path, **kwargs)  # type: ignore[arg-type]
    return info.value.lines()


def test_the_issue_example_loads(tmp_path: Path) -> None:
    fleet = load_fleet(write(tmp_path, ISSUE_EXAMPLE))
    assert fleet.center.admin_url == AdminTarget(kind="tcp", host="center.example", port=8443)
    assert fleet.center.pins == (bytes([0xAB] * 32),)
    assert fleet.center.token_file == "/etc/mcphost/worker.token"
    assert fleet.center.fleet == "file" and fleet.center.poll_seconds == 30
    (plan,) = fleet.agents
    assert plan.agent_id == "agent-7f3a"
    assert plan.bundle == "party" and plan.client == "claude" and plan.tier_tools is True
    assert plan.command is not None and plan.command[2] == "{mcp_config}"


def test_every_default_is_applied(tmp_path: Path) -> None:
    fleet = load_fleet(
        write(
            tmp_path,
            CENTER + '[[agent]]\nid = "a"\n[[agent]]\nid = "b"\n'
            'client = "codex"\n[[agent]]\nid = "c"\nclient = "command"\n'
            'command = ["run"]\n',
        )
    )
    a, b, c = fleet.agents
    assert (a.client, a.restart, a.command, a.bundle, a.user, a.env) == (
        "claude",
        "on-failure",
        None,
        None,
        None,
        (),
    )
    assert (a.restart_delay, a.restart_max_delay, a.max_restarts, a.restart_window) == (
        1,
        60,
        5,
        60,
    )
    assert (a.stop_grace, a.log_max_bytes, a.log_keep) == (10, 1 << 20, 3)
    # tiering: configgen's per-client default (Claude Code and Codex: the full catalog)
    assert a.tier_tools is False and b.tier_tools is False and c.tier_tools is True


def test_agents_override_defaults_and_env_merges(tmp_path: Path) -> None:
    text = (
        CENTER
        + """
[defaults]
restart = "always"
max_restarts = 2
env = {A = "1", B = "2"}
bundle = "party"

[[agent]]
id = "one"
restart = "never"
env = {B = "3", C = "4"}

[[agent]]
id = "two"
bundle = "other"
"""
    )
    one, two = load_fleet(write(tmp_path, text)).agents
    assert one.restart == "never" and one.max_restarts == 2 and one.bundle == "party"
    assert one.env == (("A", "1"), ("B", "3"), ("C", "4"))
    assert two.restart == "always" and two.bundle == "other" and two.env == (("A", "1"), ("B", "2"))


def test_reload_equality(tmp_path: Path) -> None:
    path = write(tmp_path, ISSUE_EXAMPLE + '[[agent]]\nid = "b"\n')
    first, again = load_fleet(path), load_fleet(path)
    assert first == again and hash(first) == hash(again)
    write(tmp_path, ISSUE_EXAMPLE + '[[agent]]\nid = "b"\nrestart = "always"\n')
    changed = load_fleet(path)
    assert changed.agents[0] == first.agents[0]  # untouched
    assert changed.agents[1] != first.agents[1]  # restart


def test_env_and_flags_override_center_only(tmp_path: Path) -> None:
    path = write(tmp_path, CENTER)
    env = {
        "MCPHOST_CENTER__ADMIN_URL": "unix:/run/center.sock",
        "MCPHOST_CENTER__POLL_SECONDS": "5",
        "MCPHOST_FLEET": "/elsewhere.toml",  # the supervise command's, not ours
        "MCPHOST_DEFAULTS__CLIENT": "codex",  # ignored: only [center] is overridable
        "AC_MCP_AGENT_ID": "ignored",
    }
    fleet = load_fleet(path, env=env, cli={"center": {"poll_seconds": 7}})
    assert str(fleet.center.admin_url) == "unix:/run/center.sock"
    assert fleet.center.poll_seconds == 7
    assert fleet.defaults.client == "claude"
    lines = problems(path, env={"MCPHOST_CENTER__ADMIN_URL": "unix:rel"})
    assert lines == [
        "MCPHOST_CENTER__ADMIN_URL is 'unix:rel': expected unix:/absolute/path.sock or "
        "tcp://host:port"
    ]
    lines = problems(path, cli={"center": {"poll_seconds": -1}})
    assert lines[0].startswith("--center-poll-seconds is -1: expected a positive number")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('[[agent]]\nid = "a/b"\n', "{p}: agent[0].id is 'a/b': expected an ASCII letter"),
        ('[[agent]]\nid = ".."\n', "{p}: agent[0].id is '..': expected"),
        ('[[agent]]\nid = "-x"\n', "{p}: agent[0].id is '-x': expected"),
        ('[[agent]]\nid = "a b"\n', "{p}: agent[0].id is 'a b': expected"),
        ('[[agent]]\nbundle = "p"\n', "{p}: agent[0].id is not set: expected"),
        (
            '[[agent]]\nid = "a"\nrestart = "sometimes"\n',
            '{p}: agent[0].restart is \'sometimes\': expected "always", "on-failure" or "never"',
        ),
        ('[[agent]]\nid = "a"\nclient = "gemini"\n', "{p}: agent[0].client is 'gemini'"),
        ('[[agent]]\nid = "a"\nmax_restarts = true\n', "{p}: agent[0].max_restarts is True"),
        (
            '[[agent]]\nid = "a"\nstop_grace = 0\n',
            "{p}: agent[0].stop_grace is 0: expected a positive number of seconds",
        ),
        (
            '[[agent]]\nid = "a"\ncolour = "red"\n',
            "{p}: agent[0].colour is not one: expected a known key",
        ),
        (
            "[defaults]\nlog_max_bytes = 10\n",
            "{p}: defaults.log_max_bytes is 10: expected a whole number of bytes, at least 4096",
        ),
        (
            '[[agent]]\nid = "a"\ncommand = ["x", "{foo}"]\n',
            "{p}: agent[0].command[1] is '{{foo}}': expected only the placeholders {{mcp_config}}",
        ),
        (
            '[[agent]]\nid = "a"\ncommand = ["x", "a{"]\n',
            "{p}: agent[0].command[1] is 'a{{': expected no lone '{{' or '}}'",
        ),
        (
            '[[agent]]\nid = "a"\ncommand = ["x", "{home!r}"]\n',
            "{p}: agent[0].command[1] is '{{home!r}}': expected only the placeholders",
        ),
        (
            '[[agent]]\nid = "a"\ncommand = []\n',
            "{p}: agent[0].command is []: expected a non-empty list",
        ),
        ('[[agent]]\nid = "a"\ncommand = "claude -p hi"\n', "{p}: agent[0].command is 'claude"),
        (
            '[[agent]]\nid = "a"\nenv = {AC_MCP_WORKER_TOKEN = "x"}\n',
            "{p}: agent[0].env.AC_MCP_WORKER_TOKEN is 'AC_MCP_WORKER_TOKEN': expected",
        ),
        ('[[agent]]\nid = "a"\nenv = {MCPHOST_X = "x"}\n', "{p}: agent[0].env.MCPHOST_X is"),
        ('[defaults]\nenv = {AGENTMUX_BUNDLE = "x"}\n', "{p}: defaults.env.AGENTMUX_BUNDLE is"),
        ('[[agent]]\nid = "a"\nenv = {lower = "x"}\n', "{p}: agent[0].env.lower is 'lower'"),
        ('[[agent]]\nid = "a"\nenv = {A = 1}\n', "{p}: agent[0].env.A is 1: expected a string"),
        (
            '[[agent]]\nid = "a"\nbundle = ".."\n',
            "{p}: agent[0].bundle is '..': expected a bundle name",
        ),
        ('[[agent]]\nid = "a"\nuser = "x y"\n', "{p}: agent[0].user is 'x y': expected a user"),
        (
            '[[agent]]\nid = "a"\nclient = "command"\n',
            '{p}: agent[0].command is not set: expected a command: client = "command"',
        ),
        (
            '[[agent]]\nid = "a.b"\nbundle = "party"\n',
            "{p}: agent[0].id is 'a.b': expected with a bundle, the id is also the agent's relay "
            "session id",
        ),
        (
            '[[agent]]\nid = "a"\nclient = "codex"\nenv = {CODEX_HOME = "/x"}\n',
            "{p}: agent[0].env.CODEX_HOME is '/x': expected no CODEX_HOME",
        ),
        (
            '[[agent]]\nid = "a"\nrestart_delay = 10\nrestart_max_delay = 5\n',
            "{p}: agent[0].restart_max_delay is 5.0: expected at least restart_delay (10 s)",
        ),
        (
            "[surprise]\nx = 1\n",
            "{p}: surprise is not one: expected a known table: [center], [defaults], [[agent]]",
        ),
        (  # a DEL made the generated coders.toml unreadable for every bundle (issue #18)
            '[[agent]]\nid = "a"\ncommand = ["x", "a\\u007fb"]\n',
            "{p}: agent[0].command[1] is 'a\\x7fb': expected no control characters",
        ),
        (
            '[defaults]\ncommand = ["x", "\\u001b[2J", "{{mcp_config}}"]\n',
            "{p}: defaults.command[1] is '\\x1b[2J': expected no control characters",
        ),
        (
            '[[agent]]\nid = "a"\ncommand = ["x", "\\u0085"]\n',
            "{p}: agent[0].command[1] is '\\x85': expected no control characters",
        ),
        (  # a 300-character bundle once failed the relay write (ENAMETOOLONG) mid-reload
            f'[[agent]]\nid = "a"\nbundle = "{"b" * 300}"\n',
            "{p}: agent[0].bundle is 'bbbb",
        ),
    ],
)
def test_bad_agent_entries_are_named(tmp_path: Path, body: str, expected: str) -> None:
    path = write(tmp_path, CENTER + body)
    lines = problems(path)
    assert any(line.startswith(expected.format(p=path)) for line in lines), lines


def test_names_that_become_paths_are_bounded_and_scripts_keep_their_whitespace(
    tmp_path: Path,
) -> None:
    longest = "b" * BUNDLE_NAME_MAX
    path = write(
        tmp_path,
        CENTER
        + f'[[agent]]\nid = "a"\nbundle = "{longest}"\nclient = "command"\n'
        + 'command = ["sh", "-c", "set -e\\n\\tprintf \'%s\\\\r\\\\n\' x\\r\\n"]\n',
    )
    plan = load_fleet(path).agents[0]
    assert plan.bundle == longest
    assert plan.command == ("sh", "-c", "set -e\n\tprintf '%s\\r\\n' x\r\n")
    (line,) = problems(write(tmp_path, CENTER + f'[[agent]]\nid = "a"\nbundle = "{longest}b"\n'))
    assert (
        f"agent[0].bundle is '{'b' * 60}'... ({BUNDLE_NAME_MAX + 1} characters): expected" in line
    )
    assert f"at most {BUNDLE_NAME_MAX} characters" in line
    with pytest.raises(SettingError, match="at most 128 characters"):
        plan_from_center(AgentDefaults(), "a", bundle="b" * 129)


def test_duplicate_ids_name_both(tmp_path: Path) -> None:
    path = write(
        tmp_path, CENTER + '[[agent]]\nid = "a"\n[[agent]]\nid = "b"\n[[agent]]\nid = "a"\n'
    )
    assert problems(path) == [
        f"{path}: agent[2].id is 'a': expected a unique agent id (agent[0].id is 'a' too)"
    ]


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        CENTER + '[[agent]]\nid = "a"\nrestart = "x"\ncommand = ["{foo}"]\nenv = {MCPHOST_A = "1"}'
        '\n[[agent]]\nid = "b"\nlog_keep = -1\n',
    )
    lines = problems(path)
    assert [line.split(" ")[1] for line in lines] == [
        "agent[0].restart",
        "agent[0].command[0]",
        "agent[0].env.MCPHOST_A",
        "agent[1].log_keep",
    ]


def test_a_bad_value_never_hides_the_other_problems(tmp_path: Path) -> None:
    """A value pydantic refuses (a bad enum) used to end the load before the cross-field checks:
    now they run on the rest of the file, and every problem comes in the one report."""
    path = write(
        tmp_path,
        '[center]\nadmin_url = "http://c"\ntoken_file = "/t"\nfleet = "both"\n'
        '[defaults]\nrestart = "sometimes"\n'
        '[[agent]]\nid = "a"\nclient = "gemini"\n'
        '[[agent]]\nid = "a"\nrestart_delay = 10\nrestart_max_delay = 5\n'
        '[[agent]]\nbundle = "p"\n'
        '[[agent]]\nid = "b"\nclient = "command"\ncommand = ["{foo}"]\n',
    )
    lines = problems(path)
    assert sorted(line.split(" ")[1] for line in lines) == [
        "agent[0].client",
        "agent[1].id",  # a duplicate: a cross-field check
        "agent[1].restart_max_delay",  # below restart_delay: a cross-field check
        "agent[2].id",  # not set (its stand-in id is never reported)
        "agent[3].command[0]",  # once: not again as "not set" for client = "command"
        "center.admin_url",  # a cross-field check
        "center.fleet",
        "defaults.restart",
    ], lines


@pytest.mark.parametrize(
    ("body", "key", "expected"),
    [
        (
            '[[agent]]\nid = "a"\nrestar = "always"\n',
            "agent[0].restar",
            "key of [[agent]] (the closest: 'restart'): id, client, restart,",
        ),
        (
            '[[agent]]\nid = "a"\ncolour = "red"\n',
            "agent[0].colour",
            "key of [[agent]]: id, client, restart,",
        ),
        ("[defaults]\nid = 'a'\n", "defaults.id", "key of [defaults]: client, restart,"),
        (
            '[agents]\nid = "a"\n',
            "agents",
            "table (the closest: 'agent'): [center], [defaults], [[agent]]",
        ),
    ],
)
def test_an_unknown_key_names_the_known_ones(
    tmp_path: Path, body: str, key: str, expected: str
) -> None:
    path = write(tmp_path, CENTER + body)
    lines = problems(path)
    assert f"{path}: {key} is not one: expected a known {expected}" in "\n".join(lines), lines


@pytest.mark.parametrize(
    ("center", "expected"),
    [
        ('admin_url = "tcp://c:1"\ntoken_file = "/t"\n', "{p}: center.fingerprint is not set"),
        ('admin_url = "http://c"\ntoken_file = "/t"\n', "{p}: center.admin_url is 'http://c'"),
        (
            f'admin_url = "unix:/s"\nfingerprint = "{PIN[:-3]}"\ntoken_file = "/t"\n',
            "{p}: center.fingerprint is",
        ),
        ('admin_url = "unix:/s"\n', "{p}: center.token_file is not set: expected the absolute"),
        (
            'admin_url = "unix:/s"\ntoken_file = "relative/t"\n',
            "{p}: center.token_file is not an absolute path (not shown",
        ),
        (
            'admin_url = "unix:/s"\ntoken_file = "/t"\nruntime_socket = "r.sock"\n',
            "{p}: center.runtime_socket is 'r.sock': expected an absolute path",
        ),
        (
            'admin_url = "unix:/s"\ntoken_file = "/t"\nfleet = "both"\n',
            '{p}: center.fleet is \'both\': expected "file" or "center"',
        ),
        ('admin_url = "unix:/s"\ntoken_file = "/t"\npoll_seconds = 0\n', "{p}: center.poll_"),
        ('admin_url = "unix:/s"\ntoken_file = "/t"\ntoken = "x"\n', "{p}: center.token is not one"),
    ],
)
def test_bad_center_is_named(tmp_path: Path, center: str, expected: str) -> None:
    path = write(tmp_path, "[center]\n" + center)
    lines = problems(path)
    assert any(line.startswith(expected.format(p=path)) for line in lines), lines


def test_missing_center(tmp_path: Path) -> None:
    path = write(tmp_path, '[[agent]]\nid = "a"\n')
    assert problems(path)[0].startswith(f"{path}: center is not set: expected a [center] table")


def test_a_token_written_where_the_token_file_belongs_is_never_shown(tmp_path: Path) -> None:
    secret = "acat_" + "s3cr3t" * 6
    path = write(tmp_path, f'[center]\nadmin_url = "unix:/s"\ntoken_file = "{secret}"\n')
    text = "\n".join(problems(path))
    assert "center.token_file" in text and secret not in text
    # a number is no path either; the message must not show it (one no temp path can contain)
    path = write(tmp_path, '[center]\nadmin_url = "unix:/s"\ntoken_file = 9081726354\n', "b.toml")
    text = "\n".join(problems(path))
    assert "center.token_file" in text and "9081726354" not in text


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, CENTER + '\n[[agent]]\nid = "a"\ncommand = ["x",\n]]\n[x]\n')
    (line,) = problems(path)
    assert line.startswith(f"{path} is not valid TOML: ") and "(at line 10, column 2)" in line
    assert problems(str(tmp_path / "missing.toml"))[0].startswith(str(tmp_path / "missing.toml"))


def test_center_fleet(tmp_path: Path) -> None:
    text = CENTER.replace("[center]", '[center]\nfleet = "center"\npoll_seconds = 5') + (
        '[defaults]\nclient = "codex"\nbundle = "party"\n'
    )
    fleet = load_fleet(write(tmp_path, text))
    assert fleet.center.fleet == "center" and fleet.agents == ()
    got = fleet_with_agents(fleet, ["a1", {"agent_id": "a2", "bundle": "other"}, "a1"])
    assert [p.agent_id for p in got.agents] == ["a1", "a2"]
    assert got.agents[0].client == "codex" and got.agents[0].bundle == "party"
    assert got.agents[1].bundle == "other"
    assert fleet_with_agents(fleet, ["a1", "a2"]) == fleet_with_agents(fleet, ["a1", "a2"])
    with pytest.raises(SettingError, match=re.escape("the center's agent id is '../x'")):
        fleet_with_agents(fleet, ["../x"])
    path = write(tmp_path, text + '[[agent]]\nid = "a"\n', "c.toml")
    assert problems(path)[0].startswith(f"{path}: agent[0] is given: expected no [[agent]]")


def test_plan_from_center_uses_defaults_and_default_command() -> None:
    defaults = AgentDefaults(client="command", command=("run", "{agent_id}"), restart="always")
    plan = plan_from_center(defaults, "z9")
    assert plan.command == ("run", "{agent_id}") and plan.restart == "always"
    assert plan.tier_tools is True
    with pytest.raises(SettingError, match=r"defaults\.command"):
        plan_from_center(AgentDefaults(client="command"), "z9")
    with pytest.raises(SettingError, match="relay session id"):
        plan_from_center(AgentDefaults(bundle="party"), "a.b")


def test_defaults_command_in_the_file(tmp_path: Path) -> None:
    text = CENTER + '[defaults]\nclient = "command"\ncommand = ["agent", "--id", "{agent_id}"]\n'
    text += '[[agent]]\nid = "a"\n'
    (plan,) = load_fleet(write(tmp_path, text)).agents
    assert plan.command == ("agent", "--id", "{agent_id}")


def test_agent_argv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import configgen.launch as launch

    fleet = load_fleet(write(tmp_path, ISSUE_EXAMPLE))
    plan = fleet.agents[0]
    home = home_paths(str(tmp_path), plan.agent_id, plan.client)
    assert agent_argv(plan, home) == [
        "claude",
        "--mcp-config",
        home.mcp_config,
        "--strict-mcp-config",
        "-p",
        "Check your work queue.",
    ]
    templated = dataclasses.replace(
        plan, command=("run", "{home}", "{workspace}", "{agent_id}", "{{literal}}", "x{mcp_config}")
    )
    assert agent_argv(templated, home) == [
        "run",
        home.root,
        home.workspace,
        "agent-7f3a",
        "{literal}",
        "x" + home.mcp_config,
    ]
    monkeypatch.setattr(launch, "find_command", lambda name: None)
    bare = dataclasses.replace(plan, command=None)
    assert agent_argv(bare, home) == [
        "claude",
        "--mcp-config",
        home.mcp_config,
        "--strict-mcp-config",
        "--allowedTools",
        "mcp__agent-center,mcp__agentmux",
    ]
    monkeypatch.setattr(launch, "find_command", lambda name: f"/opt/bin/{name}")
    assert agent_argv(bare, home)[0] == "/opt/bin/claude"
    codex = dataclasses.replace(bare, client="codex")
    assert agent_argv(codex, home_paths(str(tmp_path), "a", "codex")) == [
        "/opt/bin/codex", "--disable", "daemon_auto_start",
    ]  # fmt: skip
    assert os.path.basename(home_paths(str(tmp_path), "a", "codex").mcp_config) == "config.toml"


# -- runner = "auto" | "process" | "tmux", and the relay policy (issues 13, 19) ----------------


def test_runner_tmux_comes_from_defaults_or_the_agent(tmp_path: Path) -> None:
    fleet = load_fleet(
        write(
            tmp_path,
            CENTER + '[defaults]\nrunner = "tmux"\nbundle = "party"\n'
            '[[agent]]\nid = "a"\npolicy = "lead"\n'
            '[[agent]]\nid = "b"\nrunner = "process"\ncommand = ["claude", "-p", "go"]\n',
        )
    )
    a, b = fleet.agents
    assert (a.runner, a.bundle, a.policy) == ("tmux", "party", "lead")
    assert (b.runner, b.policy) == ("process", None)
    # a changed runner or policy is a changed plan (reload restarts the agent)
    again = load_fleet(
        write(
            tmp_path,
            CENTER + '[defaults]\nrunner = "tmux"\nbundle = "party"\n[[agent]]\nid = "a"\n',
            "again.toml",
        )
    )
    assert again.agents[0] != a


def test_runner_auto_gives_an_interactive_client_without_a_command_a_terminal(
    tmp_path: Path,
) -> None:
    """The default: claude or codex without a command run their interactive program, which
    needs a terminal (issue 19): tmux, with or without a bundle; a command runs as a process."""
    fleet = load_fleet(
        write(
            tmp_path,
            CENTER + '[[agent]]\nid = "a"\n'
            '[[agent]]\nid = "b"\nclient = "codex"\n'
            '[[agent]]\nid = "c"\nbundle = "party"\n'
            '[[agent]]\nid = "d"\ncommand = ["claude", "-p", "go"]\n'
            '[[agent]]\nid = "e"\nclient = "command"\ncommand = ["x"]\n'
            '[[agent]]\nid = "f"\nrunner = "tmux"\nclient = "command"\ncommand = ["x"]\n'
            '[[agent]]\nid = "g"\ncommand = ["x"]\nuser = "nobody"\n',
        )
    )
    assert fleet.defaults.runner == "auto"
    assert [p.runner for p in fleet.agents] == [
        "tmux", "tmux", "tmux", "process", "process", "tmux", "process",
    ]  # fmt: skip
    assert plan_from_center(fleet.defaults, "h").runner == "tmux"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('[[agent]]\nid = "a"\nrunner = "screen"\n', "agent[0].runner"),
        # an interactive client without a command cannot run without a terminal
        (
            '[[agent]]\nid = "a"\nrunner = "process"\n',
            'agent[0].runner is \'process\': expected runner = "auto" or "tmux" for client = '
            '"claude" without a command',
        ),
        (
            '[defaults]\nrunner = "process"\nclient = "codex"\n[[agent]]\nid = "a"\n',
            'defaults.runner is \'process\': expected runner = "auto" or "tmux" for client = '
            '"codex"',
        ),
        # a bad uid range
        ('[identity]\nuids = "0-10"\n', "identity.uids is '0-10': expected a range of uids"),
        ('[identity]\nuids = "9-1"\n', "identity.uids is '9-1': expected a range of uids"),
        ('[[agent]]\nid = "a"\nbundle = "p"\npolicy = "../x"\n', "agent[0].policy is '../x'"),
        # an ACP agent takes its work from its bundle's relay
        (
            '[[agent]]\nid = "a"\nrunner = "acp"\n',
            "agent[0].runner is 'acp': expected a bundle for an ACP agent",
        ),
    ],
)
def test_bad_runner_or_policy_is_named(tmp_path: Path, body: str, expected: str) -> None:
    lines = problems(write(tmp_path, CENTER + body))
    assert any(expected in line for line in lines), lines


def test_plan_from_center_refuses_a_runner_that_cannot_work() -> None:
    defaults = dataclasses.replace(AgentDefaults(), runner="process", client="claude")
    with pytest.raises(SettingError) as info:
        plan_from_center(defaults, "a")
    assert "defaults.runner" in str(info.value) and "for agent a" in str(info.value)
    tmux = dataclasses.replace(AgentDefaults(), runner="tmux", client="command", command=("x",))
    assert plan_from_center(tmux, "a").runner == "tmux"  # a tmux server of its own
    assert plan_from_center(tmux, "a", bundle="party").runner == "tmux"


def test_an_acp_agent_runs_its_clients_adapter_or_its_own_command(tmp_path: Path) -> None:
    from mcphost.supervisor.agents.homes import ACP_ADAPTERS

    fleet = load_fleet(
        write(
            tmp_path,
            CENTER + '[defaults]\nrunner = "acp"\nbundle = "party"\n'
            '[[agent]]\nid = "c"\n[[agent]]\nid = "x"\nclient = "codex"\n'
            '[[agent]]\nid = "s"\nclient = "command"\ncommand = ["my-acp", "--stdio"]\n',
        )
    )
    argv = {
        plan.agent_id: agent_argv(plan, home_paths(str(tmp_path), plan.agent_id, plan.client))
        for plan in fleet.agents
    }
    assert [p.runner for p in fleet.agents] == ["acp", "acp", "acp"]
    assert os.path.basename(argv["c"][0]) == ACP_ADAPTERS["claude"] == "claude-code-acp"
    assert os.path.basename(argv["x"][0]) == ACP_ADAPTERS["codex"] == "codex-acp"
    assert argv["s"] == ["my-acp", "--stdio"]


# `[page] listen` and `[metrics] listen` take one form (values.py; every case: test_values.py)
LISTENS = [
    ("127.0.0.1:9464", Listen("127.0.0.1", 9464)),
    ("127.3.2.1:80", Listen("127.3.2.1", 80)),
    ("[::1]:0", Listen("::1", 0)),
    ("localhost:9464", Listen("127.0.0.1", 9464)),
    ("unix:/run/mcphost//metrics.sock", Listen(path="/run/mcphost/metrics.sock")),
]
NOT_LISTENS = [
    '"0.0.0.0:8765"', '"192.168.1.2:80"', '"[::]:9464"', '"10.1.2.3:9464"', '"example.com:9464"',
    '"127.0.0.1"', '"::1:80"', '"127.0.0.1:65536"', '"unix:relative.sock"',
    '"unix:/' + "x" * 200 + '"', "8765",
]  # fmt: skip


@pytest.mark.parametrize(("listen", "expected"), LISTENS)
def test_the_page_is_off_by_default_and_listens_on_the_loopback_only(
    tmp_path: Path, listen: str, expected: Listen
) -> None:
    assert load_fleet(write(tmp_path, ISSUE_EXAMPLE, "off.toml")).page is None
    page = load_fleet(write(tmp_path, ISSUE_EXAMPLE + f'[page]\nlisten = "{listen}"\n')).page
    assert page == expected


@pytest.mark.parametrize(("listen", "expected"), LISTENS)
def test_metrics_listen_is_loopback_or_a_unix_socket(
    tmp_path: Path, listen: str, expected: Listen
) -> None:
    fleet = load_fleet(write(tmp_path, CENTER + f'\n[metrics]\nlisten = "{listen}"\n'))
    assert fleet.metrics == expected
    assert load_fleet(write(tmp_path, CENTER, "off.toml")).metrics is None  # off by default


@pytest.mark.parametrize("listen", NOT_LISTENS)
def test_a_page_beyond_the_loopback_is_refused_naming_the_key(tmp_path: Path, listen: str) -> None:
    with pytest.raises(SettingError) as info:
        load_fleet(write(tmp_path, ISSUE_EXAMPLE + f"[page]\nlisten = {listen}\n"))
    assert info.value.code == "bad_setting"
    assert info.value.details["variable"].endswith("fleet.toml: page.listen")
    assert info.value.details["expected"] == LISTEN_EXPECTED


@pytest.mark.parametrize("listen", NOT_LISTENS)
def test_a_metrics_listen_that_is_not_loopback_is_refused_at_load(
    tmp_path: Path, listen: str
) -> None:
    [line] = problems(write(tmp_path, CENTER + f"\n[metrics]\nlisten = {listen}\n"))
    assert line.startswith(f"{tmp_path}/fleet.toml: metrics.listen is "), line
    assert "never a non-loopback address" in line, line
    with pytest.raises(SettingError) as info:
        load_fleet(write(tmp_path, CENTER + f"\n[metrics]\nlisten = {listen}\n"))
    assert info.value.code == "bad_setting"
    assert info.value.details["variable"].endswith("metrics.listen")
    assert info.value.details["expected"] == LISTEN_EXPECTED


@pytest.mark.skipif(os.geteuid() != 0, reason="agents get uids of their own from a root supervisor")
def test_check_says_whom_the_agents_run_as_and_warns_of_root(tmp_path: Path) -> None:
    from mcphost.supervisor.plan import identity_lines, wants_own_uid

    body = '[identity]\nuids = "1879048192-1879048291"\n'
    body += '[[agent]]\nid = "a"\n[[agent]]\nid = "b"\nuser = "root"\n'
    fleet = load_fleet(write(tmp_path, CENTER + body))
    assert fleet.uids.first == 1879048192 and fleet.uids.size == 100
    assert [wants_own_uid(p) for p in fleet.agents] == [True, False]
    lines = identity_lines(fleet)
    assert (
        "1 agent(s) run as uids of their own from [identity] uids = '1879048192-1879048291'"
        in (lines[0])
    )
    assert lines[1].startswith("identity: warning: agent[1].user (b) runs it as root, uid 0")


@pytest.mark.skipif(os.geteuid() != 0, reason="the user database is read by a root supervisor")
def test_a_uid_range_holding_a_user_is_refused(tmp_path: Path) -> None:
    from mcphost.supervisor.plan import check_users

    body = '[identity]\nuids = "0-0"\n'  # refused by its grammar already
    assert any("identity.uids" in line for line in problems(write(tmp_path, CENTER + body)))
    fleet = load_fleet(
        write(tmp_path, CENTER + '[identity]\nuids = "1-70000"\n[[agent]]\nid = "a"\n')
    )
    with pytest.raises(SettingError, match=r"identity.uids is '1-70000', which holds user"):
        check_users(fleet)


def test_every_key_declares_what_a_reload_does_with_it() -> None:
    """Issue 34: one declaration per key (`fleet.reload_of`), read by the reload's reply and
    docs/fleet-keys.md; the agent keys declared live are exactly the ones a running agent's
    runner applies in place (`AgentRunner.update_policy`), and only a change outside them
    restarts the agent (`plan.needs_restart`)."""
    from mcphost.supervisor.fleet import IN_PLACE, SECTIONS, reload_of
    from mcphost.supervisor.plan import AgentDefaults, apply_defaults, needs_restart
    from mcphost.supervisor.values import Reload

    for section, model in SECTIONS.items():
        for key, field in model.model_fields.items():
            assert isinstance(field.json_schema_extra, dict), (section, key)
            assert reload_of(section, key) in Reload, (section, key)
    assert {
        "restart", "restart_delay", "restart_max_delay", "max_restarts", "restart_window",
        "stop_grace", "log_max_bytes", "log_keep",
    } == IN_PLACE  # fmt: skip
    assert reload_of("center", "runtime_socket", toggled=True) == Reload.RESTART_SUPERVISOR
    assert reload_of("center", "fleet") == Reload.REFUSED
    plan = apply_defaults(AgentDefaults(client="command", command=("x",)), "a")
    assert not needs_restart(plan, dataclasses.replace(plan, stop_grace=3.0), IN_PLACE)
    assert needs_restart(plan, dataclasses.replace(plan, env=(("X", "1"),)), IN_PLACE)
