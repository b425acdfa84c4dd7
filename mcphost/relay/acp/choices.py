"""A bundle's queue of ACP permission requests awaiting a decision (acp.md §4): the choices queue.

Owns: `ChoicesQueue` (one per bundle: FIFO by `sequence`, bounded by `pending_max`, in memory
only), `PendingChoice` (one request: its record and the asyncio future the agent's handler
awaits), the parse of a `session/request_permission`'s params into the record, the check of a
decision (`check_decision`) and the `choices.resolved` record of every resolution.

Rules: a request beyond `pending_max` is not queued (`request` returns None; `ask` answers the
agent cancelled at once, `runtime_choices_queue_full`, and hands `on_resolved` that resolution
under a fresh id, never listed: `decided_by: "relay"`). A decision is checked in full before
anything changes: its params, then that the request is pending
(`runtime_choices_request_already_resolved`, unknown ids included), then that a selected option
was offered (`validation_invalid_params`; the request stays pending, unlike agentmux, which
removed it first and left the agent waiting). The first decision wins, from a UI or an operator
alike. `invalidate` resolves a target's (or every target's) pending requests cancelled with the
caller's reason code (`runtime_choices_request_invalidated_by_respawn`, or
`runtime_choices_request_cancelled` at shutdown), `decided_by: "relay"`. Each resolution
resolves the request's future with the ACP outcome (`{"outcome": "selected", "optionId": ...}`
or `{"outcome": "cancelled"}`), is returned, and is handed to `on_resolved`.

Must never: talk to an agent or a stream (the session answers the agent, the relay emits the
events through `on_requested`/`on_resolved`), decide authorization (the relay's `choose`
capability), or persist anything.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mcphost.agentmux.wire import RelayError
from mcphost.relay import reasons as R
from mcphost.relay.envelope import rfc3339

PENDING_MAX_DEFAULT = 256
PENDING_MAX_RANGE = (1, 4096)

RELAY = "relay"
"""`decided_by` of the relay's own resolutions (queue full, respawn, shutdown)."""

ACP_CANCELLED: dict[str, Any] = {"outcome": "cancelled"}


def acp_selected(option_id: str) -> dict[str, Any]:
    """The ACP outcome of a selected option."""
    return {"outcome": "selected", "optionId": option_id}


def check_decision(choice_request_id: str, outcome: str, option_id: str | None) -> None:
    """A decision's own params (`choose` step 1): a non-empty id, `outcome` selected or
    cancelled, `option_id` non-empty with selected and absent with cancelled."""

    def invalid(message: str) -> RelayError:
        details = {"choice_request_id": choice_request_id, "outcome": outcome}
        return RelayError("validation_invalid_params", message, details)

    if not choice_request_id:
        raise invalid("choice_request_id must be non-empty: take it from list command=decisions")
    if outcome == "selected":
        if not option_id:
            raise invalid("outcome selected needs option_id: one of the request's option ids")
    elif outcome == "cancelled":
        if option_id is not None:
            raise invalid("outcome cancelled takes no option_id: leave it out")
    else:
        raise invalid("outcome must be 'selected' or 'cancelled'")


def _now() -> str:
    return rfc3339(datetime.now(UTC))


def _details(params: dict[str, Any], acp_request_id: int | str | None) -> dict[str, Any]:
    tool_call = params.get("toolCall")
    title = tool_call.get("title") if isinstance(tool_call, dict) else None
    raw_options = params.get("options")
    options = [
        {
            "option_id": option["optionId"],
            "name": option["name"],
            "kind": option["kind"] if isinstance(option.get("kind"), str) else "",
        }
        for option in (raw_options if isinstance(raw_options, list) else [])
        if isinstance(option, dict)
        and isinstance(option.get("optionId"), str)
        and isinstance(option.get("name"), str)
    ]
    return {
        "tool_call_title": title if isinstance(title, str) else "unknown tool",
        "options": options,
        "acp_request_id": acp_request_id,
        "raw": copy.deepcopy(params),
    }


@dataclass(eq=False)
class PendingChoice:
    """One queued permission request; `future` resolves with the ACP outcome."""

    choice_request_id: str
    message_id: str | None
    target_session: str
    requested_kind: str
    requested_details: dict[str, Any]
    enqueued_at: str
    sequence: int
    future: asyncio.Future[dict[str, Any]]

    @property
    def option_ids(self) -> list[str]:
        return [option["option_id"] for option in self.requested_details["options"]]

    def requested(self) -> dict[str, Any]:
        """The record as `choices.requested` and `list command=decisions` show it (a copy)."""
        return {
            "message_id": self.message_id,
            "choice_request_id": self.choice_request_id,
            "target_session": self.target_session,
            "requested_kind": self.requested_kind,
            "requested_details": copy.deepcopy(self.requested_details),
            "enqueued_at": self.enqueued_at,
        }


class ChoicesQueue:
    """One bundle's pending permission requests, FIFO by `sequence` (from 1)."""

    def __init__(
        self,
        pending_max: int = PENDING_MAX_DEFAULT,
        *,
        on_requested: Callable[[dict[str, Any]], None] | None = None,
        on_resolved: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        low, high = PENDING_MAX_RANGE
        if not low <= pending_max <= high:
            raise ValueError(f"pending_max must be in {low}..={high} (got {pending_max})")
        self.pending_max = pending_max
        self.on_requested = on_requested
        self.on_resolved = on_resolved
        self._pending: dict[str, PendingChoice] = {}  # insertion order is sequence order
        self._sequence = 0

    def __len__(self) -> int:
        return len(self._pending)

    def request(
        self,
        target_session: str,
        message_id: str | None,
        params: dict[str, Any],
        acp_request_id: int | str | None = None,
    ) -> PendingChoice | None:
        """Queue a `session/request_permission`'s params (the raw JSON object) for `target_session`
        (`session@bundle`), correlated with the turn's head `message_id`. None when the queue
        holds `pending_max` already: the caller answers the agent cancelled (`ask` does)."""
        if len(self._pending) >= self.pending_max:
            return None
        self._sequence += 1
        kind = params.get("kind")
        choice = PendingChoice(
            choice_request_id=str(uuid.uuid4()),
            message_id=message_id,
            target_session=target_session,
            requested_kind=kind if isinstance(kind, str) else "other",
            requested_details=_details(params, acp_request_id),
            enqueued_at=_now(),
            sequence=self._sequence,
            future=asyncio.get_running_loop().create_future(),
        )
        self._pending[choice.choice_request_id] = choice
        if self.on_requested is not None:
            self.on_requested(choice.requested())
        return choice

    async def ask(
        self,
        target_session: str,
        message_id: str | None,
        params: dict[str, Any],
        acp_request_id: int | str | None = None,
    ) -> dict[str, Any]:
        """`request`, then the ACP outcome once decided; cancelled at once when the queue is full
        (`runtime_choices_queue_full`). What a session's chooser awaits."""
        choice = self.request(target_session, message_id, params, acp_request_id)
        if choice is None:
            self._report(
                self._record(
                    message_id,
                    str(uuid.uuid4()),
                    "cancelled",
                    R.CHOICES_QUEUE_FULL,
                    RELAY,
                    f"the bundle's choices queue holds {self.pending_max} pending requests "
                    "(relay.toml [choices] pending-max): decide some (choose) or raise the bound",
                )
            )
            return dict(ACP_CANCELLED)
        return await asyncio.shield(choice.future)

    def get(self, choice_request_id: str) -> PendingChoice | None:
        return self._pending.get(choice_request_id)

    def pending(self) -> list[dict[str, Any]]:
        """Every pending request as `choices.requested` shows it, oldest (lowest sequence) first."""
        return [choice.requested() for choice in self._pending.values()]

    def snapshot(self) -> dict[str, Any]:
        """`choices.snapshot`: sent to a UI when it registers, before the pending replay."""
        return {"pending_count": len(self._pending), "choice_request_ids": list(self._pending)}

    def decide(
        self, choice_request_id: str, outcome: str, option_id: str | None, decided_by: str
    ) -> dict[str, Any]:
        """A UI's or operator's decision (`decided_by`: its `session@bundle`). Checked in full
        before the request leaves the queue; returns the `choices.resolved` record."""
        check_decision(choice_request_id, outcome, option_id)
        choice = self._pending.get(choice_request_id)
        if choice is None:
            raise RelayError(
                R.CHOICE_ALREADY_RESOLVED,
                f"choice request {choice_request_id} is not pending: it was decided, invalidated "
                "or never queued; list the pending ones with list command=decisions",
                {"choice_request_id": choice_request_id},
            )
        if outcome == "selected" and option_id not in choice.option_ids:
            raise RelayError(
                "validation_invalid_params",
                f"option {option_id!r} was not offered: choose one of {choice.option_ids}",
                {
                    "choice_request_id": choice_request_id,
                    "option_id": option_id,
                    "offered_option_ids": choice.option_ids,
                },
            )
        if outcome == "selected":
            assert option_id is not None  # check_decision
            return self._resolve(choice, acp_selected(option_id), decided_by, None, None)
        return self._resolve(
            choice, ACP_CANCELLED, decided_by, R.CHOICE_CANCELLED, f"cancelled by {decided_by}"
        )

    def invalidate(
        self, target_session: str | None, reason_code: str, reason: str
    ) -> list[dict[str, Any]]:
        """Resolve `target_session`'s pending requests (every target's when None) cancelled by the
        relay with `reason_code`; returns their `choices.resolved` records, oldest first."""
        chosen = [
            choice
            for choice in self._pending.values()
            if target_session is None or choice.target_session == target_session
        ]
        return [
            self._resolve(choice, ACP_CANCELLED, RELAY, reason_code, reason) for choice in chosen
        ]

    def _resolve(
        self,
        choice: PendingChoice,
        acp_outcome: dict[str, Any],
        decided_by: str,
        reason_code: str | None,
        reason: str | None,
    ) -> dict[str, Any]:
        del self._pending[choice.choice_request_id]
        if not choice.future.done():  # its waiter may have gone (the agent's connection closed)
            choice.future.set_result(dict(acp_outcome))
        record = self._record(
            choice.message_id,
            choice.choice_request_id,
            acp_outcome["outcome"],
            reason_code,
            decided_by,
            reason,
        )
        self._report(record)
        return record

    @staticmethod
    def _record(
        message_id: str | None,
        choice_request_id: str,
        outcome: str,
        reason_code: str | None,
        decided_by: str,
        reason: str | None,
    ) -> dict[str, Any]:
        """A `choices.resolved` record."""
        return {
            "message_id": message_id,
            "choice_request_id": choice_request_id,
            "outcome": outcome,
            "reason_code": reason_code,
            "decided_by": decided_by,
            "reason": reason,
            "resolved_at": _now(),
        }

    def _report(self, record: dict[str, Any]) -> None:
        if self.on_resolved is not None:
            self.on_resolved(dict(record))
