"""Rendering: golden bytes per client, determinism, parseability, and agreement with the host grammar."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from configgen import (
    CLIENTS,
    MARKER,
    AgentConfig,
    CenterBinding,
    ConfigError,
    HttpBinding,
    RelayBinding,
    render,
)
from configgen.clients import acp_servers, client
from mcphost.binding import AgentBinding
from tests.configgen.configgen_samples import sample_config

GOLDEN = Path(__file__).parent / "golden"
# Regenerate deliberately: CONFIGGEN_REGEN=1 pytest tests/configgen -k golden
REGEN = os.environ.get("CONFIGGEN_REGEN") == "1"


def parse(client_name: str, data: bytes) -> dict[str, Any]:
    if CLIENTS[client_name].syntax == "toml":
        return tomllib.loads(data.decode("utf-8"))
    result: dict[str, Any] = json.loads(data)
    return result


def servers_of(client_name: str, data: bytes) -> dict[str, Any]:
    servers: dict[str, Any] = parse(client_name, data)[CLIENTS[client_name].servers_key]
    return servers


@pytest.mark.parametrize("client_name", list(CLIENTS))
def test_golden(client_name: str) -> None:
    fmt = CLIENTS[client_name]
    path = GOLDEN / f"{client_name}.{fmt.syntax}"
    data = render(client_name, sample_config())
    if REGEN:
        path.write_bytes(data)
    assert data == path.read_bytes(), f"{path.name} changed; regenerate with CONFIGGEN_REGEN=1"


@pytest.mark.parametrize("client_name", list(CLIENTS))
def test_golden_relay_only_upstream(client_name: str) -> None:
    fmt = CLIENTS[client_name]
    path = GOLDEN / f"{client_name}-relay-upstream.{fmt.syntax}"
    config = AgentConfig(
        relay=RelayBinding(bundle="party", session_name="beta", upstream=True),
        agentmux="/usr/local/bin/agentmux",
    )
    data = render(client_name, config)
    if REGEN:
        path.write_bytes(data)
    assert data == path.read_bytes()


@pytest.mark.parametrize("client_name", list(CLIENTS))
def test_shape(client_name: str) -> None:
    data = render(client_name, sample_config())
    assert data.endswith(b"\n") and not data.endswith(b"\n\n")
    servers = servers_of(client_name, data)
    assert list(servers) == ["agent-center", "agentmux"]
    center, relay = servers["agent-center"], servers["agentmux"]
    assert center["command"] == "/opt/mcphost/bin/mcphost"
    assert center["args"] == ["host"]
    assert relay["args"][:5] == ["relay-tools", "--bundle", "party", "--session-name", "alpha"]
    assert relay["args"][5:] == [
        "--configuration-directory",
        "/etc/agentmux",
        "--configuration-directory",
        "/srv/agentmux/conf",
        "--state-directory",
        "/var/lib/agentmux",
        "--inscriptions-directory",
        "/var/log/agentmux",
    ]
    assert center["env"][MARKER] == "1" and relay["env"] == {MARKER: "1"}
    if client_name == "vscode":
        assert center["type"] == "stdio"
    if client_name == "codex":
        assert center["startup_timeout_sec"] == 30 and center["tool_timeout_sec"] == 300
    # Codex and Claude Code get the full catalog (see configgen/clients.py, docs/configgen.md)
    full_catalog = client_name in ("codex", "claude")
    assert center["env"]["AC_MCP_TIER_TOOLS"] == ("false" if full_catalog else "true")


@pytest.mark.parametrize("client_name", list(CLIENTS))
def test_generated_env_parses_with_the_host_grammar(client_name: str) -> None:
    """The env we write is an env the host accepts, meaning the same binding (token inline here,
    since the host would read a token file)."""
    center = CenterBinding(
        agent_id="a-1",
        admin_url="tcp://[::1]:9443",
        token="acat_secret",
        fingerprint="SHA256 Fingerprint=" + ":".join(["0F"] * 32),
        agent_root="/w/a-1/./tasks/",
        tier_tools=False,
        generation=0,
    )
    data = render(client_name, AgentConfig(center=center, mcphost="/bin/mcphost"))
    env = servers_of(client_name, data)["agent-center"]["env"]
    parsed = AgentBinding.from_env(env)
    assert parsed.agent_id == "a-1"
    assert str(parsed.target) == "tcp://[::1]:9443"
    assert parsed.token.reveal() == "acat_secret"
    assert parsed.pins == (bytes([0x0F]) * 32,)
    assert parsed.agent_root == "/w/a-1/tasks"
    assert parsed.tier_tools is False


def test_token_never_in_repr() -> None:
    center = CenterBinding(agent_id="a", admin_url="unix:/s", token="acat_topsecret")
    assert "topsecret" not in repr(center)
    assert "topsecret" not in repr(AgentConfig(center=center))


def test_deterministic_across_equal_inputs() -> None:
    assert render("codex", sample_config()) == render("codex", sample_config())
    # the pin set keeps the operator's order; the same pin in two spellings folds to one
    pins = CenterBinding(
        agent_id="a", admin_url="unix:/s", fingerprint=f"{'cd' * 32},{'ab' * 32},{'AB' * 32}"
    ).fingerprint.split(",")
    assert [pin[7:9] for pin in pins] == ["CD", "AB"]


@pytest.mark.parametrize("client_name", ["codex", "claude"])
def test_client_default_tiering_can_be_overridden(client_name: str) -> None:
    config = sample_config(
        center=CenterBinding(agent_id="a", admin_url="unix:/s", tier_tools=True), relay=None
    )
    env = servers_of(client_name, render(client_name, config))["agent-center"]["env"]
    assert env["AC_MCP_TIER_TOOLS"] == "true"


def test_names_and_timeouts_are_overridable() -> None:
    config = sample_config(center_name="center_1", relay_name="relay-1", tool_timeout_sec=45)
    servers = servers_of("gemini", render("gemini", config))
    assert set(servers) == {"center_1", "relay-1"}
    assert servers["center_1"]["timeout"] == 45000


def test_unknown_client() -> None:
    from configgen import ConfigError

    with pytest.raises(ConfigError, match="unknown client 'zed'"):
        client("zed")


def test_preapproval_is_for_attach_entries_only_and_only_when_asked() -> None:
    """`approve_attach_tools` (a supervisor's ACP agent): Codex's attach entries carry
    `default_tools_approval_mode = "approve"` and Claude Code gets `mcp__<server>` rules for
    them; an entry that is not an attach entry (here the center over a binding) never does,
    and without the flag nothing is preapproved."""
    from configgen import AttachBinding
    from configgen.clients import claude_permission_rules

    attach = {"python": "/usr/bin/python3", "attach_script": "/opt/mcphost/attach.py"}
    both = AgentConfig(
        center=AttachBinding("/run/c.sock"),
        relay=AttachBinding("/run/r.sock"),
        approve_attach_tools=True,
        **attach,
    )
    codex = servers_of("codex", render("codex", both))
    assert {name: e.get("default_tools_approval_mode") for name, e in codex.items()} == {
        "agent-center": "approve",
        "agentmux": "approve",
    }
    assert claude_permission_rules(both) == ["mcp__agent-center", "mcp__agentmux"]
    # Claude Code's own config file carries no approval: its rules live in its settings
    assert "approve" not in render("claude", both).decode()
    # renamed servers: the rules follow the names
    renamed = AgentConfig(
        center=AttachBinding("/run/c.sock"), center_name="center_1", approve_attach_tools=True,
        **attach,
    )  # fmt: skip
    assert claude_permission_rules(renamed) == ["mcp__center_1"]
    # a center over a binding beside an attach relay: only the attach entry
    mixed = sample_config(relay=AttachBinding("/run/r.sock"), approve_attach_tools=True, **attach)
    codex = servers_of("codex", render("codex", mixed))
    assert "default_tools_approval_mode" not in codex["agent-center"]
    assert codex["agentmux"]["default_tools_approval_mode"] == "approve"
    assert claude_permission_rules(mixed) == ["mcp__agentmux"]
    # not asked: nothing preapproved
    plain = AgentConfig(center=AttachBinding("/run/c.sock"), **attach)
    assert claude_permission_rules(plain) == []
    assert "default_tools_approval_mode" not in render("codex", plain).decode()


# -- HTTP entries (a supervisor's loopback listener, mcp_transport = "http") ----------------------

HTTP_CONFIG = AgentConfig(
    center=HttpBinding("http://127.0.0.1:4711/mcp/center"),
    relay=HttpBinding("http://127.0.0.1:4711/mcp/relay"),
    approve_attach_tools=True,
)


def test_claude_and_codex_get_http_entries_holding_the_url_only() -> None:
    claude = json.loads(render("claude", HTTP_CONFIG))["mcpServers"]
    assert claude == {
        "agent-center": {"type": "http", "url": "http://127.0.0.1:4711/mcp/center"},
        "agentmux": {"type": "http", "url": "http://127.0.0.1:4711/mcp/relay"},
    }
    codex = tomllib.loads(render("codex", HTTP_CONFIG).decode())["mcp_servers"]["agent-center"]
    assert codex["url"] == "http://127.0.0.1:4711/mcp/center"
    assert "command" not in codex and "env" not in codex
    assert codex["default_tools_approval_mode"] == "approve" and codex["required"] is True
    assert acp_servers(HTTP_CONFIG)[0] == {
        "type": "http",
        "name": "agent-center",
        "url": "http://127.0.0.1:4711/mcp/center",
        "headers": [],
    }


def test_a_client_without_http_entries_here_and_a_url_off_the_loopback_are_refused() -> None:
    with pytest.raises(ConfigError):
        render("desktop", HTTP_CONFIG)
    for url in ("http://10.0.0.1:80/mcp", "https://127.0.0.1:1/x", "http://127.0.0.1/x", "ftp://x"):
        with pytest.raises(ConfigError):
            HttpBinding(url)
