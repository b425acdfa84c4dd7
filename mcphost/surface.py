"""The contract between a tool surface and whatever serves it over MCP.

Owns: the data a surface hands the protocol core (`ToolSpec`, `ToolResult`), the exception that
becomes a JSON-RPC error (`RpcError`), what a running call can do (`CallContext`), and the
`Surface` protocol itself. Both surfaces (the center host, the relay tools) are written against
this module only, so the core that serves them can change without touching a tool.
Must never: do I/O or import a protocol implementation; it is pure data plus the protocol.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool as `tools/list` shows it."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    annotations: Mapping[str, Any] | None = None
    title: str | None = None
    output_schema: Mapping[str, Any] | None = None  # declared by tools that return `structured`

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
        }
        if self.title:
            out["title"] = self.title
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        if self.output_schema is not None:
            out["outputSchema"] = self.output_schema
        return out


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A `tools/call` result: one text block, optionally structured content, optionally an error."""

    text: str
    is_error: bool = False
    structured: Mapping[str, Any] | None = None

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "content": [{"type": "text", "text": self.text}],
            "isError": self.is_error,
        }
        if self.structured is not None:
            out["structuredContent"] = dict(self.structured)
        return out


class RpcError(Exception):
    """Raised by a surface to answer the request with a JSON-RPC error object."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            out["data"] = self.data
        return out


@dataclass(slots=True)
class CallContext:
    """What a tool call may do besides returning: report progress, announce a new tool list."""

    request_id: Any
    progress_token: Any = None
    send_notification: Callable[[str, dict[str, Any]], Awaitable[None]] | None = field(
        default=None, repr=False
    )

    async def progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Send `notifications/progress` if the client asked for it; otherwise do nothing."""
        if self.progress_token is None or self.send_notification is None:
            return
        params: dict[str, Any] = {"progressToken": self.progress_token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        await self.send_notification("notifications/progress", params)

    async def tools_changed(self) -> None:
        """Tell the client the tool list changed (`notifications/tools/list_changed`)."""
        if self.send_notification is not None:
            await self.send_notification("notifications/tools/list_changed", {})


class Surface(Protocol):
    """A set of tools served over MCP. The core owns the wire; the surface owns the tools."""

    name: str
    version: str
    instructions: str | None
    list_changed: bool

    def list_tools(self) -> Sequence[ToolSpec]: ...

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], ctx: CallContext
    ) -> ToolResult: ...

    async def aclose(self) -> None: ...
