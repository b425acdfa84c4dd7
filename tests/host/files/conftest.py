"""Fixtures for the file-tool tests: a session reference center, an empty workspace per test,
the real host process (SDK client), and an in-process `HostSurface` for volume tests."""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from mcphost.admin.target import parse_target
from mcphost.binding import AgentBinding
from mcphost.testing import DevCenter

HOST_ARGS = ["-m", "mcphost.cli", "host"]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module-scoped, so a module may share one async fixture (a host process) across tests."""
    return "asyncio"


@pytest.fixture(scope="session")
def center(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCenter]:
    with DevCenter.start(tmp_path_factory.mktemp("files-center"), unix=True, control=True) as c:
        yield c


@pytest.fixture
def workspace(center: DevCenter, tmp_path: Path) -> Iterator[Path]:
    """The center's agent-1 workspace, emptied before and after the test, plus a sibling
    `outside` directory (holding a secret) that no tool may ever touch."""
    root = center.agent_root
    _empty(root)
    yield root
    _empty(root)


def _empty(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for child in root.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


@pytest.fixture
def outside(center: DevCenter) -> Iterator[Path]:
    """A directory next to the workspace (`<root>Evil`, a sibling prefix) with a secret."""
    path = Path(str(center.agent_root) + "Evil")
    path.mkdir(exist_ok=True)
    (path / "secret.txt").write_text("top secret\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def local_binding(root: Path | str | None, agent_id: str = "agent-1") -> AgentBinding:
    return AgentBinding(
        agent_id=agent_id,
        target=parse_target("unix:/nonexistent/admin.sock"),
        agent_root=None if root is None else str(root),
    )


def center_binding(center: DevCenter, **overrides: str | None) -> AgentBinding:
    return AgentBinding.from_env(center.binding_env("unix", **overrides))


@asynccontextmanager
async def open_host(env: dict[str, str], **client_options: Any) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=sys.executable, args=HOST_ARGS, env=env)
    async with Client(params, mode="legacy", **client_options) as client:
        yield client


async def call(client: Client, tool: str, args: dict[str, Any], **kw: Any) -> tuple[bool, Any]:
    result = await client.call_tool(tool, args, **kw)
    text = result.content[0].text
    try:
        return bool(result.is_error), json.loads(text)
    except ValueError:
        return bool(result.is_error), text


def mark(center: DevCenter) -> str:
    """Put a unique entry in the center's request log; `since(center, marker)` reads after it.
    (The log is a sliding window, so positions are not stable across a session.)"""
    marker = f"marker-{uuid.uuid4().hex}"
    center.call("get_issue", {"issue_id": marker})
    return marker


def since(center: DevCenter, marker: str) -> list[dict[str, Any]]:
    entries = center.requests(1000)
    for index in range(len(entries) - 1, -1, -1):
        body = entries[index].get("body")
        if isinstance(body, dict) and body.get("issue_id") == marker:
            return entries[index + 1 :]
    raise AssertionError("the marker fell out of the center's request log")
