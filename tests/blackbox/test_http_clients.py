"""Issue 35: the real Claude Code and Codex CLIs reach the center over HTTP entries, no pump.

One real root supervisor (every agent a uid of its own, fenced: the default fleet) runs one agent
whose fleet entry says `mcp_transport = "http"`, so its config holds an HTTP entry naming the
supervisor's loopback listener (Claude Code: `{"type": "http", "url": ...}`; Codex: `url = ...`
in its `config.toml`) and nothing to run. Its model API is a loopback stand-in whose script loads
and calls the center's `get_my_work` through that entry; the center hears the call as the agent,
at the generation `ctl status` shows, and no pump ran in the agent's tree.
"""

from __future__ import annotations

import json
import os
import shutil
import tomllib

import pytest

from mcphost.standin.anthropic import ModelStandIn, Say, ToolUse
from mcphost.standin.responses import Code, ResponsesStandIn, tool_outputs
from mcphost.standin.responses import Say as CodexSay
from mcphost.supervisor.confine import probe as machine
from mcphost.testing import DevCenter
from tests.blackbox.conftest import project_root
from tests.supervisor.supervise_harness import Supervised, center_heard, fenced_turn

BIN = project_root() / "tools" / "node_modules" / ".bin"
GET_MY_WORK = "mcp__agent-center__get_my_work"

# deep (make test-slow): the real agent CLIs, fenced, over the supervisor's HTTP listener.
pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="HTTP needs agents of their own uids (root)"),
    pytest.mark.skipif(
        machine.probe().missing() is not None, reason=f"no fence here: {machine.probe().missing()}"
    ),
]


def heard_as_itself(sv: Supervised, center: DevCenter, agent: str) -> None:
    """The center heard `get_my_work` as `agent` at its generation; no pump ever attached."""
    heard = center_heard(center, agent, "get_my_work")
    assert heard, "the center heard no call"
    generation = str(sv.status()[agent]["generation"])
    seen = {{k.lower(): v for k, v in r["headers"].items()}["x-ac-mcp-generation"] for r in heard}
    assert seen == {generation}, (seen, generation)
    started = [e for e in sv.events() if e.get("event") == "supervisor.session.started"]
    assert started and all(e.get("transport") == "http" for e in started), started


def test_claude_code_calls_the_center_over_its_http_entry(
    tmp_path_factory: pytest.TempPathFactory, own_center: DevCenter
) -> None:
    claude = BIN / "claude"
    if not claude.exists():
        pytest.fail(f"{claude} missing: run `make node`")
    center = own_center
    sv = Supervised(tmp_path_factory.mktemp("http-claude"), center)
    agent = center.agent_id
    script = [
        # Claude Code defers MCP tools behind its own ToolSearch (test_claude_code.py)
        ToolUse("ToolSearch", {"query": f"select:{GET_MY_WORK}"}),
        ToolUse(GET_MY_WORK, {}),
        Say("done"),
    ]
    with ModelStandIn(script).running() as model:
        env = {
            "ANTHROPIC_BASE_URL": model.base_url,
            "ANTHROPIC_API_KEY": "sk-ant-standin-not-a-key",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
        }
        command = [
            str(claude), "-p", "Do the task.", "--mcp-config", "{mcp_config}",
            "--strict-mcp-config", "--allowedTools", "mcp__agent-center",
            "--output-format", "json",
        ]  # fmt: skip
        entry = {"id": agent, "client": "claude", "runner": "process", "command": command}
        sv.write_fleet([entry], restart="never", env=env, mcp_transport="http")
        try:
            log = fenced_turn(sv, agent)
            config = json.loads((sv.state / "agents" / agent / "mcp.json").read_text())
            assert config["mcpServers"]["agent-center"]["type"] == "http", config
            results = [r for e in model.exchanges for r in e.tool_results]
            assert len(results) == 2, (log, results)
            work = results[1]
            assert not work["is_error"] and '"tasks"' in work["text"], work
            heard_as_itself(sv, center, agent)
        finally:
            sv.close()
            shutil.rmtree(sv.state, ignore_errors=True)


def test_codex_calls_the_center_over_its_url_entry(
    tmp_path_factory: pytest.TempPathFactory, own_center: DevCenter
) -> None:
    codex = BIN / "codex"
    if not codex.exists():
        pytest.fail(f"{codex} missing: run `make node`")
    center = own_center
    # not under /tmp: Codex refuses its helper links in a CODEX_HOME beneath it
    sv = Supervised(tmp_path_factory.mktemp("http-codex"), center, state_parent="/var/tmp")
    agent = center.agent_id
    call = "\n".join(
        [
            "const name = ALL_TOOLS.map(t => t.name).find(n => n.endsWith('get_my_work'));",
            "text('tool=' + name);",
            "text('work=' + JSON.stringify(await tools[name]({})));",
        ]
    )
    with ResponsesStandIn("done", [Code(call), CodexSay("done")]).running() as model:
        command = [
            str(codex), "exec", "--disable", "daemon_auto_start", "--skip-git-repo-check",
            "--json", "Do the task.",
        ]  # fmt: skip
        env = {
            "OPENAI_API_KEY": "sk-standin-not-a-key-0123456789",
            "OPENAI_BASE_URL": model.base_url,
        }
        entry = {"id": agent, "client": "codex", "runner": "process", "command": command}
        sv.write_fleet([entry], restart="never", env=env, mcp_transport="http")
        try:
            log = fenced_turn(sv, agent)
            config = tomllib.loads(
                (sv.state / "agents" / agent / "codex" / "config.toml").read_text()
            )
            server = config["mcp_servers"]["agent-center"]
            assert server["url"].endswith("/mcp/center") and "command" not in server, server
            outputs = [o for body in model.responses for o in tool_outputs(body)]
            assert len(outputs) == 1, (log, outputs)
            out = outputs[0]
            assert "tool=mcp__agent_center__get_my_work" in out, out
            assert "tasks" in out and '"isError":false' in out, out
            heard_as_itself(sv, center, agent)
        finally:
            sv.close()
            shutil.rmtree(sv.state, ignore_errors=True)
