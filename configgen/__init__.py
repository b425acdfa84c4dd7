"""configgen: one pure generator of MCP client configs for the center host and the relay tools.

The pure layer (`model`, `clients`, `merge`; TOML via `tomli_w` and `tomlkit`) turns an `AgentConfig` into the bytes of a
client's config; the edge (`launch`, `files`, `cli`) finds commands and writes files. The
functions here are the Python API a worker daemon uses:

    config = AgentConfig(center=CenterBinding(agent_id=..., admin_url=..., token_file=...))
    write_config("/home/agent/mcp.json", "claude", config)

or, for an agent run by `mcphost supervise`, attach entries that hold no identity or secret:

    config = AgentConfig(center=AttachBinding("/var/lib/mcphost/run/center.sock"))

Must never: read the token file (the host does), or write a file other than 0600.
"""

from __future__ import annotations

from configgen.clients import CLIENTS, render
from configgen.files import read_existing, write_private
from configgen.launch import attach_script, resolve_commands
from configgen.merge import is_ours, merge
from configgen.model import (
    MARKER,
    AgentConfig,
    AttachBinding,
    CenterBinding,
    ConfigError,
    HttpBinding,
    RelayBinding,
)

__all__ = [
    "CLIENTS",
    "MARKER",
    "AgentConfig",
    "AttachBinding",
    "CenterBinding",
    "ConfigError",
    "HttpBinding",
    "RelayBinding",
    "attach_script",
    "generate",
    "is_ours",
    "merge",
    "render",
    "resolve_commands",
    "write_config",
]


def generate(
    client: str, config: AgentConfig, *, existing: bytes | None = None, force: bool = False
) -> bytes:
    """The config bytes for `client`, with default commands resolved; merged into `existing`
    when given (see `configgen.merge`)."""
    config = resolve_commands(config)
    if existing is None:
        return render(client, config)
    return merge(client, existing, config, force=force)


def write_config(
    path: str,
    client: str,
    config: AgentConfig,
    *,
    merge_existing: bool = False,
    force: bool = False,
) -> bytes:
    """Generate (merging into the file at `path` when `merge_existing`) and write it 0600,
    atomically. Returns the bytes written."""
    existing = read_existing(path) if merge_existing else None
    data = generate(client, config, existing=existing, force=force)
    write_private(path, data)
    return data
