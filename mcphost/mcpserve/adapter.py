"""A `Surface` as an MCP SDK low-level `Server`, served over any pair of SDK message streams.

Owns: the mapping between the protocol-neutral contract (`mcphost.surface`) and
`mcp.server.lowlevel.Server`:
- `tools/list` -> `Surface.list_tools()` (the surface decides tiering), each `ToolSpec` in its
  wire form, `outputSchema` included where the tool declares one;
- `tools/call` -> `Surface.call_tool()` with a `CallContext` whose progress goes out as
  `notifications/progress` under the request's `progressToken` and whose `tools_changed()` is
  the session's `send_tool_list_changed` in the handshake era, and in the 2026-07-28 era (which
  delivers list changes only on `subscriptions/listen` streams) a `ToolsListChanged` event on
  the session's subscription bus, served by the SDK's `ListenHandler` (only for surfaces whose
  list changes);
- `ToolResult` -> `CallToolResult` (`content`, `isError`, `structuredContent`);
- `RpcError` -> a JSON-RPC error with its `data` (`MCPError`); any other exception -> -32603
  with `data: {code: internal_unexpected_failure, ...}` and the traceback in an event on stderr,
  never on the wire.
Cancellation (`notifications/cancelled`) is the SDK's: it cancels the handler's scope and the
request is never answered.

Must never: touch stdin/stdout or any transport (see `mcphost.mcpserve.stdio`), validate
arguments itself (the surface does, with its own error shapes), or let an exception text reach
the client unmapped (the SDK would send `code 0, message str(exc)`).
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.server.caching import CacheHint
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp.shared.subscriptions import ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcphost import events
from mcphost.surface import CallContext, RpcError, Surface

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext
    from mcp.shared._stream_protocols import ReadStream, WriteStream
    from mcp.shared.message import SessionMessage

INTERNAL_ERROR = -32603
UNEXPECTED = "the tool failed unexpectedly; the error was logged on the server"


def build_server(surface: Surface) -> Server[Any]:
    """The SDK low-level server that serves `surface`'s tools (and nothing else)."""
    bus = InMemorySubscriptionBus()

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams
    ) -> dict[str, Any]:
        listed: dict[str, Any] = {"tools": [spec.wire() for spec in surface.list_tools()]}
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            listed["resultType"] = "complete"  # required from 2026-07-28 on
        return listed

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> dict[str, Any]:
        session = ctx.session
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        token = progress_token_from_params(ctx.params)
        request_id = ctx.request_id

        async def send(method: str, body: dict[str, Any]) -> None:
            if method == "notifications/progress":
                if token is None:
                    return
                await session.send_progress_notification(
                    token,
                    body["progress"],
                    body.get("total"),
                    body.get("message"),
                    related_request_id=request_id,  # type: ignore[arg-type]
                )
            elif method == "notifications/tools/list_changed":
                if modern:
                    await bus.publish(ToolsListChanged())
                else:
                    await session.send_tool_list_changed()

        call = CallContext(request_id=request_id, progress_token=token, send_notification=send)
        try:
            result = await surface.call_tool(params.name, params.arguments or {}, call)
        except RpcError as err:
            raise MCPError(code=err.code, message=err.message, data=err.data) from None
        except Exception as exc:
            events.emit(
                "mcp.call.unexpected_failure",
                level="error",
                tool=params.name[:128],
                exception=type(exc).__name__,
                traceback=traceback.format_exc(limit=8),
            )
            raise MCPError(
                code=INTERNAL_ERROR,
                message=UNEXPECTED,
                data={
                    "code": "internal_unexpected_failure",
                    "message": UNEXPECTED,
                    "details": {"exception": type(exc).__name__},
                },
            ) from None
        answer = result.wire()
        if modern:
            answer["resultType"] = "complete"
        return answer

    server: Server[Any] = Server(
        surface.name,
        version=surface.version,
        instructions=surface.instructions,
        # 2026-07-28 lists carry a freshness hint: ours is per agent and changes with tiering
        cache_hints={"tools/list": CacheHint(ttl_ms=0, scope="private")},
    )
    server.add_request_handler("tools/list", types.PaginatedRequestParams, list_tools)
    server.add_request_handler("tools/call", types.CallToolRequestParams, call_tool)
    if surface.list_changed:
        listen = ListenHandler(bus)
        server.add_request_handler(
            "subscriptions/listen", types.SubscriptionsListenRequestParams, listen
        )
    # No tracing exporter is ever installed in these processes: skip the per-message span.
    server.middleware = []
    return server


def initialization_options(surface: Surface, server: Server[Any]) -> InitializationOptions:
    return server.create_initialization_options(
        NotificationOptions(tools_changed=surface.list_changed)
    )


async def serve_streams(
    surface: Surface,
    read_stream: ReadStream[SessionMessage | Exception],
    write_stream: WriteStream[SessionMessage],
) -> None:
    """Serve one MCP session of `surface` over an SDK stream pair until the read side closes.

    Every protocol era the SDK speaks is served (the client's first request decides). The
    surface is not closed here: its owner (one stdio process, or a supervisor session) does.
    """
    server = build_server(surface)
    await server.run(read_stream, write_stream, initialization_options(surface, server))
