"""Shared pytest configuration: anyio on asyncio only, and hypothesis without a database.

The suite runs in parallel (pytest-xdist): every worker is its own process with its own
session fixtures (each starts its own reference center, on its own sockets under its own
`tmp_path_factory` directory, TCP on port 0). Hypothesis keeps no example database, so workers
never share a `.hypothesis/` directory and a run does not depend on what earlier runs found;
a failure prints its reproduction blob instead.
"""

import pytest
from hypothesis import settings

settings.register_profile("mcphost", database=None, print_blob=True)
settings.load_profile("mcphost")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
