"""The relay tools as a `mcphost.surface` Surface: dispatch, the association guard, result and error shapes.

Owns: the order every call goes through (validate -> association guard -> handler), turning a
`ToolFailure` into a JSON-RPC error (`-32602`/`-32603`, `data: {code, message, details}` with
`details` null when absent), turning a success payload into one text content item holding the
compact JSON document, the `initialize` instructions, and `mcp.startup` /
`mcp.tool.stream.events_ignored` inscriptions.

Must never: touch stdin/stdout (the protocol core, `mcphost.mcpserve`, owns them), let a Python exception escape as
anything but a `ToolFailure`-shaped error, or surface relay stream events to the client.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from mcphost import __version__
from mcphost.agentmux.inscriptions import Inscriptions
from mcphost.relaytools import errors, help, tools
from mcphost.relaytools import validation as V
from mcphost.relaytools.handlers import Handlers, Relay
from mcphost.relaytools.layout import Layout
from mcphost.surface import CallContext, RpcError, ToolResult, ToolSpec

BASE_INSTRUCTIONS = "agentmux MCP server for tmux-backed multi-agent coordination."


def instructions(layout: Layout) -> str:
    if layout.associated:
        return (
            f"{BASE_INSTRUCTIONS} Associated with session '{layout.session}' in namespace "
            f"'{layout.bundle}'."
        )
    if layout.fault is not None:
        return (
            f"{BASE_INSTRUCTIONS} This server could not associate ({layout.fault.code}: "
            f"{layout.fault.message}); relay-backed tools fail with {layout.fault.code}. "
            f"Start it with `{errors.REMEDY}`."
        )
    return (
        f"{BASE_INSTRUCTIONS} This server is unassociated (no bundle/session); relay-backed "
        f"tools fail with validation_unknown_sender. Start it with `{errors.REMEDY}`."
    )


def dumps(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def rpc_error(failure: errors.ToolFailure) -> RpcError:
    return RpcError(failure.rpc_code, failure.message, failure.data())


class RelayToolsSurface:
    """Nine agentmux tools over one lazily connected relay stream."""

    name = "mcphost-relay-tools"
    version = __version__
    list_changed = False

    def __init__(
        self,
        layout: Layout,
        relay_factory: Callable[[Layout, Callable[[int], None], Callable[..., None]], Relay],
    ) -> None:
        from mcphost.agentmux.inscriptions import log_path

        self.layout = layout
        self.instructions: str | None = instructions(layout)
        self.inscriptions = Inscriptions(
            log_path(layout.inscriptions_root, layout.bundle, layout.session)
            if layout.associated
            else log_path(layout.inscriptions_root, None, None)
        )
        self.relay: Relay | None = None
        self.handlers: Handlers | None = None
        if layout.associated:
            self.relay = relay_factory(layout, self._events_ignored, self.inscriptions.write)
            self.handlers = Handlers(layout, self.relay, self.inscriptions.write)
        self._specs = tools.tool_specs()
        self.inscriptions.write(
            "mcp.startup",
            association_status="associated" if layout.associated else "unassociated",
            association_reason=layout.reason,
            bundle_name=layout.bundle,
            session_name=layout.session,
            fault_code=layout.fault.code if layout.fault else None,
            configuration_root=[str(r) for r in layout.configuration_roots],
            state_root=str(layout.state_root),
            inscriptions_root=str(layout.inscriptions_root),
        )

    def _events_ignored(self, count: int) -> None:
        self.inscriptions.write(
            "mcp.tool.stream.events_ignored", namespace=self.layout.bundle, count=count
        )

    # -- Surface ----------------------------------------------------------------------------

    def list_tools(self) -> Sequence[ToolSpec]:
        return self._specs

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], ctx: CallContext
    ) -> ToolResult:
        try:
            payload = await self._dispatch(name, arguments)
        except errors.ToolFailure as failure:
            raise rpc_error(failure) from None
        return ToolResult(dumps(payload))

    async def aclose(self) -> None:
        aclose = getattr(self.relay, "aclose", None)
        if aclose is not None:
            await aclose()
        self.inscriptions.close()

    # -- dispatch ---------------------------------------------------------------------------

    def _handlers(self) -> Handlers:
        """The association guard: relay-backed tools need a bundle and a session."""
        if self.handlers is not None:
            return self.handlers
        if self.layout.fault is not None:
            raise errors.startup_fault(self.layout.fault.code, self.layout.fault.message)
        raise errors.unknown_sender()

    async def _dispatch(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        if name == "help":
            query = V.validate_help(arguments).query
            block = help.association_block(
                self.layout.bundle,
                self.layout.session,
                self.layout.associated,
                self.layout.fault.code if self.layout.fault else None,
            )
            return help.render(query, block)
        route = _ROUTES.get(name)
        if route is None:
            raise errors.invalid_params(
                f"unknown tool '{name}'; available tools: {', '.join(tools.REGISTRATION_ORDER)}",
                {"tool": name},
            )
        validate, run = route
        request = validate(arguments)
        return await run(self._handlers(), request)


def _list(h: Handlers, req: Any) -> Awaitable[dict[str, Any]]:
    if isinstance(req, V.ListDecisions):
        return h.list_decisions(req)
    return h.list_principals(req)


_ROUTES: dict[
    str,
    tuple[Callable[[Mapping[str, Any]], Any], Callable[[Handlers, Any], Awaitable[dict[str, Any]]]],
] = {
    "list": (V.validate_list, _list),
    "send": (V.validate_send, Handlers.send),
    "look": (V.validate_look, Handlers.look),
    "raww": (V.validate_raww, Handlers.raww),
    "choose": (V.validate_choose, Handlers.choose),
    "updown": (V.validate_updown, Handlers.updown),
    "new": (V.validate_new, Handlers.new_peer),
    "change": (V.validate_change, Handlers.change_psk),
}
