"""Issue 21: the real Codex CLI, run by `mcphost supervise` inside the fence, completes a turn.

One real supervisor with the default `sandbox = "auto"` runs one agent: Codex non-interactively
(`codex exec`, a process agent) with the config the supervisor writes in its `CODEX_HOME` (the
agent-center MCP server) and the sign-in it writes from `env`'s `OPENAI_API_KEY`, its model API
a loopback stand-in (`codex_standin.py`), whose address the agent's `env` gives only as
`OPENAI_BASE_URL`: Codex 0.171 ignores that variable, so this also shows the supervisor carry it
into `config.toml` as Codex's `openai_base_url`. Codex 0.171
offers the model one `exec` tool ("code mode": JavaScript calling the nested tools), so the
stand-in's one tool turn is a script that writes a file with `apply_patch`, runs a shell command
with `exec_command` and calls the center's `get_my_work` through the MCP server, then the turn
ends. The file and the command's output land in the workspace, the center hears the call as
the agent (and answers it), Codex exits, `ctl status` shows the fence, and the shell command
finds no worker token file.

Codex's own sandbox and approvals are off (`--dangerously-bypass-approvals-and-sandbox`, which
Codex documents for environments sandboxed from outside): our fence is the boundary, and what
this test proves is that fence, not Codex's. No `HOME` is given: a fenced agent gets its home as
`HOME`.
"""

from __future__ import annotations

import json
import shutil

import pytest

from mcphost.supervisor import fence
from mcphost.testing import DevCenter
from tests.blackbox.codex_standin import Code, ResponsesStandIn, Say, tool_outputs
from tests.blackbox.conftest import project_root
from tests.supervisor.supervise_harness import Supervised, center_heard, fenced_turn

CODEX = project_root() / "tools" / "node_modules" / ".bin" / "codex"

# deep (make test-slow): the real Codex CLI completing a turn inside the fence.
pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(not CODEX.exists(), reason=f"{CODEX} missing: run `make node`"),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
    pytest.mark.skipif(
        fence.probe().missing() is not None, reason=f"no fence here: {fence.probe().missing()}"
    ),
]


def turn_script(shell: str) -> str:
    """The JavaScript of the tool turn: a patch, a shell command, the center's get_my_work
    (found by name among Codex's tools, as a model would), each result appended as text."""
    patch = "*** Begin Patch\n*** Add File: fenced.txt\n+written\n*** End Patch\n"
    return "\n".join(
        [
            f"text(JSON.stringify(await tools.apply_patch({json.dumps(patch)})));",
            f"const ran = await tools.exec_command({{cmd: {json.dumps(shell)}}});",
            "text('exit_code=' + ran.exit_code);",
            "const name = ALL_TOOLS.map(t => t.name).find(n => n.endsWith('get_my_work'));",
            "text('tool=' + name);",
            "text('work=' + JSON.stringify(await tools[name]({})));",
        ]
    )


def test_codex_fenced_writes_runs_and_calls_the_center(
    tmp_path_factory: pytest.TempPathFactory, own_center: DevCenter
) -> None:
    center = own_center
    sv = Supervised(tmp_path_factory.mktemp("fenced-codex"), center)
    agent = center.agent_id  # the agent the reference center knows
    workspace = sv.workspace(agent)
    # the command runs, and inside the fence: the worker token file is not there for it
    shell = f"id -u > ran.txt; test -e {sv.token_file} || echo hidden > hidden.txt"
    with ResponsesStandIn("done", [Code(turn_script(shell)), Say("done")]).running() as model:
        command = [
            str(CODEX), "exec", "--disable", "daemon_auto_start",
            "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "--json", "Do the task.",
        ]  # fmt: skip
        # the model's address only as the variable: the supervisor's config.toml carries it
        env = {
            "OPENAI_API_KEY": "sk-standin-not-a-key-0123456789",
            "OPENAI_BASE_URL": model.base_url,
        }
        sv.write_fleet(
            [{"id": agent, "client": "codex", "runner": "process", "command": command}],
            restart="never",
            env=env,
        )
        try:
            log = fenced_turn(sv, agent)
            outputs = [o for body in model.responses for o in tool_outputs(body)]
            assert (workspace / "fenced.txt").read_text() == "written\n", (log, outputs)
            assert (workspace / "ran.txt").read_text().strip().isdigit(), (log, outputs)
            assert (workspace / "hidden.txt").read_text() == "hidden\n", (log, outputs)
            heard = center_heard(center, agent, "get_my_work")
            assert heard, (log, outputs)
            assert len(outputs) == 1 and "exit_code=0" in outputs[0], outputs
            # the center's answer reached the model
            assert "tool=mcp__agent_center__get_my_work" in outputs[0], outputs
            assert "tasks" in outputs[0] and '"isError":false' in outputs[0], outputs
            assert '"type":"turn.completed"' in log.replace(" ", ""), log  # `--json` events
            assert sv.status()[agent]["state"] == "stopped", (sv.status()[agent], log)
        finally:
            sv.close()
            shutil.rmtree(sv.state, ignore_errors=True)
