"""`look` (reference §1.6): the target member's own snapshot. Capability `look.inspect`.

Owns: the response (`LookResponse`: the common fields, then the member's snapshot: a tmux
member's `snapshot_format` "lines" and `snapshot_lines`; an ACP member's
"structured_entries_v1", `snapshot_entries`, `entries_total`, `returned_entries_count`,
`freshness`, `snapshot_source`, `stale_reason_code`?, `snapshot_age_ms`?), and the order:
the body (`LookRequest`: `lines` within `LOOK_LINES_MIN..LOOK_LINES_MAX`, the one home of those
bounds), the target (existing, of a registered kind), `offset` only 0 unless the kind supports
it (`validation_offset_unsupported`), authorization, then the member's `look` with `lines`
defaulting to the kind's (`default_look_lines`: 120 for tmux) and `transport_unavailable` while
it is not hosted.

Every string of the snapshot, whatever the member's kind (a tmux member's lines; an ACP
member's entry lines, and the keys and strings of its invocations' raw data), is made visible by
`envelope.neutralise`, the one function `send` uses (SECURITY.md X7, X11): an escape sequence or
a control character an agent put in its pane or its ACP updates reaches the reader of `look` as
text (`^[`, `<U+009B>`), never as a sequence their terminal would act on.

Must never: read a member but through its kind (`Member.look`), or return a string of the
member's that `neutralise` did not pass.
"""

from __future__ import annotations

from typing import Any

from mcphost.agentmux.operations import LookRequest
from mcphost.agentmux.wire import Principal, RelayError, utc_now
from mcphost.relay import requester as rq
from mcphost.relay.envelope import neutralise
from mcphost.relay.members.port import unavailable
from mcphost.relay.ops.base import Operation, Response, identified
from mcphost.relay.policy import authorize
from mcphost.relay.state import RelayState

CAPABILITY = "look.inspect"


class LookResponse(Response):
    KIND = "look"
    requester_session: str
    target_session: str
    captured_at: str
    snapshot_format: str
    snapshot_lines: list[str] | None = None
    snapshot_entries: list[dict[str, Any]] | None = None
    entries_total: int | None = None
    returned_entries_count: int | None = None
    freshness: str | None = None
    snapshot_source: str | None = None
    stale_reason_code: str | None = None
    snapshot_age_ms: int | None = None
    authenticated_identity: str | None = None


async def run(
    state: RelayState, principal: Principal, request: LookRequest, namespace: str | None
) -> LookResponse:
    target = rq.target(state, request.target_session, operation="look")
    bundle, session = target.bundle, target.session
    assert bundle is not None and session is not None  # look refuses @GLOBAL targets
    kind = rq.member_kind(bundle, session, "look")
    if request.offset and not kind.supports_offset:
        raise RelayError(
            "validation_offset_unsupported",
            "offset is only supported for ACP look targets",
            {"target_session": target.principal.id, "offset": request.offset},
        )
    requester = rq.requester(state, principal, request.requester_session)
    authorize(requester.policy, CAPABILITY, principal, [target.principal])
    member = rq.member(state, bundle, session)
    if member is None:
        raise unavailable(target.principal.id, "the target's bundle is not hosted")
    snapshot = await member.look(request.lines or kind.default_look_lines, request.offset or 0)
    state.inscribe(
        "relay.look.response",
        requester_session=principal.id,
        target_session=target.principal.id,
        snapshot_count=snapshot.count,
    )
    return LookResponse(
        requester_session=principal.id,
        target_session=target.principal.id,
        captured_at=utc_now(),
        **visible(snapshot.fields),
        authenticated_identity=identified(principal),
    )


def visible(value: Any) -> Any:
    """`value` (a snapshot's fields) with every string in it, keys included, neutralised."""
    if isinstance(value, str):
        return neutralise(value)
    if isinstance(value, dict):
        return {visible(key): visible(item) for key, item in value.items()}
    if isinstance(value, list):
        return [visible(item) for item in value]
    return value


OPERATIONS: tuple[Operation[Any], ...] = (Operation(LookRequest, CAPABILITY, run),)
