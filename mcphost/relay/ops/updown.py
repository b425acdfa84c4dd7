"""`up` / `down` (reference §1.9): a bundle's hosting, asked of the host. Capability `updown`.

Owns: the response (`BundleTransition`, one `BundleOutcome`) and the rules: the subject bundle
is the frame's namespace, else the requester's; skipped `already_hosted` / `already_unhosted`;
a host failure is outcome `failed`, `runtime_startup_failed` / `runtime_shutdown_failed`.

Must never: start or stop a process itself (`BundleHost.up` / `down` do).
"""

from __future__ import annotations

from typing import Any

from mcphost.agentmux.bundlefile import Bundle
from mcphost.agentmux.operations import DownRequest, UpRequest
from mcphost.agentmux.wire import Principal
from mcphost.errors import CodedFailure
from mcphost.relay import reasons as R
from mcphost.relay import requester as rq
from mcphost.relay.ops.base import Entry, Operation, Response
from mcphost.relay.policy import authorize
from mcphost.relay.state import RelayState

CAPABILITY = "updown"


class BundleOutcome(Entry):
    bundle_name: str
    outcome: str
    reason_code: str | None = None
    reason: str | None = None


class BundleTransition(Response):
    KIND = "bundle_transition"
    action: str
    bundles: list[BundleOutcome]
    changed_bundle_count: int
    skipped_bundle_count: int
    failed_bundle_count: int
    changed_any: bool


async def _transition(state: RelayState, bundle: Bundle, up: bool) -> BundleOutcome:
    hosted = state.host.hosted(bundle)
    if up and hosted:
        return BundleOutcome(bundle_name=bundle.id, outcome="skipped",
                             reason_code="already_hosted",
                             reason="bundle runtime is already hosted")  # fmt: skip
    if not up and not hosted:
        return BundleOutcome(bundle_name=bundle.id, outcome="skipped",
                             reason_code="already_unhosted",
                             reason="bundle runtime is already unhosted")  # fmt: skip
    try:
        await (state.host.up(bundle) if up else state.host.down(bundle))
    except Exception as exc:
        code = R.STARTUP_FAILED if up else R.SHUTDOWN_FAILED
        reason = exc.message if isinstance(exc, CodedFailure) else str(exc)
        return BundleOutcome(
            bundle_name=bundle.id, outcome="failed", reason_code=code, reason=reason or code
        )
    return BundleOutcome(bundle_name=bundle.id, outcome="hosted" if up else "unhosted")


async def run(
    state: RelayState, principal: Principal, request: UpRequest | DownRequest,
    namespace: str | None,
) -> BundleTransition:  # fmt: skip
    action = request.operation
    bundle = rq.bundle(state, rq.subject(principal, namespace, action))
    requester = rq.requester(state, principal, request.requester_session)
    authorize(requester.policy, CAPABILITY, principal, subject_bundle=bundle.id)
    entry = await _transition(state, bundle, action == "up")
    state.inscribe(
        f"relay.bundle.{action}",
        requester_session=principal.id,
        bundle_name=bundle.id,
        outcome=entry.outcome,
    )
    changed = entry.outcome in ("hosted", "unhosted")
    return BundleTransition(
        action=action,
        bundles=[entry],
        changed_bundle_count=int(changed),
        skipped_bundle_count=int(entry.outcome == "skipped"),
        failed_bundle_count=int(entry.outcome == "failed"),
        changed_any=changed,
    )


OPERATIONS: tuple[Operation[Any], ...] = (
    Operation(UpRequest, CAPABILITY, run),
    Operation(DownRequest, CAPABILITY, run),
)
