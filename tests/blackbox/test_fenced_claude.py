"""Issue 21: the real Claude Code, run by `mcphost supervise` inside the fence, completes a turn.

One real supervisor with the default `sandbox = "auto"` runs one agent: Claude Code in print
mode (`claude -p`, a process agent) with its generated attach config, its model API a loopback
stand-in (`model_standin.py`) whose script makes it write a file in the workspace with its Write
tool, run a shell command with its Bash tool, load and call the center's `get_my_work` through
its MCP server, then end the turn. The file and the command's output land in the workspace, the
center hears the call as the agent (and answers it), Claude Code exits 0, `ctl status` shows the
fence, and the shell command finds no worker token file.
No `HOME` is given: a fenced agent gets its home as `HOME`.
"""

from __future__ import annotations

import shutil

import pytest

from mcphost.supervisor import fence
from mcphost.testing import DevCenter
from tests.blackbox.conftest import project_root
from tests.blackbox.model_standin import ModelStandIn, Say, ToolUse
from tests.supervisor.supervise_harness import Supervised, center_heard, fenced_turn

CLAUDE = project_root() / "tools" / "node_modules" / ".bin" / "claude"
GET_MY_WORK = "mcp__agent-center__get_my_work"

# deep (make test-slow): the real Claude Code completing a turn inside the fence.
pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed"),
    pytest.mark.skipif(
        fence.probe().missing() is not None, reason=f"no fence here: {fence.probe().missing()}"
    ),
]


def test_claude_code_fenced_writes_runs_and_calls_the_center(
    tmp_path_factory: pytest.TempPathFactory, own_center: DevCenter
) -> None:
    center = own_center
    if not CLAUDE.exists():
        pytest.fail(f"{CLAUDE} missing: run `make node` (make test does it)")
    sv = Supervised(tmp_path_factory.mktemp("fenced-claude"), center)
    agent = center.agent_id  # the agent the reference center knows
    workspace = sv.workspace(agent)
    # the command runs, and inside the fence: the worker token file is not there for it
    shell = f"id -u > ran.txt; test -e {sv.token_file} || echo hidden > hidden.txt"
    script = [
        ToolUse("Write", {"file_path": str(workspace / "fenced.txt"), "content": "written\n"}),
        ToolUse("Bash", {"command": shell, "description": "record the uid"}),
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
            str(CLAUDE), "-p", "Do the task.", "--mcp-config", "{mcp_config}",
            "--strict-mcp-config", "--allowedTools", "Write,Bash,mcp__agent-center",
            "--output-format", "json",
        ]  # fmt: skip
        sv.write_fleet(
            [{"id": agent, "client": "claude", "runner": "process", "command": command}],
            restart="never",
            env=env,
        )
        try:
            log = fenced_turn(sv, agent)
            assert (workspace / "fenced.txt").read_text() == "written\n", log
            assert (workspace / "ran.txt").read_text().strip().isdigit(), log
            assert (workspace / "hidden.txt").read_text() == "hidden\n", log
            assert '"is_error":false' in log.replace(" ", ""), log
            heard = center_heard(center, agent, "get_my_work")
            assert heard, (log, [e.turn for e in model.exchanges])
            results = [r for e in model.exchanges for r in e.tool_results]
            assert len(results) == 4 and not any(r["is_error"] for r in results), results
            assert '"tasks"' in results[3]["text"], results[3]  # the center's answer
        finally:
            sv.close()
            shutil.rmtree(sv.state, ignore_errors=True)
