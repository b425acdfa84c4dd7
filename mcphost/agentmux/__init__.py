"""agentmux's conventions, below both the relay (`mcphost.relay`) and its client, the relay tools
(`mcphost.relaytools`): what both ends must agree on lives here once.

- `layers`       the configuration layers and state root, and the ONE reader of their TOML files
- `tables`       a configuration table read key by key, strictly or leniently (`Reading`)
- `bundlefile`   the bundle file (`bundles/<id>.toml`, `coders.toml`): its model, its ONE reader
                 (strict for the relay, lenient for the relay tools) and its writer (the supervisor's)
- `settings`     `AgentmuxSettings`: flags > `AGENTMUX_*` (pydantic-settings, imported lazily)
- `wire`         the relay wire protocol: frames, `RelayError`, principal ids, constants
- `operations`   typed request bodies per operation (pydantic): the one reader both ends use
- `inscriptions` the JSON-lines record writer (`mcp.log`, `relay.log`)

Must never: import `mcphost.relay` or `mcphost.relaytools` (checked by import-linter,
pyproject.toml), or anything heavy at package import time (this file imports nothing).
"""
