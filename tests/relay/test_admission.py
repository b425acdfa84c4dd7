"""The delivery queue bounds (mcphost/relay/admission.py): per target, per sender, relay-wide."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcphost.agentmux.wire import RelayError
from mcphost.relay import admission
from mcphost.relay.admission import QUEUE_FULL, Ledger, Limits

SMALL = Limits(per_target=3, bytes_per_target=100, per_sender=5, bytes_per_sender=150,
               total=8, bytes_total=200, share=4, bytes_share=101)  # fmt: skip
FAIR = dataclasses.replace(SMALL, share=2, bytes_share=60)  # the share binds before the target


def refusal(ledger: Ledger, sender: str, items: list[tuple[str, int]]) -> RelayError:
    with pytest.raises(RelayError) as caught:
        ledger.check(sender, items)
    assert caught.value.code == QUEUE_FULL
    assert "nothing of this request was queued" in caught.value.message
    return caught.value


def test_the_default_bounds_are_the_documented_constants() -> None:
    limits = Ledger().limits
    assert (limits.per_target, limits.bytes_per_target) == (64, 4 << 20)
    assert (limits.per_sender, limits.bytes_per_sender) == (256, 8 << 20)
    assert (limits.total, limits.bytes_total) == (1024, 32 << 20)
    assert admission.MAX_QUEUED_BYTES_PER_TARGET == 4 << 20


def test_each_scope_refuses_by_count_then_bytes_and_names_the_cause() -> None:
    ledger = Ledger(SMALL)
    for _ in range(3):
        ledger.check("a@p", [("t@p", 10)])
        ledger.admit("a@p", "t@p", 10)
    err = refusal(ledger, "a@p", [("t@p", 1)])
    assert err.details == {
        "target_session": "t@p", "sender_session": "a@p", "scope": "target",
        "component": "envelopes", "limit": 3, "queued": 3, "size": 1,
    }  # fmt: skip
    err = refusal(ledger, "a@p", [("u@p", 60), ("v@p", 61)])  # 30 + 121 > 150 from a@p
    assert (err.details["scope"], err.details["component"]) == ("sender", "bytes")
    assert (err.details["queued"], err.details["target_session"]) == (30, "v@p")
    err = refusal(ledger, "b@p", [("u@p", 101)])  # one item over the target's bytes
    assert (err.details["scope"], err.details["component"]) == ("target", "bytes")
    for n in range(5):  # others fill the relay: 3 + 5 = 8 items
        ledger.admit(f"s{n}@p", f"x{n}@p", 1)
    err = refusal(ledger, "c@p", [("y@p", 1)])
    assert (err.details["scope"], err.details["component"]) == ("relay", "envelopes")


def test_one_sender_gets_its_share_of_a_target_and_leaves_the_rest_to_others() -> None:
    """A sender holds at most half of a target's queue: a peer kept busy by one sender
    (64 items once refused every other sender for the readiness timeout) still takes others'."""
    ledger = Ledger()
    share = admission.MAX_QUEUED_PER_SENDER_PER_TARGET
    assert share == admission.MAX_QUEUED_PER_TARGET // 2
    for _ in range(share):
        ledger.check("hog@p", [("t@p", 10)])
        ledger.admit("hog@p", "t@p", 10)
    err = refusal(ledger, "hog@p", [("t@p", 10)])
    assert err.details == {
        "target_session": "t@p", "sender_session": "hog@p", "scope": "share",
        "component": "envelopes", "limit": share, "queued": share, "size": 10,
    }  # fmt: skip
    assert "its share" in err.message
    ledger.check("hog@p", [("u@p", 10)])  # its share of another target is its own
    for other in ("b@p",):  # another sender gets its share too
        for _ in range(share):
            ledger.check(other, [("t@p", 10)])
            ledger.admit(other, "t@p", 10)
    assert ledger.queued("share", "b@p", "t@p") == (share, 10 * share)
    err = refusal(ledger, "e@p", [("t@p", 10)])  # two full shares fill the target
    assert (err.details["scope"], err.details["queued"]) == (
        "target",
        admission.MAX_QUEUED_PER_TARGET,
    )
    big = refusal(Ledger(), "a@p", [("t@p", admission.MAX_QUEUED_BYTES_PER_SENDER_PER_TARGET + 1)])
    assert (big.details["scope"], big.details["component"]) == ("share", "bytes")


def test_a_request_is_checked_whole() -> None:
    """A broadcast (or several targets) counts together: refused whole, nothing admitted."""
    ledger = Ledger(SMALL)
    ledger.check("a@p", [("t@p", 50), ("u@p", 50), ("v@p", 50)])  # 150: fits the sender
    err = refusal(ledger, "a@p", [("t@p", 50), ("u@p", 50), ("v@p", 51)])
    assert (err.details["scope"], err.details["target_session"]) == ("sender", "v@p")
    refusal(ledger, "a@p", [("t@p", 1)] * 4)  # four to one target
    assert ledger.count == 0 and ledger.bytes == 0  # check never admits


def test_release_frees_exactly_what_was_admitted() -> None:
    ledger = Ledger(SMALL)
    ledger.admit("a@p", "t@p", 100)
    refusal(ledger, "a@p", [("t@p", 1)])
    ledger.release("a@p", "t@p", 100)
    ledger.check("a@p", [("t@p", 100)])
    assert ledger.queued("target", "t@p") == (0, 0) and ledger.queued("sender", "a@p") == (0, 0)


@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.sampled_from("tuv"), st.integers(0, 60)),
        max_size=40,
    )
)
def test_admitted_stays_within_every_bound_and_drains_to_zero(
    requests: list[tuple[str, str, int]],
) -> None:
    ledger = Ledger(FAIR)
    admitted: list[tuple[str, str, int]] = []
    for sender, target, size in requests:
        try:
            ledger.check(sender, [(target, size)])
        except RelayError:
            continue
        ledger.admit(sender, target, size)
        admitted.append((sender, target, size))
        assert ledger.count <= FAIR.total and ledger.bytes <= FAIR.bytes_total
        for who in "abc":
            count, nbytes = ledger.queued("sender", who)
            assert count <= FAIR.per_sender and nbytes <= FAIR.bytes_per_sender
        for where in "tuv":
            count, nbytes = ledger.queued("target", where)
            assert count <= FAIR.per_target and nbytes <= FAIR.bytes_per_target
            for who in "abc":
                count, nbytes = ledger.queued("share", who, where)
                assert count <= FAIR.share and nbytes <= FAIR.bytes_share
    for sender, target, size in admitted:
        ledger.release(sender, target, size)
    assert ledger.count == 0 and ledger.bytes == 0
    assert all(ledger.queued(k, w) == (0, 0) for k in ("sender", "target") for w in "abctuv")
