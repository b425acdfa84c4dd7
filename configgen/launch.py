"""Finding the commands that start the servers: the edge where configgen looks at the filesystem.

Owns: the default `mcphost` command (the console script installed next to the running Python,
else the one on PATH), resolved to an absolute path so a config works outside the virtual
environment, and the same for upstream's `agentmux`; for attach entries, the running
interpreter (`sys.executable`, the real Python, never a wrapper script) and the installed pump
(`mcphost/attach.py`, found beside the imported `mcphost` package without importing it).
Must never: be imported by the pure modules (model, clients, merge, jsonedit).
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


def attach_script() -> str:
    """The absolute path of the installed pump, `mcphost/attach.py` (it may not exist)."""
    import mcphost  # tiny: its version only

    return os.path.join(os.path.dirname(os.path.abspath(mcphost.__file__)), "attach.py")


def resolve_commands(config: AgentConfig) -> AgentConfig:
    """`config` with its unset commands filled in (only those it needs): `mcphost` /
    `agentmux`, and for attach entries the interpreter and the pump script."""
    mcphost, agentmux = config.mcphost, config.agentmux
    python, script = config.python, config.attach_script
    if config.needs_mcphost and mcphost is None:
        mcphost = _required("mcphost")
    if config.needs_agentmux and agentmux is None:
        agentmux = _required("agentmux")
    if config.needs_attach:
        if python is None:
            if not sys.executable or not os.path.isabs(sys.executable):
                raise ConfigError(
                    "attach python",
                    "the running Python's path is unknown; pass the interpreter's absolute path",
                )
            python = sys.executable
        if script is None:
            script = attach_script()
            if not os.path.isfile(script):
                raise ConfigError(
                    "attach script",
                    f"the attach pump {script} is missing from the installed mcphost; "
                    "reinstall mcphost or pass the script's absolute path",
                )
    return dataclasses.replace(
        config, mcphost=mcphost, agentmux=agentmux, python=python, attach_script=script
    )


def _required(name: str) -> str:
    found = find_command(name)
    if found is None:
        raise ConfigError(
            f"{name} command",
            f"cannot find the {name} command next to {sys.executable} or on PATH; "
            f"pass its absolute path (--{name}-command)",
        )
    return found
