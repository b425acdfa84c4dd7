"""`until()`, and `eventually()` on an event loop: poll for a condition instead of sleeping
for a guess or bounding wall time.

A sleep long enough for a quiet machine is too short on a loaded one, and an upper bound on
wall time fails whenever the machine is busy. Tests wait for the condition they need (a request
reached the center, a file appeared, a process is gone), with a generous deadline that only a
real hang reaches; how long things take is measured in `make bench`, not asserted here.
`MCPHOST_TEST_SLOWDOWN` (a factor, default 1) stretches every deadline `until()` gives, for a
machine several times slower than ours: tests/kernels/ sets it for a kernel under QEMU's
software emulation, where a supervisor's cold start alone can pass 60 s.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
SLOWDOWN = float(os.environ.get("MCPHOST_TEST_SLOWDOWN", "1"))


def until(
    condition: Callable[[], T], timeout: float = 30.0, what: str = "condition", every: float = 0.01
) -> T:
    """Call `condition` until it returns something truthy; return that. Fail after `timeout`
    (times `SLOWDOWN`)."""
    deadline = time.monotonic() + timeout * SLOWDOWN
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout:.0f}s")
        time.sleep(every)


def arrived(center: Any, route: str, before: int) -> Callable[[], bool]:
    """A condition: the center's request log holds more than `before` requests to `route`."""
    return lambda: count(center, route) > before


def count(center: Any, route: str) -> int:
    """How many requests to `route` the center's request log holds (its last 1,000)."""
    return sum(1 for entry in center.requests(1000) if entry.get("route") == route)


async def eventually(
    condition: Callable[[], Any],
    what: str = "condition",
    timeout: float = 30.0,
    every: float = 0.01,
) -> Any:
    """`until` for a test on an event loop: `condition()` (a value, or an awaitable of one) is
    polled without blocking the loop until it is truthy; that value is returned."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout * SLOWDOWN
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"{what} not met within {timeout:.0f}s")
        await asyncio.sleep(every)
