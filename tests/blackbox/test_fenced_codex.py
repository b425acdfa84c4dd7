"""Issues 21 and 25: the real Codex CLI, with its own sandbox, completes a turn inside the fence.

One real supervisor with the default `sandbox = "auto"` runs one agent: Codex non-interactively
(`codex exec`, a process agent) with the config the supervisor writes in its `CODEX_HOME` (the
agent-center MCP server) and the sign-in it writes from `env`'s `OPENAI_API_KEY`, its model API
a loopback stand-in (`mcphost/standin/responses.py`), whose address the agent's `env` gives only as
`OPENAI_BASE_URL`: Codex 0.171 ignores that variable, so this also shows the supervisor carry it
into `config.toml` as Codex's `openai_base_url`. Codex 0.171 offers the model one `exec` tool
("code mode": JavaScript calling the nested tools), so the stand-in's one tool turn is a script
that writes a file with `apply_patch`, runs a shell command with `exec_command` and calls the
center's `get_my_work` through the MCP server, then the turn ends.

Codex keeps its own sandbox and approvals (no `--dangerously-bypass-approvals-and-sandbox`):
- `default`: no sandbox or approval flag at all. Measured with Codex 0.171: `codex exec` in a
  directory no config trusts runs `read-only` with approval `never` (its session record's
  `turn_context` says so, and the test checks it there), so the command runs but writes
  nothing, and the patch is refused;
- `workspace-write` (`--sandbox workspace-write`, what Codex picks for a trusted project): the
  patch and the command's output file land in the workspace.
Either way Codex's own sandbox (its bubblewrap, user and PID namespaces, seccomp) runs the
command inside the fence, and the command shows it: it is one PID namespace deeper than the
agent, under a seccomp filter (the fence sets none), and refused a write to the agent's home,
which the fence allows. It also shows the nested sandbox sees no more than the fence: the worker
token file is not there, nor the state file, and of the agents' homes only its own. Codex's
sandbox gets no /proc of its own here (fence.py: a uid-0 agent's nested sandboxes share its
/proc, which shows only the agent's own processes); Codex falls back to that by itself.

The state directory is not under /tmp: Codex refuses to create its helper links (the
`codex-linux-sandbox` it runs inside bubblewrap) in a `CODEX_HOME` beneath the temporary
directory, and then no sandboxed command can start ("execvp codex-linux-sandbox: No such file").
No `HOME` is given: a fenced agent gets its home as `HOME`.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest

from mcphost.standin.responses import Code, ResponsesStandIn, Say, tool_outputs
from mcphost.supervisor.confine import probe as machine
from mcphost.testing import DevCenter
from tests.blackbox.conftest import listed_agents, project_root, sandbox_probe
from tests.supervisor.supervise_harness import Supervised, center_heard, fenced_turn

CODEX = project_root() / "tools" / "node_modules" / ".bin" / "codex"

# deep (make test-slow): the real Codex CLI, sandboxed by itself, completing a turn in the fence.
pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(not CODEX.exists(), reason=f"{CODEX} missing: run `make node`"),
    pytest.mark.skipif(
        machine.probe().missing() is not None, reason=f"no fence here: {machine.probe().missing()}"
    ),
]

PATCH = "*** Begin Patch\n*** Add File: fenced.txt\n+written\n*** End Patch\n"


def turn_script(shell: str) -> str:
    """The JavaScript of the tool turn: a patch, a shell command, the center's get_my_work
    (found by name among Codex's tools, as a model would), each result appended as text; a
    step Codex refuses is recorded, and the script goes on."""
    return "\n".join(
        [
            f"try {{ text('patch=' + JSON.stringify(await tools.apply_patch({json.dumps(PATCH)})));"
            " } catch (e) { text('patch_error=' + e); }",
            f"const ran = await tools.exec_command({{cmd: {json.dumps(shell)}}});",
            "text('exit_code=' + ran.exit_code);",
            "text('output=' + ran.output);",
            "const name = ALL_TOOLS.map(t => t.name).find(n => n.endsWith('get_my_work'));",
            "text('tool=' + name);",
            "text('work=' + JSON.stringify(await tools[name]({})));",
        ]
    )


def probe(sv: Supervised) -> str:
    """The shell command: what it can reach and write, and whose sandbox it is in."""
    return "; ".join(
        [
            *sandbox_probe(sv.token_file, sv.state),
            "(echo x > ran.txt) 2>/dev/null && echo workspace-written || echo workspace-refused",
            "true",
        ]
    )


def turn_context(sv: Supervised, agent: str) -> dict[str, Any]:
    """The `turn_context` of Codex's one session record (its CODEX_HOME's sessions/)."""
    records = list((sv.state / "agents" / agent / "codex" / "sessions").rglob("rollout-*.jsonl"))
    assert len(records) == 1, records
    for line in records[0].read_text().splitlines():
        entry = json.loads(line)
        if entry.get("type") == "turn_context":
            return dict(entry["payload"])
    raise AssertionError(f"no turn_context in {records[0]}")


@pytest.mark.parametrize(
    ("flags", "policy"),
    [([], "read-only"), (["--sandbox", "workspace-write"], "workspace-write")],
    ids=["default", "workspace-write"],
)
def test_codex_sandboxed_by_itself_runs_a_command_inside_the_fence(
    tmp_path_factory: pytest.TempPathFactory,
    own_center: DevCenter,
    flags: list[str],
    policy: str,
) -> None:
    center = own_center
    sv = Supervised(tmp_path_factory.mktemp("fenced-codex"), center, state_parent="/var/tmp")
    agent = center.agent_id  # the agent the reference center knows
    workspace = sv.workspace(agent)
    script = [Code(turn_script(probe(sv))), Say("done")]
    with ResponsesStandIn("done", script).running() as model:
        command = [
            str(CODEX), "exec", "--disable", "daemon_auto_start", "--skip-git-repo-check",
            *flags, "--json", "Do the task.",
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
            assert len(outputs) == 1, (log, outputs)
            out = outputs[0]
            context = turn_context(sv, agent)
            # Codex's own settings: approval never, and the sandbox policy asked for (default:
            # read-only)
            assert context["approval_policy"] == "never", context
            assert context["sandbox_policy"]["type"] == policy, context
            # the command ran, inside Codex's sandbox: one PID namespace below the agent's (two
            # pids seen from the agent's /proc), a seccomp filter, the agent's home refused
            assert "exit_code=0" in out, out
            nspid = [line for line in out.splitlines() if line.startswith("NSpid:")]
            assert len(nspid) == 1 and len(nspid[0].split()) == 3, out
            assert "Seccomp:\t2" in out and "home-refused" in out, out
            assert not (sv.state / "agents" / agent / "home-probe").exists()
            # and it saw no more than the fence: no token, no state file, at most its own home
            # (a root supervisor's agent, of its own uid, may not list the fence's directory)
            assert "token-hidden" in out and "state-hidden" in out, out
            assert listed_agents(out) == ([] if os.geteuid() == 0 else [agent]), out
            if policy == "workspace-write":
                assert "workspace-written" in out, out
                assert (workspace / "ran.txt").read_text() == "x\n", out
                assert (workspace / "fenced.txt").read_text() == "written\n", out
            else:
                assert "workspace-refused" in out and "read-only sandbox" in out, out
                assert (
                    not (workspace / "ran.txt").exists() and not (workspace / "fenced.txt").exists()
                )
            # the center heard the agent's MCP call, and its answer reached the model
            assert center_heard(center, agent, "get_my_work"), (log, out)
            assert "tool=mcp__agent_center__get_my_work" in out, out
            assert "tasks" in out and '"isError":false' in out, out
            assert '"type":"turn.completed"' in log.replace(" ", ""), log  # `--json` events
            assert sv.status()[agent]["state"] == "stopped", (sv.status()[agent], log)
        finally:
            sv.close()
            shutil.rmtree(sv.state, ignore_errors=True)
