"""Validate what the servers write on stdout against the MCP SDK's own models (`mcp_types`).

The raw drivers (tests/hardening/conftest.py `RawHost`, mcphost/testing/relayharness.py
`RawServer`) see every stdout line; each one goes through `check_message`, and each answer to a
request whose method is known also through the result model for that method. A problem is
recorded, not raised, by the reader; the driver asserts there were none when it closes.

One deliberate exception: an error reply *without* an `id` member. JSON-RPC 2.0 says `id` is
null when the request's id could not be read; the MCP schema (2025-11-25 and later:
`JSONRPCErrorResponse.id` is optional) allows leaving it out, and our core does so for a line it
could not parse. The Python SDK's `JSONRPCError` model requires the member (nullable), so such a
reply is validated as if it carried `"id": null`, and nothing else is relaxed.
"""

from __future__ import annotations

from typing import Any

import mcp_types
from pydantic import BaseModel, ValidationError

RESULT_MODELS: dict[str, type[BaseModel]] = {
    "initialize": mcp_types.InitializeResult,
    "tools/list": mcp_types.ListToolsResult,
    "tools/call": mcp_types.CallToolResult,
    "ping": mcp_types.EmptyResult,
}


def check_message(message: Any, method: str | None = None) -> str | None:
    """None if `message` is a valid MCP message (and a valid result for `method`), else why."""
    if not isinstance(message, dict):
        return f"not a JSON object: {message!r:.200}"
    try:
        if "error" in message and "id" not in message:
            # schema-valid without an id (see the module docstring); the SDK model wants null
            mcp_types.JSONRPCError.model_validate({**message, "id": None})
            return None
        parsed = mcp_types.jsonrpc_message_adapter.validate_python(message)
        if isinstance(parsed, mcp_types.JSONRPCNotification):
            mcp_types.server_notification_adapter.validate_python(message)
        elif isinstance(parsed, mcp_types.JSONRPCResponse) and method in RESULT_MODELS:
            RESULT_MODELS[method].model_validate(parsed.result)
    except ValidationError as exc:
        return f"{str(exc)[:500]} in {str(message)[:300]}"
    return None
