"""Shared pytest configuration: anyio on asyncio only, and hypothesis without a database.

The suite runs in parallel (pytest-xdist): every worker is its own process with its own
session fixtures (each starts its own reference center, on its own sockets under its own
`tmp_path_factory` directory, TCP on port 0). Hypothesis keeps no example database, so workers
never share a `.hypothesis/` directory and a run does not depend on what earlier runs found;
a failure prints its reproduction blob instead.

A suite started in the background by a non-interactive shell (`make test &`, a CI wrapper)
inherits SIGINT ignored, and every process it starts would inherit that too, so the tests that
press Ctrl-C on a child (`ctl logs --follow`, `ctl exec`) would wait for an exit that never
comes. The default disposition is restored here, in the controller and in every worker.
"""

import shutil
import signal
import sys
from collections.abc import Iterator

import pytest
from hypothesis import settings

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

settings.register_profile("mcphost", database=None, print_blob=True)
settings.load_profile("mcphost")


@pytest.fixture(scope="session", autouse=True)
def _remove_supervisor_state_dirs() -> Iterator[None]:
    """At the end of this test process, the supervisors' state directories under /tmp go too."""
    yield
    harness = sys.modules.get("tests.supervisor.supervise_harness")
    for state in getattr(harness, "STATE_DIRS", []):
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# The suite's two tiers: `make test` runs every test not marked `slow` or `deep`; a file that
# proves one property in depth with many real processes marks itself `deep` (`make test-slow`).
# Both, and where the test of X is: tests/README.md.
