"""Black-box fixtures: the real reference center, the real `mcphost host`, the real SDK client."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from mcphost.testing import DevCenter

HOST_ARGS = ["-m", "mcphost.cli", "host"]


@pytest.fixture(scope="session")
def center(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCenter]:
    with DevCenter.start(
        tmp_path_factory.mktemp("center"), unix=True, tcp=True, runtime_socket=True, control=True
    ) as running:
        yield running


@asynccontextmanager
async def open_host(env: dict[str, str], **client_options: Any) -> AsyncIterator[Client]:
    """The real host process, driven by the official SDK client over stdio."""
    params = StdioServerParameters(command=sys.executable, args=HOST_ARGS, env=env)
    async with Client(params, mode="legacy", **client_options) as client:
        yield client


async def call(client: Client, tool: str, args: dict[str, Any]) -> tuple[bool, Any]:
    """Call a tool; return (is_error, parsed JSON text)."""
    result = await client.call_tool(tool, args)
    text = result.content[0].text
    try:
        return bool(result.is_error), json.loads(text)
    except ValueError:
        return bool(result.is_error), text


def admin_bodies(center: DevCenter, since: int = 0) -> list[dict[str, Any]]:
    return [
        r["body"]
        for r in center.requests(500)[since:]
        if str(r.get("route", "")).startswith("/admin/") and isinstance(r.get("body"), dict)
    ]


def project_root() -> Path:
    return Path(__file__).resolve().parents[2]
