"""Delivery: per-target queues, the readiness gate, batching, paste-and-submit, outcomes, receipts.

Owns: the per-target delivery workers of `RelayBehaviour` (FIFO, one asyncio task per target
with something queued; a raww is a batch barrier), the readiness gate built from the coder
(`_gate`), the batch taken once the gate settles and pasted through `tmux.deliver` (the one
paste-and-submit, which the tests drive too), the queue bounds' ledger entries (admission.py),
the recent outcomes (`outcomes`, the last `OUTCOMES_KEPT`), the `@GLOBAL` events
(`incoming_message`, `delivery_outcome`), and the terminal-outcome receipts to a coder-backed
sender.

Must never: log a message body or raww text (ids, sizes and outcomes only), or start a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import traceback
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
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
from mcphost.relay import admission
from mcphost.relay import envelope as env
from mcphost.relay import tmux as tm
from mcphost.relay.bundles import (
    Bundle,
    Session,
    TmuxCoder,
    require_bundle,
)
from mcphost.relay.hosting import BundleHost, Revoke, SendEvent
from mcphost.relay.inscriptions import RelayInscriptions
from mcphost.relay.requester import _Target, _unavailable

GLOBAL = "GLOBAL"
RELAY_WIDE = ("GLOBAL", "EXTERNAL", "RELAY")
DEFAULT_QUIET_MS = 750
OUTCOMES_KEPT = 4096
REVOKED_MESSAGE = "identity credential was rotated; reconnect with the new credential"
DROPPED_MESSAGE = "identity credential was dropped"
TMUX_ONLY = ("tmux",)
FAIL_STOPPED = "delivery_target_fail_stopped"


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
    send_event: SendEvent | None
    revoke: Revoke | None
    live_principals: Callable[[], Iterable[str]] | None
    quiet_ms: int
    poll_ms: int
    queue_bounds: admission.Ledger
    outcomes: OrderedDict[str, dict[str, Any]]
    _workers: dict[tuple[str, str], _Worker]
    _closed: bool

    if TYPE_CHECKING:

        def _check_transport(
            self, bundle: Bundle, session: Session, operation: str
        ) -> TmuxCoder: ...

    def _deliver_event(self, item: _Item, body: str) -> None:
        """A `@GLOBAL` recipient: an `incoming_message` event on its live connections."""
        sent = 0
        if self.send_event is not None:
            payload = {"message_id": item.message_id, "sender_session": item.sender, "body": body}
            sent = self.send_event(
                item.target, wire.event("incoming_message", item.target, payload)
            )
        if sent:
            self._record(item.message_id, item.sender, item.target, "delivered", None)
        else:
            self._record_delivery(
                item,
                tm.Delivery(
                    "not_submitted", tm.UNREACHABLE, "the recipient has no live connection"
                ),
            )

    # -- delivery workers ----------------------------------------------------------------------

    def _enqueue(self, bundle_id: str, session_id: str, item: _Item) -> None:
        if self._closed:
            self._record_delivery(
                item, tm.Delivery("failed", "dropped_on_shutdown", "relay shut down")
            )
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
                            item, tm.Delivery("failed", "dropped_on_shutdown", "relay shut down")
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
                    result = tm.Delivery(
                        "submission_unknown", "internal_unexpected_failure", type(exc).__name__
                    )
                for item in batch:
                    self._record_delivery(item, result)
        finally:
            worker.task = None

    def _gate(self, coder: TmuxCoder) -> tm.Gate:
        return tm.Gate(
            quiet_ms=self.quiet_ms,
            prompt_regex=coder.prompt_regex,
            inspect_lines=coder.prompt_inspect_lines,
            idle_column=coder.prompt_idle_column,
            timeout_ms=coder.readiness_timeout_ms,
            prime_timeout_ms=coder.prime_timeout_ms,
            poll_ms=self.poll_ms,
        )

    async def _deliver_next(self, worker: _Worker, batch: list[_Item]) -> tm.Delivery:
        """Deliver the head of the queue (a raww, or the envelopes that fit one batch), moving
        the delivered items into `batch`; their outcome."""
        head = worker.queue[0]
        try:
            bundle = require_bundle(self.roots, worker.bundle_id)
            session = bundle.member(worker.session_id)
            if session is None:
                raise _unavailable(head.target, "the target is no longer configured")
            coder = self._check_transport(bundle, session, head.kind)
        except RelayError as err:
            batch.append(worker.queue.popleft())
            return tm.Delivery("not_submitted", err.code, err.message)
        server = self.host.tmux(bundle)
        name = self.host.session_name(bundle, session.id)
        if server is None:
            batch.append(worker.queue.popleft())
            return tm.Delivery("not_submitted", tm.UNREACHABLE, "the bundle is not hosted")
        if head.kind == "raww":
            batch.append(worker.queue.popleft())
            try:
                return await tm.raw_write(server, name, head.text, head.no_enter)
            except tm.TmuxError as exc:
                return tm.Delivery("not_submitted", tm.UNREACHABLE, exc.message)

        def take() -> str:
            envelopes = list(itertools.takewhile(lambda i: i.kind == "envelope", worker.queue))
            count = env.take_batch([i.text for i in envelopes])
            batch.extend(worker.queue.popleft() for _ in range(count))
            # every envelope is text, never keys (envelope.neutralise), even one that reached
            # here without `envelope.render`
            return env.neutralise(env.join_batch([i.text for i in batch]))

        return await tm.deliver(server, name, self._gate(coder), take)

    def _record_delivery(self, item: _Item, result: tm.Delivery) -> None:
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

    def _receipt(self, item: _Item, result: tm.Delivery) -> None:
        """The terminal-outcome receipt (§3.4) for a queued item that was not delivered, to its
        sender when that is a coder-backed member: an envelope from `relay@RELAY`
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
            bundle: Bundle | None = require_bundle(self.roots, sender.namespace)
        except RelayError:
            bundle = None
        session = bundle.member(sender.name) if bundle is not None else None
        if bundle is None or session is None or session.transport in ("ui", "pubsub"):
            return  # not a coder-backed member (any more)
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
        if self.host.tmux(bundle) is None or not self.host.member_state(bundle, session.id)[0]:
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
        if self.send_event is not None and sender.endswith("@" + GLOBAL):
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
                self.send_event(sender, wire.event("delivery_outcome", sender, payload))

    async def drain(self) -> None:
        """Wait until every queued delivery has an outcome (tests and shutdown)."""
        while True:
            tasks = [w.task for w in self._workers.values() if w.task is not None]
            if not tasks:
                return
            await asyncio.gather(*tasks, return_exceptions=True)

    async def aclose(self) -> None:
        """Stop the workers; what is still queued is `dropped_on_shutdown`."""
        self._closed = True
        tasks = [w.task for w in self._workers.values() if w.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for worker in self._workers.values():
            while worker.queue:
                item = worker.queue.popleft()
                self._record_delivery(
                    item, tm.Delivery("failed", "dropped_on_shutdown", "relay shut down")
                )
        self.inscribe.close()
