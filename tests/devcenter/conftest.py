"""Fixtures for the reference-center tests: the real `mcphost devcenter` subprocess."""

from __future__ import annotations

import itertools

import pytest

from mcphost.testing.pytest_plugin import devcenter, devcenter_session

__all__ = ["devcenter", "devcenter_session"]

_counter = itertools.count()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def unique() -> str:
    """A suffix that keeps titles distinct across tests sharing the session center."""
    return f"{next(_counter):04d}"
