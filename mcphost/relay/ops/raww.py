"""`raww` (reference §1.7): text written to a member as is. Capability `raww.write`.

Owns: the response (`RawwResponse`: `queued`, the target's transport, the message id) and the
rules: 32 KiB of UTF-8 at most (`RawwRequest`: `validation_invalid_params`), a target of a
registered kind, queued to the same worker as the envelopes (delivery.py) as a batch barrier
(envelopes before it are delivered before it, later ones after it), under the same queue bounds;
no readiness gate (`Member.write_raw`); its text is keys by design (that is what `raww.write`
grants). A stopped target: `delivery_target_fail_stopped`.

Must never: log the text (its length only).
"""

from __future__ import annotations

import uuid
from typing import Any

from mcphost.agentmux.operations import RawwRequest
from mcphost.agentmux.wire import Principal
from mcphost.relay import delivery
from mcphost.relay import requester as rq
from mcphost.relay.ops.base import Operation, Response
from mcphost.relay.policy import authorize
from mcphost.relay.state import Item, RelayState

CAPABILITY = "raww.write"


class RawwResponse(Response):
    KIND = "raww"
    status: str
    target_session: str
    transport: str
    request_id: str | None = None
    message_id: str


async def run(
    state: RelayState, principal: Principal, request: RawwRequest, namespace: str | None
) -> RawwResponse:
    text = request.raw_text
    target = rq.target(state, request.target_session, operation="raww")
    assert target.bundle is not None and target.session is not None  # raww refuses @GLOBAL
    kind = rq.member_kind(target.bundle, target.session, "raww")
    requester = rq.requester(state, principal, request.requester_session)
    authorize(requester.policy, CAPABILITY, principal, [target.principal])
    if delivery.stopped(state, target):
        raise rq.fail_stopped(target.principal.id)
    message_id = str(uuid.uuid4())
    item = Item(message_id, "raww", text, principal.id, target.principal.id,
                         request.no_enter)  # fmt: skip
    item.size = len(text.encode("utf-8", "surrogatepass"))
    state.queue_bounds.check(principal.id, [(item.target, item.size)])
    delivery.enqueue(state, target.bundle.id, target.session.id, item)
    state.inscribe(
        "relay.raww.request",
        requester_session=principal.id,
        target_session=target.principal.id,
        message_id=message_id,
        text_length=len(text),
        no_enter=request.no_enter,
    )
    return RawwResponse(
        status="queued",
        target_session=target.principal.id,
        transport=kind.transport,
        request_id=request.request_id,
        message_id=message_id,
    )


OPERATIONS: tuple[Operation[Any], ...] = (Operation(RawwRequest, CAPABILITY, run),)
