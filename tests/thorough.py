"""Two depths for the expensive tests: `make test` runs a sample, `make test-slow` the full count.

A test marked `thorough` runs in both suites. Under `make test` it draws `quick` examples (or
iterations); `make test-slow` (CI runs it after `make test`) sets `MCPHOST_TEST_DEPTH=full`,
selects `-m "slow or thorough"` and so runs the same test again with the `full` count. Nothing is
dropped: the sample and the full run are the same code, only the count differs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import settings

F = TypeVar("F", bound=Callable[..., Any])

FULL = os.environ.get("MCPHOST_TEST_DEPTH", "") == "full"


def depth(full: int, quick: int) -> int:
    """`full` under `make test-slow`, `quick` under `make test`."""
    return full if FULL else quick


def examples(full: int, quick: int, **options: Any) -> Callable[[F], F]:
    """`@settings(max_examples=depth(full, quick), deadline=None, ...)` plus the `thorough` mark."""

    def apply(test: F) -> F:
        configured = settings(max_examples=depth(full, quick), deadline=None, **options)(test)
        return pytest.mark.thorough(configured)  # type: ignore[no-any-return]

    return apply
