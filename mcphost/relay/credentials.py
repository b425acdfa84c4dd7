"""Credentials: the identity administration operations `new_peer`, `change_psk`, `drop_peer`
(and `change_scope`, refused after validation and authorization).

Owns: the principal store's changes, serialized; the PSK destinations (`response`, `config`,
`path`, checked before the store changes) and the revocation of a principal's live connections
after a rotation or a drop (except the requester's own rotation).

Must never: log, store or return a PSK except in a `response`-destination answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcphost.agentmux.wire import (
    SCHEMA_VERSION,
    Principal,
    RelayError,
    Request,
    parse_principal,
)
from mcphost.relay.hosting import BundleHost, Revoke, SendEvent
from mcphost.relay.inscriptions import RelayInscriptions
from mcphost.relay.policy import authorize
from mcphost.relay.principals import (
    PrincipalStore,
    StoredPrincipal,
    check_destination,
    principal_type,
    session_credential_path,
    unknown_principal,
    write_credential,
    write_session_credential,
)
from mcphost.relay.requester import _bad, _not_implemented, _opt_str, _Requester

GLOBAL = "GLOBAL"
RELAY_WIDE = ("GLOBAL", "EXTERNAL", "RELAY")
DEFAULT_QUIET_MS = 750
OUTCOMES_KEPT = 4096
REVOKED_MESSAGE = "identity credential was rotated; reconnect with the new credential"
DROPPED_MESSAGE = "identity credential was dropped"
TMUX_ONLY = ("tmux",)
FAIL_STOPPED = "delivery_target_fail_stopped"


class Credentials:
    """The credential operations of `RelayBehaviour` (a mixin over its state)."""

    # set by RelayBehaviour.__init__
    roots: tuple[Path, ...]
    state_root: Path
    host: BundleHost
    inscribe: RelayInscriptions
    send_event: SendEvent | None
    revoke: Revoke | None
    live_principals: Callable[[], Iterable[str]] | None
    store: PrincipalStore
    _admin: asyncio.Lock

    if TYPE_CHECKING:

        def _requester(self, principal: Principal, body: dict[str, Any]) -> _Requester: ...

    # -- identity administration ---------------------------------------------------------------

    def _admin_target(self, body: dict[str, Any], operation: str) -> tuple[str, str]:
        principal_id = body.get("principal_id")
        if not isinstance(principal_id, str) or not principal_id:
            raise RelayError(
                "validation_invalid_principal_id",
                f"principal_id is required for {operation}",
                {"principal_id": principal_id if isinstance(principal_id, str) else None},
            )
        return principal_id, principal_type(principal_id)

    def _destination(
        self, body: dict[str, Any], principal_id: str, kind: str
    ) -> tuple[str, Path | None]:
        """(`response` | `config` | `path`, the file for the file destinations), checked
        before anything changes."""
        raw = body.get("destination")
        if raw is None:
            return "response", None
        if not isinstance(raw, dict) or raw.get("kind") not in ("response", "config", "path"):
            raise _bad(
                'destination must be {"kind": "response" | "config" | "path"}',
                {"field": "destination"},
            )
        dest = raw["kind"]
        if dest == "response":
            return dest, None
        if dest == "config":
            if kind != "session":
                raise RelayError(
                    "validation_config_destination_unsupported",
                    "the config destination is only for session principals",
                    {"principal_id": principal_id, "principal_type": kind},
                )
            principal = parse_principal(principal_id)
            return dest, session_credential_path(
                self.state_root, principal.namespace, principal.name
            )
        path = raw.get("path")
        if not isinstance(path, str):
            raise RelayError(
                "validation_invalid_output_path",
                "output_path must be an absolute path",
                {"path": path},
            )
        return dest, check_destination(path)

    def _deliverer(
        self, dest: str, principal_id: str, path: Path | None
    ) -> Callable[[str], object] | None:
        if dest == "config":
            principal = parse_principal(principal_id)
            return lambda psk: write_session_credential(
                self.state_root, principal.namespace, principal.name, psk
            )
        if dest == "path":
            assert path is not None
            return lambda psk: write_credential(path, psk)
        return None

    def _admin_requester(self, principal: Principal, body: dict[str, Any], capability: str) -> None:
        requester = self._requester(principal, body)
        authorize(requester.policy, capability, principal)

    @staticmethod
    def _credential_fields(dest: str, psk: str, path: Path | None) -> dict[str, Any]:
        if dest == "response":
            return {"psk": psk}
        assert path is not None
        return {"written_path": str(path)}

    def _snippet(self, principal_id: str, kind: str) -> str:
        principal = parse_principal(principal_id)
        if kind == "session":
            path = session_credential_path(self.state_root, principal.namespace, principal.name)
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

    async def _new_peer(self, principal: Principal, request: Request) -> dict[str, Any]:
        body = request.body
        principal_id, kind = self._admin_target(body, "new peer")
        scope = _opt_str(body, "scope")
        dest, path = self._destination(body, principal_id, kind)
        self._admin_requester(principal, body, "new.peer")
        async with self._admin:
            psk = self.store.mint(
                principal_id, kind, scope=scope, deliver=self._deliverer(dest, principal_id, path)
            )
        self.inscribe(
            "relay.identity.principal_registered",
            requester_session=principal.id,
            principal_id=principal_id,
            principal_type=kind,
            destination=dest,
        )
        out: dict[str, Any] = {
            "kind": "new_peer",
            "schema_version": SCHEMA_VERSION,
            "principal_id": principal_id,
            "principal_type": kind,
            **self._credential_fields(dest, psk, path),
            "config_snippet": self._snippet(principal_id, kind),
        }
        return out

    async def _change_psk(self, principal: Principal, request: Request) -> dict[str, Any]:
        body = request.body
        principal_id, kind = self._admin_target(body, "change psk")
        dest, path = self._destination(body, principal_id, kind)
        self._admin_requester(principal, body, "change.psk")
        async with self._admin:
            psk = self.store.rotate(principal_id, deliver=self._deliverer(dest, principal_id, path))
        revoked = 0
        if principal_id != principal.id and self.revoke is not None:
            revoked = int(
                self.revoke(principal_id, "runtime_identity_revoked", REVOKED_MESSAGE) or 0
            )
        self.inscribe(
            "relay.identity.psk_rotated",
            requester_session=principal.id,
            principal_id=principal_id,
            destination=dest,
            revoked_connections=revoked,
        )
        return {
            "kind": "change_psk",
            "schema_version": SCHEMA_VERSION,
            "principal_id": principal_id,
            **self._credential_fields(dest, psk, path),
        }

    async def _drop_peer(self, principal: Principal, request: Request) -> dict[str, Any]:
        body = request.body
        principal_id, kind = self._admin_target(body, "drop peer")
        if principal_id == principal.id:
            raise RelayError(
                "validation_self_drop_forbidden",
                "a principal cannot drop its own credential",
                {"principal_id": principal_id},
            )
        self._admin_requester(principal, body, "drop.peer")
        async with self._admin:
            record: StoredPrincipal | None = self.store.get(principal_id)
            if record is None or not self.store.drop(principal_id):
                raise unknown_principal(principal_id)
        if self.revoke is not None:
            self.revoke(principal_id, "runtime_identity_revoked", DROPPED_MESSAGE)
        self.inscribe(
            "relay.identity.principal_dropped",
            requester_session=principal.id,
            principal_id=principal_id,
        )
        out: dict[str, Any] = {
            "kind": "drop_peer",
            "schema_version": SCHEMA_VERSION,
            "principal_id": principal_id,
            "principal_type": record.principal_type,
        }
        if kind == "session":
            target = parse_principal(principal_id)
            out["credential_path"] = str(
                session_credential_path(self.state_root, target.namespace, target.name)
            )
        return out

    async def _change_scope(self, principal: Principal, request: Request) -> dict[str, Any]:
        principal_id, kind = self._admin_target(request.body, "change scope")
        if kind != "relay":
            raise RelayError(
                "validation_invalid_principal_id",
                "change scope applies to peer relay principals (<id>@RELAY) only",
                {"principal_id": principal_id},
            )
        self._admin_requester(principal, request.body, "change.scope")
        raise _not_implemented("change_scope", "peer scopes apply to cross-relay ingress only")

    async def _identity_introspect(self, principal: Principal, request: Request) -> dict[str, Any]:
        raise _not_implemented("identity_introspect", "this relay has no trusted hosts")
