"""Slots: who may start an exchange with the center next, fairly between lanes.

Owns: the admission of exchanges to one admin client. At most `size` are in flight at once,
and at most `per_lane` of them from one lane (a lane is whose share the exchange spends: the
supervisor's lanes are agents, a standalone host has one). A released slot goes to the next
lane, round-robin, that has a live waiter and is below its cap; within a lane, waiters are
served in arrival order. A newcomer takes a free slot at once only when no waiter could take
it (free slots are handed out on every change, so a free slot means no eligible waiter). A
waiter that gives up (timeout, cancellation) after being handed a slot passes it on.

With one lane and `per_lane == size` (the defaults) this is a plain FIFO of `size` slots.

Pure asyncio bookkeeping: no I/O, no clock but the caller's timeout. Must never: let a lane
hold more than `per_lane` slots, leave a free slot while an eligible waiter waits, or let one
lane's queue delay another lane's turn by more than one round.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Slots:
    """`size` slots, at most `per_lane` per lane, granted round-robin between lanes."""

    def __init__(self, size: int, per_lane: int | None = None) -> None:
        if size < 1 or (per_lane is not None and per_lane < 1):
            raise ValueError("size and per_lane must be at least 1")
        self.size = size
        self.per_lane = min(per_lane or size, size)
        self._free = size
        self._held: dict[str, int] = {}
        self._queues: dict[str, deque[asyncio.Future[None]]] = {}  # lanes in turn order

    @property
    def waiting(self) -> int:
        """Waiters still waiting, every lane together."""
        return sum(1 for queue in self._queues.values() for fut in queue if not fut.done())

    def held(self, lane: str) -> int:
        """Slots `lane` holds now."""
        return self._held.get(lane, 0)

    async def acquire(self, lane: str, timeout: float | None) -> None:
        """Wait for a slot for `lane` (at most `timeout` seconds: `TimeoutError`)."""
        if self._free > 0 and self.held(lane) < self.per_lane:
            self._take(lane)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(lane, deque()).append(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(lane)  # handed a slot just as we gave up: pass it on
            else:
                fut.cancel()
                self._prune(lane)
            raise

    def release(self, lane: str) -> None:
        """Give back one slot of `lane`; it goes to the next eligible waiter, if any."""
        held = self._held.get(lane, 0) - 1
        if held < 0:
            raise RuntimeError(f"lane {lane!r} released a slot it did not hold")
        if held:
            self._held[lane] = held
        else:
            del self._held[lane]
        self._free += 1
        self._grant()

    def _take(self, lane: str) -> None:
        self._free -= 1
        self._held[lane] = self._held.get(lane, 0) + 1

    def _grant(self) -> None:
        """Hand free slots to waiters: one per eligible lane per round, in turn order."""
        while self._free > 0:
            for lane in list(self._queues):
                if self.held(lane) >= self.per_lane:
                    continue
                queue = self._queues[lane]
                while queue and queue[0].done():
                    queue.popleft()
                if not queue:
                    del self._queues[lane]
                    continue
                queue.popleft().set_result(None)
                self._take(lane)
                del self._queues[lane]
                if queue:
                    self._queues[lane] = queue  # its turn is over: to the back of the round
                break
            else:
                return  # no lane has an eligible waiter

    def _prune(self, lane: str) -> None:
        queue = self._queues.get(lane)
        if queue is None:
            return
        while queue and queue[0].done():
            queue.popleft()
        if not queue:
            del self._queues[lane]
