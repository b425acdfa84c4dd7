"""`list` (reference §1.3): one namespace's ListedBundle. Capability `list.read`.

Owns: the request (`ListRequest`: the namespace is the frame's, else the requester's bundle),
the ListedBundle and its principals (`ListedBundle`, `ListedPrincipal`) and how they are made:
- a configured bundle (`listed_bundle`): a member is ready when its host says so and its member
  (`requester.member`: the kind bound to the host's endpoint) does too; it carries its member's
  `state` / `state_reason_code` when the member reports them (an ACP member); `hosted` / `state`
  "up" iff at least one member is ready; `startup_health` "healthy" (all ready) or "degraded"
  (some), only when up; `state_reason_code` `runtime_members_not_ready` (degraded: the reason
  names the members not ready; not agentmux's, which gives a degraded bundle no reason),
  `runtime_no_configured_sessions` (no members) or `runtime_startup_failed` (none ready while
  the host hosts the bundle); a bundle the host does
  not host is "down" with no reason;
- `GLOBAL` (`global_view`): the users.toml principals plus live `@GLOBAL` connections, `ready`
  = a live connection.
`discover_principals` (discovery.py) answers with the same ListedBundle (`listed`).

Must never: report a member ready that its host does not.
"""

from __future__ import annotations

from typing import Any

from mcphost.agentmux.bundlefile import Bundle
from mcphost.agentmux.operations import ListRequest
from mcphost.agentmux.wire import Principal
from mcphost.relay import reasons as R
from mcphost.relay import requester as rq
from mcphost.relay.config import Users, load_users
from mcphost.relay.ops.base import Entry, Operation, Response
from mcphost.relay.policy import authorize
from mcphost.relay.requester import GLOBAL
from mcphost.relay.state import RelayState

CAPABILITY = "list.read"


class ListedPrincipal(Entry):
    id: str
    name: str | None = None
    transport: str
    ready: bool
    state: str | None = None
    state_reason_code: str | None = None


class ListedBundle(Entry):
    id: str
    hosted: bool
    state: str
    startup_health: str | None = None
    state_reason_code: str | None = None
    state_reason: str | None = None
    startup_failure_count: int = 0
    recent_startup_failures: list[dict[str, Any]] = []
    principals: list[ListedPrincipal] = []


class ListResponse(Response):
    KIND = "list"
    bundle: ListedBundle


def listed(
    state: RelayState, principal: Principal, namespace: str, claimed: str | None
) -> ListedBundle:
    """The namespace's ListedBundle, once the requester may read it."""
    if namespace == GLOBAL:
        users = load_users(state.roots)
        requester = rq.requester(state, principal, claimed)
        authorize(requester.policy, CAPABILITY, principal, subject_bundle=GLOBAL)
        return global_view(state, users)
    bundle = rq.bundle(state, namespace)
    requester = rq.requester(state, principal, claimed)
    authorize(requester.policy, CAPABILITY, principal, subject_bundle=bundle.id)
    return listed_bundle(state, bundle)


def listed_bundle(state: RelayState, bundle: Bundle) -> ListedBundle:
    """The ListedBundle of a configured bundle, from the host's and the members' states."""
    principals: list[ListedPrincipal] = []
    failures: list[dict[str, Any]] = []
    count = 0
    ready_count = 0
    for session in bundle.sessions:
        ready, health = state.host.member_state(bundle, session.id)
        member = rq.member(state, bundle, session)
        readiness = member.readiness() if member is not None else None
        ready = bool(ready) and readiness is not None and readiness.ready
        principals.append(
            ListedPrincipal(
                id=session.principal_id(bundle.id),
                name=session.name,
                transport=session.transport,
                ready=ready,
                state=readiness.state if readiness is not None else None,
                state_reason_code=readiness.reason_code if readiness is not None else None,
            )
        )
        ready_count += ready
        count += health.startup_failure_count
        failures.extend(dict(f) for f in health.recent_startup_failures)
    failures.sort(key=lambda f: (f.get("sequence", 0), f.get("timestamp", "")))
    up = ready_count > 0
    health_of: str | None = None
    code: str | None = None
    reason: str | None = None
    if up:
        health_of = "healthy" if ready_count == len(bundle.sessions) else "degraded"
        if health_of == "degraded":  # say which members, so the degradation has a reason
            waiting = [p.id for p in principals if not p.ready]
            code = "runtime_members_not_ready"
            reason = f"{len(waiting)} of {len(principals)} members are not ready: " + ", ".join(
                waiting
            )
    elif not bundle.sessions:
        code, reason = "runtime_no_configured_sessions", "bundle has zero configured sessions"
    elif state.host.hosted(bundle):
        code, reason = R.STARTUP_FAILED, "zero configured sessions are currently ready"
    return ListedBundle(
        id=bundle.id,
        hosted=up,
        state="up" if up else "down",
        startup_health=health_of,
        state_reason_code=code,
        state_reason=reason,
        startup_failure_count=count,
        recent_startup_failures=failures,
        principals=principals,
    )


def global_view(state: RelayState, users: Users) -> ListedBundle:
    """The GLOBAL registry: users.toml principals, then other live `@GLOBAL` connections."""
    live = rq.live(state)
    principals = [
        ListedPrincipal(id=user.id, name=user.name, transport=user.transport, ready=user.id in live)
        for user in users.users
    ]
    known = {user.id for user in users.users}
    principals += [
        ListedPrincipal(id=pid, transport="ui", ready=True)
        for pid in sorted(live)
        if pid.endswith("@" + GLOBAL) and pid not in known
    ]
    up = any(p.ready for p in principals)
    return ListedBundle(id=GLOBAL, hosted=up, state="up" if up else "down", principals=principals)


async def run(
    state: RelayState, principal: Principal, request: ListRequest, namespace: str | None
) -> ListResponse:
    subject = rq.subject(principal, namespace, request.operation)
    bundle = listed(state, principal, subject, request.requester_session)
    state.inscribe(
        "relay.list.response",
        requester_session=principal.id,
        namespace=bundle.id,
        state=bundle.state,
        principal_count=len(bundle.principals),
        ready_count=sum(1 for p in bundle.principals if p.ready),
    )
    return ListResponse(bundle=bundle)


OPERATIONS: tuple[Operation[Any], ...] = (Operation(ListRequest, CAPABILITY, run),)
