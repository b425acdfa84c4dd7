"""`mcphost host`: read the binding, then serve the center tools for one agent over stdio.

Owns: start-up of the per-agent host. A bad binding exits 2 with one stderr line naming the
variable; a center that is down does not stop start-up (each call then gets a classified error).
Must never: write to stdout (it is the JSON-RPC stream), accept identity from argv, or echo an
argument it was given (one may be a token typed where it does not belong; it is named, not shown).
"""

from __future__ import annotations

import sys

USAGE = """usage: mcphost [host]

Serve the agent-center tools for one agent over stdio (MCP). Configured only by environment:
  AC_MCP_AGENT_ID            the agent's id (required)
  AC_MCP_ADMIN_URL           unix:/abs/path.sock | /abs/path.sock | tcp://host:port (required)
  AC_MCP_WORKER_TOKEN        bearer token (or AC_MCP_WORKER_TOKEN_FILE, a 0600 file)
  AC_MCP_SERVER_FINGERPRINT  pinned certificate SHA-256, comma-separated for rotation (tcp://)
  AC_MCP_AGENT_ROOT          workspace root for file tools (absolute)
  AC_MCP_RUNTIME_SOCKET      agent-runtime control socket for fork_executor (absolute)
  AC_MCP_TIER_TOOLS          true (default): core tools + search_tools; false: everything
  AC_MCP_GENERATION          host generation (integer >= 0, default 0)
"""


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 0
    if argv:
        from mcphost.cliargs import describe_unexpected

        print(
            f"mcphost host: {describe_unexpected(argv)}; configure with AC_MCP_* variables "
            "(see mcphost host --help)",
            file=sys.stderr,
        )
        return 2
    from mcphost.binding import AgentBinding, BindingError

    try:
        binding = AgentBinding.from_env()
    except BindingError as exc:
        for line in exc.lines():  # one line per bad variable
            print(f"mcphost: {line}", file=sys.stderr)
        return 2

    from mcphost import events
    from mcphost.host.server import HostSurface
    from mcphost.mcpserve.stdio import run

    def build() -> HostSurface:
        return HostSurface(binding)  # warmed up by the core once `initialize` is answered

    events.emit(
        "mcp.startup",
        surface="host",
        agent_id=binding.agent_id,
        target=str(binding.target),
        tier_tools=binding.tier_tools,
        generation=binding.generation,
    )
    return run(build)
