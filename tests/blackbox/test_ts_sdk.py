"""Interop: the TypeScript SDK's own stdio client (`@modelcontextprotocol/sdk`) drives the host.

`tools/ts_sdk_client.mjs` connects with `StdioClientTransport` + `Client` (the SDK's handshake),
lists tools, calls a core tool, loads deferred tools through `search_tools` (which announces
`notifications/tools/list_changed`) and sends a smuggled `agent_id`; it prints one JSON report.
Skipped where node or the package (`make node`) is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

from mcphost.testing import DevCenter
from tests.blackbox.conftest import project_root

TOOLS = project_root() / "tools"
SDK = TOOLS / "node_modules" / "@modelcontextprotocol" / "sdk"

# deep (make test-slow): the TypeScript SDK's stdio client (node).
pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(
        shutil.which("node") is None or not SDK.exists(),
        reason="node or tools/node_modules/@modelcontextprotocol/sdk missing (`make node`)",
    ),
]


def drive(center: DevCenter) -> Any:
    env = {
        **center.binding_env("unix"),
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(project_root()),
    }
    proc = subprocess.run(
        ["node", str(TOOLS / "ts_sdk_client.mjs"), sys.executable, "-m", "mcphost.cli", "host"],
        capture_output=True,
        timeout=120,
        cwd=TOOLS,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return json.loads(proc.stdout)


def test_the_typescript_sdk_stdio_client_drives_the_host(center: DevCenter) -> None:
    report = drive(center)
    assert report["server"]["name"] == "mcphost"
    assert report["capabilities"]["tools"]["listChanged"] is True
    assert {"get_my_work", "get_issue", "search_tools", "upload_file"} <= set(report["tools"])
    issue = report["issue"]
    assert issue["isError"] is False, issue
    assert json.loads(issue["content"][0]["text"])["issue_id"] == "i-1"
    loaded = json.loads(report["search"]["content"][0]["text"])["loaded"]
    assert "subscribe" in {tool["name"] for tool in loaded}
    assert "notifications/tools/list_changed" in report["notes"]
    refused = report["invalid"]
    assert refused["isError"] is True
    assert json.loads(refused["content"][0]["text"])["error"] == "invalid_arguments"
