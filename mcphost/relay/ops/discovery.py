"""Discovery (reference §1.12), local only: `list_relays`, `discover_namespaces`,
`discover_principals`. Capability `list.read`.

Owns: their responses and rules: `list_relays` -> the relay.toml peer aliases;
`discover_namespaces` -> the configured bundle ids (the host's layer and the files);
`discover_principals` -> the namespace's ListedBundle (listing.py; `namespace` required). A
`relay` naming a peer: `runtime_cross_relay_unavailable` (this relay routes to no peer).

Must never: reach another relay.
"""

from __future__ import annotations

from typing import Any

from mcphost.agentmux.bundlefile import bundle_ids
from mcphost.agentmux.operations import (
    DiscoverNamespacesRequest,
    DiscoverPrincipalsRequest,
    ListRelaysRequest,
)
from mcphost.agentmux.wire import Principal
from mcphost.relay import requester as rq
from mcphost.relay.config import load_relay_settings
from mcphost.relay.ops.base import Entry, Operation, Response
from mcphost.relay.ops.listing import ListedBundle, listed
from mcphost.relay.policy import authorize
from mcphost.relay.state import RelayState

CAPABILITY = "list.read"


class RelayAlias(Entry):
    alias: str


class ListRelaysResponse(Response):
    KIND = "list_relays"
    relays: list[RelayAlias]


class DiscoverNamespacesResponse(Response):
    KIND = "discover_namespaces"
    namespaces: list[str]


class DiscoverPrincipalsResponse(Response):
    KIND = "discover_principals"
    bundles: list[ListedBundle]


def _local(relay: str | None) -> None:
    if relay:
        raise rq.cross_relay(relay)


async def list_relays(
    state: RelayState, principal: Principal, request: ListRelaysRequest, namespace: str | None
) -> ListRelaysResponse:
    requester = rq.requester(state, principal, request.requester_session)
    authorize(requester.policy, CAPABILITY, principal)
    settings = load_relay_settings(state.roots, state.environ)
    aliases = sorted(peer.alias for peer in settings.peers)
    return ListRelaysResponse(relays=[RelayAlias(alias=a) for a in aliases])


async def discover_namespaces(
    state: RelayState, principal: Principal, request: DiscoverNamespacesRequest,
    namespace: str | None,
) -> DiscoverNamespacesResponse:  # fmt: skip
    _local(request.relay)
    requester = rq.requester(state, principal, request.requester_session)
    authorize(requester.policy, CAPABILITY, principal)
    layer = [state.bundles()] if state.bundles is not None else []
    return DiscoverNamespacesResponse(namespaces=sorted(set(bundle_ids(state.roots)).union(*layer)))


async def discover_principals(
    state: RelayState, principal: Principal, request: DiscoverPrincipalsRequest,
    namespace: str | None,
) -> DiscoverPrincipalsResponse:  # fmt: skip
    _local(request.relay)
    if not request.namespace:
        raise rq.bad("namespace is required", {"field": "namespace"})
    bundle = listed(state, principal, request.namespace, request.requester_session)
    return DiscoverPrincipalsResponse(bundles=[bundle])


OPERATIONS: tuple[Operation[Any], ...] = (
    Operation(ListRelaysRequest, CAPABILITY, list_relays),
    Operation(DiscoverNamespacesRequest, CAPABILITY, discover_namespaces),
    Operation(DiscoverPrincipalsRequest, CAPABILITY, discover_principals),
)
