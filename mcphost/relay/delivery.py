"""Delivery: per-target queues, batching, a batch handed to its member, outcomes, receipts.

Owns, as functions of the relay's state (`state.RelayState`): the per-target delivery workers
(FIFO, one asyncio task per target with something queued; a raww is a batch barrier; `enqueue`,
`drain`, `aclose`), the batch taken once the target's member takes input (`Member.deliver`: a
tmux member's readiness gate, then one paste and submit; the member is `requester.member`), the
queue bounds' ledger entries (admission.py),
the recent outcomes (`outcomes`, the last `OUTCOMES_KEPT`; `outcome_counts`, every outcome ever
by its name, for the supervisor's metrics), the `@GLOBAL` events
(`incoming_message`, `delivery_outcome`), and the terminal-outcome receipts to a sender that is a
member of a registered kind.

Must never: log a message body or raww text (ids, sizes and outcomes only), or start a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import traceback
import uuid
from datetime import UTC, datetime
from typing import Any

from mcphost import events
from mcphost.agentmux import wire
from mcphost.agentmux.bundlefile import Bundle
from mcphost.agentmux.wire import (
    RelayError,
    parse_principal,
)
from mcphost.relay import envelope as env
from mcphost.relay import members, requester
from mcphost.relay.members.port import Batch, unavailable
from mcphost.relay.outcome import UNREACHABLE
from mcphost.relay.outcome import Delivery as Outcome
from mcphost.relay.requester import GLOBAL, Target
from mcphost.relay.state import Item, RelayState, Worker

OUTCOMES_KEPT = 4096


def deliver_event(state: RelayState, item: Item, body: str) -> None:
    """A `@GLOBAL` recipient: an `incoming_message` event on its live connections."""
    payload = {"message_id": item.message_id, "sender_session": item.sender, "body": body}
    sent = state.connections.send_event(
        item.target, wire.event("incoming_message", item.target, payload)
    )
    if sent:
        record(state, item.message_id, item.sender, item.target, "delivered", None)
    else:
        record_delivery(
            state,
            item,
            Outcome("not_submitted", UNREACHABLE, "the recipient has no live connection"),
        )


# -- delivery workers ----------------------------------------------------------------------


def enqueue(state: RelayState, bundle_id: str, session_id: str, item: Item) -> None:
    if state.closed:
        record_delivery(state, item, Outcome("failed", "dropped_on_shutdown", "relay shut down"))
        return
    key = (bundle_id, session_id)
    worker = state.workers.get(key)
    if worker is None:
        worker = state.workers[key] = Worker(bundle_id, session_id)
    state.queue_bounds.admit(item.sender, item.target, item.size)
    item.admitted = True
    worker.queue.append(item)
    if worker.task is None:
        worker.task = asyncio.get_running_loop().create_task(_work(state, worker))


async def _work(state: RelayState, worker: Worker) -> None:
    """Drain one target's queue in order; exits when it is empty (a later enqueue starts a
    new task). Envelopes are coalesced up to a raww barrier; a raww goes alone. Items are
    taken off the queue into `batch` before they are written, so each gets one outcome."""
    try:
        while worker.queue:
            batch: list[Item] = []
            try:
                result = await _deliver_next(state, worker, batch)
            except asyncio.CancelledError:
                for item in batch:
                    record_delivery(
                        state, item, Outcome("failed", "dropped_on_shutdown", "relay shut down")
                    )
                raise
            except Exception as exc:  # one bad delivery must not stop the queue
                events.emit(
                    "relay.delivery.unexpected_failure",
                    level="error",
                    target_session=f"{worker.session_id}@{worker.bundle_id}",
                    traceback=traceback.format_exc(),
                )
                if not batch and worker.queue:
                    batch.append(worker.queue.popleft())
                result = Outcome(
                    "submission_unknown", "internal_unexpected_failure", type(exc).__name__
                )
            for item in batch:
                record_delivery(state, item, result)
    finally:
        worker.task = None


async def _deliver_next(state: RelayState, worker: Worker, batch: list[Item]) -> Outcome:
    """Deliver the head of the queue (a raww, or the envelopes that fit one batch), moving
    the delivered items into `batch`; their outcome."""
    head = worker.queue[0]
    try:
        bundle = requester.bundle(state, worker.bundle_id)
        session = bundle.member(worker.session_id)
        if session is None:
            raise unavailable(head.target, "the target is no longer configured")
        requester.member_kind(bundle, session, head.kind)
    except RelayError as err:
        batch.append(worker.queue.popleft())
        return Outcome("not_submitted", err.code, err.message)
    member = requester.member(state, bundle, session)
    if member is None:
        batch.append(worker.queue.popleft())
        return Outcome("not_submitted", UNREACHABLE, "the bundle is not hosted")
    if head.kind == "raww":
        batch.append(worker.queue.popleft())
        return await member.write_raw(head.text, head.no_enter)

    def take() -> Batch:
        envelopes = list(itertools.takewhile(lambda i: i.kind == "envelope", worker.queue))
        count = env.take_batch([i.text for i in envelopes])
        batch.extend(worker.queue.popleft() for _ in range(count))
        # every envelope is text, never keys (envelope.neutralise), even one that reached
        # here without `envelope.render`
        text = env.neutralise(env.join_batch([i.text for i in batch]))
        return Batch(text, tuple(i.message_id for i in batch), tuple(i.sender for i in batch))

    return await member.deliver(take)


def record_delivery(state: RelayState, item: Item, result: Outcome) -> None:
    if item.admitted:  # its outcome frees its place in the queue bounds
        item.admitted = False
        state.queue_bounds.release(item.sender, item.target, item.size)
    record(
        state, item.message_id, item.sender, item.target, result.outcome, result.reason_code,
        result.reason,
    )  # fmt: skip
    _receipt(state, item, result)


def stopped(state: RelayState, target: Target) -> bool:
    """Whether the host says a bundle member target is stopped (MemberHealth.stopped)."""
    if target.bundle is None or target.session is None:
        return False
    return state.host.member_state(target.bundle, target.session.id)[1].stopped


def _receipt(state: RelayState, item: Item, result: Outcome) -> None:
    """The terminal-outcome receipt (§3.4) for a queued item that was not delivered, to its
    sender when that is a member of a registered kind (`members.KINDS`): an envelope from `relay@RELAY`
    (envelope.receipt_body) queued to the sender's pane like any message. Best-effort: a
    sender that is not running now, or whose queue is full (the receipts count in the
    queue bounds as sender `relay@RELAY`), loses it; a receipt's own outcome gets none;
    a user is told by its `delivery_outcome` event instead (`_record`). Each receipt or
    dropped one is a `relay.delivery.receipt` record."""
    if item.receipt or result.outcome == "delivered" or state.closed:
        return
    sender = parse_principal(item.sender)
    if sender.kind != "session":
        return
    try:
        bundle: Bundle | None = requester.bundle(state, sender.namespace)
    except RelayError:
        bundle = None
    session = bundle.member(sender.name) if bundle is not None else None
    if bundle is None or session is None or members.kind_of(bundle, session) is None:
        return  # not a member of a registered kind (any more)
    receipt_id = uuid.uuid4()
    body = env.receipt_body(
        item.message_id, item.target, result.outcome, result.reason_code, result.reason
    )
    sender_address = env.Address(sender.id, session.name)
    text = env.render_receipt(env.receipt(receipt_id, datetime.now(UTC), sender_address, body))
    receipt = Item(str(receipt_id), "envelope", text, env.RELAY_PRINCIPAL, sender.id)
    receipt.receipt = True
    receipt.size = len(text.encode("utf-8", "surrogatepass"))
    dropped: str | None = None
    hosted = state.host.member_endpoint(bundle, session.id) is not None
    if not hosted or not state.host.member_state(bundle, session.id)[0]:
        dropped = "sender_not_running"
    else:
        try:
            state.queue_bounds.check(env.RELAY_PRINCIPAL, [(receipt.target, receipt.size)])
        except RelayError as err:
            dropped = err.code
    if dropped is None:
        enqueue(state, bundle.id, session.id, receipt)
    state.inscribe(
        "relay.delivery.receipt",
        message_id=item.message_id,
        receipt_message_id=None if dropped else receipt.message_id,
        sender_session=sender.id,
        target_session=item.target,
        outcome=result.outcome,
        reason_code=result.reason_code,
        dropped=dropped,
    )


def record(
    state: RelayState,
    message_id: str,
    sender: str,
    target: str,
    outcome: str,
    reason_code: str | None,
    reason: str | None = None,
) -> None:
    """Keep the outcome (the last OUTCOMES_KEPT), log it, and tell a `@GLOBAL` sender."""
    kept: dict[str, Any] = {"target_session": target, "outcome": outcome}
    if reason_code is not None:
        kept["reason_code"] = reason_code
    if reason is not None:
        kept["reason"] = reason
    state.outcomes[message_id] = kept
    state.outcome_counts[outcome] += 1
    while len(state.outcomes) > OUTCOMES_KEPT:
        state.outcomes.popitem(last=False)
    state.inscribe(
        "relay.delivery.outcome",
        message_id=message_id,
        sender_session=sender,
        target_session=target,
        outcome=outcome,
        reason_code=reason_code,
    )
    if sender.endswith("@" + GLOBAL):
        payload: dict[str, Any] = {
            "message_id": message_id,
            "phase": "failed" if outcome == "timeout" else outcome,
            "outcome": {"delivered": "success", "timeout": "failed"}.get(outcome, outcome),
        }
        if reason_code is not None:
            payload["reason_code"] = reason_code
        if reason is not None:
            payload["reason"] = reason
        with contextlib.suppress(Exception):
            state.connections.send_event(sender, wire.event("delivery_outcome", sender, payload))


async def drain(state: RelayState) -> None:
    """Wait until every queued delivery has an outcome (tests and shutdown)."""
    while True:
        tasks = [w.task for w in state.workers.values() if w.task is not None]
        if not tasks:
            return
        await asyncio.gather(*tasks, return_exceptions=True)


async def aclose(state: RelayState) -> None:
    """Stop the workers; what is still queued is `dropped_on_shutdown`."""
    state.closed = True
    tasks = [w.task for w in state.workers.values() if w.task is not None]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for worker in state.workers.values():
        while worker.queue:
            item = worker.queue.popleft()
            record_delivery(
                state, item, Outcome("failed", "dropped_on_shutdown", "relay shut down")
            )
