"""The agents' own uids: the range's grammar and who gets which uid (uids.py, pure)."""

from __future__ import annotations

import pwd
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcphost.supervisor import uids
from mcphost.supervisor.uids import DEFAULT_RANGE, UidRange, UidsExhausted, allocate, parse_range
from tests.thorough import examples

AGENT_IDS = st.lists(st.from_regex(r"agent-[a-z0-9]{1,8}", fullmatch=True), max_size=40)


def never(uid: int) -> bool:
    return False


def test_the_default_range_is_systemds_unused_block_and_holds_no_user_here() -> None:
    assert (DEFAULT_RANGE.first, DEFAULT_RANGE.last) == (0x70000000, 0x7000FFFF)
    assert uids.users_in_range(DEFAULT_RANGE) == []
    assert str(DEFAULT_RANGE) == "1879048192-1879113727"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("0-100", "includes uid 0 (root)"),
        ("200-100", "ends before it starts"),
        ("100", "is not FIRST-LAST"),
        ("a-b", "is not FIRST-LAST"),
        ("-5-10", "is not FIRST-LAST"),
        ("1-2147483648", "goes past 2147483647"),
    ],
)
def test_a_bad_range_says_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_range(text)


def test_a_range_parses_with_its_ends_included() -> None:
    r = parse_range(" 70000-70002 ")
    assert (r.first, r.last, r.size) == (70000, 70002, 3)
    assert 70000 in r and 70002 in r and 70003 not in r and 69999 not in r


@given(AGENT_IDS)
@examples(500, 50)
def test_every_agent_gets_a_distinct_nonzero_uid_in_the_range(ids: list[str]) -> None:
    r = UidRange(5000, 5063)
    out = allocate(ids, {}, r, taken=never)
    assert set(out) == set(ids)
    assert len(set(out.values())) == len(out)
    assert all(uid in r and uid != 0 for uid in out.values())


@given(AGENT_IDS, AGENT_IDS)
@examples(500, 50)
def test_an_agent_keeps_its_recorded_uid_whoever_joins_or_leaves(
    first: list[str], second: list[str]
) -> None:
    r = UidRange(5000, 5127)
    before = allocate(first, {}, r, taken=never)
    after = allocate(second, before, r, taken=never)
    assert all(after[a] == before[a] for a in second if a in before)
    assert len(set(after.values())) == len(after)


def test_the_same_id_lands_on_the_same_uid_in_an_empty_state() -> None:
    r = DEFAULT_RANGE
    assert allocate(["agent-7f3a"], {}, r) == allocate(["agent-7f3a"], {}, r)
    assert uids.candidate("agent-7f3a", r) in r


def test_a_uid_the_user_database_names_is_never_handed_out() -> None:
    """A uid an NSS user took since it was recorded is given up, and never handed out."""
    r = UidRange(5000, 5001)
    assert allocate(["a"], {"a": 5000}, r, taken=lambda uid: uid == 5000) == {"a": 5001}
    with pytest.raises(UidsExhausted, match="no free uid left"):
        allocate(["a", "b"], {}, r, taken=lambda uid: uid == 5000)


def test_a_recorded_uid_outside_a_narrowed_range_is_replaced() -> None:
    out = allocate(["a"], {"a": 9000}, UidRange(5000, 5009), taken=never)
    assert out["a"] in UidRange(5000, 5009)


def test_a_full_range_names_the_key_and_the_fix() -> None:
    with pytest.raises(UidsExhausted, match=r"\[identity\] uids = '5000-5001'.*wider range"):
        allocate(["a", "b", "c"], {}, UidRange(5000, 5001), taken=never)


def test_in_user_db_knows_root_and_nobody() -> None:
    assert uids.in_user_db(0)
    nobody = pwd.getpwnam("nobody").pw_uid
    assert uids.in_user_db(nobody)
    assert not uids.in_user_db(DEFAULT_RANGE.first)


def test_a_range_holding_a_user_is_named() -> None:
    nobody = pwd.getpwnam("nobody").pw_uid
    found = uids.users_in_range(UidRange(nobody, nobody))
    assert any(f"user nobody ({nobody})" == entry for entry in found)
