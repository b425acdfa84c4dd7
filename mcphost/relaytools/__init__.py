"""The agentmux-compatible relay tools: nine MCP tools that speak agentmux's relay wire protocol.

One small module per concern (agentmux's own conventions, shared with the relay: the layers'
reader, the wire, the inscriptions writer, are `mcphost.agentmux`):

- `layout`       association (flags / env / XDG), bundle membership (the bundle file's lenient
                 reading, `agentmux.bundlefile`), socket and PSK paths
- `errors`       the stable error taxonomy and its JSON-RPC mapping
- `params`       input schemas as data (no null unions, `additionalProperties: false`)
- `validation`   pure request validation: the upstream order, messages and details
- `tools`        the catalog: tool names, descriptions, kinds, commands
- `help`         the `help` tool's documents, composed from the catalog and the schemas
- `stream`       the one long-lived, multiplexed relay connection
- `handlers`     relay request building and response mapping, per tool
- `surface`      the MCP `Surface` the protocol core (`mcphost.mcpserve`) serves
- `cli`          argv -> layout -> `mcpserve.stdio.run`

Must never: import the MCP SDK, or anything heavy at package import time (this file imports
nothing).
"""
