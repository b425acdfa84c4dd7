"""agentmux's conventions, below both the relay (`mcphost.relay`) and its client, the relay tools
(`mcphost.relaytools`): what both ends must agree on lives here once.

- `layers`       the configuration layers and state root, and the ONE reader of their TOML files
- `settings`     `AgentmuxSettings`: flags > `AGENTMUX_*` (pydantic-settings, imported lazily)
- `wire`         the relay wire protocol: frames, `RelayError`, principal ids, constants
- `inscriptions` the JSON-lines record writer (`mcp.log`, `relay.log`)

Must never: import `mcphost.relay` or `mcphost.relaytools` (checked by import-linter,
pyproject.toml), or anything heavy at package import time (this file imports nothing).
"""
