"""Round trip: start the host exactly as a generated config says (Claude, Codex) and call a tool.

The config is generated through the public API with default command resolution (the installed
`mcphost` script, an absolute path) and the token in a 0600 file, the way a worker daemon would.
The official SDK client launches `command` with `args` and `env` as written, against the real
reference center over its Unix socket.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from configgen import AgentConfig, CenterBinding, ConfigError, write_config

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
            # Codex gets the whole catalog at start-up (no tiering meta-tool)
            assert ("search_tools" in names) == (client != "codex")
            result = await session.call_tool("get_my_work", {})
            assert not result.is_error, result
