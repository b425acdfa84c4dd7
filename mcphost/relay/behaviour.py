"""The relay's dispatcher (reference `agentmux-relay.md` §1.3-§1.12, §2.2-§2.6, §3.2-§3.7).

Owns: `RelayBehaviour`, what `RelayServer` calls: `authenticate(hello, peer_cred)` (the hello's
identity, §2.2), `admit(principal_id)` (an in-process session's principal) and
`handle(principal, request)` (one request's response body `{"kind": ...}`, or a `RelayError`):
the operation's request model reads the body, its module runs it (`relay/ops`: one module per
operation, with its response models and its capability; `ops.OPERATIONS` is the table), and a
refusal is inscribed. The state every operation shares is one object (`state.RelayState`), built
here; resolution is `requester.py`, delivery `delivery.py`, the members `members/`, the hosting
contract `hosting.py`. The configuration layers (bundles, coders, users, policies, relay.toml)
are read afresh for every request (no watcher: an edit applies to the next request).

Hosting is the supervisor's: it implements `BundleHost` and hands it in. The relay never
starts or stops a process itself; `up` / `down` ask the host.

Delivery outcomes (§3.4: `delivered`, `timeout` with the gate's reason code, `not_submitted`,
`submission_unknown`, `failed` `dropped_on_shutdown`) are kept in `outcomes` (the last 4096, by
message id) and inscribed as `relay.delivery.outcome`; a `@GLOBAL` sender also gets a
`delivery_outcome` event, and a member sender of a registered kind, for every outcome of a queued
send or raww but `delivered`, the terminal-outcome receipt: an envelope from `relay@RELAY`
(envelope.receipt_body) queued to it as any message is, best-effort (dropped when the sender is not
running or the receipts' queue bound is full; never a receipt for a receipt), each one a
`relay.delivery.receipt` record. Revocation goes through the shared
registry's `revoke`, which closes every live connection of the principal (a socket-trust one too).

Order (§3.2): request validation (the body's `mcphost.agentmux.operations` model, the one the
relay tools build it with), then existence (bundle, member, target), then authorization
(`policy.authorize` with the requester's member policy), then the action. The requester is
always the connection's principal: a `requester_session` naming anyone else is
`validation_unknown_sender`.

Identity (§2.2): a PSK hello is looked up in the store (`validation_unrecognized_credential`,
`validation_identity_binding_mismatch`, `runtime_identity_expired`); `socket-trust` is accepted
only for a session or user principal, only when relay.toml does not require session credentials,
and only when the host's `socket_trust(principal_id, peer_cred)` says the kernel vouches for the
peer (`validation_credential_required` otherwise). Then the principal must exist: a member of a
configured bundle, or a users.toml user with a known policy.

Inscriptions (§5, inscriptions.py): requests and outcomes are `relay.*` records in
`<inscriptions root>/relay.log` (default `<state root>/inscriptions`) and the event log:
`relay.list.response`, `relay.look.response`, `relay.send.request`, one
`relay.send.envelope.metadata` per envelope (schema_version, message_id, namespace,
sender_session, target_sessions, cc_sessions, created_at: what the pane never shows),
`relay.raww.request`, `relay.delivery.outcome`, `relay.bundle.up|down`,
`relay.identity.principal_registered|psk_rotated|principal_dropped`,
`relay.choices.requested|resolved` (a bundle's choices queue: ids, kinds, outcome, reason code
and decider; requester.choices), and
`relay.request.refused` (operation, code, the capability of an authorization refusal) for a
request answered with an error. `inscribe` is handed to
the server too (its connection records).

Must never: log, store or return a PSK except in a `response`-destination answer; log a message
body or raww text (events carry ids, sizes and outcomes only); act as any principal but the
connection's; start a process or a tmux session itself.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mcphost.agentmux.operations import WireRequest
from mcphost.agentmux.wire import (
    SOCKET_TRUST,
    Hello,
    Principal,
    RelayError,
    Request,
    parse_principal,
)
from mcphost.peer import PeerCred
from mcphost.relay import delivery
from mcphost.relay import requester as rq
from mcphost.relay.config import load_relay_settings
from mcphost.relay.connections import Connections
from mcphost.relay.hosting import BundleHost, Bundles, MemberHealth, SocketTrust
from mcphost.relay.inscriptions import RelayInscriptions, inscriptions_root
from mcphost.relay.members.port import Choices
from mcphost.relay.ops import OPERATIONS, choices
from mcphost.relay.ops.base import Operation
from mcphost.relay.policy import load_policies, member_policy
from mcphost.relay.principals import PrincipalStore, check_expiry
from mcphost.relay.state import DEFAULT_POLL_MS, DEFAULT_QUIET_MS, RelayState

__all__ = ["BundleHost", "MemberHealth", "RelayBehaviour"]


class RelayBehaviour:
    """The relay's operations over the configuration, the principal store and a `BundleHost`.

    `socket_trust` decides whether the kernel vouches for a socket-trust hello (None: refuse
    every socket-trust hello). `connections` is the relay's live connections (connections.py):
    revocation tears a principal's down, `@GLOBAL` deliveries and outcomes are events on them,
    and the GLOBAL view lists who is connected. One registry is shared with the server, so
    neither is patched after construction: by default the behaviour builds it (with its
    inscriptions) and the server is handed `registry=behaviour.connections` (and
    `admit=behaviour.admit` for in-process sessions, which the registry holds too). `bundles` is
    the host's in-memory bundle layer, read before the file layers (`requester.bundle`).
    `quiet_ms` is the readiness gate's quiet window. All of it is `state` (state.RelayState),
    the one object the operations are handed.
    """

    def __init__(
        self,
        configuration_roots: Sequence[Path | str],
        state_root: Path | str,
        host: BundleHost,
        *,
        socket_trust: SocketTrust | None = None,
        connections: Connections | None = None,
        bundles: Bundles | None = None,
        quiet_ms: int = DEFAULT_QUIET_MS,
        poll_ms: int = DEFAULT_POLL_MS,
        environ: dict[str, str] | None = None,
        inscriptions: Path | str | None = None,
    ) -> None:
        root = Path(state_root).absolute()
        inscribe = RelayInscriptions(
            inscriptions if inscriptions is not None else inscriptions_root(root)
        )
        self.state = RelayState(
            roots=tuple(Path(r) for r in configuration_roots),
            state_root=root,
            host=host,
            store=PrincipalStore(root / "identity" / "principals.json"),
            inscribe=inscribe,
            connections=connections if connections is not None else Connections(inscribe),
            socket_trust=socket_trust,
            bundles=bundles,
            environ=environ,
            quiet_ms=quiet_ms,
            poll_ms=poll_ms,
        )

    # what the host, the server and the tests reach
    @property
    def inscribe(self) -> RelayInscriptions:
        return self.state.inscribe

    @property
    def connections(self) -> Connections:
        return self.state.connections

    @property
    def outcomes(self) -> OrderedDict[str, dict[str, Any]]:
        return self.state.outcomes

    @property
    def choices(self) -> dict[str, Choices]:
        return self.state.choices

    # -- identity ------------------------------------------------------------------------------

    def authenticate(self, hello: Hello, peer_cred: PeerCred | None) -> Principal:
        """The hello's principal, or a §2.2 RelayError. Never logs the token."""
        state = self.state
        principal = parse_principal(hello.principal_id)
        token = hello.identity_token
        if token == SOCKET_TRUST:
            settings = load_relay_settings(state.roots, state.environ)
            vouched = (
                principal.kind in ("session", "user")
                and not settings.require_session_credentials
                and state.socket_trust is not None
                and state.socket_trust(principal.id, peer_cred)
            )
            if not vouched:
                raise RelayError(
                    "validation_credential_required",
                    "socket trust is not accepted for this principal; present its PSK",
                    {"principal_id": principal.id},
                )
            verified = False
        else:
            record = state.store.lookup(token)
            if record is None:
                raise RelayError(
                    "validation_unrecognized_credential",
                    "identity token not recognized",
                    {"principal_id": principal.id},
                )
            if record.principal_id != principal.id:
                raise RelayError(
                    "validation_identity_binding_mismatch",
                    "identity token is registered to another principal",
                    {
                        "principal_id": principal.id,
                        "registered_principal_id": record.principal_id,
                    },
                )
            check_expiry(record)
            verified = True
        return self._existing(principal, verified)

    def admit(self, principal_id: str) -> Principal:
        """The principal of an in-process session its host established (the kernel vouched for
        the agent before this is called; `RelayServer.local_session`): no credential, and so
        unverified as a socket-trust one is; the same existence checks as a hello."""
        return self._existing(parse_principal(principal_id), False)

    def _existing(self, principal: Principal, verified: bool) -> Principal:
        """`principal` if it exists (`member_of` for a hello: a member of a configured bundle,
        or a users.toml user with a known policy), marked `verified`; else
        `validation_unknown_sender` (§2.2)."""
        _member, user = rq.member_of(self.state, principal, "hello")
        if user is not None:
            member_policy(load_policies(self.state.roots), user)  # validation_unknown_policy
        return Principal(
            principal.id, principal.name, principal.namespace, principal.kind, verified
        )

    # -- dispatch ------------------------------------------------------------------------------

    async def handle(self, principal: Principal, request: Request) -> dict[str, Any]:
        """One request's response body (`{"kind": ...}`); raises RelayError."""
        op = OPERATIONS.get(request.operation)
        try:
            if op is None:
                raise rq.not_implemented(request.operation, "unknown operation")
            response = await op.run(self.state, principal, _typed(op, request), request.namespace)
        except RelayError as err:
            details = err.details or {}
            self.state.inscribe(
                "relay.request.refused",
                requester_session=principal.id,
                operation=request.operation,
                code=err.code,
                capability=details.get("capability"),
            )
            raise
        return response.wire()

    async def drain(self) -> None:
        """Wait until every queued delivery has an outcome (tests and shutdown)."""
        await delivery.drain(self.state)

    async def aclose(self) -> None:
        """Stop the delivery workers (what is still queued is `dropped_on_shutdown`), resolve
        every pending choice cancelled, and close the inscriptions."""
        choices.close(self.state)
        await delivery.aclose(self.state)
        self.state.inscribe.close()


def _typed(op: Operation[Any], request: Request) -> WireRequest:
    """The request's body as the operation's model: an in-process caller's model as it is (its
    rules ran when it was read), a decoded body read by the model (`read`: its rules, codes and
    messages)."""
    body = request.body
    if isinstance(body, op.request):
        return body
    return op.request.read(body if isinstance(body, dict) else body.wire())
