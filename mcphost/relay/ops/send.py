"""`send` (reference §1.5, §3.4): envelopes queued to their targets. Capability `send.deliver`.

Owns: the response (`SendResponse`, one `SendResult` per target) and the rules: targets fully
qualified (bare names are the relay tools' job), deduplicated in order; broadcast = every other
member of the sender's bundle (a bundle-bound sender only). Each target gets a uuid4
`message_id` and its envelope (envelope.py), queued to the target's worker (delivery.py), which
hands the member the contiguous envelopes that fit one batch as one unit (`Member.deliver`); the
answer is `queued` at once. A `@GLOBAL` target gets an `incoming_message` event on its live
connections instead. An explicit target no registered member kind hosts fails the request with
`runtime_session_type_not_implemented` before anything is queued (ui/pubsub:
`validation_unsupported_operation`); in a broadcast such a member gets a result `not_submitted`
with that reason code. The queue is bounded per target, per sender and in all (admission.py): a
request that would go over is refused whole, `runtime_delivery_queue_full`, after authorization
and before anything is queued. A target the host reports stopped (`MemberHealth.stopped`)
refuses the request whole too, after authorization: `delivery_target_fail_stopped`, details
`{target_session}`; in a broadcast it gets `not_submitted` with that code instead.

Must never: log a message body (the `relay.send.*` records carry ids and sizes), or queue part
of a refused request.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from mcphost.agentmux.operations import SendRequest
from mcphost.agentmux.wire import SCHEMA_VERSION, Principal, RelayError, parse_principal
from mcphost.relay import delivery, members
from mcphost.relay import envelope as env
from mcphost.relay import requester as rq
from mcphost.relay.config import load_users
from mcphost.relay.ops.base import Entry, Operation, Response, identified
from mcphost.relay.policy import authorize
from mcphost.relay.requester import Target
from mcphost.relay.state import Item, RelayState

CAPABILITY = "send.deliver"


class SendResult(Entry):
    target_session: str
    message_id: str
    outcome: str
    reason_code: str | None = None
    reason: str | None = None


class SendResponse(Response):
    KIND = "send"
    request_id: str | None = None
    requester_session: str
    sender_display_name: str | None = None
    authenticated_identity: str | None = None
    results: list[SendResult]


def _targets(
    state: RelayState, principal: Principal, request: SendRequest
) -> tuple[list[Target], list[Target]]:
    """(the targets, the broadcast members no registered kind hosts)."""
    targets: list[Target] = []
    skipped: list[Target] = []
    if request.broadcast:
        home = rq.bundle(state, principal.namespace)
        for session in home.sessions:
            if session.id == principal.name:
                continue
            target = Target(
                parse_principal(session.principal_id(home.id)), home, session, session.name
            )
            supported = members.kind_of(home, session) is not None
            (targets if supported else skipped).append(target)
        return targets, skipped
    users = load_users(state.roots)
    seen: set[str] = set()
    for raw in request.targets:
        target = rq.target(state, raw, operation="send", users=users)
        if target.principal.id in seen:
            continue
        seen.add(target.principal.id)
        if target.bundle is not None and target.session is not None:
            rq.member_kind(target.bundle, target.session, "send")
        targets.append(target)
    return targets, skipped


async def run(
    state: RelayState, principal: Principal, request: SendRequest, namespace: str | None
) -> SendResponse:
    message, broadcast = request.message, request.broadcast
    if broadcast and principal.kind != "session":
        raise rq.bad("broadcast requires a bundle-bound sender")
    targets, skipped = _targets(state, principal, request)
    requester = rq.requester(state, principal, request.requester_session)
    everyone_targets = targets + skipped
    authorize(requester.policy, CAPABILITY, principal, [t.principal for t in everyone_targets])
    # a stopped member: an explicit target refuses the request whole; in a broadcast it gets a
    # not_submitted result, as an unsupported member does
    unsent: list[tuple[Target, RelayError]] = [
        (t, rq.session_type(t.bundle, t.session)) for t in skipped if t.bundle and t.session
    ]
    stopped = [t for t in targets if delivery.stopped(state, t)]
    if stopped and not broadcast:
        raise rq.fail_stopped(stopped[0].principal.id)
    unsent += [(t, rq.fail_stopped(t.principal.id)) for t in stopped]
    targets = [t for t in targets if t not in stopped]

    created = datetime.now(UTC)
    sender = env.Address(principal.id, requester.display_name)
    everyone = [env.Address(t.principal.id, t.display_name) for t in everyone_targets]
    rendered: list[tuple[Target, Item, list[env.Address]]] = []
    for target in targets:
        message_id = uuid.uuid4()
        to = env.Address(target.principal.id, target.display_name)
        cc = [a for a in everyone if a.canonical_id != target.principal.id]
        text = env.render(env.Envelope(message_id, created, sender, to, message, cc))
        item = Item(str(message_id), "envelope", text, principal.id, target.principal.id)
        item.size = len(text.encode("utf-8", "surrogatepass"))
        rendered.append((target, item, cc))
    # the whole request, or nothing of it (a @GLOBAL target is an event, never queued)
    state.queue_bounds.check(
        principal.id, [(i.target, i.size) for t, i, _ in rendered if t.bundle is not None]
    )
    results: list[SendResult] = []
    for target, item, cc in rendered:
        # the machine metadata the pane never shows (envelope.py)
        state.inscribe(
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
            delivery.deliver_event(state, item, message)
        else:
            assert target.session is not None
            delivery.enqueue(state, target.bundle.id, target.session.id, item)
        results.append(SendResult(target_session=target.principal.id,
                                  message_id=item.message_id, outcome="queued"))  # fmt: skip
    for target, err in unsent:
        skipped_id = str(uuid.uuid4())
        results.append(
            SendResult(
                target_session=target.principal.id,
                message_id=skipped_id,
                outcome="not_submitted",
                reason_code=err.code,
                reason=err.message,
            )
        )
        delivery.record(state, skipped_id, principal.id, target.principal.id, "not_submitted",
                        err.code)  # fmt: skip
    state.inscribe(
        "relay.send.request",
        requester_session=principal.id,
        request_id=request.request_id,
        targets=[t.principal.id for t in everyone_targets],
        broadcast=broadcast,
        message_length=len(message),
    )
    return SendResponse(
        request_id=request.request_id,
        requester_session=principal.id,
        sender_display_name=requester.display_name,
        authenticated_identity=identified(principal),
        results=results,
    )


OPERATIONS: tuple[Operation[Any], ...] = (Operation(SendRequest, CAPABILITY, run),)
