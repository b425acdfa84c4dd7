"""Shared pytest configuration: anyio on asyncio only."""

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
