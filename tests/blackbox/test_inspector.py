"""Interop: the TypeScript SDK's client (MCP Inspector CLI from npm) drives the real host.

Every protocol era the Inspector speaks: `legacy` (the initialize handshake), `modern`
(2026-07-28, per-request envelopes, no handshake) and `auto` (probe `server/discover`, which
the SDK core answers, so it stays modern).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mcphost.testing import DevCenter
from tests.blackbox.conftest import project_root

INSPECTOR = project_root() / "tools" / "node_modules" / ".bin" / "mcp-inspector"

# deep (make test-slow): the MCP Inspector CLI (node), one host per method and era.
pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(
        shutil.which("node") is None, reason="node is not installed: Inspector interop not run"
    ),
]


ERAS = ["legacy", "modern", "auto"]


def inspect(center: DevCenter, tmp_path: Path, era: str, *method_args: str) -> Any:
    if not INSPECTOR.exists():
        pytest.fail(f"{INSPECTOR} missing: run `make node` (make test does it)")
    env_flags = [f"-e{key}={value}" for key, value in center.binding_env("unix").items()]
    proc = subprocess.run(
        [
            str(INSPECTOR),
            "--cli",
            "--protocol-era",
            era,
            *env_flags,
            sys.executable,
            "-m",
            "mcphost.cli",
            "host",
            *method_args,
        ],
        capture_output=True,
        timeout=60,
        env={**os.environ, "MCP_CATALOG_PATH": str(tmp_path / "catalog.json")},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("era", ERAS)
def test_inspector_lists_tools(center: DevCenter, tmp_path: Path, era: str) -> None:
    listed = inspect(center, tmp_path, era, "--method", "tools/list")
    names = {tool["name"] for tool in listed["tools"]}
    assert {"get_my_work", "create_task", "search_tools"} <= names
    assert all(t["inputSchema"]["additionalProperties"] is False for t in listed["tools"])


@pytest.mark.parametrize("era", ERAS)
def test_inspector_calls_a_tool(center: DevCenter, tmp_path: Path, era: str) -> None:
    result = inspect(
        center,
        tmp_path,
        era,
        "--method",
        "tools/call",
        "--tool-name",
        "get_issue",
        "--tool-arg",
        "issue_id=i-1",
    )
    assert result.get("isError") in (False, None)
    issue = json.loads(result["content"][0]["text"])
    assert issue["issue_id"] == "i-1"
