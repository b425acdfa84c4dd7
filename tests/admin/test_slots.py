"""`mcphost.admin.slots.Slots`: the admin client's admission, fair between lanes.

Pure bookkeeping on one event loop: waiters are futures, grants are observed in the order the
waiters' tasks complete, never by timing.
"""

from __future__ import annotations

import asyncio

import pytest

from mcphost.admin.slots import Slots


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class Recorder:
    """Tasks that acquire a slot and record (lane, n) when they get it, holding it until told."""

    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self.granted: list[tuple[str, int]] = []
        self.tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.done: dict[tuple[str, int], asyncio.Event] = {}

    def want(self, lane: str, n: int, timeout: float | None = None) -> None:
        key = (lane, n)
        self.done[key] = asyncio.Event()

        async def run() -> None:
            await self.slots.acquire(lane, timeout)
            self.granted.append(key)
            try:
                await self.done[key].wait()
            finally:
                self.slots.release(lane)

        self.tasks[key] = asyncio.ensure_future(run())

    def finish(self, lane: str, n: int) -> None:
        self.done[(lane, n)].set()


@pytest.mark.anyio
async def test_one_lane_without_a_cap_is_a_plain_fifo() -> None:
    slots = Slots(2)
    rec = Recorder(slots)
    for n in range(6):
        rec.want("", n)
    await settle()
    assert rec.granted == [("", 0), ("", 1)]
    for n in range(4):
        rec.finish("", n)
        await settle()
    assert rec.granted == [("", n) for n in range(6)]
    for n in range(4, 6):
        rec.finish("", n)
    await asyncio.gather(*rec.tasks.values())
    assert slots.held("") == 0 and slots.waiting == 0


@pytest.mark.anyio
async def test_a_lane_never_holds_more_than_its_cap_and_another_lane_gets_a_free_slot() -> None:
    slots = Slots(8, per_lane=2)
    rec = Recorder(slots)
    for n in range(100):
        rec.want("a", n)
    await settle()
    assert rec.granted == [("a", 0), ("a", 1)], "a lane stops at its cap with slots free"
    assert slots.held("a") == 2 and slots.waiting == 98
    rec.want("b", 0)
    await settle()
    assert rec.granted[-1] == ("b", 0), "another lane is served at once, ahead of a's queue"
    assert slots.held("a") == 2
    for key in list(rec.tasks):
        rec.finish(*key)
    await asyncio.gather(*rec.tasks.values())


@pytest.mark.anyio
async def test_waiting_lanes_take_turns_round_robin() -> None:
    slots = Slots(1)
    rec = Recorder(slots)
    rec.want("hold", 0)
    await settle()
    for n in range(4):
        rec.want("a", n)
    for n in range(2):
        rec.want("b", n)
    rec.want("c", 0)
    await settle()
    order = []
    for key in [("hold", 0), ("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("a", 2)]:
        rec.finish(*key)
        await settle()
        order.append(rec.granted[-1])
    assert order == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("a", 2), ("a", 3)]
    rec.finish("a", 3)
    await asyncio.gather(*rec.tasks.values())


@pytest.mark.anyio
async def test_a_waiter_that_times_out_leaves_no_trace() -> None:
    slots = Slots(1, per_lane=1)
    await slots.acquire("a", None)
    with pytest.raises(TimeoutError):
        await slots.acquire("b", 0.01)
    assert slots.waiting == 0 and slots.held("b") == 0
    slots.release("a")
    await slots.acquire("b", 0)  # the slot is free, and b is not charged for its first wait
    assert slots.held("b") == 1
    slots.release("b")


@pytest.mark.anyio
async def test_a_waiter_cancelled_after_its_grant_passes_the_slot_on() -> None:
    slots = Slots(1)
    await slots.acquire("a", None)
    late = asyncio.ensure_future(slots.acquire("b", None))
    await settle()
    slots.release("a")  # hands the slot to b's waiter at once
    assert slots.held("b") == 1
    late.cancel()  # before b runs: it gives up holding a slot it never used
    with pytest.raises(asyncio.CancelledError):
        await late
    assert slots.held("b") == 0
    await slots.acquire("c", 0)
    slots.release("c")


@pytest.mark.anyio
async def test_a_newcomer_never_overtakes_an_eligible_waiter() -> None:
    slots = Slots(2, per_lane=2)
    rec = Recorder(slots)
    rec.want("a", 0)
    rec.want("a", 1)
    rec.want("b", 0)  # waits: the pool is full
    await settle()
    rec.finish("a", 0)
    rec.want("c", 0)  # arrives while b waits for the slot a just gave back
    await settle()
    assert rec.granted[2:] == [("b", 0)], rec.granted
    for key in [("a", 1), ("b", 0), ("c", 0)]:
        rec.finish(*key)
    await asyncio.gather(*rec.tasks.values())


def test_releasing_a_slot_never_held_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        Slots(1).release("a")
