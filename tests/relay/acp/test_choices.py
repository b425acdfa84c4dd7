"""ChoicesQueue (mcphost/relay/acp/choices.py): the record, the bound, the decision's checks and
their order, first decision wins, invalidation: every rule of acp.md §4 the queue owns."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcphost.agentmux.wire import RelayError
from mcphost.relay.acp.choices import ChoicesQueue, check_decision
from mcphost.relay.reasons import CHOICE_ALREADY_RESOLVED as ALREADY_RESOLVED
from mcphost.relay.reasons import CHOICE_CANCELLED as CANCELLED
from mcphost.relay.reasons import CHOICE_INVALIDATED_BY_RESPAWN as INVALIDATED_BY_RESPAWN
from mcphost.relay.reasons import CHOICES_QUEUE_FULL as QUEUE_FULL
from tests.thorough import examples

T = TypeVar("T")
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def run(test: Callable[[], Awaitable[T]]) -> T:
    """The queue makes asyncio futures: each test body runs on a fresh loop."""

    async def body() -> T:
        return await test()

    return asyncio.run(body())


def params(title: str | None = "rm -rf /tmp/x", **extra: Any) -> dict[str, Any]:
    tool_call: dict[str, Any] = {"toolCallId": "call-1", "kind": "execute"}
    if title is not None:
        tool_call["title"] = title
    return {
        "sessionId": "s1",
        "toolCall": tool_call,
        "options": [
            {"optionId": "allow", "name": "Allow once", "kind": "allow_once"},
            {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
        ],
        **extra,
    }


def code_of(call: Callable[[], Any]) -> str:
    with pytest.raises(RelayError) as caught:
        call()
    return caught.value.code


def test_the_record_has_acp_md_fields() -> None:
    async def test() -> None:
        seen: list[dict[str, Any]] = []
        queue = ChoicesQueue(on_requested=seen.append)
        raw = params(kind="edit")
        choice = queue.request("alpha@party", "m-1", raw, acp_request_id=7)
        assert choice is not None and choice.sequence == 1
        raw["toolCall"]["title"] = "changed later"  # the record keeps its own copy
        record = queue.pending()[0]
        assert seen == [record]
        assert set(record) == {
            "message_id",
            "choice_request_id",
            "target_session",
            "requested_kind",
            "requested_details",
            "enqueued_at",
        }
        assert UUID4.match(record["choice_request_id"]) and RFC3339.match(record["enqueued_at"])
        assert record["message_id"] == "m-1" and record["target_session"] == "alpha@party"
        assert record["requested_kind"] == "edit"  # the top-level kind, not toolCall.kind
        assert record["requested_details"] == {
            "tool_call_title": "rm -rf /tmp/x",
            "options": [
                {"option_id": "allow", "name": "Allow once", "kind": "allow_once"},
                {"option_id": "reject", "name": "Reject", "kind": "reject_once"},
            ],
            "acp_request_id": 7,
            "raw": params(kind="edit"),
        }

    run(test)


def test_parse_defaults_and_option_filter() -> None:
    async def test() -> None:
        queue = ChoicesQueue()
        odd = params(title=None)
        odd["options"] = [
            {"optionId": "a", "name": "A"},  # kind defaults to ""
            {"optionId": "b"},  # no name: dropped
            {"name": "C"},  # no id: dropped
            {"optionId": 4, "name": "D"},  # not a string: dropped
            "junk",
        ]
        queue.request("alpha@party", None, odd)
        record = queue.pending()[0]
        assert record["requested_kind"] == "other"
        details = record["requested_details"]
        assert details["tool_call_title"] == "unknown tool"
        assert details["options"] == [{"option_id": "a", "name": "A", "kind": ""}]
        assert details["acp_request_id"] is None

    run(test)


def test_pending_is_fifo_by_sequence_and_snapshot_lists_the_ids() -> None:
    async def test() -> None:
        queue = ChoicesQueue()
        made = [queue.request(f"s{n}@party", f"m{n}", params()) for n in range(4)]
        assert [c.sequence for c in made if c is not None] == [1, 2, 3, 4]
        queue.decide(made[1].choice_request_id, "cancelled", None, "ui@party")  # type: ignore[union-attr]
        later = queue.request("s9@party", "m9", params())
        assert later is not None and later.sequence == 5
        ids = [r["choice_request_id"] for r in queue.pending()]
        assert [r["message_id"] for r in queue.pending()] == ["m0", "m2", "m3", "m9"]
        assert queue.snapshot() == {"pending_count": 4, "choice_request_ids": ids}

    run(test)


def test_selected_resolves_the_future_and_returns_the_resolved_record() -> None:
    async def test() -> None:
        resolved: list[dict[str, Any]] = []
        queue = ChoicesQueue(on_resolved=resolved.append)
        choice = queue.request("alpha@party", "m-1", params())
        assert choice is not None
        record = queue.decide(choice.choice_request_id, "selected", "allow", "ui@party")
        assert await choice.future == {"outcome": "selected", "optionId": "allow"}
        assert resolved == [record]
        assert RFC3339.match(record.pop("resolved_at"))
        assert record == {
            "message_id": "m-1",
            "choice_request_id": choice.choice_request_id,
            "outcome": "selected",
            "reason_code": None,
            "decided_by": "ui@party",
            "reason": None,
        }
        assert queue.pending() == [] and queue.get(choice.choice_request_id) is None

    run(test)


def test_a_cancel_by_a_ui_reports_request_cancelled() -> None:
    async def test() -> None:
        queue = ChoicesQueue()
        choice = queue.request("alpha@party", "m-1", params())
        assert choice is not None
        record = queue.decide(choice.choice_request_id, "cancelled", None, "op@party")
        assert await choice.future == {"outcome": "cancelled"}
        assert (record["outcome"], record["reason_code"], record["decided_by"]) == (
            "cancelled",
            CANCELLED,
            "op@party",
        )

    run(test)


@pytest.mark.parametrize(
    ("choice_request_id", "outcome", "option_id"),
    [
        ("", "cancelled", None),
        ("id", "selected", None),
        ("id", "selected", ""),
        ("id", "cancelled", "allow"),
        ("id", "accepted", None),
    ],
)
def test_check_decision_refuses_bad_params(
    choice_request_id: str, outcome: str, option_id: str | None
) -> None:
    assert code_of(lambda: check_decision(choice_request_id, outcome, option_id)) == (
        "validation_invalid_params"
    )


def test_bad_decisions_leave_the_choice_pending() -> None:
    async def test() -> None:
        queue = ChoicesQueue()
        choice = queue.request("alpha@party", "m-1", params())
        assert choice is not None
        cid = choice.choice_request_id
        with pytest.raises(RelayError) as caught:
            queue.decide(cid, "selected", "allow_always", "ui@party")  # not offered
        assert caught.value.code == "validation_invalid_params"
        assert caught.value.details == {
            "choice_request_id": cid,
            "option_id": "allow_always",
            "offered_option_ids": ["allow", "reject"],
        }
        assert code_of(lambda: queue.decide(cid, "cancelled", "allow", "ui@party")) == (
            "validation_invalid_params"
        )
        assert queue.get(cid) is choice and not choice.future.done()
        queue.decide(cid, "selected", "reject", "ui@party")
        assert await choice.future == {"outcome": "selected", "optionId": "reject"}

    run(test)


def test_the_first_decision_wins_and_a_late_or_unknown_one_is_already_resolved() -> None:
    async def test() -> None:
        queue = ChoicesQueue()
        choice = queue.request("alpha@party", "m-1", params())
        assert choice is not None
        cid = choice.choice_request_id
        queue.decide(cid, "cancelled", None, "op@party")
        assert (
            code_of(lambda: queue.decide(cid, "selected", "allow", "ui@party")) == ALREADY_RESOLVED
        )
        assert code_of(lambda: queue.decide("no-such-id", "cancelled", None, "ui@party")) == (
            ALREADY_RESOLVED
        )
        assert await choice.future == {"outcome": "cancelled"}

    run(test)


def test_the_queue_is_bounded_and_a_full_queue_answers_cancelled_at_once() -> None:
    async def test() -> None:
        resolved: list[dict[str, Any]] = []
        queue = ChoicesQueue(pending_max=2, on_resolved=resolved.append)
        first = queue.request("a@p", "m1", params())
        assert first is not None and queue.request("a@p", "m2", params()) is not None
        assert queue.request("a@p", "m3", params()) is None
        assert await queue.ask("a@p", "m3", params()) == {"outcome": "cancelled"}
        assert len(queue) == 2
        (full,) = resolved  # the refusal is a resolution of its own, under an id never listed
        assert {k: full[k] for k in ("message_id", "outcome", "reason_code", "decided_by")} == {
            "message_id": "m3",
            "outcome": "cancelled",
            "reason_code": QUEUE_FULL,
            "decided_by": "relay",
        }
        assert full["choice_request_id"] not in {c["choice_request_id"] for c in queue.pending()}
        assert "pending-max" in full["reason"]
        queue.decide(first.choice_request_id, "cancelled", None, "ui@p")
        assert queue.request("a@p", "m4", params()) is not None
        assert QUEUE_FULL == "runtime_choices_queue_full"

    run(test)
    for bad in (0, 4097):
        with pytest.raises(ValueError):
            ChoicesQueue(pending_max=bad)
    assert ChoicesQueue().pending_max == 256


def test_ask_waits_for_the_decision() -> None:
    async def test() -> None:
        requested = asyncio.Event()
        queue = ChoicesQueue(on_requested=lambda _: requested.set())
        asked = asyncio.ensure_future(queue.ask("a@p", "m1", params(), 3))
        await asyncio.wait_for(requested.wait(), 30)
        record = queue.pending()[0]
        assert record["requested_details"]["acp_request_id"] == 3
        queue.decide(record["choice_request_id"], "selected", "allow", "ui@p")
        assert await asyncio.wait_for(asked, 30) == {"outcome": "selected", "optionId": "allow"}

    run(test)


def test_invalidate_resolves_one_targets_choices_with_the_reason() -> None:
    async def test() -> None:
        resolved: list[dict[str, Any]] = []
        queue = ChoicesQueue(on_resolved=resolved.append)
        a1 = queue.request("alpha@party", "m1", params())
        b1 = queue.request("beta@party", "m2", params())
        a2 = queue.request("alpha@party", "m3", params())
        assert a1 is not None and b1 is not None and a2 is not None
        records = queue.invalidate("alpha@party", INVALIDATED_BY_RESPAWN, "the agent respawned")
        assert [r["choice_request_id"] for r in records] == [
            a1.choice_request_id,
            a2.choice_request_id,
        ]
        assert resolved == records
        for record in records:
            assert (
                record["outcome"],
                record["reason_code"],
                record["decided_by"],
                record["reason"],
            ) == (
                "cancelled",
                INVALIDATED_BY_RESPAWN,
                "relay",
                "the agent respawned",
            )
        assert await a1.future == await a2.future == {"outcome": "cancelled"}
        assert not b1.future.done() and [r["target_session"] for r in queue.pending()] == [
            "beta@party"
        ]
        assert code_of(
            lambda: queue.decide(a1.choice_request_id, "selected", "allow", "ui@party")
        ) == (ALREADY_RESOLVED)
        everything = queue.invalidate(None, CANCELLED, "the relay stopped")
        assert [r["choice_request_id"] for r in everything] == [b1.choice_request_id]
        assert len(queue) == 0

    run(test)


def test_a_resolution_whose_waiter_left_is_still_recorded() -> None:
    async def test() -> None:
        queue = ChoicesQueue()
        choice = queue.request("alpha@party", "m1", params())
        assert choice is not None
        choice.future.cancel()  # the agent's handler was cancelled (its connection closed)
        record = queue.decide(choice.choice_request_id, "selected", "allow", "ui@party")
        assert record["outcome"] == "selected" and len(queue) == 0

    run(test)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("request"), st.sampled_from(["a@p", "b@p"])),
        st.tuples(st.just("decide"), st.integers(0, 20), st.sampled_from(["allow", "nope", None])),
        st.tuples(st.just("invalidate"), st.sampled_from(["a@p", "b@p", None])),
    ),
    max_size=40,
)


@examples(full=1000, quick=100)
@given(operations, st.integers(1, 5))
def test_queue_properties(ops: list[tuple[Any, ...]], pending_max: int) -> None:
    """Whatever happens: at most pending_max pending, FIFO by strictly rising sequence, each
    future resolved exactly when its request left the queue, each request resolved once."""

    async def test() -> None:
        resolved: list[str] = []
        queue = ChoicesQueue(
            pending_max, on_resolved=lambda r: resolved.append(r["choice_request_id"])
        )
        made = []
        for op in ops:
            if op[0] == "request":
                full = len(queue) >= pending_max
                choice = queue.request(op[1], None, params())
                assert (choice is None) == full
                if choice is not None:
                    made.append(choice)
            elif op[0] == "decide" and made:
                choice = made[op[1] % len(made)]
                outcome = "selected" if op[2] is not None else "cancelled"
                was_pending = queue.get(choice.choice_request_id) is not None
                try:
                    queue.decide(choice.choice_request_id, outcome, op[2], "ui@p")
                except RelayError as err:
                    expected = "validation_invalid_params" if was_pending else ALREADY_RESOLVED
                    assert err.code == expected
            elif op[0] == "invalidate":
                queue.invalidate(op[1], INVALIDATED_BY_RESPAWN, "respawn")
            pending = queue.pending()
            assert len(pending) <= pending_max
            sequences = [queue.get(r["choice_request_id"]).sequence for r in pending]  # type: ignore[union-attr]
            assert sequences == sorted(set(sequences))
        assert len(resolved) == len(set(resolved))
        for choice in made:
            left = queue.get(choice.choice_request_id) is None
            assert choice.future.done() == left == (choice.choice_request_id in resolved)

    run(test)
