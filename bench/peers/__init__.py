"""Peer MCP servers measured beside the host, launched as separate processes."""
