"""The identity administration operations (reference §1.10-§1.11): `new_peer`, `change_psk`,
`drop_peer`, and `change_scope` / `identity_introspect` (refused). Capabilities `new.peer`,
`change.psk`, `drop.peer`, `change.scope`.

Owns: their responses (`NewPeerResponse`, `ChangePskResponse`, `DropPeerResponse`) and rules:
the principal store's changes, serialized (`RelayState.admin`); the PSK destinations
(`response`: the PSK in this response only; `config`: a session principal's `identity.psk`
under the state root, `validation_config_destination_unsupported` for other types; `path`:
absolute, checked before the store changes, written without following a symlink); and the
revocation of a principal's live connections after a rotation or a drop
(`connections.revoke`: `runtime_identity_revoked`), except the requester's own rotation.
`change_scope` is refused after validating the `@RELAY` id and authorizing, and
`identity_introspect` always: `runtime_operation_not_implemented` (peer scopes matter only for
cross-relay ingress, and there are no trusted hosts).

Must never: log, store or return a PSK except in a `response`-destination answer (the
responses' `psk` is kept out of their repr).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field

from mcphost.agentmux.operations import (
    ChangePskRequest,
    ChangeScopeRequest,
    CredentialRequest,
    DropPeerRequest,
    IdentityIntrospectRequest,
    NewPeerRequest,
)
from mcphost.agentmux.wire import Principal, RelayError, parse_principal
from mcphost.relay import requester as rq
from mcphost.relay.ops.base import Operation, Response
from mcphost.relay.policy import authorize
from mcphost.relay.principals import (
    StoredPrincipal,
    check_destination,
    principal_type,
    session_credential_path,
    unknown_principal,
    write_credential,
    write_session_credential,
)
from mcphost.relay.state import RelayState

NEW_PEER = "new.peer"
CHANGE_PSK = "change.psk"
DROP_PEER = "drop.peer"
CHANGE_SCOPE = "change.scope"
REVOKED_MESSAGE = "identity credential was rotated; reconnect with the new credential"
DROPPED_MESSAGE = "identity credential was dropped"

C = TypeVar("C", bound=CredentialRequest)


class NewPeerResponse(Response):
    KIND = "new_peer"
    principal_id: str
    principal_type: str
    psk: str | None = Field(default=None, repr=False)
    written_path: str | None = None
    config_snippet: str


class ChangePskResponse(Response):
    KIND = "change_psk"
    principal_id: str
    psk: str | None = Field(default=None, repr=False)
    written_path: str | None = None


class DropPeerResponse(Response):
    KIND = "drop_peer"
    principal_id: str
    principal_type: str
    credential_path: str | None = None


def _destination(
    state: RelayState, request: NewPeerRequest | ChangePskRequest, kind: str
) -> tuple[str, Path | None]:
    """(`response` | `config` | `path`, the file for the file destinations), checked before
    anything changes (the destination's shape was checked by its wire model)."""
    raw = request.destination
    if raw is None or raw["kind"] == "response":
        return "response", None
    if raw["kind"] == "config":
        if kind != "session":
            raise RelayError(
                "validation_config_destination_unsupported",
                "the config destination is only for session principals",
                {"principal_id": request.principal, "principal_type": kind},
            )
        principal = parse_principal(request.principal)
        return "config", session_credential_path(
            state.state_root, principal.namespace, principal.name
        )
    return "path", check_destination(raw["path"])


def _deliverer(
    state: RelayState, dest: str, principal_id: str, path: Path | None
) -> Callable[[str], object] | None:
    if dest == "config":
        principal = parse_principal(principal_id)
        return lambda psk: write_session_credential(
            state.state_root, principal.namespace, principal.name, psk
        )
    if dest == "path":
        assert path is not None
        return lambda psk: write_credential(path, psk)
    return None


def _authorized(state: RelayState, principal: Principal, request: C, capability: str) -> None:
    requester = rq.requester(state, principal, request.requester_session)
    authorize(requester.policy, capability, principal)


def _psk_fields(dest: str, psk: str, path: Path | None) -> dict[str, Any]:
    if dest == "response":
        return {"psk": psk}
    assert path is not None
    return {"written_path": str(path)}


def _snippet(state: RelayState, principal_id: str, kind: str) -> str:
    principal = parse_principal(principal_id)
    if kind == "session":
        path = session_credential_path(state.state_root, principal.namespace, principal.name)
        return (
            f"Write the PSK to {path} (mode 0600); the session presents it as "
            "identity_token at Hello."
        )
    if kind == "relay":
        return (
            f"Store the PSK at <state>/peers/{principal.name}.psk (mode 0600) on the peer "
            f"relay; it presents it as identity_token at Hello as {principal_id}."
        )
    return (
        "Store the PSK at an operator-chosen path (mode 0600) and present it as "
        "identity_token at Hello."
    )


async def new_peer(
    state: RelayState, principal: Principal, request: NewPeerRequest, namespace: str | None
) -> NewPeerResponse:
    principal_id = request.principal
    kind = principal_type(principal_id)
    dest, path = _destination(state, request, kind)
    _authorized(state, principal, request, NEW_PEER)
    async with state.admin:
        psk = state.store.mint(principal_id, kind, scope=request.scope,
                               deliver=_deliverer(state, dest, principal_id, path))  # fmt: skip
    state.inscribe(
        "relay.identity.principal_registered",
        requester_session=principal.id,
        principal_id=principal_id,
        principal_type=kind,
        destination=dest,
    )
    return NewPeerResponse(
        principal_id=principal_id,
        principal_type=kind,
        **_psk_fields(dest, psk, path),
        config_snippet=_snippet(state, principal_id, kind),
    )


async def change_psk(
    state: RelayState, principal: Principal, request: ChangePskRequest, namespace: str | None
) -> ChangePskResponse:
    principal_id = request.principal
    dest, path = _destination(state, request, principal_type(principal_id))
    _authorized(state, principal, request, CHANGE_PSK)
    async with state.admin:
        psk = state.store.rotate(principal_id, deliver=_deliverer(state, dest, principal_id, path))
    revoked = 0
    if principal_id != principal.id:
        revoked = state.connections.revoke(
            principal_id, "runtime_identity_revoked", REVOKED_MESSAGE
        )
    state.inscribe(
        "relay.identity.psk_rotated",
        requester_session=principal.id,
        principal_id=principal_id,
        destination=dest,
        revoked_connections=revoked,
    )
    return ChangePskResponse(principal_id=principal_id, **_psk_fields(dest, psk, path))


async def drop_peer(
    state: RelayState, principal: Principal, request: DropPeerRequest, namespace: str | None
) -> DropPeerResponse:
    principal_id = request.principal
    kind = principal_type(principal_id)
    if principal_id == principal.id:
        raise RelayError(
            "validation_self_drop_forbidden",
            "a principal cannot drop its own credential",
            {"principal_id": principal_id},
        )
    _authorized(state, principal, request, DROP_PEER)
    async with state.admin:
        record: StoredPrincipal | None = state.store.get(principal_id)
        if record is None or not state.store.drop(principal_id):
            raise unknown_principal(principal_id)
    state.connections.revoke(principal_id, "runtime_identity_revoked", DROPPED_MESSAGE)
    state.inscribe(
        "relay.identity.principal_dropped",
        requester_session=principal.id,
        principal_id=principal_id,
    )
    credential_path = None
    if kind == "session":
        target = parse_principal(principal_id)
        credential_path = str(
            session_credential_path(state.state_root, target.namespace, target.name)
        )
    return DropPeerResponse(
        principal_id=principal_id,
        principal_type=record.principal_type,
        credential_path=credential_path,
    )


async def change_scope(
    state: RelayState, principal: Principal, request: ChangeScopeRequest, namespace: str | None
) -> Response:
    if principal_type(request.principal) != "relay":
        raise RelayError(
            "validation_invalid_principal_id",
            "change scope applies to peer relay principals (<id>@RELAY) only",
            {"principal_id": request.principal},
        )
    _authorized(state, principal, request, CHANGE_SCOPE)
    raise rq.not_implemented("change_scope", "peer scopes apply to cross-relay ingress only")


async def identity_introspect(
    state: RelayState, principal: Principal, request: IdentityIntrospectRequest,
    namespace: str | None,
) -> Response:  # fmt: skip
    raise rq.not_implemented("identity_introspect", "this relay has no trusted hosts")


OPERATIONS: tuple[Operation[Any], ...] = (
    Operation(NewPeerRequest, NEW_PEER, new_peer),
    Operation(ChangePskRequest, CHANGE_PSK, change_psk),
    Operation(DropPeerRequest, DROP_PEER, drop_peer),
    Operation(ChangeScopeRequest, CHANGE_SCOPE, change_scope),
    Operation(IdentityIntrospectRequest, None, identity_introspect),
)
