"""The relay's operations (reference `agentmux-relay.md` §1.3-§1.12, §2.3-§2.6, §3.2-§3.7).

Owns: `RelayBehaviour`, what `RelayServer` calls: `authenticate(hello, peer_cred)` (the hello's
identity, §2.2) and `handle(principal, request)` (one request's response body `{"kind": ...}`,
or a `RelayError`), through the operation table. Split along agentmux's seams, each a mixin
over this object's state in its own module: requester and target resolution (`requester.py`),
delivery (`delivery.py`: per-target workers, readiness gate, batching, paste-and-submit,
outcomes, receipts), credentials (`credentials.py`: new_peer, change_psk, drop_peer); the
hosting contract is `hosting.py`. It reads the configuration layers (bundles,
coders, users, policies, relay.toml) afresh for every request (no watcher: an edit applies to the
next request) and keeps the principal store (`<state>/identity/principals.json`).

Hosting is the supervisor's: it implements `BundleHost` (below) and hands it in. The relay never
starts or stops a process itself; `up` / `down` ask the host.

Operations and what each answers:
- `list`: namespace (the frame's, else the requester's bundle) -> one ListedBundle (§1.3); a
  member is ready when the host says so and its member (members.KINDS, bound to the host's
  endpoint) does too, and carries its member's `state` / `state_reason_code` when the member
  reports them (an ACP member); `hosted` / `state` "up" iff at least one member is
  ready; `startup_health` "healthy" (all ready) or "degraded" (some), only when up;
  `state_reason_code` `runtime_no_configured_sessions` (no members) or `runtime_startup_failed`
  (none ready while the host hosts the bundle); a bundle the host does not host is "down" with
  no reason. `GLOBAL` -> the users.toml principals plus live `@GLOBAL` connections, `ready` =
  a live connection. Capability `list.read`.
- `look`: the target member's own snapshot (`Member.look`: a tmux member captures its pane,
  `snapshot_format: "lines"`), `lines` 1..=1000 (default: the kind's, 120 for tmux), `offset`
  only 0 unless the kind supports it (`validation_offset_unsupported`). Capability
  `look.inspect`.
- `send`: targets fully qualified (bare names are the relay tools' job), deduplicated in order;
  broadcast = every other member of the sender's bundle. Each target gets a uuid4
  `message_id` and its envelope (envelope.py), queued to the target's worker, which hands the
  member the contiguous envelopes that fit one batch (envelope.take_batch) as one unit
  (`Member.deliver`: a tmux member waits for the coder's readiness gate, coders.toml
  `prompt-regex` etc., then pastes them bracketed, then a separate "\\r"). The
  response is `queued` at once. A `@GLOBAL` target gets an `incoming_message` event on its live
  connections (`connections.send_event`) instead. Explicit targets of a transport no
  registered member kind hosts (pty; acp until its kind is registered; ui, pubsub) fail the request with
  `runtime_session_type_not_implemented` before anything is queued; in a broadcast such a member
  gets a result with outcome `not_submitted` and that reason code. Every envelope is text,
  never keys (envelope.neutralise). The queue is bounded per target, per sender and in all
  (admission.py): a request that would go over is refused whole, `runtime_delivery_queue_full`,
  after authorization and before anything is queued. A target the host reports stopped
  (`MemberHealth.stopped`) refuses the request whole too, after authorization:
  `delivery_target_fail_stopped`, details `{target_session}` (agentmux's code and shape); in a
  broadcast a stopped member gets outcome `not_submitted` with that reason code instead.
  Capability `send.deliver`.
- `raww`: 32 KiB of UTF-8 at most (`validation_invalid_params`), queued to the same worker as a
  batch barrier (envelopes before it are delivered before it, later ones after it), under the
  same queue bounds; no gate; its text is keys by design (that is what `raww.write` grants).
  A stopped target: `delivery_target_fail_stopped`. Capability `raww.write`.
- `up` / `down`: `bundle_transition` for the subject bundle (namespace, else the requester's);
  skipped `already_hosted` / `already_unhosted`; a host failure is outcome `failed`,
  `runtime_startup_failed` / `runtime_shutdown_failed`. Capability `updown`.
- `new_peer` / `change_psk` / `drop_peer`: the principal store, serialized; destinations
  `response` (the PSK in this response only), `config` (a session principal's `identity.psk`
  under the state root; `validation_config_destination_unsupported` for other types), `path`
  (absolute, checked before the store changes, written without following a symlink).
  `change_psk` and `drop_peer` then revoke the principal's live connections
  (`connections.revoke`: `runtime_identity_revoked`), except when the requester rotates its own.
  Capabilities `new.peer`, `change.psk`, `drop.peer`.
- `choices_list` -> the bundle's choices queue's `pending_requests` (a queue is made by the first
  member kind of the bundle that keeps one: `MemberKind.choices_queue`; none: empty);
  `choices_pick` -> the queue's decision (`Choices.decide`, decided by the requester), or
  `runtime_choices_request_not_found` for a bundle without a queue. Capability `choose`.
- `list_relays` -> the relay.toml peer aliases; `discover_namespaces` (no `relay`) -> the
  configured bundle ids; `discover_principals` (no `relay`) -> the namespace's ListedBundle.
  With a `relay`, and for any `!` target: `runtime_cross_relay_unavailable`. Capability
  `list.read`.
- `change_scope` (after validating the `@RELAY` id and authorizing `change.scope`) and
  `identity_introspect`: `runtime_operation_not_implemented` (peer scopes matter only for
  cross-relay ingress, and there are no trusted hosts).

Delivery outcomes (§3.4: `delivered`, `timeout` with the gate's reason code, `not_submitted`,
`submission_unknown`, `failed` `dropped_on_shutdown`) are kept in `outcomes` (the last 4096, by
message id) and inscribed as `relay.delivery.outcome`; a `@GLOBAL` sender also gets a
`delivery_outcome` event, and a member sender of a registered kind, for every outcome of a queued
send or raww but `delivered`, the terminal-outcome receipt: an envelope from `relay@RELAY`
(envelope.receipt_body) queued to its own pane, best-effort (dropped when the sender is not
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
`relay.identity.principal_registered|psk_rotated|principal_dropped`, and
`relay.request.refused` (operation, code, the capability of an authorization refusal) for a
request answered with an error. `inscribe` is handed to
the server too (its connection records).

Must never: log, store or return a PSK except in a `response`-destination answer; log a message
body or raww text (events carry ids, sizes and outcomes only); act as any principal but the
connection's; start a process or a tmux session itself.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mcphost.agentmux.operations import (
    ChoicesPickRequest,
    LookRequest,
    RawwRequest,
    SendRequest,
)
from mcphost.agentmux.wire import (
    SCHEMA_VERSION,
    SOCKET_TRUST,
    Hello,
    Principal,
    RelayError,
    Request,
    parse_principal,
    utc_now,
)
from mcphost.errors import CodedFailure
from mcphost.peer import PeerCred
from mcphost.relay import admission, members
from mcphost.relay import envelope as env
from mcphost.relay.bundles import Bundle, Users, bundle_ids, load_relay_settings, load_users
from mcphost.relay.connections import Connections
from mcphost.relay.credentials import Credentials
from mcphost.relay.delivery import Delivery, _Item, _Worker
from mcphost.relay.hosting import BundleHost, Bundles, MemberHealth, SocketTrust
from mcphost.relay.inscriptions import RelayInscriptions, inscriptions_root
from mcphost.relay.members.port import Choices, unavailable
from mcphost.relay.policy import authorize, load_policies, member_policy
from mcphost.relay.principals import (
    PrincipalStore,
    check_expiry,
)
from mcphost.relay.requester import (
    GLOBAL,
    Resolution,
    _bad,
    _cross_relay,
    _fail_stopped,
    _not_implemented,
    _opt_str,
    _session_type,
    _Target,
)

__all__ = ["BundleHost", "MemberHealth", "RelayBehaviour"]

DEFAULT_QUIET_MS = 750


# -- the behaviour -----------------------------------------------------------------------------


class RelayBehaviour(Resolution, Delivery, Credentials):
    """The relay's operations over the configuration, the principal store and a `BundleHost`.

    `socket_trust` decides whether the kernel vouches for a socket-trust hello (None: refuse
    every socket-trust hello). `connections` is the relay's live connections (connections.py):
    revocation tears a principal's down, `@GLOBAL` deliveries and outcomes are events on them,
    and the GLOBAL view lists who is connected. One registry is shared with the server, so
    neither is patched after construction: by default the behaviour builds it (with its
    inscriptions) and the server is handed `registry=behaviour.connections` (and
    `admit=behaviour.admit` for in-process sessions, which the registry holds too). `bundles` is
    the host's in-memory bundle layer, read before the file layers (`Resolution._bundle`).
    `quiet_ms` is the readiness gate's quiet window.
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
        poll_ms: int = 50,
        environ: dict[str, str] | None = None,
        inscriptions: Path | str | None = None,
    ) -> None:
        self.roots = tuple(Path(r) for r in configuration_roots)
        self.state_root = Path(state_root).absolute()
        self.host = host
        self.socket_trust = socket_trust
        self.bundles = bundles
        self.quiet_ms = quiet_ms
        self.poll_ms = poll_ms
        self._environ = environ
        self.store = PrincipalStore(self.state_root / "identity" / "principals.json")
        self.inscribe = RelayInscriptions(
            inscriptions if inscriptions is not None else inscriptions_root(self.state_root)
        )
        self.connections = connections if connections is not None else Connections(self.inscribe)
        self._admin = asyncio.Lock()
        self._workers: dict[tuple[str, str], _Worker] = {}
        self.queue_bounds = admission.Ledger()
        self.outcomes: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.choices: dict[str, Choices] = {}  # bundle id -> its choices queue (Delivery._choices)
        self._closed = False
        self._ops: dict[str, Callable[[Principal, Request], Any]] = {
            "list": self._list,
            "look": self._look,
            "send": self._send,
            "raww": self._raww,
            "up": self._updown,
            "down": self._updown,
            "new_peer": self._new_peer,
            "change_psk": self._change_psk,
            "drop_peer": self._drop_peer,
            "change_scope": self._change_scope,
            "identity_introspect": self._identity_introspect,
            "choices_list": self._choices_list,
            "choices_pick": self._choices_pick,
            "list_relays": self._list_relays,
            "discover_namespaces": self._discover_namespaces,
            "discover_principals": self._discover_principals,
        }

    # -- identity ------------------------------------------------------------------------------

    def authenticate(self, hello: Hello, peer_cred: PeerCred | None) -> Principal:
        """The hello's principal, or a §2.2 RelayError. Never logs the token."""
        principal = parse_principal(hello.principal_id)
        token = hello.identity_token
        if token == SOCKET_TRUST:
            settings = load_relay_settings(self.roots, self._environ)
            vouched = (
                principal.kind in ("session", "user")
                and not settings.require_session_credentials
                and self.socket_trust is not None
                and self.socket_trust(principal.id, peer_cred)
            )
            if not vouched:
                raise RelayError(
                    "validation_credential_required",
                    "socket trust is not accepted for this principal; present its PSK",
                    {"principal_id": principal.id},
                )
            verified = False
        else:
            record = self.store.lookup(token)
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
        _member, user = self.member_of(principal, "hello")
        if user is not None:
            member_policy(load_policies(self.roots), user)  # validation_unknown_policy
        return Principal(
            principal.id, principal.name, principal.namespace, principal.kind, verified
        )

    # -- dispatch ------------------------------------------------------------------------------

    async def handle(self, principal: Principal, request: Request) -> dict[str, Any]:
        """One request's response body (`{"kind": ...}`); raises RelayError."""
        op = self._ops.get(request.operation)
        try:
            if op is None:
                raise _not_implemented(request.operation, "unknown operation")
            result: dict[str, Any] = await op(principal, request)
        except RelayError as err:
            details = err.details or {}
            self.inscribe(
                "relay.request.refused",
                requester_session=principal.id,
                operation=request.operation,
                code=err.code,
                capability=details.get("capability"),
            )
            raise
        return result

    # -- list ----------------------------------------------------------------------------------

    async def _list(self, principal: Principal, request: Request) -> dict[str, Any]:
        namespace = self._subject(principal, request)
        listed = self._listed(principal, namespace, request.body)
        self.inscribe(
            "relay.list.response",
            requester_session=principal.id,
            namespace=listed["id"],
            state=listed["state"],
            principal_count=len(listed["principals"]),
            ready_count=sum(1 for p in listed["principals"] if p.get("ready")),
        )
        return {"kind": "list", "schema_version": SCHEMA_VERSION, "bundle": listed}

    def _listed(self, principal: Principal, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        if namespace == GLOBAL:
            users = load_users(self.roots)
            requester = self._requester(principal, body)
            authorize(requester.policy, "list.read", principal, subject_bundle=GLOBAL)
            return self.global_view(users)
        bundle = self._bundle(namespace)
        requester = self._requester(principal, body)
        authorize(requester.policy, "list.read", principal, subject_bundle=bundle.id)
        return self.listed_bundle(bundle)

    def listed_bundle(self, bundle: Bundle) -> dict[str, Any]:
        """The §1.3 ListedBundle of a configured bundle, from the host's member states."""
        principals: list[dict[str, Any]] = []
        failures: list[dict[str, Any]] = []
        count = 0
        ready_count = 0
        for session in bundle.sessions:
            ready, health = self.host.member_state(bundle, session.id)
            member = self._member(bundle, session)
            readiness = member.readiness() if member is not None else None
            ready = ready and readiness is not None and readiness.ready
            entry: dict[str, Any] = {"id": session.principal_id(bundle.id)}
            if session.name is not None:
                entry["name"] = session.name
            entry["transport"] = session.transport
            entry["ready"] = bool(ready)
            if readiness is not None and readiness.state is not None:
                entry["state"] = readiness.state
            if readiness is not None and readiness.reason_code is not None:
                entry["state_reason_code"] = readiness.reason_code
            principals.append(entry)
            ready_count += bool(ready)
            count += health.startup_failure_count
            failures.extend(dict(f) for f in health.recent_startup_failures)
        failures.sort(key=lambda f: (f.get("sequence", 0), f.get("timestamp", "")))
        out: dict[str, Any] = {"id": bundle.id}
        up = ready_count > 0
        out["hosted"] = up
        out["state"] = "up" if up else "down"
        if up:
            out["startup_health"] = "healthy" if ready_count == len(bundle.sessions) else "degraded"
        elif not bundle.sessions:
            out["state_reason_code"] = "runtime_no_configured_sessions"
            out["state_reason"] = "bundle has zero configured sessions"
        elif self.host.hosted(bundle):
            out["state_reason_code"] = "runtime_startup_failed"
            out["state_reason"] = "zero configured sessions are currently ready"
        out["startup_failure_count"] = count
        out["recent_startup_failures"] = failures
        out["principals"] = principals
        return out

    def global_view(self, users: Users) -> dict[str, Any]:
        """The GLOBAL registry: users.toml principals, then other live `@GLOBAL` connections."""
        live = self._live()
        principals: list[dict[str, Any]] = []
        for user in users.users:
            entry: dict[str, Any] = {"id": user.id}
            if user.name is not None:
                entry["name"] = user.name
            entry["transport"] = user.transport
            entry["ready"] = user.id in live
            principals.append(entry)
        known = {user.id for user in users.users}
        for pid in sorted(live):
            if pid.endswith("@" + GLOBAL) and pid not in known:
                principals.append({"id": pid, "transport": "ui", "ready": True})
        up = any(p["ready"] for p in principals)
        return {
            "id": GLOBAL,
            "hosted": up,
            "state": "up" if up else "down",
            "startup_failure_count": 0,
            "recent_startup_failures": [],
            "principals": principals,
        }

    # -- look ----------------------------------------------------------------------------------

    async def _look(self, principal: Principal, request: Request) -> dict[str, Any]:
        body = request.body
        look = LookRequest.read(body)
        raw_target, lines, offset = look.target_session, look.lines, look.offset
        target = self._target(raw_target, operation="look")
        bundle, session = target.bundle, target.session
        assert bundle is not None and session is not None
        kind = self._member_kind(bundle, session, "look")
        if offset and not kind.supports_offset:
            raise RelayError(
                "validation_offset_unsupported",
                "offset is only supported for ACP look targets",
                {"target_session": target.principal.id, "offset": offset},
            )
        requester = self._requester(principal, body)
        authorize(requester.policy, "look.inspect", principal, [target.principal])
        member = self._member(bundle, session)
        if member is None:
            raise unavailable(target.principal.id, "the target's bundle is not hosted")
        snapshot = await member.look(lines or kind.default_look_lines, offset or 0)
        self.inscribe(
            "relay.look.response",
            requester_session=principal.id,
            target_session=target.principal.id,
            snapshot_count=snapshot.count,
        )
        out: dict[str, Any] = {
            "kind": "look",
            "schema_version": SCHEMA_VERSION,
            "requester_session": principal.id,
            "target_session": target.principal.id,
            "captured_at": utc_now(),
            **snapshot.fields,
        }
        if principal.verified:
            out["authenticated_identity"] = principal.id
        return out

    # -- send ----------------------------------------------------------------------------------

    async def _send(self, principal: Principal, request: Request) -> dict[str, Any]:
        body = request.body
        send = SendRequest.read(body)
        message, broadcast, client_request_id = send.message, send.broadcast, send.request_id
        if broadcast and principal.kind != "session":
            raise _bad("broadcast requires a bundle-bound sender")

        targets: list[_Target] = []
        skipped: list[_Target] = []  # broadcast members of an unsupported transport
        if broadcast:
            home = self._bundle(principal.namespace)
            for session in home.sessions:
                if session.id == principal.name:
                    continue
                target = _Target(
                    parse_principal(session.principal_id(home.id)), home, session, session.name
                )
                supported = members.kind_of(home, session) is not None
                (targets if supported else skipped).append(target)
        else:
            users = load_users(self.roots)
            seen: set[str] = set()
            for raw in send.targets:
                target = self._target(raw, operation="send", users=users)
                if target.principal.id in seen:
                    continue
                seen.add(target.principal.id)
                if target.bundle is not None and target.session is not None:
                    self._member_kind(target.bundle, target.session, "send")
                targets.append(target)
        requester = self._requester(principal, body)
        authorize(
            requester.policy, "send.deliver", principal, [t.principal for t in targets + skipped]
        )
        # a stopped member: an explicit target refuses the request whole; in a broadcast it
        # gets a not_submitted result, as an unsupported member does
        unsent = [
            (t, _session_type(t.bundle, t.session)) for t in skipped if t.bundle and t.session
        ]
        stopped = [t for t in targets if self._stopped(t)]
        if stopped and not broadcast:
            raise _fail_stopped(stopped[0].principal.id)
        unsent += [(t, _fail_stopped(t.principal.id)) for t in stopped]
        everyone_targets = targets + skipped
        targets = [t for t in targets if t not in stopped]

        created = datetime.now(UTC)
        sender = env.Address(principal.id, requester.display_name)
        everyone = [env.Address(t.principal.id, t.display_name) for t in everyone_targets]
        results: list[dict[str, Any]] = []
        rendered: list[tuple[_Target, _Item, list[env.Address]]] = []
        for target in targets:
            message_id = uuid.uuid4()
            to = env.Address(target.principal.id, target.display_name)
            cc = [a for a in everyone if a.canonical_id != target.principal.id]
            text = env.render(env.Envelope(message_id, created, sender, to, message, cc))
            item = _Item(str(message_id), "envelope", text, principal.id, target.principal.id)
            item.size = len(text.encode("utf-8", "surrogatepass"))
            rendered.append((target, item, cc))
        # the whole request, or nothing of it (a @GLOBAL target is an event, never queued)
        self.queue_bounds.check(
            principal.id, [(i.target, i.size) for t, i, _ in rendered if t.bundle is not None]
        )
        for target, item, cc in rendered:
            # the machine metadata the pane never shows (envelope.py)
            self.inscribe(
                "relay.send.envelope.metadata",
                schema_version=SCHEMA_VERSION,
                message_id=item.message_id,
                namespace=target.principal.namespace,
                sender_session=principal.id,
                target_sessions=[target.principal.id],
                cc_sessions=[a.canonical_id for a in cc],
                created_at=env.rfc3339(created),
                message_length=len(message),
            )
            if target.bundle is None:
                self._deliver_event(item, message)
            else:
                assert target.session is not None
                self._enqueue(target.bundle.id, target.session.id, item)
            results.append(
                {
                    "target_session": target.principal.id,
                    "message_id": item.message_id,
                    "outcome": "queued",
                }
            )
        for target, err in unsent:
            skipped_id = str(uuid.uuid4())
            results.append(
                {
                    "target_session": target.principal.id,
                    "message_id": skipped_id,
                    "outcome": "not_submitted",
                    "reason_code": err.code,
                    "reason": err.message,
                }
            )
            self._record(skipped_id, principal.id, target.principal.id, "not_submitted", err.code)
        self.inscribe(
            "relay.send.request",
            requester_session=principal.id,
            request_id=client_request_id,
            targets=[t.principal.id for t in everyone_targets],
            broadcast=broadcast,
            message_length=len(message),
        )
        out: dict[str, Any] = {"kind": "send", "schema_version": SCHEMA_VERSION}
        if client_request_id is not None:
            out["request_id"] = client_request_id
        out["requester_session"] = principal.id
        if requester.display_name is not None:
            out["sender_display_name"] = requester.display_name
        if principal.verified:
            out["authenticated_identity"] = principal.id
        out["results"] = results
        return out

    # -- raww ----------------------------------------------------------------------------------

    async def _raww(self, principal: Principal, request: Request) -> dict[str, Any]:
        body = request.body
        raww = RawwRequest.read(body)
        raw_target, text, no_enter = raww.target_session, raww.raw_text, raww.no_enter
        client_request_id = raww.request_id
        target = self._target(raw_target, operation="raww")
        assert target.bundle is not None and target.session is not None
        kind = self._member_kind(target.bundle, target.session, "raww")
        requester = self._requester(principal, body)
        authorize(requester.policy, "raww.write", principal, [target.principal])
        if self._stopped(target):
            raise _fail_stopped(target.principal.id)
        message_id = str(uuid.uuid4())
        item = _Item(message_id, "raww", text, principal.id, target.principal.id, no_enter)
        item.size = len(text.encode("utf-8", "surrogatepass"))
        self.queue_bounds.check(principal.id, [(item.target, item.size)])
        self._enqueue(target.bundle.id, target.session.id, item)
        self.inscribe(
            "relay.raww.request",
            requester_session=principal.id,
            target_session=target.principal.id,
            message_id=message_id,
            text_length=len(text),
            no_enter=no_enter,
        )
        out: dict[str, Any] = {
            "kind": "raww",
            "schema_version": SCHEMA_VERSION,
            "status": "queued",
            "target_session": target.principal.id,
            "transport": kind.transport,
        }
        if client_request_id is not None:
            out["request_id"] = client_request_id
        out["message_id"] = message_id
        return out

    # -- up / down -----------------------------------------------------------------------------

    async def _updown(self, principal: Principal, request: Request) -> dict[str, Any]:
        action = request.operation
        bundle = self._bundle(self._subject(principal, request))
        requester = self._requester(principal, request.body)
        authorize(requester.policy, "updown", principal, subject_bundle=bundle.id)
        entry: dict[str, Any] = {"bundle_name": bundle.id}
        hosted = self.host.hosted(bundle)
        if action == "up" and hosted:
            entry.update(
                outcome="skipped",
                reason_code="already_hosted",
                reason="bundle runtime is already hosted",
            )
        elif action == "down" and not hosted:
            entry.update(
                outcome="skipped",
                reason_code="already_unhosted",
                reason="bundle runtime is already unhosted",
            )
        else:
            try:
                if action == "up":
                    await self.host.up(bundle)
                else:
                    await self.host.down(bundle)
                entry["outcome"] = "hosted" if action == "up" else "unhosted"
            except Exception as exc:
                code = "runtime_startup_failed" if action == "up" else "runtime_shutdown_failed"
                reason = exc.message if isinstance(exc, CodedFailure) else str(exc)
                entry.update(outcome="failed", reason_code=code, reason=reason or code)
        self.inscribe(
            f"relay.bundle.{action}",
            requester_session=principal.id,
            bundle_name=bundle.id,
            outcome=entry["outcome"],
        )
        changed = entry["outcome"] in ("hosted", "unhosted")
        return {
            "kind": "bundle_transition",
            "schema_version": SCHEMA_VERSION,
            "action": action,
            "bundles": [entry],
            "changed_bundle_count": int(changed),
            "skipped_bundle_count": int(entry["outcome"] == "skipped"),
            "failed_bundle_count": int(entry["outcome"] == "failed"),
            "changed_any": changed,
        }

    # -- choices --------------------------------------------------------------------------------

    async def _choices_list(self, principal: Principal, request: Request) -> dict[str, Any]:
        bundle = self._bundle(self._subject(principal, request))
        requester = self._requester(principal, request.body)
        authorize(requester.policy, "choose", principal, subject_bundle=bundle.id)
        queue = self._choices(bundle)
        pending = queue.pending() if queue is not None else []
        return {
            "kind": "choices_list",
            "schema_version": SCHEMA_VERSION,
            "pending_requests": pending,
        }

    async def _choices_pick(self, principal: Principal, request: Request) -> dict[str, Any]:
        body = request.body
        pick = ChoicesPickRequest.read(body)
        bundle = self._bundle(self._subject(principal, request))
        requester = self._requester(principal, body)
        authorize(requester.policy, "choose", principal, subject_bundle=bundle.id)
        queue = self._choices(bundle)
        if queue is None:
            raise RelayError(
                "runtime_choices_request_not_found",
                "choice request is not pending (no member of this bundle raises choices, so it "
                "never has pending choices)",
                {"choice_request_id": pick.choice_request_id},
            )
        assert pick.outcome is not None  # the model's rules refused a body without one
        resolved = queue.decide(pick.choice_request_id, pick.outcome, pick.option_id, principal.id)
        out: dict[str, Any] = {
            "kind": "choices_pick",
            "schema_version": SCHEMA_VERSION,
            "status": "resolved",
            "choice_request_id": pick.choice_request_id,
            "outcome": resolved.get("outcome", pick.outcome),
            "decided_by": resolved.get("decided_by", principal.id),
        }
        for name in ("reason_code", "reason"):
            if resolved.get(name) is not None:
                out[name] = resolved[name]
        return out

    # -- discovery (local only) ----------------------------------------------------------------

    def _no_foreign(self, body: dict[str, Any]) -> None:
        relay = _opt_str(body, "relay")
        if relay:
            raise _cross_relay(relay)

    async def _list_relays(self, principal: Principal, request: Request) -> dict[str, Any]:
        requester = self._requester(principal, request.body)
        authorize(requester.policy, "list.read", principal)
        settings = load_relay_settings(self.roots, self._environ)
        aliases = sorted(peer.alias for peer in settings.peers)
        return {
            "kind": "list_relays",
            "schema_version": SCHEMA_VERSION,
            "relays": [{"alias": a} for a in aliases],
        }

    async def _discover_namespaces(self, principal: Principal, request: Request) -> dict[str, Any]:
        self._no_foreign(request.body)
        requester = self._requester(principal, request.body)
        authorize(requester.policy, "list.read", principal)
        layer = [self.bundles()] if self.bundles is not None else []
        return {
            "kind": "discover_namespaces",
            "schema_version": SCHEMA_VERSION,
            "namespaces": sorted(set(bundle_ids(self.roots)).union(*layer)),
        }

    async def _discover_principals(self, principal: Principal, request: Request) -> dict[str, Any]:
        self._no_foreign(request.body)
        namespace = _opt_str(request.body, "namespace")
        if not namespace:
            raise _bad("namespace is required", {"field": "namespace"})
        listed = self._listed(principal, namespace, request.body)
        return {
            "kind": "discover_principals",
            "schema_version": SCHEMA_VERSION,
            "bundles": [listed],
        }
