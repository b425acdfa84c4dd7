"""RequestBuilder: every request one agent's host sends to its center, built in one place.

Owns: the route, JSON body, query and headers of every request made for one `AgentBinding`:
catalog tools (to the center or the runtime socket; the route is `ToolDecl.route`), the three
upload steps and the download of the file tools, and `mcphost check`'s probe. It is the only
writer of identity: `agent_id` (set last in every JSON body, so nothing can overwrite it; in the
query of the two byte transfers, whose bodies are bytes) and `X-AC-MCP-Generation` (in the
headers of every request, the runtime socket's included), and the agent is each request's `lane`
(whose share of a shared client's slots it spends). It also checks the one center-given
value that becomes part of a route (the upload's `transfer_id`, `transfer_segment`).

Why in `mcphost.host` and not `mcphost.admin`: it is built from an `AgentBinding`, and
`mcphost.binding` imports `mcphost.admin` (the target and pin grammars), so an admin module that
imported the binding would tie the two in a circle. The split keeps each side simple: the admin
client (`mcphost.admin.client`) is a transport that knows no agent and sends an `AdminRequest`
exactly as built, so one pooled client can carry the requests of many bindings (the supervisor),
while this builder knows the agent and no socket.

Pure: no I/O. Must never: take identity from tool arguments, see the token (the client adds it),
or put a center-given id into a route unchecked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from mcphost.admin.client import AdminRequest
from mcphost.binding import AgentBinding
from mcphost.catalog import BY_NAME
from mcphost.catalog.files import UPLOAD_FILE
from mcphost.catalog.model import StrictInput, ToolDecl
from mcphost.errors import AdminFailure

GENERATION_HEADER = "X-AC-MCP-Generation"
PROBE_TOOL = "get_my_work"  # harmless, read-only, needs no argument
# A center-given transfer id becomes a URL path segment: it must be one plain id, never a path,
# query or fragment (`T1?agent_id=agent-2`, `..`). It is also percent-quoted when used.
_TRANSFER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:~-]{0,127}")


class RequestBuilder:
    """The requests of one agent: identity from the binding, nothing else from anywhere."""

    def __init__(self, binding: AgentBinding) -> None:
        self._agent_id = binding.agent_id
        self._headers = {GENERATION_HEADER: str(binding.generation)}

    # -- JSON calls -----------------------------------------------------------------------
    def tool(self, decl: ToolDecl, params: StrictInput) -> AdminRequest:
        """A catalog tool: its validated arguments as the body, to its declared route."""
        return self._post(decl.route, params.model_dump(mode="json", exclude_none=True))

    def probe(self) -> AdminRequest:
        """`mcphost check`'s one harmless read."""
        decl = BY_NAME[PROBE_TOOL]
        return self.tool(decl, decl.input())

    def upload_open(
        self, filename: str, content_type: str, size: int, scope: Mapping[str, Any]
    ) -> AdminRequest:
        """Step 1 of an upload: open a transfer session (the tool's own center route)."""
        body = {"filename": filename, "content_type": content_type, "size": size, **scope}
        return self._post(UPLOAD_FILE.route, body)

    def upload_complete(
        self, transfer: Any, sha256: str, size: int, scope: Mapping[str, Any]
    ) -> AdminRequest:
        """Step 3: complete the transfer with the hash and size that were sent."""
        body = {"sha256": sha256, "size": size, **scope}
        return self._post(f"/admin/files/transfer/{transfer_segment(transfer)}/complete", body)

    # -- byte transfers (identity in the query) --------------------------------------------
    def upload_bytes(self, transfer: Any, size: int) -> AdminRequest:
        """Step 2: the PUT whose body is the file's bytes (streamed by the caller)."""
        return AdminRequest(
            "PUT",
            f"/admin/files/transfer/{transfer_segment(transfer)}",
            query={"agent_id": self._agent_id},
            headers={
                **self._headers,
                "Content-Type": "application/octet-stream",
                "Content-Length": str(size),
            },
            lane=self._agent_id,
        )

    def download(self, file_id: str) -> AdminRequest:
        """The GET of a file's bytes; `file_id` is a ULID already parsed from the reference."""
        return AdminRequest(
            "GET",
            f"/admin/files/{quote(file_id, safe='')}",
            query={"agent_id": self._agent_id},
            headers={**self._headers, "Accept": "*/*"},
            lane=self._agent_id,
        )

    def _post(self, route: str, body: Mapping[str, Any]) -> AdminRequest:
        return AdminRequest(
            "POST",
            route,
            body={**body, "agent_id": self._agent_id},
            headers=self._headers,
            lane=self._agent_id,
        )


def transfer_segment(value: Any) -> str:
    """The center's transfer id as one quoted URL path segment, or `admin_protocol_error`.

    The id is data the host did not write: it must match the id grammar (so `..`, `a/b`,
    `T1?agent_id=agent-2` or a fragment can never change the route or the query), and it is
    percent-quoted as well, so no character of it is ever read as URL syntax."""
    if isinstance(value, str) and _TRANSFER_ID.fullmatch(value):
        return quote(value, safe="")
    shown = None if value is None else str(value)[:200]
    raise AdminFailure(
        "admin_protocol_error",
        "the center opened no usable upload session: its transfer_id "
        + ("is missing" if value is None else f"{shown!r} is not a plain id")
        + " (letters, digits and . _ : ~ -, at most 128); nothing was sent. Retry once, then "
        "report it to the center's operators",
        {"transfer_id": shown},
    )
