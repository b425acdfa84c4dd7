"""The CLI as a real process: stdout, --out (0600, atomic, no symlinks), --merge, --force, --from-env."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

# deep (make test-slow): the configgen CLI as a process, option by option.
pytestmark = pytest.mark.deep

ROOT = Path(__file__).resolve().parents[2]
BASE = [
    "--agent-id",
    "a1",
    "--admin-url",
    "unix:/run/center.sock",
    "--token-file",
    "/srv/a1/token",
    "--mcphost-command",
    "/opt/bin/mcphost",
]


def run(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AC_MCP_")}
    clean["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "configgen", *args],
        env={**clean, **(env or {})},
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )


def one_line_error(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("configgen: error: ")
    assert result.stderr.count("\n") == 1, result.stderr
    assert fragment in result.stderr, result.stderr


def test_stdout() -> None:
    result = run("claude", *BASE, "--bundle", "party", "--session-name", "alpha")
    assert result.returncode == 0, result.stderr
    servers = json.loads(result.stdout)["mcpServers"]
    assert servers["agent-center"]["env"]["AC_MCP_WORKER_TOKEN_FILE"] == "/srv/a1/token"
    assert servers["agentmux"]["args"][:3] == ["relay-tools", "--bundle", "party"]
    assert result.stderr == ""


def test_out_is_private_and_replaces_atomically(tmp_path: Path) -> None:
    out = tmp_path / "config.toml"
    out.write_text("old")
    out.chmod(0o644)
    result = run("codex", *BASE, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert b"[mcp_servers.agent-center]" in out.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]  # no temp left


def test_out_refuses_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text("keep")
    link = tmp_path / "mcp.json"
    link.symlink_to(target)
    one_line_error(run("claude", *BASE, "--out", str(link)), "symlink")
    assert target.read_text() == "keep" and link.is_symlink()


def test_out_into_a_missing_directory(tmp_path: Path) -> None:
    one_line_error(run("claude", *BASE, "--out", str(tmp_path / "no" / "x.json")), "does not exist")


def test_merge_and_force(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"theme": "x", "mcpServers": {"agent-center": {"command": "mine"}}}))
    one_line_error(run("gemini", *BASE, "--merge", str(path), "--out", str(path)), "pass --force")
    assert json.loads(path.read_text())["mcpServers"]["agent-center"] == {"command": "mine"}
    result = run("gemini", *BASE, "--merge", str(path), "--out", str(path), "--force")
    assert result.returncode == 0, result.stderr
    merged: dict[str, Any] = json.loads(path.read_text())
    assert merged["theme"] == "x"
    assert merged["mcpServers"]["agent-center"]["command"] == "/opt/bin/mcphost"
    # a second run replaces our own server without --force
    result = run("gemini", *BASE, "--generation", "2", "--merge", str(path), "--out", str(path))
    assert result.returncode == 0, result.stderr
    env = json.loads(path.read_text())["mcpServers"]["agent-center"]["env"]
    assert env["AC_MCP_GENERATION"] == "2"


def test_merge_refuses_a_codex_config_that_does_not_parse_and_leaves_it_alone(
    tmp_path: Path,
) -> None:
    path = tmp_path / "config.toml"
    broken = b'# mine\nmodel = "o4"\n[mcp_servers.github\ncommand = "npx"\n'
    path.write_bytes(broken)
    one_line_error(run("codex", *BASE, "--merge", str(path), "--out", str(path)), "is not TOML")
    assert path.read_bytes() == broken
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]


def test_merge_of_a_missing_file_to_stdout(tmp_path: Path) -> None:
    result = run("vscode", *BASE, "--merge", str(tmp_path / "absent.json"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["servers"]["agent-center"]["type"] == "stdio"


def test_from_env_with_overrides() -> None:
    env = {
        "AC_MCP_AGENT_ID": "from-env",
        "AC_MCP_ADMIN_URL": "unix:/run/c.sock",
        "AC_MCP_WORKER_TOKEN": "acat_inline",
        "AC_MCP_GENERATION": "5",
    }
    result = run("claude", "--from-env", "--mcphost-command", "/m", env=env)
    assert result.returncode == 0, result.stderr
    written = json.loads(result.stdout)["mcpServers"]["agent-center"]["env"]
    assert written["AC_MCP_AGENT_ID"] == "from-env"
    assert written["AC_MCP_WORKER_TOKEN"] == "acat_inline"
    assert written["AC_MCP_GENERATION"] == "5"
    # an explicit --token-file replaces the inherited inline token; options win over the env
    result = run(
        "claude",
        "--from-env",
        "--token-file",
        "/t",
        "--generation",
        "6",
        "--mcphost-command",
        "/m",
        env=env,
    )
    assert result.returncode == 0, result.stderr
    written = json.loads(result.stdout)["mcpServers"]["agent-center"]["env"]
    assert "AC_MCP_WORKER_TOKEN" not in written
    assert written["AC_MCP_WORKER_TOKEN_FILE"] == "/t" and written["AC_MCP_GENERATION"] == "6"


def test_from_env_error_names_the_variable_and_flag() -> None:
    result = run(
        "claude", "--from-env", env={"AC_MCP_AGENT_ID": "a", "AC_MCP_ADMIN_URL": "tcp://h:1"}
    )
    one_line_error(result, "AC_MCP_SERVER_FINGERPRINT is not set")
    assert "(--fingerprint)" in result.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["claude"], "nothing to generate"),
        (["zed", *BASE], "invalid choice"),
        (["claude", *BASE, "--admin-url", "http://x"], "AC_MCP_ADMIN_URL"),
        (["claude", *BASE, "--bundle", "b"], "--session-name"),
        (["claude", *BASE, "--force"], "--force only makes sense with --merge"),
        (["claude", *BASE, "--center-name", "a b"], "center server name"),
        (["claude", *BASE, "--no-center"], "--no-center with"),
        (["claude", *BASE, "--startup-timeout-sec", "x"], "invalid int"),
        (["claude", *BASE, "--merge", "/"], "is a directory"),
    ],
)
def test_errors_are_one_line_exit_2(args: list[str], fragment: str) -> None:
    one_line_error(run(*args), fragment)


def test_default_command_is_an_absolute_path(tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "mcphost"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    args = [a for a in BASE if a not in ("--mcphost-command", "/opt/bin/mcphost")]
    result = run("claude", *args, env={"PATH": f"{fake.parent}:/usr/bin:/bin"}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    command = json.loads(result.stdout)["mcpServers"]["agent-center"]["command"]
    assert os.path.isabs(command) and os.access(command, os.X_OK)
    assert os.path.basename(command) == "mcphost"


def test_relay_only_upstream() -> None:
    result = run(
        "codex",
        "--bundle",
        "party",
        "--session-name",
        "beta",
        "--upstream-agentmux",
        "--agentmux-command",
        "/usr/local/bin/agentmux",
    )
    assert result.returncode == 0, result.stderr
    servers = tomllib.loads(result.stdout)["mcp_servers"]
    assert list(servers) == ["agentmux"]
    assert servers["agentmux"]["args"] == [
        "host",
        "mcp",
        "--bundle",
        "party",
        "--session-name",
        "beta",
    ]
