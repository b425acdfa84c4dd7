"""HostSurface: the catalog served over MCP for one agent, through one generic passthrough.

Owns: listing (tiering: core tools plus `search_tools`, deferred tools loaded additively),
argument validation before any I/O (first the size bounds of `mcphost.argbounds`, so an
oversized object is refused without being walked, then the tool's pydantic model), sending each
call's request (built, identity included, by `mcphost.host.requests.RequestBuilder`) to the
center or the runtime socket, and mapping replies to results. Tools with `destination="local"`
are served by the surface's table of local handlers: `search_tools` here, the file tools from
`mcphost.host.files.FileTools.handlers()` (this module imports the file tools; they never import
it).

Clients: standalone, the surface opens its own admin client (and runtime client) from the
binding and closes them in `aclose()`. Under the supervisor, one pooled, pinned client is shared
by every agent's surface: passed in as `admin=` (and `runtime=`), it is used and never closed
here (its owner closes it); identity still comes from this surface's binding, through its
`RequestBuilder`, never from the client. The owner may also pass `on_failure`, told of every
failure a call returns (the supervisor learns there that the center fenced a generation), and
`on_done`, told of every call's end: the tool (a catalog name, or `unknown`), its outcome (`ok`
or the failure's code) and its seconds (the supervisor counts them: `ctl status`).

Deferral is a listing choice, not a permission: every catalog tool is callable by name, so a
client that ignores `tools/list_changed` still reaches what `search_tools` found.
Must never: let an argument decide the identity, or write identity itself; log the token.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from pydantic import ValidationError

from mcphost import __version__, events
from mcphost.admin.client import CALL_TIMEOUT, AdminClient
from mcphost.admin.target import AdminTarget
from mcphost.argbounds import oversize, short_name
from mcphost.binding import AgentBinding
from mcphost.catalog import CATALOG
from mcphost.catalog.meta import SearchTools
from mcphost.catalog.model import StrictInput, ToolDecl
from mcphost.errors import StaleGeneration, ToolFailure
from mcphost.host.files import FileTools, LocalHandler
from mcphost.host.requests import RequestBuilder
from mcphost.host.results import (
    arguments_too_large,
    failure_result,
    invalid_arguments,
    success_text,
)
from mcphost.host.workspace import HeldRoot
from mcphost.surface import CallContext, ToolResult, ToolSpec
from mcphost.tuning import tuning


def call_timeout_from_env() -> float:
    """`MCPHOST_CALL_TIMEOUT_SECONDS` (`mcphost.tuning`; tests shorten it), else the default."""
    return tuning().call_timeout_seconds or CALL_TIMEOUT


def _spec(decl: ToolDecl) -> ToolSpec:
    return ToolSpec(
        name=decl.name,
        description=decl.description,
        input_schema=decl.input_schema,
        annotations=decl.annotations,
        output_schema=decl.output_schema,
    )


class HostSurface:
    """The center tools for one agent."""

    name: str = "mcphost"
    version: str = __version__
    instructions: str | None
    list_changed: bool

    def __init__(
        self,
        binding: AgentBinding,
        *,
        catalog: Sequence[ToolDecl] = CATALOG,
        admin: AdminClient | None = None,
        runtime: AdminClient | None = None,
        workspace: HeldRoot | None = None,
        on_failure: Callable[[ToolFailure], None] | None = None,
        on_done: Callable[[str, str, float], None] | None = None,
    ) -> None:
        """`admin`/`runtime`: shared clients owned by the caller (used, never closed here);
        without them the surface opens its own from the binding and closes them itself.
        `workspace`: the root to serve the file tools beneath, handed over (closed with the
        surface); without it the surface opens `binding.agent_root` now.
        `on_failure`: called with each failure a call returns, before it is returned.
        `on_done(tool, outcome, seconds)`: called as each call ends (outcome `ok`, a failure's
        code, `cancelled`, or `internal` for an exception that escapes)."""
        self.binding = binding
        self.on_failure = on_failure
        self.on_done = on_done
        self.catalog = {decl.name: decl for decl in catalog}
        self.list_changed = binding.tier_tools
        self.loaded: set[str] = set()
        self.requests = RequestBuilder(binding)
        self._owned: list[AdminClient] = []
        if admin is None:
            admin = AdminClient(
                binding.target,
                token=binding.token.reveal(),
                pins=binding.pins,
                call_timeout=call_timeout_from_env(),
            )
            self._owned.append(admin)
        if runtime is None and binding.runtime_socket:
            runtime = AdminClient(AdminTarget(kind="unix", path=binding.runtime_socket))
            self._owned.append(runtime)
        self.admin = admin
        self.runtime = runtime
        self.instructions = (
            f"Agent-center tools for agent {binding.agent_id}. Your identity is fixed by this "
            "host; never pass agent_id. "
            + (
                "Only core tools are listed: call search_tools to find and load the others."
                if binding.tier_tools
                else ""
            )
        ).strip()
        self._specs = {decl.name: _spec(decl) for decl in self.catalog.values()}
        # the workspace root, opened once now and held: every file call resolves beneath it
        self.workspace = HeldRoot(binding) if workspace is None else workspace
        self.files = FileTools(self.requests, self.admin, self.workspace)
        self.local: dict[str, LocalHandler] = {
            "search_tools": partial(search_tools, self),
            **self.files.handlers(),
        }

    # -- listing --------------------------------------------------------------------------
    def visible(self, decl: ToolDecl) -> bool:
        if decl.name == "search_tools":
            return self.binding.tier_tools
        return not self.binding.tier_tools or decl.tier == "core" or decl.name in self.loaded

    def list_tools(self) -> Sequence[ToolSpec]:
        return [self._specs[d.name] for d in self.catalog.values() if self.visible(d)]

    # -- calling --------------------------------------------------------------------------
    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], ctx: CallContext
    ) -> ToolResult:
        started, outcome = time.perf_counter(), "internal"
        try:
            result, outcome = await self._call(name, arguments, ctx)
            return result
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            if self.on_done is not None:
                tool = name if name in self.catalog else "unknown"
                self.on_done(tool, outcome, time.perf_counter() - started)

    async def _call(
        self, name: str, arguments: Mapping[str, Any], ctx: CallContext
    ) -> tuple[ToolResult, str]:
        """The call's result and its outcome (`ok`, or the failure's code)."""
        started = time.perf_counter()
        decl = self.catalog.get(name)
        try:
            if decl is None:
                raise ToolFailure(
                    "unknown_tool",
                    f"there is no tool named {short_name(name)!r}; call search_tools to find "
                    "the right one",
                    {"tool": short_name(name)},
                )
            too_large = oversize(arguments)
            if too_large is not None:
                raise arguments_too_large(name, too_large, arguments, self.binding.agent_id)
            try:
                params = decl.input.model_validate(arguments)
            except ValidationError as exc:
                raise invalid_arguments(
                    name, exc.errors(include_url=False), self.binding.agent_id
                ) from None
            if decl.destination == "local":
                result = await self.local[name](params, ctx)
            else:
                result = await self._forward(decl, params)
        except ToolFailure as failure:
            failure = self._explain(failure)
            if self.on_failure is not None:
                self.on_failure(failure)
            events.emit(
                "mcp.tool.failed",
                level="warning",
                tool=short_name(name),
                code=failure.code,
                status=failure.status,
                ms=round((time.perf_counter() - started) * 1000, 2),
            )
            return failure_result(failure), failure.code
        if events.enabled("debug"):
            events.emit(
                "mcp.tool.ok",
                level="debug",
                tool=name,
                ms=round((time.perf_counter() - started) * 1000, 2),
            )
        return result, "ok"

    async def _forward(self, decl: ToolDecl, params: StrictInput) -> ToolResult:
        """The one generic passthrough: the request from the builder, the reply mapped."""
        client = self.admin if decl.destination == "center" else self.runtime
        if client is None:
            raise ToolFailure(
                "runtime_socket_unconfigured",
                f"{decl.name} needs this worker's agent-runtime control socket, and this host "
                "has none: the operator must set AC_MCP_RUNTIME_SOCKET",
                {"tool": decl.name, "variable": "AC_MCP_RUNTIME_SOCKET"},
            )
        reply = await client.call(self.requests.tool(decl, params), retry_safe=decl.read_only)
        return ToolResult(text=success_text(reply.body))

    def _explain(self, failure: ToolFailure) -> ToolFailure:
        """Add the remedy the center cannot know about to center codes that need one."""
        if isinstance(failure, StaleGeneration):
            return StaleGeneration(
                "stale_generation",
                f"this host (generation {self.binding.generation}) has been superseded by a "
                f"newer host for agent {self.binding.agent_id}; stop using these tools — the "
                "worker has started a replacement session",
                {**failure.details, "center_message": failure.message},
                status=failure.status,
            )
        return failure

    async def aclose(self) -> None:
        """Close what this surface opened: its own clients (never shared ones), the root."""
        for client in self._owned:
            await client.aclose()
        self.workspace.close()

    def warm_up(self) -> None:
        """Import the HTTP stack in the background so the first call does not pay for it."""
        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, __import__, "aiohttp")


async def search_tools(surface: HostSurface, params: StrictInput, ctx: CallContext) -> ToolResult:
    assert isinstance(params, SearchTools)
    deferred = [d for d in surface.catalog.values() if d.tier == "deferred"]
    unknown: list[str] = []
    if params.names:
        wanted = set(params.names)
        matches = [d for d in deferred if d.name in wanted]
        unknown = sorted(wanted - {d.name for d in surface.catalog.values()})
        core_hits = sorted(wanted & {d.name for d in surface.catalog.values() if d.tier == "core"})
    else:
        terms = [t for t in (params.query or "").lower().split() if len(t) >= 2]

        def hit(decl: ToolDecl) -> bool:
            haystack = f"{decl.name} {decl.summary} {decl.description}".lower()
            return all(term in haystack for term in terms)

        matches = [d for d in deferred if hit(d)]
        core_hits = sorted(
            d.name
            for d in surface.catalog.values()
            if d.tier == "core" and d.name != "search_tools" and terms and hit(d)
        )
    newly = {d.name for d in matches} - surface.loaded
    surface.loaded |= newly
    if newly and surface.binding.tier_tools:
        await ctx.tools_changed()
    payload = {
        "loaded": [
            {"name": d.name, "description": d.description, "inputSchema": d.input_schema}
            for d in matches
        ],
        "already_available": core_hits,
        "note": (
            "The host serves the loaded tools by name now; they join your tool list once "
            "your client refreshes it. If your client refuses a call as an unknown tool, "
            "call it again on your next turn. Loading is additive."
            if matches
            else "No deferred tool matched; try fewer or different words, or omit query to "
            "list them all."
        ),
    }
    if unknown:
        payload["unknown_names"] = unknown
    return ToolResult(text=json.dumps(payload, ensure_ascii=False))
