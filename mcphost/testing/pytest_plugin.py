"""pytest plugin: `devcenter` (one center per test) and `devcenter_session` (one per run).

Enable with `pytest_plugins = ["mcphost.testing.pytest_plugin"]` in a root conftest.py. Both
centers serve the admin API on a Unix socket and on TLS, plus the runtime socket and the
control API. The session center is shared: reset faults you set (`center.faults(...)` as a
context manager does), and remember that generation fences persist per agent.
Must never: leave a center process behind (both fixtures stop theirs on teardown).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mcphost.testing.devcenter import DevCenter


@pytest.fixture
def devcenter(tmp_path: Path) -> Iterator[DevCenter]:
    with DevCenter.start(
        tmp_path / "devcenter", unix=True, tcp=True, runtime_socket=True, control=True
    ) as center:
        yield center


@pytest.fixture(scope="session")
def devcenter_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCenter]:
    base = tmp_path_factory.mktemp("devcenter")
    with DevCenter.start(base, unix=True, tcp=True, runtime_socket=True, control=True) as center:
        yield center
