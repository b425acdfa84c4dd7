"""contrib/worker_daemon.py in --dry-run: it writes the per-agent config and plans the launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "contrib" / "worker_daemon.py"


def daemon(tmp_path: Path, *args: str, token_mode: int = 0o600) -> subprocess.CompletedProcess[str]:
    token = tmp_path / "worker.token"
    token.write_text("acat_x")
    token.chmod(token_mode)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path / "home")}
    return subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--base",
            str(tmp_path / "base"),
            "--agent-id",
            "agent-1",
            "--admin-url",
            "unix:/run/center.sock",
            "--token-file",
            str(token),
            "--dry-run",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def _mcphost_installed() -> bool:
    return os.access(Path(sys.executable).parent / "mcphost", os.X_OK)


pytestmark = pytest.mark.skipif(
    not _mcphost_installed(), reason="the mcphost console script is not installed in this venv"
)


def test_claude_plan(tmp_path: Path) -> None:
    result = daemon(tmp_path, "--bundle", "party", "--", "-p", "hello")
    assert result.returncode == 0, result.stderr
    plan: dict[str, Any] = json.loads(result.stdout)
    config = Path(plan["config"])
    assert plan["argv"] == [
        "claude",
        "--mcp-config",
        str(config),
        "--strict-mcp-config",
        "-p",
        "hello",
    ]
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    assert oct(config.parent.stat().st_mode & 0o777) == "0o700"
    servers = json.loads(config.read_text())["mcpServers"]
    assert servers["agent-center"]["env"]["AC_MCP_AGENT_ROOT"] == plan["cwd"]
    assert "acat_x" not in config.read_text()
    assert servers["agentmux"]["args"][:5] == [
        "relay-tools",
        "--bundle",
        "party",
        "--session-name",
        "agent-1",
    ]


def test_codex_plan_merges_into_codex_home(tmp_path: Path) -> None:
    codex_home = tmp_path / "base" / "agents" / "agent-1" / "codex-home"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text('model = "o4"\n')
    result = daemon(tmp_path, "--client", "codex")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["env"] == {"CODEX_HOME": str(codex_home)}
    text = (codex_home / "config.toml").read_text()
    assert text.startswith('model = "o4"\n')
    assert tomllib.loads(text)["mcp_servers"]["agent-center"]["env"]["AC_MCP_TIER_TOOLS"] == "false"


def test_refuses_a_readable_token_file(tmp_path: Path) -> None:
    result = daemon(tmp_path, token_mode=0o644)
    assert result.returncode == 2
    assert "chmod 600" in result.stderr
