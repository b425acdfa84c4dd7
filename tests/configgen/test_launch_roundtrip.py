"""Round trip: start the servers exactly as a generated config says and call a tool.

The config is generated through the public API with default command resolution (the installed
`mcphost` script, an absolute path) and the token in a 0600 file, the way a worker daemon would.
The official SDK client launches `command` with `args` and `env` as written, against the real
reference center over its Unix socket; the relay tools (`agentmux`) the same way, against the
relay test harness's fake relay.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from configgen import AgentConfig, CenterBinding, ConfigError, RelayBinding, write_config
from mcphost.testing.relayharness import FakeRelay, cleanup, make_env, tool_json

# deep (make test-slow): every client's generated config starts a host.
pytestmark = pytest.mark.deep

testing = pytest.importorskip(
    "mcphost.testing", reason="mcphost.testing (the reference-center fixture) is not available"
)


def _generate(center: Any, tmp_path: Path, client: str) -> dict[str, Any]:
    token_file = tmp_path / "token"
    token_file.write_text(center.token + "\n")
    token_file.chmod(0o600)
    env = center.binding_env(transport="unix", AC_MCP_WORKER_TOKEN=None)
    env["AC_MCP_WORKER_TOKEN_FILE"] = str(token_file)
    try:
        config = AgentConfig(center=CenterBinding.from_env(env))
        path = tmp_path / ("config.toml" if client == "codex" else "mcp.json")
        write_config(str(path), client, config)
    except ConfigError as exc:
        if "cannot find the mcphost command" in str(exc):
            pytest.skip(f"the mcphost console script is not installed: {exc}")
        raise
    assert (path.stat().st_mode & 0o777) == 0o600
    assert center.token not in path.read_text()
    if client == "codex":
        entry: dict[str, Any] = tomllib.loads(path.read_text())["mcp_servers"]["agent-center"]
    else:
        entry = json.loads(path.read_text())["mcpServers"]["agent-center"]
    return entry


@pytest.mark.anyio
@pytest.mark.parametrize("client", ["claude", "codex"])
async def test_generated_config_starts_a_working_host(tmp_path: Path, client: str) -> None:
    from mcp import Client, StdioServerParameters

    with testing.DevCenter.start(tmp_path / "center", unix=True) as center:
        entry = _generate(center, tmp_path, client)
        assert os.path.isabs(entry["command"])
        params = StdioServerParameters(
            command=entry["command"], args=entry["args"], env=entry["env"]
        )
        async with Client(params, mode="legacy") as session:
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert "get_my_work" in names
            # Claude Code and Codex get the whole catalog at start-up (no tiering meta-tool)
            assert "search_tools" not in names and "subscribe" in names
            result = await session.call_tool("get_my_work", {})
            assert not result.is_error, result


@pytest.mark.anyio
async def test_generated_config_starts_working_relay_tools(tmp_path: Path) -> None:
    """Both servers side by side; the `agentmux` entry reaches the relay as `alpha@party`."""
    from mcp import Client, StdioServerParameters

    env = make_env()
    relay = await FakeRelay(env.socket).start()
    relay.respond(
        "send",
        {
            "kind": "send",
            "schema_version": "1",
            "requester_session": "alpha@party",
            "results": [{"target_session": "bravo@party", "message_id": "m1", "outcome": "queued"}],
        },
    )
    try:
        config = AgentConfig(
            center=CenterBinding(agent_id="agent-1", admin_url=str(tmp_path / "admin.sock")),
            relay=RelayBinding(
                bundle="party",
                session_name="alpha",
                configuration_directories=(str(env.config),),
                state_directory=str(env.state),
            ),
        )
        path = tmp_path / "mcp.json"
        try:
            write_config(str(path), "claude", config)
        except ConfigError as exc:
            if "cannot find the mcphost command" in str(exc):
                pytest.skip(f"the mcphost console script is not installed: {exc}")
            raise
        servers = json.loads(path.read_text())["mcpServers"]
        assert set(servers) == {"agent-center", "agentmux"}
        entry = servers["agentmux"]
        assert os.path.isabs(entry["command"])
        params = StdioServerParameters(
            command=entry["command"], args=entry["args"], env=entry["env"]
        )
        async with Client(params, mode="legacy", read_timeout_seconds=15) as session:
            result = await session.call_tool("list", {"command": "principals"})
            assert not result.is_error, result
            listed = tool_json(result)
            assert [b["id"] for b in listed["bundles"]] == ["party", "GLOBAL"]
            result = await session.call_tool("send", {"message": "hi", "targets": ["bravo"]})
            assert not result.is_error, result
            assert tool_json(result)["results"][0]["outcome"] == "queued"
        assert [h["principal_id"] for h in relay.hellos] == ["alpha@party"]
        assert relay.operations() == ["list", "list", "send"]
        assert {r["request"]["requester_session"] for r in relay.requests} == {"alpha"}
        assert relay.requests[-1]["request"]["targets"] == ["bravo@party"]
        assert (env.inscriptions / "bundles/party/sessions/alpha/mcp.log").exists()
    finally:
        await relay.stop()
        cleanup(env)
