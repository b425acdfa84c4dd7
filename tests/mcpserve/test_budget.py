"""`mcphost.mcpserve.budget`: one peer's sessions share a byte budget (pure bookkeeping)."""

from __future__ import annotations

from mcphost.mcpserve.budget import Budget, Budgets, Share


def woken(share: Share) -> list[int]:
    calls: list[int] = []
    share.wake = lambda: calls.append(1)
    return calls


def test_sessions_block_when_the_sum_is_spent_and_wake_at_half() -> None:
    budget = Budget(100)
    one, two = budget.share(), budget.share()
    rung = woken(two)
    one.set(60, False)
    assert not two.blocks()
    two.set(40, False)
    assert budget.used == 100
    assert two.blocks() and one.blocks(), "the sum, not each session's part, is spent"
    one.set(20, False)  # 60 used: below the capacity, but a paused session waits for half
    assert rung == []
    one.set(10, False)  # 50 used: half
    assert rung == [1]
    assert not two.blocks()


def test_a_closed_share_gives_everything_back_and_a_closed_budget_is_dropped() -> None:
    budgets = Budgets(100)
    share = budgets.share("agent-a")
    other = budgets.share("agent-b")
    share.set(100, False)
    assert share.blocks() and not other.blocks(), "one agent's budget is not another's"
    share.close()
    assert budgets.used("agent-a") == 0
    share.set(500, False)  # late accounting from a session that ended changes nothing
    assert budgets.used("agent-a") == 0
    assert "agent-a" not in budgets._by_key and "agent-b" in budgets._by_key


def test_one_session_mid_line_may_finish_its_line_past_the_budget_then_the_next() -> None:
    budget = Budget(100)
    first, second, third = budget.share(), budget.share(), budget.share()
    rung = woken(second)
    rung_third = woken(third)
    third.set(30, False)
    first.set(40, True)
    second.set(40, True)
    assert not first.blocks(), "the first session stopped mid-line takes the baton"
    assert second.blocks(), "only one session reads past the budget"
    assert third.blocks(), "a session between lines waits"
    first.set(200, True)
    assert not first.blocks()
    first.set(200, False)  # its line is complete: the baton passes to a session mid-line
    assert rung == [1] and rung_third == []
    assert not second.blocks() and first.blocks()
    second.close()  # ends holding the baton: it is free again
    first.set(0, False)  # 30 used: everyone waiting is woken
    assert rung_third == [1]
