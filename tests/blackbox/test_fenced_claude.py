"""Issues 21 and 25: the real Claude Code, with its own sandbox on, completes a turn in the fence.

One real supervisor with the default `sandbox = "auto"` runs one agent: Claude Code in print
mode (`claude -p`, a process agent) with its generated attach config and its sandbox enabled
(`--settings`: `sandbox.enabled`, and `sandbox.failIfUnavailable`, so that a sandbox that cannot
start stops Claude Code instead of letting it run commands unsandboxed), its model API a loopback
stand-in (`mcphost/standin/anthropic.py`) whose script makes it write a file in the workspace with its Write
tool, run a shell command with its Bash tool, load and call the center's `get_my_work` through
its MCP server, then end the turn. The file and the command's output land in the workspace, the
center hears the call as the agent (and answers it), Claude Code exits 0.

The Bash command runs in Claude Code's own bubblewrap sandbox inside the fence, and shows it: it
runs under a seccomp filter (the fence sets none), is refused a write to the agent's home (which
the fence allows), and sits in a PID namespace of Claude Code's (through the agent's /proc, its
pids go deeper than the agent's; with a /proc of its own, it does not see Claude Code at all).
It sees no more than the fence: no worker token file, no state file, of the agents' homes only
its own.

Three supervisors:
- `unprivileged`: run as nobody (as this user when the test is not root). Claude Code's
  sandbox, with no setting beyond those two, mounts a /proc of its own: the command does not
  see Claude Code's process.
- `root-weaker`: a root supervisor, whose default agent is uid 0 outside. There the fence keeps
  the agent's /proc partly covered, so no nested sandbox mounts one of its own (fence.py: that
  would give uid 0 the sysctls back), and Claude Code needs `sandbox.enableWeakerNestedSandbox` (Claude Code's documented
  switch for hosts that cannot mount a /proc; it binds the agent's /proc, which shows only the
  agent's own processes).
- `root-default`: the same without that switch, to pin why it is needed: Claude Code's bubblewrap
  cannot mount its /proc, so the command fails and nothing runs unsandboxed.
No `HOME` is given: a fenced agent gets its home as `HOME`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from mcphost.standin.anthropic import ModelStandIn, Say, ToolUse
from mcphost.supervisor.confine import probe as machine
from mcphost.testing import DevCenter
from tests.blackbox.conftest import listed_agents, project_root, sandbox_probe
from tests.supervisor.confine.test_fence import AsUser
from tests.supervisor.supervise_harness import REPO, Supervised, center_heard, fenced_turn

CLAUDE = project_root() / "tools" / "node_modules" / ".bin" / "claude"
GET_MY_WORK = "mcp__agent-center__get_my_work"
ROOT = os.geteuid() == 0
NOBODY = machine.nobody_uid()

# deep (make test-slow): the real Claude Code, sandboxed by itself, completing a turn in the fence.
pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed"),
    pytest.mark.skipif(
        machine.probe().missing() is not None, reason=f"no fence here: {machine.probe().missing()}"
    ),
]


def probe(sv: Supervised) -> str:
    """The Bash command: what it can reach and write, and whose sandbox and /proc it is in."""
    return "; ".join(
        [
            *sandbox_probe(sv.token_file, sv.state, grep="command grep"),
            # Claude Code's own process, found by one of its arguments, spelled so that no
            # argv of this command's own processes holds it
            "claude=invisible; for f in /proc/[0-9]*/cmdline; do"
            " case \"$(tr '\\0' ' ' 2>/dev/null < $f) \" in"
            ' *" --strict-mcp-$(echo config) "*) claude=visible;; esac; done',
            'echo "claude-$claude"',
            "echo x > ran.txt",
        ]
    )


def supervised(kind: str, base: Path, center: DevCenter) -> Supervised:
    """The supervisor of `kind`: as root, or unprivileged (nobody when the test is root)."""
    if kind == "unprivileged" and ROOT:
        # a base nobody can reach (pytest's own directories are root's, 0700)
        return AsUser(Path(tempfile.mkdtemp(prefix="fenced-claude-")), center, NOBODY)
    return Supervised(base, center)


def write_fleet(
    sv: Supervised, center: DevCenter, agent: dict[str, object], env: dict[str, str]
) -> None:
    sv.write_fleet([agent], restart="never", env=env)
    uid = getattr(sv, "uid", None)
    if uid is not None:  # the tcp:// binding, which a supervisor of any uid reaches (pinned)
        text = sv.fleet.read_text().replace(
            f'admin_url = "{center.admin_url("unix")}"',
            f'admin_url = "{center.admin_url("tcp")}"\nfingerprint = "{center.fingerprint}"',
        )
        sv.fleet.write_text(text)
        os.chown(sv.fleet, uid, uid)
        sv.extra_env.setdefault("PYTHONPATH", REPO)


@pytest.mark.parametrize(
    "kind",
    [
        "unprivileged",
        pytest.param("root-weaker", marks=pytest.mark.skipif(not ROOT, reason="needs root")),
        pytest.param("root-default", marks=pytest.mark.skipif(not ROOT, reason="needs root")),
    ],
)
def test_claude_code_sandboxed_by_itself_runs_a_command_inside_the_fence(
    tmp_path_factory: pytest.TempPathFactory, own_center: DevCenter, kind: str
) -> None:
    center = own_center
    if not CLAUDE.exists():
        pytest.fail(f"{CLAUDE} missing: run `make node` (make test does it)")
    sv = supervised(kind, tmp_path_factory.mktemp("fenced-claude"), center)
    agent = center.agent_id  # the agent the reference center knows
    workspace = sv.workspace(agent)
    home = sv.state / "agents" / agent
    script = [
        ToolUse("Write", {"file_path": str(workspace / "fenced.txt"), "content": "written\n"}),
        ToolUse("Bash", {"command": probe(sv), "description": "probe the sandbox"}),
        # Claude Code defers MCP tools behind its own ToolSearch (test_claude_code.py)
        ToolUse("ToolSearch", {"query": f"select:{GET_MY_WORK}"}),
        ToolUse(GET_MY_WORK, {}),
        Say("done"),
    ]
    sandbox = {"enabled": True, "failIfUnavailable": True}
    if kind == "root-weaker":
        sandbox["enableWeakerNestedSandbox"] = True
    settings = json.dumps({"sandbox": sandbox}).replace("{", "{{").replace("}", "}}")
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
            "--settings", settings, "--output-format", "json",
        ]  # fmt: skip
        agent_entry = {"id": agent, "client": "claude", "runner": "process", "command": command}
        write_fleet(sv, center, agent_entry, env)
        try:
            log = fenced_turn(sv, agent)
            results = [r for e in model.exchanges for r in e.tool_results]
            assert len(results) == 4, (log, results)
            write, bash, _, work = results
            assert not write["is_error"] and (workspace / "fenced.txt").read_text() == "written\n"
            out = bash["text"]
            if kind == "root-default":
                # Claude Code's bubblewrap asks for a /proc of its own, which the fence of a
                # uid-0 agent refuses: the command fails, and it never ran unsandboxed
                assert bash["is_error"] and "Can't mount proc" in out, bash
                assert not (workspace / "ran.txt").exists(), out
            else:
                assert not bash["is_error"], bash
                assert (workspace / "ran.txt").read_text() == "x\n", out
                # Claude Code's sandbox: seccomp, the home refused, and its PID namespace: with
                # a /proc of its own (where the agent is not uid 0 outside), the command sees
                # itself only there (one pid) and Claude Code not at all; through the agent's
                # /proc, it sits PID namespaces below the agent's and Claude Code is in view
                assert "Seccomp:\t2" in out and "home-refused" in out, out
                assert not (home / "home-probe").exists()
                nspid = [line.split()[1:] for line in out.splitlines() if line.startswith("NSpid:")]
                if kind == "unprivileged":
                    assert len(nspid) == 1 and len(nspid[0]) == 1, out
                    assert "claude-invisible" in out, out
                else:
                    assert len(nspid) == 1 and len(nspid[0]) >= 2, out
                    assert "claude-visible" in out, out
                # no more than the fence: no token, no state file, only its own home
                assert "token-hidden" in out and "state-hidden" in out, out
                # at most its own home (an agent of its own uid may not list the fence's 0711
                # directory, which root's bubblewrap made)
                assert listed_agents(out) == ([agent] if kind == "unprivileged" else []), out
            assert '"is_error":false' in log.replace(" ", ""), log
            assert center_heard(center, agent, "get_my_work"), (log, results)
            assert not work["is_error"] and '"tasks"' in work["text"], work  # the center's answer
        finally:
            sv.close()
            shutil.rmtree(sv.state, ignore_errors=True)
            if sv.base.name.startswith("fenced-claude-"):
                shutil.rmtree(sv.base, ignore_errors=True)
