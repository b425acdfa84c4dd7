"""Validation at generation time: the host's grammar, with messages naming the culprit."""

from __future__ import annotations

import pytest

from configgen import AgentConfig, CenterBinding, ConfigError, RelayBinding, render
from tests.configgen.configgen_samples import sample_config

GOOD = {"agent_id": "a1", "admin_url": "unix:/run/center.sock"}


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"agent_id": ""}, "AC_MCP_AGENT_ID", "is not set"),
        ({"agent_id": "has space"}, "AC_MCP_AGENT_ID", "without whitespace"),
        ({"admin_url": ""}, "AC_MCP_ADMIN_URL", "is not set"),
        ({"admin_url": "https://c:443"}, "AC_MCP_ADMIN_URL", "unrecognised admin URL"),
        ({"admin_url": "unix:relative.sock"}, "AC_MCP_ADMIN_URL", "must be absolute"),
        ({"admin_url": "tcp://c:99999"}, "AC_MCP_ADMIN_URL", "out of range"),
        ({"admin_url": "tcp://c:443"}, "AC_MCP_SERVER_FINGERPRINT", "tcp:// targets are pinned"),
        ({"fingerprint": "SHA256:deadbeef"}, "AC_MCP_SERVER_FINGERPRINT", "not a SHA-256"),
        ({"agent_root": "tasks"}, "AC_MCP_AGENT_ROOT", "absolute path"),
        ({"runtime_socket": "rt.sock"}, "AC_MCP_RUNTIME_SOCKET", "absolute path"),
        ({"token_file": "token"}, "AC_MCP_WORKER_TOKEN_FILE", "absolute path"),
        ({"token_file": "/t", "token": "x"}, "AC_MCP_WORKER_TOKEN_FILE", "not both"),
        ({"generation": -1}, "AC_MCP_GENERATION", "non-negative"),
        ({"generation": True}, "AC_MCP_GENERATION", "integer"),
        ({"tier_tools": "no"}, "AC_MCP_TIER_TOOLS", "true or false"),
        ({"agent_id": "a\0b"}, "AC_MCP_AGENT_ID", "NUL"),
        ({"agent_root": "/a\ud800"}, "AC_MCP_AGENT_ROOT", "surrogate"),
    ],
)
def test_center_binding_errors(overrides: dict[str, object], field: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        CenterBinding(**{**GOOD, **overrides})  # type: ignore[arg-type]
    assert info.value.field == field
    assert fragment in str(info.value)
    assert field in str(info.value)
    assert "\n" not in str(info.value)


def test_token_is_never_shown_in_errors() -> None:
    with pytest.raises(ConfigError) as info:
        CenterBinding(agent_id="a", admin_url="tcp://c:1", token="acat_SECRET")
    assert "SECRET" not in str(info.value)


def test_canonical_forms() -> None:
    center = CenterBinding(
        agent_id=" a1 ",
        admin_url="/run/center.sock",
        fingerprint="ab" * 32,
        agent_root="/w//x/../y",
        generation=7,
    )
    assert center.agent_id == "a1"
    assert center.admin_url == "unix:/run/center.sock"
    assert center.fingerprint == "sha256:" + ":".join(["AB"] * 32)
    assert center.agent_root == "/w/y"


def test_from_env_uses_the_host_grammar_without_reading_the_token_file() -> None:
    center = CenterBinding.from_env(
        {
            "AC_MCP_AGENT_ID": "a1",
            "AC_MCP_ADMIN_URL": "unix:/s",
            "AC_MCP_WORKER_TOKEN_FILE": "/does/not/exist",
            "AC_MCP_TIER_TOOLS": "off",
            "AC_MCP_GENERATION": "+4",
            "UNRELATED": "x",
        }
    )
    assert center.token_file == "/does/not/exist"
    assert center.tier_tools is False and center.generation == 4
    unset = CenterBinding.from_env({"AC_MCP_AGENT_ID": "a1", "AC_MCP_ADMIN_URL": "unix:/s"})
    assert unset.tier_tools is None


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"AC_MCP_TIER_TOOLS": "maybe"}, "AC_MCP_TIER_TOOLS"),
        ({"AC_MCP_GENERATION": "-1"}, "AC_MCP_GENERATION"),
    ],
)
def test_from_env_errors(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        CenterBinding.from_env({"AC_MCP_AGENT_ID": "a", "AC_MCP_ADMIN_URL": "unix:/s", **env})
    assert info.value.field == field


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"bundle": "", "session_name": "s"}, "relay bundle is empty"),
        ({"bundle": "b", "session_name": " s"}, "surrounding space"),
        ({"bundle": "b\n", "session_name": "s"}, "control characters"),
        ({"bundle": "b", "session_name": "s", "state_directory": "state"}, "absolute path"),
        (
            {"bundle": "b", "session_name": "s", "configuration_directories": "/etc"},
            "not one string",
        ),
        ({"bundle": "b", "session_name": "s", "configuration_directories": ["rel"]}, "absolute"),
    ],
)
def test_relay_errors(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        RelayBinding(**kwargs)  # type: ignore[arg-type]


def test_relay_names_starting_with_a_dash_stay_values() -> None:
    """`--bundle -x` makes `mcphost relay-tools` exit 2 at start; `--bundle=-x` is the value.
    (A session id starts with a letter: `--alpha` is refused, see the grammar test below.)"""
    relay = RelayBinding(bundle="-x", session_name="alpha", state_directory="/s")
    assert relay.args() == ["--bundle=-x", "--session-name", "alpha", "--state-directory", "/s"]
    from mcphost.relaytools.cli import _parser

    parsed = _parser().parse_args(relay.args())
    assert (parsed.bundle, parsed.session, parsed.state) == ("-x", "alpha", "/s")


@pytest.mark.parametrize("session", ["--alpha", "../../x", "a.b", "1st", "x" * 32, "a b"])
def test_relay_session_names_follow_the_session_id_grammar(session: str) -> None:
    with pytest.raises(ConfigError) as info:
        RelayBinding(bundle="party", session_name=session)
    assert info.value.field == "relay session name"
    assert "expected a session id" in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"center": None, "relay": None}, "nothing to generate"),
        ({"center_name": "agent center"}, "center server name"),
        ({"relay_name": "a" * 65}, "1-64 characters"),
        ({"relay_name": "agent.mux"}, "collide"),
        ({"relay_name": "agent-center"}, "both named"),
        ({"mcphost": "bin/mcphost"}, "relative path"),
        ({"mcphost": ""}, "mcphost command is empty"),
        ({"startup_timeout_sec": 0}, "startup timeout"),
        ({"tool_timeout_sec": 1.5}, "tool timeout"),
    ],
)
def test_agent_config_errors(overrides: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        sample_config(**overrides)


def test_bare_command_name_is_allowed() -> None:
    assert b'"command": "mcphost"' in render("claude", sample_config(mcphost="mcphost"))


def test_missing_command_is_reported_at_render() -> None:
    with pytest.raises(ConfigError, match="mcphost command is not set"):
        render("claude", sample_config(mcphost=None))
    upstream = AgentConfig(relay=RelayBinding(bundle="b", session_name="s", upstream=True))
    with pytest.raises(ConfigError, match="agentmux command is not set"):
        render("claude", upstream)


@pytest.mark.parametrize(
    ("client_name", "value", "refused"),
    [
        ("claude", "/w/${HOME}", True),
        ("cursor", "/w/${env:X}", True),
        ("vscode", "/w/${workspaceFolder}", True),
        ("gemini", "/w/$HOME", True),
        ("gemini", "/w/$5", False),
        ("claude", "/w/$HOME", False),
        ("codex", "/w/${HOME}", False),
        ("desktop", "/w/${HOME}", False),
    ],
)
def test_interpolation_is_refused_where_the_client_expands(
    client_name: str, value: str, refused: bool
) -> None:
    config = AgentConfig(
        center=CenterBinding(agent_id="a", admin_url="unix:/s", agent_root=value), mcphost="/m"
    )
    if refused:
        with pytest.raises(ConfigError, match="AC_MCP_AGENT_ROOT"):
            render(client_name, config)
    else:
        assert value.encode() in render(client_name, config)


@pytest.mark.parametrize("bundle", ["my party", "a/b", "..", "ünïcode", "semi;colon"])
def test_relay_bundle_names_follow_the_relay_tools_grammar(bundle: str) -> None:
    with pytest.raises(ConfigError) as info:
        RelayBinding(bundle=bundle, session_name="alpha")
    assert info.value.field == "relay bundle"
