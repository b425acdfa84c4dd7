"""Fixtures of the supervisor's black-box tests: one reference center per test module, and a
supervisor per test (closed, with every process it started, when the test ends).

A module that needs something else (another worker's token, a second center) overrides the
fixture locally.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import Supervised


@pytest.fixture(scope="module")
def center(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCenter]:
    with DevCenter.start(tmp_path_factory.mktemp("center")) as running:
        yield running


@pytest.fixture
def supervised(tmp_path: Path, center: DevCenter) -> Iterator[Supervised]:
    sv = Supervised(tmp_path, center)
    try:
        yield sv
    finally:
        sv.close()
