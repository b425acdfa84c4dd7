"""Finding the commands that start the servers: the edge where configgen looks at the filesystem.

Owns: the default `mcphost` command (the console script installed next to the running Python,
else the one on PATH), resolved to an absolute path so a config works outside the virtual
environment, and the same for upstream's `agentmux`.
Must never: be imported by the pure modules (model, clients, merge, toml).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys

from configgen.model import AgentConfig, ConfigError


def find_command(name: str) -> str | None:
    """`name` next to `sys.executable` (a venv's bin/), else on PATH; absolute, or None."""
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), name)
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    found = shutil.which(name)
    return os.path.abspath(found) if found else None


def resolve_commands(config: AgentConfig) -> AgentConfig:
    """`config` with its unset `mcphost` / `agentmux` commands filled in (only those it needs)."""
    mcphost, agentmux = config.mcphost, config.agentmux
    if config.needs_mcphost and mcphost is None:
        mcphost = _required("mcphost")
    if config.needs_agentmux and agentmux is None:
        agentmux = _required("agentmux")
    return dataclasses.replace(config, mcphost=mcphost, agentmux=agentmux)


def _required(name: str) -> str:
    found = find_command(name)
    if found is None:
        raise ConfigError(
            f"{name} command",
            f"cannot find the {name} command next to {sys.executable} or on PATH; "
            f"pass its absolute path (--{name}-command)",
        )
    return found
