"""Per-tool relay work: validated request -> relay request frame(s) -> MCP payload.

Owns: the relay request bodies (every body is its operation's `mcphost.agentmux.operations` model,
handed to the relay as it is: the stream sends it as `wire()` over a socket, with exact field
names, `null` where upstream sends null, omitted where it omits; an in-process stream hands the
model itself to the relay), which `namespace` each frame carries, the expected response `kind` per operation, the
pass-through of success payloads (only the `kind` tag is dropped), the `list principals`
algorithm (fan-out, the appended GLOBAL view, the synthesized down bundles), and the
`mcp.tool.<name>.<phase>` inscriptions around every relay call.

Must never: validate arguments (that is `validation`, and has already happened), decide
authorization, reshape a relay success payload, or replay a request.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from mcphost.agentmux.operations import (
    ChangePskRequest,
    ChoicesListRequest,
    ChoicesPickRequest,
    DownRequest,
    ListRequest,
    LookRequest,
    NewPeerRequest,
    RawwRequest,
    SendRequest,
    UpRequest,
    WireRequest,
)
from mcphost.relaytools import validation as V
from mcphost.relaytools.errors import (
    UNAVAILABLE_KINDS,
    RelayIOError,
    ToolFailure,
    from_relay_error,
    relay_io_failure,
    unexpected_response,
)
from mcphost.relaytools.layout import Layout
from mcphost.relaytools.params import FAN_OUT, GLOBAL

SCHEMA_VERSION = "1"


class Relay(Protocol):
    async def request(self, body: WireRequest, namespace: str | None = None) -> Any: ...


Inscribe = Callable[..., None]


def synthesized_home(layout: Layout, bundle: str, socket_present: bool) -> dict[str, Any]:
    """The down bundle reported for the home bundle when its relay cannot be reached."""
    if socket_present:
        code, reason = "relay_unavailable", "relay socket is present but relay is unavailable"
    else:
        code, reason = "not_started", "relay socket is not present"
    principals = []
    for member in layout.members:
        entry: dict[str, Any] = {"id": f"{member.id}@{bundle}"}
        if member.name:
            entry["name"] = member.name
        entry["transport"] = member.transport
        entry["ready"] = False
        principals.append(entry)
    return {
        "id": bundle,
        "hosted": False,
        "state": "down",
        "state_reason_code": code,
        "state_reason": reason,
        "startup_failure_count": 0,
        "recent_startup_failures": [],
        "principals": principals,
    }


def synthesized_global() -> dict[str, Any]:
    return {
        "id": GLOBAL,
        "hosted": False,
        "state": "down",
        "state_reason_code": "relay_unavailable",
        "state_reason": "relay is unavailable; GLOBAL session registry not enumerable",
        "startup_failure_count": 0,
        "recent_startup_failures": [],
        "principals": [],
    }


def _unavailable(exc: BaseException) -> bool:
    return isinstance(exc, RelayIOError) and exc.kind in UNAVAILABLE_KINDS


class Handlers:
    """The relay-backed tools for one associated server (bundle and session are set)."""

    def __init__(self, layout: Layout, relay: Relay, inscribe: Inscribe) -> None:
        assert layout.bundle is not None and layout.session is not None
        self.layout = layout
        self.bundle: str = layout.bundle
        self.session: str = layout.session
        self.relay = relay
        self.inscribe = inscribe
        self.socket = str(layout.socket_path)

    # -- the one relay round trip -----------------------------------------------------------

    async def _raw(self, event: str, body: WireRequest, namespace: str | None) -> Any:
        """The raw response object; transport failures inscribed and re-raised unmapped."""
        try:
            return await self.relay.request(body, namespace)
        except RelayIOError as exc:
            self.inscribe(f"{event}.io_error", error=f"{exc.kind}: {exc.cause}")
            raise
        except ToolFailure as failure:
            self.inscribe(
                f"{event}.relay_error",
                code=failure.code,
                message=failure.message,
                details=failure.details,
            )
            raise

    def _payload(self, event: str, response: Any, kind: str) -> dict[str, Any]:
        if isinstance(response, dict) and response.get("kind") == "error":
            failure = from_relay_error(response.get("error"))
            self.inscribe(
                f"{event}.relay_error",
                code=failure.code,
                message=failure.message,
                details=failure.details,
            )
            raise failure
        if not isinstance(response, dict) or response.get("kind") != kind:
            self.inscribe(f"{event}.unexpected_response", response=response)
            raise unexpected_response(response)
        return {k: v for k, v in response.items() if k != "kind"}

    async def _call(
        self, event: str, body: WireRequest, kind: str, namespace: str | None = None
    ) -> dict[str, Any]:
        try:
            response = await self._raw(event, body, namespace)
        except RelayIOError as exc:
            raise relay_io_failure(self.socket, exc) from None
        return self._payload(event, response, kind)

    def _succeeded(
        self, event: str, payload: dict[str, Any], fields: Sequence[str], **extra: Any
    ) -> None:
        """Inscribe `<event>.success` with the named payload fields and any computed extras."""
        self.inscribe(f"{event}.success", **extra, **{name: payload.get(name) for name in fields})

    # -- list -------------------------------------------------------------------------------

    async def list_principals(self, req: V.ListPrincipals) -> dict[str, Any]:
        namespace = req.namespace
        self.inscribe(
            "mcp.tool.list.request",
            requester_session=self.session,
            command="principals",
            namespace=namespace or self.bundle,
        )
        if namespace is None:
            bundles: Sequence[str] = [self.bundle]
        elif namespace == GLOBAL:
            bundles = []
        elif namespace == FAN_OUT:
            bundles = self.layout.configured_bundles()
        else:
            bundles = [namespace]
        body = ListRequest(requester_session=self.session)
        # every frame goes out at once; answers are assembled in the deterministic order
        outcomes = await asyncio.gather(
            *(self._raw("mcp.tool.list", body, ns) for ns in bundles),
            self._raw("mcp.tool.list.global", body, GLOBAL),
            return_exceptions=True,
        )
        listed: list[dict[str, Any]] = []
        for ns, outcome in zip([*bundles, GLOBAL], outcomes, strict=True):
            event = "mcp.tool.list.global" if ns == GLOBAL else "mcp.tool.list"
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome
                if _unavailable(outcome) and ns == GLOBAL:
                    listed.append(synthesized_global())
                    continue
                if _unavailable(outcome) and ns == self.bundle:
                    listed.append(synthesized_home(self.layout, ns, os.path.exists(self.socket)))
                    continue
                if isinstance(outcome, RelayIOError):
                    raise relay_io_failure(self.socket, outcome)
                raise outcome
            payload = self._payload(event, outcome, "list")
            bundle = payload.get("bundle")
            if not isinstance(bundle, dict):
                raise unexpected_response(outcome)
            listed.append(bundle)
        self.inscribe(
            "mcp.tool.list.success", namespace=namespace or self.bundle, bundle_count=len(listed)
        )
        return {"schema_version": SCHEMA_VERSION, "bundles": listed}

    async def list_decisions(self, _req: V.ListDecisions) -> dict[str, Any]:
        event = "mcp.tool.list.decisions"
        self.inscribe(f"{event}.request", namespace=self.bundle)
        payload = await self._call(event, ChoicesListRequest(), "choices_list", self.bundle)
        pending = payload.get("pending_requests")
        self.inscribe(
            f"{event}.success", pending_count=len(pending) if isinstance(pending, list) else 0
        )
        return payload

    # -- plain tools ------------------------------------------------------------------------

    async def send(self, req: SendRequest) -> dict[str, Any]:
        targets = [V.qualify_target(t.strip(), self.bundle) for t in req.targets]
        event = "mcp.tool.send"
        self.inscribe(
            f"{event}.request",
            namespace=self.bundle,
            request_id=req.request_id,
            targets=targets,
            broadcast=req.broadcast,
            message_length=len(req.message),
        )
        body = req.model_copy(update={"requester_session": self.session, "targets": targets})
        payload = await self._call(event, body, "send")
        results = payload.get("results")
        self.inscribe(
            f"{event}.success", result_count=len(results) if isinstance(results, list) else 0
        )
        return payload

    async def look(self, req: LookRequest) -> dict[str, Any]:
        event = "mcp.tool.look"
        self.inscribe(
            f"{event}.request",
            namespace=self.bundle,
            requester_session=self.session,
            target_session=req.target_session,
            lines=req.lines,
            offset=req.offset,
        )
        body = req.model_copy(update={"requester_session": self.session})
        payload = await self._call(event, body, "look")
        snapshot = payload.get("snapshot_lines", payload.get("snapshot_entries"))
        self._succeeded(
            event,
            payload,
            ("requester_session", "target_session", "snapshot_format"),
            snapshot_count=len(snapshot) if isinstance(snapshot, list) else 0,
        )
        return payload

    async def raww(self, req: RawwRequest) -> dict[str, Any]:
        event = "mcp.tool.raww"
        self.inscribe(
            f"{event}.request",
            namespace=self.bundle,
            request_id=req.request_id,
            target_session=req.target_session,
            text_length=len(req.raw_text),
            no_enter=req.no_enter,
        )
        body = req.model_copy(update={"requester_session": self.session})
        payload = await self._call(event, body, "raww")
        self._succeeded(
            event, payload, ("status", "target_session", "transport"), namespace=self.bundle
        )
        return payload

    async def choose(self, req: ChoicesPickRequest) -> dict[str, Any]:
        event = "mcp.tool.choose"
        self.inscribe(
            f"{event}.request",
            namespace=self.bundle,
            choice_request_id=req.choice_request_id,
            outcome=req.outcome,
            has_option_id=req.option_id is not None,
        )
        payload = await self._call(event, req, "choices_pick")
        self._succeeded(
            event, payload, ("choice_request_id", "status", "outcome"), namespace=self.bundle
        )
        return payload

    # -- administration ---------------------------------------------------------------------

    async def updown(self, req: V.Updown) -> dict[str, Any]:
        event = f"mcp.tool.updown.{req.command}"
        self.inscribe(f"{event}.request", namespace=self.bundle, command=req.command)
        body = UpRequest() if req.command == "up" else DownRequest()
        payload = await self._call(event, body, "bundle_transition")
        self._succeeded(
            event,
            payload,
            ("action", "changed_bundle_count", "skipped_bundle_count", "failed_bundle_count"),
            namespace=self.bundle,
        )
        return payload

    async def new_peer(self, req: NewPeerRequest) -> dict[str, Any]:
        event = "mcp.tool.new.peer"
        self.inscribe(
            f"{event}.request",
            namespace=self.bundle,
            principal_id=req.principal_id,
            has_output=req.destination["kind"] != "response",
        )
        payload = await self._call(event, req, "new_peer")
        self._succeeded(
            event, payload, ("principal_id", "principal_type"), written="written_path" in payload
        )
        return payload

    async def change_psk(self, req: ChangePskRequest) -> dict[str, Any]:
        event = "mcp.tool.change.psk"
        self.inscribe(f"{event}.request", principal_id=req.principal_id)
        payload = await self._call(event, req, "change_psk")
        self._succeeded(event, payload, ("principal_id",))
        return payload
