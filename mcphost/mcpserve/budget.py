"""Byte budgets shared by sessions: what one peer's sessions together may hold unanswered.

Owns: the accounting of request bytes a group of sessions (the supervisor's: one agent's, on
both surfaces) has read from its sockets and not yet let go of: a line being read, lines
waiting, a line being parsed, requests with the SDK until answered or cancelled. Each session
reports its own total through its `Share`; the `Budget` sums them. When the sum reaches the
capacity a session asking `blocks()` is told to stop reading (its reader pauses the socket), and
it is woken (`Share.wake`) when the sum is back to half the capacity.

A line cannot be split: a session that was stopped in the middle of a line could wait forever
for room that only its own finished line would bring. So one session at a time (the baton) may
read on past the capacity to the end of the line it is in; when that line is complete the baton
is free, and the next session stopped mid-line takes it. The group can therefore hold at most
the capacity, plus one line (its session's line cap), plus what each session read in the one
read that crossed the capacity.

Pure bookkeeping: no I/O, no clock, no asyncio (`Share.wake` is the session's; it must not read
synchronously, since it is called from inside another session's accounting). Must never: let a closed share keep a byte of
the budget, or wake a session that is not waiting.
"""

from __future__ import annotations

from collections.abc import Callable


class Share:
    """One session's part of a budget: the bytes it holds now (`set`), and how to wake it."""

    __slots__ = ("_budget", "closed", "held", "mid_line", "wake")

    def __init__(self, budget: Budget) -> None:
        self._budget = budget
        self.held = 0
        self.mid_line = False
        self.wake: Callable[[], object] = lambda: None
        self.closed = False

    def set(self, held: int, mid_line: bool) -> None:
        """The session now holds `held` bytes, and is (or is not) in the middle of a line."""
        if self.closed:
            return
        self._budget._update(self, held, mid_line)

    def blocks(self) -> bool:
        """Should this session stop reading? If so it is woken when it may read again."""
        return False if self.closed else self._budget._blocks(self)

    def close(self) -> None:
        """The session ended: everything it held is given back."""
        if not self.closed:
            self._budget._update(self, 0, False)
            self.closed = True
            self._budget._leave(self)


class Budget:
    """`capacity` bytes shared by the sessions holding a `Share` of it."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.used = 0
        self.shares = 0
        self._baton: Share | None = None
        self._waiting: list[Share] = []
        self.on_empty: Callable[[], object] = lambda: None  # the last share closed

    def share(self) -> Share:
        self.shares += 1
        return Share(self)

    @property
    def waiting(self) -> int:
        """Sessions told to stop reading, not yet woken."""
        return len(self._waiting)

    def _update(self, share: Share, held: int, mid_line: bool) -> None:
        self.used += held - share.held
        share.held = held
        share.mid_line = mid_line
        if share is self._baton and not mid_line:
            self._baton = None  # its line is complete: another session may finish its own
            self._wake(lambda s: s.mid_line)
        if self.used <= self.capacity // 2:
            self._wake(lambda s: True)

    def _blocks(self, share: Share) -> bool:
        if self.used < self.capacity or share is self._baton:
            return False
        if share.mid_line and self._baton is None:
            self._baton = share
            return False
        if share not in self._waiting:
            self._waiting.append(share)
        return True

    def _wake(self, which: Callable[[Share], bool]) -> None:
        if not self._waiting:
            return
        woken = [s for s in self._waiting if which(s)]
        self._waiting = [s for s in self._waiting if not which(s)]
        for share in woken:
            share.wake()

    def _leave(self, share: Share) -> None:
        self.shares -= 1
        if share in self._waiting:
            self._waiting.remove(share)
        if share is self._baton:
            self._baton = None
            self._wake(lambda s: s.mid_line)
        if self.shares == 0:
            self.on_empty()


class Budgets:
    """Budgets by key (the supervisor's: agent id), each `capacity` bytes, kept while in use."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_key: dict[str, Budget] = {}

    def share(self, key: str) -> Share:
        budget = self._by_key.get(key)
        if budget is None:
            budget = self._by_key[key] = Budget(self.capacity)
            budget.on_empty = lambda: self._by_key.pop(key, None)
        return budget.share()

    def used(self, key: str) -> int:
        budget = self._by_key.get(key)
        return budget.used if budget else 0
