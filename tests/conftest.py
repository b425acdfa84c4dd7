"""Shared pytest configuration: anyio on asyncio only, and hypothesis without a database.

The suite runs in parallel (pytest-xdist, one worker more than the CPUs): every worker is its
own process with its own session fixtures (each starts its own reference center, on its own
sockets under its own `tmp_path_factory` directory, TCP on port 0). Hypothesis keeps no example database, so workers
never share a `.hypothesis/` directory and a run does not depend on what earlier runs found;
a failure prints its reproduction blob instead.

A suite started in the background by a non-interactive shell (`make test &`, a CI wrapper)
inherits SIGINT ignored, and every process it starts would inherit that too, so the tests that
press Ctrl-C on a child (`ctl logs --follow`, `ctl exec`) would wait for an exit that never
comes. The default disposition is restored here, in the controller and in every worker.

Every run ends with a line naming the environment skips by what the machine lacked; with
`MCPHOST_CI=1` (`.ci/run`) a skip for want of something CI must have fails the run
(tests/skips.py).
"""

import os
import shutil
import signal
import sys
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests import skips

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


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto`: one worker more than this process may use CPUs. A black-box test spends much
    of its time waiting on processes it started (a supervisor's start, an agent's restart), and
    one worker per CPU left a CPU idle meanwhile. PYTEST_XDIST_AUTO_NUM_WORKERS still decides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return len(os.sched_getaffinity(0)) + 1


def _skip_groups(config: pytest.Config) -> dict[str, list[str]] | None:
    """The run's skips by requirement, in the controller (None in an xdist worker, whose
    reports the controller sees anyway)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if hasattr(config, "workerinput") or reporter is None:
        return None
    skipped = [r for r in reporter.stats.get("skipped", []) if not hasattr(r, "wasxfail")]
    return skips.grouped(skips.reason_of(report) for report in skipped)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    groups = _skip_groups(session.config)
    if groups and skips.on_ci() and skips.enforced(groups) and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    groups = _skip_groups(terminalreporter.config)
    if groups is not None:
        for line in skips.summary(groups, skips.on_ci()):
            terminalreporter.write_line(line, red=line.startswith("FAILED"))


# The suite's two tiers: `make test` runs every test not marked `slow` or `deep`; a file that
# proves one property in depth with many real processes marks itself `deep` (`make test-slow`).
# Both, and where the test of X is: tests/README.md.
