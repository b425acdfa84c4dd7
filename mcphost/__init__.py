"""mcphost: per-agent MCP tool surfaces bound to one agent identity.

Kept tiny on purpose: a worker starts one host per agent, so importing this package must cost
nothing. Each subcommand imports its own machinery lazily (see `mcphost.cli`).
"""

__version__ = "0.1.0"
