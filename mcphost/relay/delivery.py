"""Delivery: per-target queues, the readiness gate, batching, paste-and-submit, outcomes, receipts.

Owns: the per-target delivery workers of `RelayBehaviour` (FIFO, one asyncio task per target
with something queued; a raww is a batch barrier), the target reached as a member of its kind
(`_member`: `members.member`, with the context the relay lends it and the bundle's choices queue,
`_choices`), the batch taken once the member takes input (`Member.deliver`: a tmux member's
readiness gate, then one paste and submit), the queue bounds' ledger entries (admission.py),
the recent outcomes (`outcomes`, the last `OUTCOMES_KEPT`), the `@GLOBAL` events
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
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcphost import events
from mcphost.agentmux import wire
from mcphost.agentmux.wire import (
    RelayError,
    parse_principal,
)
from mcphost.relay import admission, members
from mcphost.relay import envelope as env
from mcphost.relay.bundles import Bundle, Session, load_relay_settings
from mcphost.relay.connections import Connections
from mcphost.relay.hosting import BundleHost
from mcphost.relay.inscriptions import RelayInscriptions
from mcphost.relay.members.port import (
    Batch,
    Choices,
    Member,
    MemberContext,
    MemberKind,
    unavailable,
)
from mcphost.relay.outcome import UNREACHABLE
from mcphost.relay.outcome import Delivery as Outcome
from mcphost.relay.requester import GLOBAL, _Target

OUTCOMES_KEPT = 4096
CHOICE_CANCELLED = "runtime_choices_request_cancelled"


@dataclass(slots=True)
class _Item:
    message_id: str
    kind: str  # "envelope" | "raww"
    text: str = field(repr=False)
    sender: str
    target: str
    no_enter: bool = False
    size: int = 0  # UTF-8 bytes of `text`, what the queue bounds count (admission.py)
    admitted: bool = False  # counted in the ledger until its outcome is recorded
    receipt: bool = False  # a terminal-outcome receipt: its own outcome gets none


@dataclass(slots=True)
class _Worker:
    bundle_id: str
    session_id: str
    queue: deque[_Item] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


class Delivery:
    """The delivery side of `RelayBehaviour` (a mixin over its state)."""

    # set by RelayBehaviour.__init__
    roots: tuple[Path, ...]
    state_root: Path
    host: BundleHost
    inscribe: RelayInscriptions
    connections: Connections
    quiet_ms: int
    poll_ms: int
    queue_bounds: admission.Ledger
    outcomes: OrderedDict[str, dict[str, Any]]
    _workers: dict[tuple[str, str], _Worker]
    _closed: bool
    _environ: dict[str, str] | None
    choices: dict[str, Choices]

    if TYPE_CHECKING:

        def _bundle(self, bundle_id: str) -> Bundle: ...

        def _member_kind(self, bundle: Bundle, session: Session, operation: str) -> MemberKind: ...

    # -- members -------------------------------------------------------------------------------

    def _choices(self, bundle: Bundle) -> Choices | None:
        """The bundle's choices queue: made on first use by the first kind of its members that
        keeps one (relay.toml `[choices] pending-max`), None when none does."""
        queue = self.choices.get(bundle.id)
        if queue is not None:
            return queue
        for session in bundle.sessions:
            kind = members.kind_of(bundle, session)
            if kind is not None and kind.choices_queue is not None:
                settings = load_relay_settings(self.roots, self._environ)
                queue = self.choices[bundle.id] = kind.choices_queue(settings.choices_pending_max)
                return queue
        return None

    def _member(self, bundle: Bundle, session: Session) -> Member | None:
        """The member bound to its host's endpoint (`members.member`), None when not hosted."""
        context = MemberContext(self.quiet_ms, self.poll_ms, self._choices(bundle))
        return members.member(bundle, session, self.host, context)

    def _deliver_event(self, item: _Item, body: str) -> None:
        """A `@GLOBAL` recipient: an `incoming_message` event on its live connections."""
        payload = {"message_id": item.message_id, "sender_session": item.sender, "body": body}
        sent = self.connections.send_event(
            item.target, wire.event("incoming_message", item.target, payload)
        )
        if sent:
            self._record(item.message_id, item.sender, item.target, "delivered", None)
        else:
            self._record_delivery(
                item,
                Outcome("not_submitted", UNREACHABLE, "the recipient has no live connection"),
            )

    # -- delivery workers ----------------------------------------------------------------------

    def _enqueue(self, bundle_id: str, session_id: str, item: _Item) -> None:
        if self._closed:
            self._record_delivery(item, Outcome("failed", "dropped_on_shutdown", "relay shut down"))
            return
        key = (bundle_id, session_id)
        worker = self._workers.get(key)
        if worker is None:
            worker = self._workers[key] = _Worker(bundle_id, session_id)
        self.queue_bounds.admit(item.sender, item.target, item.size)
        item.admitted = True
        worker.queue.append(item)
        if worker.task is None:
            worker.task = asyncio.get_running_loop().create_task(self._work(worker))

    async def _work(self, worker: _Worker) -> None:
        """Drain one target's queue in order; exits when it is empty (a later enqueue starts a
        new task). Envelopes are coalesced up to a raww barrier; a raww goes alone. Items are
        taken off the queue into `batch` before they are written, so each gets one outcome."""
        try:
            while worker.queue:
                batch: list[_Item] = []
                try:
                    result = await self._deliver_next(worker, batch)
                except asyncio.CancelledError:
                    for item in batch:
                        self._record_delivery(
                            item, Outcome("failed", "dropped_on_shutdown", "relay shut down")
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
                    self._record_delivery(item, result)
        finally:
            worker.task = None

    async def _deliver_next(self, worker: _Worker, batch: list[_Item]) -> Outcome:
        """Deliver the head of the queue (a raww, or the envelopes that fit one batch), moving
        the delivered items into `batch`; their outcome."""
        head = worker.queue[0]
        try:
            bundle = self._bundle(worker.bundle_id)
            session = bundle.member(worker.session_id)
            if session is None:
                raise unavailable(head.target, "the target is no longer configured")
            self._member_kind(bundle, session, head.kind)
        except RelayError as err:
            batch.append(worker.queue.popleft())
            return Outcome("not_submitted", err.code, err.message)
        member = self._member(bundle, session)
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

    def _record_delivery(self, item: _Item, result: Outcome) -> None:
        if item.admitted:  # its outcome frees its place in the queue bounds
            item.admitted = False
            self.queue_bounds.release(item.sender, item.target, item.size)
        self._record(
            item.message_id, item.sender, item.target, result.outcome, result.reason_code,
            result.reason,
        )  # fmt: skip
        self._receipt(item, result)

    def _stopped(self, target: _Target) -> bool:
        """Whether the host says a bundle member target is stopped (MemberHealth.stopped)."""
        if target.bundle is None or target.session is None:
            return False
        return self.host.member_state(target.bundle, target.session.id)[1].stopped

    def _receipt(self, item: _Item, result: Outcome) -> None:
        """The terminal-outcome receipt (§3.4) for a queued item that was not delivered, to its
        sender when that is a member of a registered kind (`members.KINDS`): an envelope from `relay@RELAY`
        (envelope.receipt_body) queued to the sender's pane like any message. Best-effort: a
        sender that is not running now, or whose queue is full (the receipts count in the
        queue bounds as sender `relay@RELAY`), loses it; a receipt's own outcome gets none;
        a user is told by its `delivery_outcome` event instead (`_record`). Each receipt or
        dropped one is a `relay.delivery.receipt` record."""
        if item.receipt or result.outcome == "delivered" or self._closed:
            return
        sender = parse_principal(item.sender)
        if sender.kind != "session":
            return
        try:
            bundle: Bundle | None = self._bundle(sender.namespace)
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
        receipt = _Item(str(receipt_id), "envelope", text, env.RELAY_PRINCIPAL, sender.id)
        receipt.receipt = True
        receipt.size = len(text.encode("utf-8", "surrogatepass"))
        dropped: str | None = None
        hosted = self.host.member_endpoint(bundle, session.id) is not None
        if not hosted or not self.host.member_state(bundle, session.id)[0]:
            dropped = "sender_not_running"
        else:
            try:
                self.queue_bounds.check(env.RELAY_PRINCIPAL, [(receipt.target, receipt.size)])
            except RelayError as err:
                dropped = err.code
        if dropped is None:
            self._enqueue(bundle.id, session.id, receipt)
        self.inscribe(
            "relay.delivery.receipt",
            message_id=item.message_id,
            receipt_message_id=None if dropped else receipt.message_id,
            sender_session=sender.id,
            target_session=item.target,
            outcome=result.outcome,
            reason_code=result.reason_code,
            dropped=dropped,
        )

    def _record(
        self,
        message_id: str,
        sender: str,
        target: str,
        outcome: str,
        reason_code: str | None,
        reason: str | None = None,
    ) -> None:
        """Keep the outcome (the last OUTCOMES_KEPT), log it, and tell a `@GLOBAL` sender."""
        record: dict[str, Any] = {"target_session": target, "outcome": outcome}
        if reason_code is not None:
            record["reason_code"] = reason_code
        if reason is not None:
            record["reason"] = reason
        self.outcomes[message_id] = record
        while len(self.outcomes) > OUTCOMES_KEPT:
            self.outcomes.popitem(last=False)
        self.inscribe(
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
                self.connections.send_event(sender, wire.event("delivery_outcome", sender, payload))

    async def drain(self) -> None:
        """Wait until every queued delivery has an outcome (tests and shutdown)."""
        while True:
            tasks = [w.task for w in self._workers.values() if w.task is not None]
            if not tasks:
                return
            await asyncio.gather(*tasks, return_exceptions=True)

    async def aclose(self) -> None:
        """Stop the workers; what is still queued is `dropped_on_shutdown`, and every pending
        choice is resolved cancelled (`runtime_choices_request_cancelled`)."""
        self._closed = True
        for queue in self.choices.values():
            for target in dict.fromkeys(c.get("target_session") for c in queue.pending()):
                if isinstance(target, str):
                    queue.invalidate(target, CHOICE_CANCELLED, "relay shut down")
        tasks = [w.task for w in self._workers.values() if w.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for worker in self._workers.values():
            while worker.queue:
                item = worker.queue.popleft()
                self._record_delivery(
                    item, Outcome("failed", "dropped_on_shutdown", "relay shut down")
                )
        self.inscribe.close()
