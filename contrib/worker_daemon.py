#!/usr/bin/env python3
"""A worked worker-daemon example: per-agent MCP config with configgen, then launch the agent.

For one agent this
  1. makes the agent's home `<base>/agents/<id>/` (0700) and its workspace `tasks/` (0700),
  2. writes the client config with configgen's Python API, 0600 and atomically:
       claude: `<home>/mcp.json`, launched as `claude --mcp-config <file> --strict-mcp-config`
       codex:  `<home>/codex-home/config.toml` (merged, so other Codex settings you keep there
               survive), launched as `codex` with `CODEX_HOME=<home>/codex-home`
  3. starts the agent in its workspace and waits for it (`--dry-run` prints the plan instead).

The config references the worker's token *file* (AC_MCP_WORKER_TOKEN_FILE), so no secret is
written into it. The host refuses a token file readable by group or others; this script checks
that first so the mistake shows here and not as a dead MCP server inside the agent.

It is an example, not a supervisor: one agent per invocation, no restarts.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from configgen import AgentConfig, CenterBinding, ConfigError, RelayBinding, write_config
from mcphost.cliargs import Parser


def prepare(args: argparse.Namespace) -> tuple[list[str], dict[str, str], Path, Path]:
    """Write the agent's config; return (argv, extra env, config path, workspace)."""
    home = Path(args.base).resolve() / "agents" / args.agent_id
    workspace = home / "tasks"
    for directory in (home, workspace):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)

    token_file = os.path.abspath(args.token_file)
    mode = stat.S_IMODE(os.stat(token_file).st_mode)
    if mode & 0o077:
        raise ConfigError(
            "AC_MCP_WORKER_TOKEN_FILE",
            f"{token_file} has mode {mode:04o}; the host refuses it: chmod 600 {token_file}",
        )

    center = CenterBinding(
        agent_id=args.agent_id,
        admin_url=args.admin_url,
        token_file=token_file,
        fingerprint=",".join(args.fingerprint or []),
        agent_root=str(workspace),
        generation=args.generation,
    )
    relay = (
        RelayBinding(bundle=args.bundle, session_name=args.session_name or args.agent_id)
        if args.bundle
        else None
    )
    config = AgentConfig(center=center, relay=relay)

    if args.client == "claude":
        path = home / "mcp.json"
        write_config(str(path), "claude", config)
        argv = [args.agent_command or "claude", "--mcp-config", str(path), "--strict-mcp-config"]
        return [*argv, *args.agent_args], {}, path, workspace

    codex_home = home / "codex-home"
    codex_home.mkdir(mode=0o700, exist_ok=True)
    path = codex_home / "config.toml"
    write_config(str(path), "codex", config, merge_existing=True)
    # Codex reads its login from $CODEX_HOME/auth.json: share the user's, if there is one.
    auth = Path.home() / ".codex" / "auth.json"
    link = codex_home / "auth.json"
    if auth.exists() and not link.exists():
        link.symlink_to(auth)
    argv = [args.agent_command or "codex", *args.agent_args]
    return argv, {"CODEX_HOME": str(codex_home)}, path, workspace


def main(argv: list[str] | None = None) -> int:
    # No abbreviations (`--token` must not become `--token-file`); unknown values never echoed.
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--client", choices=["claude", "codex"], default="claude")
    parser.add_argument("--base", required=True, help="the worker's agent home base")
    parser.add_argument("--agent-id", required=True)
    parser.add_argument("--admin-url", required=True, help="unix:/path.sock or tcp://host:port")
    parser.add_argument("--token-file", required=True, help="the worker token, mode 0600")
    parser.add_argument("--fingerprint", action="append", help="center pin(s); needed for tcp://")
    parser.add_argument("--generation", type=int, default=0)
    parser.add_argument("--bundle", help="add the relay tools for this agentmux bundle")
    parser.add_argument("--session-name", help="relay session (default: the agent id)")
    parser.add_argument("--agent-command", help="the claude/codex executable (default: on PATH)")
    parser.add_argument("--dry-run", action="store_true", help="write the config, print the plan")
    parser.add_argument("agent_args", nargs="*", help="after --: passed to the agent")
    args = parser.parse_args(argv)
    try:
        command, extra_env, path, workspace = prepare(args)
    except (ConfigError, OSError) as exc:
        print(f"worker_daemon: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        plan = {"argv": command, "env": extra_env, "config": str(path), "cwd": str(workspace)}
        print(json.dumps(plan, indent=2))
        return 0
    return subprocess.run(command, cwd=workspace, env={**os.environ, **extra_env}).returncode


if __name__ == "__main__":
    sys.exit(main())
