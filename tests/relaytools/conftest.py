"""Fixtures for the relay tools: anyio on asyncio, a per-test config/state root, a fake relay."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from mcphost.testing.relayharness import Env, FakeRelay, cleanup, make_env


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def env() -> Iterator[Env]:
    e = make_env()
    yield e
    cleanup(e)


@pytest.fixture
async def relay(env: Env) -> AsyncIterator[FakeRelay]:
    fake = await FakeRelay(env.socket).start()
    yield fake
    await fake.stop()
