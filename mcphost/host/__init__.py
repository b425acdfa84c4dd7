"""One MCP server bound to one AgentBinding: the per-agent center host.

Must never: take `agent_id`, the workspace root or the token from tool arguments.
"""
