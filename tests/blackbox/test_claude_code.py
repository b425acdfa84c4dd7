"""Interop: the real Claude Code CLI runs the host from a configgen config against the real center.

Claude Code (`tools/node_modules`, installed by `make node`) is started exactly as a worker
would: `claude -p --mcp-config FILE --strict-mcp-config`, with FILE written by `python -m
configgen claude ...`. Its model API is a loopback stand-in (`mcphost/standin/anthropic.py`) that replays a
fixed script of tool calls and records what every request offered and every tool result said.

What these tests pin down (Claude Code 2.1):

- Claude Code builds a request from the tool list it held when the previous turn ended. After
  `search_tools` sends `notifications/tools/list_changed`, its refresh lands later, so the
  request right after the search did not offer the found tool in any of ~25 runs, and calling
  it there failed inside Claude Code ("No such tool available") in about one run in four —
  the call never reached the host. Both are races, so no test asserts them.
- Claude Code defers MCP tools itself (its ToolSearch: only names in the prompt, schemas
  loaded on demand, inside the client, with no round trip to the server). So configgen writes
  `AC_MCP_TIER_TOOLS=false` for Claude Code: every tool is listed from the start and Claude
  Code's own search makes a tool callable on the very next request.
- With tiering switched on by hand, a found tool is callable once Claude Code offers it.

Skipped where npm is absent, like the Inspector test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from mcphost.catalog import CATALOG
from mcphost.standin.anthropic import Exchange, ModelStandIn, Say, ToolUse, Turn
from mcphost.testing import DevCenter
from tests.blackbox.conftest import project_root

CLAUDE = project_root() / "tools" / "node_modules" / ".bin" / "claude"
SERVER = "agent-center"  # configgen's default name for the center host

# deep (make test-slow): the Claude Code CLI (node) against generated configs.
pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(
        shutil.which("npm") is None, reason="npm is not installed: Claude Code interop not run"
    ),
]


def mcp(tool: str) -> str:
    """The name Claude Code gives a tool of our server."""
    return f"mcp__{SERVER}__{tool}"


def generate_config(center: DevCenter, tmp_path: Path, *extra: str) -> Path:
    """`python -m configgen claude ...`, as a user would run it (token in a 0600 file)."""
    token = tmp_path / "worker.token"
    token.write_text(center.token + "\n")
    token.chmod(0o600)
    out = tmp_path / "mcp.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "configgen",
            "claude",
            "--agent-id",
            center.agent_id,
            "--admin-url",
            center.admin_url("unix"),
            "--token-file",
            str(token),
            "--agent-root",
            str(center.agent_root),
            *extra,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 and "cannot find the mcphost command" in proc.stderr:
        pytest.skip(f"the mcphost console script is not installed: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    return out


def run_claude(
    config: Path, tmp_path: Path, script: Sequence[Turn], meanwhile: Turn | None = None
) -> tuple[ModelStandIn, dict[str, Any]]:
    """Run `claude -p` to completion against a stand-in replaying `script`."""
    if not CLAUDE.exists():
        pytest.fail(f"{CLAUDE} missing: run `make node` (make test does it)")
    home = tmp_path / "home"
    home.mkdir()
    with ModelStandIn(script, meanwhile=meanwhile).running() as model:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "CLAUDE_CONFIG_DIR": str(home / ".claude"),
            "ANTHROPIC_BASE_URL": model.base_url,
            "ANTHROPIC_API_KEY": "sk-ant-standin-not-a-key",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
        }
        proc = subprocess.run(
            [
                str(CLAUDE),
                "-p",
                "Use the agent-center tools.",
                "--mcp-config",
                str(config),
                "--strict-mcp-config",
                "--allowedTools",
                f"mcp__{SERVER}",
                "--output-format",
                "json",
            ],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    outcome: dict[str, Any] = json.loads(proc.stdout)
    return model, outcome


def result_after(exchanges: list[Exchange], index: int) -> dict[str, Any]:
    """The one tool result carried by the request after exchange `index`."""
    results = exchanges[index + 1].tool_results
    assert len(results) == 1, results
    return results[0]


def subscribe_calls(center: DevCenter, task_id: str) -> list[dict[str, Any]]:
    return [
        r["body"]
        for r in center.requests(500)
        if r.get("route") == "/admin/agent-tools/subscribe"
        and isinstance(r.get("body"), dict)
        and r["body"].get("task_id") == task_id
    ]


def new_task(center: DevCenter) -> str:
    reply = center.call("create_task", {"project_id": "p-1", "title": "followed by Claude Code"})
    assert reply.status == 200, reply.body
    return str(reply.json()["task_id"])


def assert_real_subscribe(center: DevCenter, task_id: str, result: dict[str, Any]) -> None:
    """The tool result is the host's answer from the center, not a Claude Code refusal."""
    assert "No such tool" not in result["text"], result
    assert not result["is_error"], result
    assert json.loads(result["text"]) == {"ok": True}
    calls = subscribe_calls(center, task_id)
    assert len(calls) == 1, calls
    assert calls[0]["agent_id"] == center.agent_id
    task = center.call("get_task", {"task_id": task_id}).json()
    assert f"agent:{center.agent_id}" in task["subscribers"], task


def test_claude_code_config_makes_a_searched_tool_callable_on_the_next_request(
    center: DevCenter, tmp_path: Path
) -> None:
    """configgen's Claude Code config: a search, then the found tool on the very next request.

    `subscribe` is deferred in the host's tiering. The search is Claude Code's own ToolSearch,
    the search a Claude Code model is told to use for tools it sees only by name."""
    task_id = new_task(center)
    config = generate_config(center, tmp_path)
    model, outcome = run_claude(
        config,
        tmp_path,
        [
            ToolUse("ToolSearch", {"query": f"select:{mcp('subscribe')}"}),
            ToolUse(mcp("subscribe"), {"task_id": task_id}),
            Say("subscribed"),
        ],
    )
    exchanges = model.exchanges
    assert [e.turn for e in exchanges] == [0, 1, 2], exchanges
    # the request right after the search offers the found tool ...
    assert mcp("subscribe") in exchanges[1].offered, sorted(exchanges[1].offered)
    search = result_after(exchanges, 0)
    # (ToolSearch answers with `tool_reference` blocks naming the tools it loaded)
    assert not search["is_error"] and mcp("subscribe") in json.dumps(search["content"]), search
    # ... and the call made there reached the real center through the host
    assert_real_subscribe(center, task_id, result_after(exchanges, 1))
    assert outcome["result"] == "subscribed"
    # because every catalog tool is listed from the start, without the tiering meta-tool
    catalog = {mcp(d.name) for d in CATALOG if d.name != "search_tools"}
    assert catalog <= exchanges[0].offered, sorted(catalog - exchanges[0].offered)
    assert mcp("search_tools") not in exchanges[0].offered


def test_claude_code_with_tiering_calls_a_found_tool_once_offered(
    center: DevCenter, tmp_path: Path
) -> None:
    """Tiering switched on by hand: `search_tools` loads `subscribe`, Claude Code refreshes its
    list, and a call made once the tool is offered reaches the center (what `search_tools`'
    description promises). Until then the model repeats the search, as told to."""
    task_id = new_task(center)
    config = generate_config(center, tmp_path, "--tier-tools", "true")
    env = json.loads(config.read_text())["mcpServers"][SERVER]["env"]
    assert env["AC_MCP_TIER_TOOLS"] == "true"
    model, outcome = run_claude(
        config,
        tmp_path,
        [
            ToolUse(mcp("search_tools"), {"query": "subscribe"}),
            ToolUse(mcp("subscribe"), {"task_id": task_id}, once_offered=True),
            Say("subscribed"),
        ],
        meanwhile=ToolUse(mcp("search_tools"), {"names": ["subscribe"]}),
    )
    exchanges = model.exchanges
    assert mcp("search_tools") in exchanges[0].offered
    assert mcp("subscribe") not in exchanges[0].offered
    found = json.loads(result_after(exchanges, 0)["text"])
    assert "subscribe" in [tool["name"] for tool in found["loaded"]], found
    calling = next(i for i, e in enumerate(exchanges) if e.turn == 1)
    assert mcp("subscribe") in exchanges[calling].offered, "Claude Code never offered the tool"
    assert_real_subscribe(center, task_id, result_after(exchanges, calling))
    assert outcome["result"] == "subscribed"
