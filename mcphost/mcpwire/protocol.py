"""JSON-RPC and MCP constants of the wire core: error codes and the handshake versions spoken.

The surface contract (tool specs, results, errors, call context) lives in `mcphost.surface`.
Must never: do I/O.
"""

from __future__ import annotations

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_HANDSHAKE_VERSION = HANDSHAKE_VERSIONS[-1]
