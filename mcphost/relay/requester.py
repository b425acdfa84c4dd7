"""Requester and target resolution for the relay's operations: who is asking, about whom.

Owns, as functions of the relay's state (`state.RelayState`): bundle lookup (`bundle`: the host's
in-memory layer, then the file layers), the membership rule (a session principal is a member of
its configured bundle, a user principal a users.toml user: `member_of`, the one place it is
written, used by the hello's `authenticate`, an in-process session's `admit` and every request),
the requester with its policy (`requester`: a `requester_session` naming anyone but the
connection's principal is `validation_unknown_sender`), the routing namespace of a
bundle-subject request (`subject`, §2.3), target resolution (`target`: fully qualified,
existing; validation and existence errors only), the member kind check (`member_kind`: the
registered kind hosting a target, `members.KINDS`), the target reached as a member (`member`:
bound to its host's endpoint, with the context the relay lends it and its bundle's choices queue,
`choices`, whose records it inscribes: `relay.choices.requested` / `relay.choices.resolved`),
and the refusals the operations share.

Must never: authorize (that is `policy.authorize`, called by the operations), or act on anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from mcphost.agentmux.bundlefile import Bundle, Session, require_bundle
from mcphost.agentmux.wire import Principal, RelayError, parse_principal
from mcphost.relay import members
from mcphost.relay.config import User, Users, load_relay_settings, load_users
from mcphost.relay.members.port import (
    Choices,
    Member,
    MemberContext,
    MemberKind,
    session_type_not_implemented,
)
from mcphost.relay.policy import Policy, load_policies, member_policy
from mcphost.relay.state import RelayState

GLOBAL = "GLOBAL"
FAIL_STOPPED = "delivery_target_fail_stopped"


# -- small helpers -----------------------------------------------------------------------------


def bad(message: str, details: dict[str, Any] | None = None) -> RelayError:
    return RelayError("validation_invalid_arguments", message, details)


def not_implemented(operation: str, why: str) -> RelayError:
    return RelayError(
        "runtime_operation_not_implemented",
        f"{operation} is not implemented by this relay: {why}",
        {"operation": operation},
    )


def cross_relay(target: str) -> RelayError:
    return RelayError(
        "runtime_cross_relay_unavailable",
        "cross-relay routing is not available on this relay (no peer relays)",
        {"target": target},
    )


def fail_stopped(target: str) -> RelayError:
    """agentmux's refusal of a target that accepts nothing until an operator acts (§3.4)."""
    return RelayError(
        FAIL_STOPPED,
        f"target session {target} is stopped and accepts no messages; nothing of this request "
        "was queued: start it again (ctl start, or updown up) and send then",
        {"target_session": target},
    )


def session_type(bundle: Bundle, session: Session) -> RelayError:
    return session_type_not_implemented(bundle, session, members.hosted_kinds())


_NOT_A_MEMBER = {
    "hello": "hello session_id is not configured in associated bundle",
    "request": "requester session is not configured in its bundle",
}
_NOT_A_USER = {
    "hello": "hello principal is not configured in users.toml",
    "request": "requester is not configured in users.toml",
}


def _unknown_sender(principal: Principal, when: str, message: str) -> RelayError:
    key = "principal_id" if when == "hello" else "requester_session"
    return RelayError("validation_unknown_sender", message, {key: principal.id})


@dataclass(frozen=True, slots=True)
class Requester:
    principal: Principal
    policy: Policy
    member: Session | None  # a session principal's bundle member
    user: User | None  # a user principal's users.toml entry

    @property
    def display_name(self) -> str | None:
        if self.member is not None:
            return self.member.name
        return self.user.name if self.user is not None else None


@dataclass(frozen=True, slots=True)
class Target:
    principal: Principal
    bundle: Bundle | None  # None for @GLOBAL
    session: Session | None
    display_name: str | None


def bundle(state: RelayState, bundle_id: str) -> Bundle:
    """The bundle `bundle_id`: the host's in-memory layer first, then the file layers
    (`validation_unknown_bundle` when neither configures it)."""
    if state.bundles is not None:
        found = state.bundles().get(bundle_id)
        if found is not None:
            return found
    return require_bundle(state.roots, bundle_id)


def requester(state: RelayState, principal: Principal, claimed: str | None) -> Requester:
    """The connection's principal with its policy; a `requester_session` (`claimed`) naming
    anyone else is `validation_unknown_sender`."""
    if claimed is not None:
        bare = claimed.removesuffix("@" + principal.namespace)
        if bare != principal.name:
            raise RelayError(
                "validation_unknown_sender",
                "requester_session does not name this connection's principal",
                {"requester_session": claimed, "principal_id": principal.id},
            )
    member, user = member_of(state, principal, "request")
    policies = load_policies(state.roots)
    # application / relay principals (neither): authorize() refuses them everything
    return Requester(principal, member_policy(policies, member or user), member, user)


def member_of(
    state: RelayState, principal: Principal, when: Literal["hello", "request"]
) -> tuple[Session | None, User | None]:
    """The membership rule, the one place it is written: a session principal must be a
    member of its configured bundle (`validation_unknown_bundle` when the bundle is not),
    a user principal a users.toml user; else `validation_unknown_sender`, worded for the
    hello or the request it refuses. Application and relay principals are neither."""
    if principal.kind == "session":
        member = bundle(state, principal.namespace).member(principal.name)
        if member is None:
            raise _unknown_sender(principal, when, _NOT_A_MEMBER[when])
        return member, None
    if principal.kind == "user":
        user = load_users(state.roots).get(principal.id)
        if user is None:
            raise _unknown_sender(principal, when, _NOT_A_USER[when])
        return None, user
    return None, None


def subject(principal: Principal, namespace: str | None, operation: str) -> str:
    """The routing namespace of a bundle-subject request (§2.3): the frame's `namespace`,
    else the requester's bundle."""
    if namespace is None:
        if principal.kind != "session":
            raise RelayError(
                "validation_missing_routing_namespace",
                "a relay-wide principal must name the namespace of this request",
                {"operation": operation},
            )
        return principal.namespace
    if namespace in ("EXTERNAL", "RELAY"):
        raise RelayError(
            "validation_unsupported_namespace",
            f"namespace {namespace!r} cannot be routed to",
            {"namespace": namespace},
        )
    return namespace


def target(state: RelayState, raw: Any, *, operation: str, users: Users | None = None) -> Target:
    """A fully-qualified target, resolved; validation and existence errors only."""
    if not isinstance(raw, str) or not raw.strip():
        raise RelayError("validation_unknown_target", "target_session must be non-empty")
    if "!" in raw:
        raise cross_relay(raw)
    if "@" not in raw:
        raise RelayError(
            "validation_unqualified_target",
            "target must be a fully-qualified principal id (id@namespace)",
            {"target": raw},
        )
    principal = parse_principal(raw)
    if principal.namespace in ("EXTERNAL", "RELAY"):
        raise RelayError(
            "validation_unsupported_namespace",
            f"targets in namespace {principal.namespace!r} are not supported",
            {"target": raw, "namespace": principal.namespace},
        )
    if principal.namespace == GLOBAL:
        if operation != "send":
            raise RelayError(
                "validation_unsupported_operation",
                f"{operation} cannot target a relay-wide principal",
                {"target_session": raw},
            )
        users = users if users is not None else load_users(state.roots)
        user = users.get(raw)
        if user is None and raw not in live(state):
            raise RelayError(
                "validation_unknown_target",
                "target is not a configured or connected principal",
                {"target_session": raw},
            )
        return Target(principal, None, None, user.name if user else None)
    home = bundle(state, principal.namespace)
    session = home.member(principal.name)
    if session is None:
        raise RelayError(
            "validation_unknown_target",
            "target is not a member of its bundle",
            {"target_session": raw},
        )
    return Target(principal, home, session, session.name)


def live(state: RelayState) -> set[str]:
    """The principals with a live connection (or in-process session) now."""
    return set(state.connections.live_principals())


def member_kind(bundle: Bundle, session: Session, operation: str) -> MemberKind:
    """The registered kind hosting the member (`members.KINDS`); ui/pubsub members cannot be
    looked at or written to, and a transport no kind hosts is not implemented."""
    if session.transport in ("ui", "pubsub"):
        raise RelayError(
            "validation_unsupported_operation",
            f"{operation} is not supported for a {session.transport} session",
            {
                "target_session": session.principal_id(bundle.id),
                "transport": session.transport,
            },
        )
    kind = members.kind_of(bundle, session)
    if kind is None:
        raise session_type(bundle, session)
    return kind


def choices(state: RelayState, bundle: Bundle) -> Choices | None:
    """The bundle's choices queue: made on first use by the first kind of its members that
    keeps one (relay.toml `[choices] pending-max`), None when none does. Its records are
    inscribed: `relay.choices.requested` (the ids and the kind, never the agent's params or
    tool title) and `relay.choices.resolved` (the outcome, its reason code and the decider)."""
    queue = state.choices.get(bundle.id)
    if queue is not None:
        return queue
    for session in bundle.sessions:
        kind = members.kind_of(bundle, session)
        if kind is not None and kind.choices_queue is not None:
            settings = load_relay_settings(state.roots, state.environ)
            queue = state.choices[bundle.id] = kind.choices_queue(
                settings.choices_pending_max,
                lambda record: _inscribe_requested(state, record),
                lambda record: _inscribe_resolved(state, record),
            )
            return queue
    return None


def _inscribe_requested(state: RelayState, record: dict[str, Any]) -> None:
    details = record.get("requested_details")
    details = details if isinstance(details, dict) else {}
    options = details.get("options")
    state.inscribe(
        "relay.choices.requested",
        choice_request_id=record.get("choice_request_id"),
        message_id=record.get("message_id"),
        target_session=record.get("target_session"),
        requested_kind=record.get("requested_kind"),
        acp_request_id=details.get("acp_request_id"),
        option_ids=[o.get("option_id") for o in options if isinstance(o, dict)]
        if isinstance(options, list)
        else [],
    )


def _inscribe_resolved(state: RelayState, record: dict[str, Any]) -> None:
    state.inscribe(
        "relay.choices.resolved",
        choice_request_id=record.get("choice_request_id"),
        message_id=record.get("message_id"),
        outcome=record.get("outcome"),
        reason_code=record.get("reason_code"),
        decided_by=record.get("decided_by"),
    )


def member(state: RelayState, bundle: Bundle, session: Session) -> Member | None:
    """The member bound to its host's endpoint (`members.member`), None when not hosted."""
    context = MemberContext(state.quiet_ms, state.poll_ms, choices(state, bundle))
    return members.member(bundle, session, state.host, context)
