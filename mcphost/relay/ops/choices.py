"""`choices_list` / `choices_pick` (reference §1.8; acp.md §4): a bundle's pending permission
choices and the decisions on them. Capability `choose`.

Owns: the responses (`ChoicesListResponse`: the queue's `pending_requests`;
`ChoicesPickResponse`: `resolved`, the outcome, `decided_by` = the requester) and the rules:
the bundle is the frame's namespace, else the requester's; both need `choose` at `home` in it
(`all` for another bundle; a `choices_pick` refusal names its `choice_request_id`); its queue is
`requester.choices` (made by the first kind of its members that keeps one, `MemberKind.
choices_queue`: the same queue the kind installs as its members' chooser); a bundle without one
has nothing pending (`choices_pick`: `runtime_choices_request_already_resolved`, as for any id
not pending); a decision is the queue's (`Choices.decide`: not pending
`runtime_choices_request_already_resolved`, an option not offered `validation_invalid_params`,
first decision wins), its `decided_by` the requester (the connection's principal: a body
naming the decider was refused when it was read, `ChoicesPickRequest.STAMPED`). `close`
resolves every pending choice cancelled when the relay shuts down
(`runtime_choices_request_cancelled`).

Must never: decide for anyone but the requester.
"""

from __future__ import annotations

from typing import Any

from mcphost.agentmux.bundlefile import Bundle
from mcphost.agentmux.operations import ChoicesListRequest, ChoicesPickRequest
from mcphost.agentmux.wire import Principal, RelayError
from mcphost.relay import reasons as R
from mcphost.relay import requester as rq
from mcphost.relay.ops.base import Operation, Response
from mcphost.relay.policy import authorize
from mcphost.relay.state import RelayState

CAPABILITY = "choose"


class ChoicesListResponse(Response):
    KIND = "choices_list"
    pending_requests: list[dict[str, Any]]


class ChoicesPickResponse(Response):
    KIND = "choices_pick"
    status: str
    choice_request_id: str
    outcome: str
    decided_by: str
    reason_code: str | None = None
    reason: str | None = None


def _bundle(
    state: RelayState,
    principal: Principal,
    namespace: str | None,
    request: ChoicesListRequest | ChoicesPickRequest,
) -> Bundle:
    """The subject bundle, once the requester may choose in it (a `choices_pick` refusal
    names the choice request too)."""
    bundle = rq.bundle(state, rq.subject(principal, namespace, request.operation))
    requester = rq.requester(state, principal, request.requester_session)
    try:
        authorize(requester.policy, CAPABILITY, principal, subject_bundle=bundle.id)
    except RelayError as err:
        if isinstance(request, ChoicesPickRequest):
            details = {**(err.details or {}), "choice_request_id": request.choice_request_id}
            raise RelayError(err.code, err.message, details) from None
        raise
    return bundle


async def run_list(
    state: RelayState, principal: Principal, request: ChoicesListRequest, namespace: str | None
) -> ChoicesListResponse:
    bundle = _bundle(state, principal, namespace, request)
    queue = rq.choices(state, bundle)
    return ChoicesListResponse(pending_requests=queue.pending() if queue is not None else [])


async def run_pick(
    state: RelayState, principal: Principal, request: ChoicesPickRequest, namespace: str | None
) -> ChoicesPickResponse:
    bundle = _bundle(state, principal, namespace, request)
    queue = rq.choices(state, bundle)
    if queue is None:
        raise RelayError(
            R.CHOICE_ALREADY_RESOLVED,
            f"choice request {request.choice_request_id} is not pending: no member of bundle "
            f"{bundle.id} raises choices (only ACP members do), so it has none; list the "
            "pending ones with list command=decisions",
            {"choice_request_id": request.choice_request_id},
        )
    assert request.outcome is not None  # the model's rules refused a body without one
    resolved = queue.decide(
        request.choice_request_id, request.outcome, request.option_id, principal.id
    )
    return ChoicesPickResponse(
        status="resolved",
        choice_request_id=request.choice_request_id,
        outcome=resolved.get("outcome", request.outcome),
        decided_by=resolved.get("decided_by", principal.id),
        reason_code=resolved.get("reason_code"),
        reason=resolved.get("reason"),
    )


def close(state: RelayState) -> None:
    """Resolve every pending choice cancelled: the relay shuts down."""
    for queue in state.choices.values():
        for target in dict.fromkeys(c.get("target_session") for c in queue.pending()):
            if isinstance(target, str):
                queue.invalidate(target, R.CHOICE_CANCELLED, "relay shut down")


OPERATIONS: tuple[Operation[Any], ...] = (
    Operation(ChoicesListRequest, CAPABILITY, run_list),
    Operation(ChoicesPickRequest, CAPABILITY, run_pick),
)
