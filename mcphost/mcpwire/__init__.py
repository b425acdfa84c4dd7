"""A lean MCP server core for stdio: framing, handshake, tools, progress, cancellation, backpressure.

Owns: the wire. Both tool surfaces (the center host and the relay tools) plug a
`mcphost.surface.Surface` into `serve_stdio` and never touch stdin or stdout themselves.

Why not the SDK's server: importing `mcp.server` costs about a second and ~70 MB per process,
and a worker runs one host per agent. This core speaks the handshake-era protocol
(2024-11-05 .. 2025-11-25) that Claude Code, Codex, the Inspector and the SDK client use over
stdio, imports only the standard library, and is tested against the official SDK client and
the TypeScript Inspector. Nothing here imports `mcp`.

Must never: write anything but JSON-RPC to the protocol stream, or import heavy modules.
"""
