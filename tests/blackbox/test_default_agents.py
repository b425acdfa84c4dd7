"""Issue 19: the fleet's default agents — `client = "claude"` and `client = "codex"` without a
`command` — stay up as the interactive sessions a worker runs, with the real CLIs.

A real `mcphost supervise` runs one default Claude Code agent and one default Codex agent
(`runner` not given: "auto" puts each in a tmux pane of its own). Each agent's `env` points its
client at a loopback model stand-in (`mcphost/standin/anthropic.py`, `mcphost/standin/responses.py`) with a dummy key.
The Claude Code agent's `CLAUDE_CONFIG_DIR` is prepared as a worker's would be (onboarding done,
the workspace trusted, the key approved); the Codex agent gets nothing but `OPENAI_API_KEY` in
its `env`: the supervisor writes its sign-in (homes.py), so its pane must show Codex past the
sign-in screen.

The spec is a duration: each agent stays `running`, with 0 restarts and the same pid, for 30 s
of monotonic time, observed by polling `ctl status`; and each attached its MCP servers
(`sessions` > 0). Skipped, with the reason, where the CLIs or tmux are absent.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcphost.standin.anthropic import ModelStandIn, Say
from mcphost.standin.responses import ResponsesStandIn
from mcphost.testing import DevCenter
from tests.blackbox.conftest import QUIET, needs_clis, project_root
from tests.supervisor.supervise_harness import Supervised, give_to
from tests.waiting import until

BIN = project_root() / "tools" / "node_modules" / ".bin"
CLAUDE, CODEX = BIN / "claude", BIN / "codex"
OBSERVE = 30.0  # seconds each agent must stay up: the spec
SIGN_IN = ("Sign in with ChatGPT", "Sign in with Device Code", "Provide your own API key")

# deep (make test-slow): the real Claude Code and Codex TUIs kept up 30 s each.
pytestmark = needs_clis(CLAUDE, CODEX)


def claude_config_dir(directory: Path, workspace: Path, key: str) -> Path:
    """Claude Code's settings as a worker prepares them once: onboarding done, the agent's
    workspace trusted, the API key approved (else an interactive Claude Code asks each)."""
    directory.mkdir(parents=True, mode=0o700)
    state = {
        "hasCompletedOnboarding": True,
        "projects": {str(workspace): {"hasTrustDialogAccepted": True}},
        "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []},
    }
    (directory / ".claude.json").write_text(json.dumps(state))
    return directory


@pytest.fixture
def models() -> Iterator[tuple[ModelStandIn, ResponsesStandIn]]:
    with (
        ModelStandIn([Say("ok")]).running() as anthropic,
        ResponsesStandIn().running() as openai,
    ):
        yield anthropic, openai


@pytest.fixture
def sv(own_center: DevCenter, tmp_path: Path) -> Iterator[Supervised]:
    supervised = Supervised(tmp_path, own_center)
    try:
        yield supervised
    finally:
        supervised.close()
        shutil.rmtree(supervised.state, ignore_errors=True)


def daemons(codex_home: Path) -> list[str]:
    """Codex app-server daemons of `codex_home` (a detached daemon leaves the agent's tree)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path("/proc", entry, "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            text = cmdline.decode(errors="replace")
            if "app-server" in text and str(codex_home) in text:
                found.append(f"{entry}: {text}")
    return found


def screen(sv: Supervised, agent_id: str) -> str:
    """The agent's pane as `ctl logs` shows it (the running pane's screen, captured now)."""
    return sv.ctl("logs", agent_id, "--lines", "200").stdout


def test_default_claude_and_codex_agents_stay_up_attached_and_codex_past_sign_in(
    sv: Supervised, models: tuple[ModelStandIn, ResponsesStandIn], tmp_path: Path
) -> None:
    anthropic, openai = models
    claude_key = "sk-ant-standin-not-a-key-0123456789"
    homes = tmp_path / "homes"
    # the default commands are found on the supervisor's PATH, as a worker installs them
    path = os.pathsep.join((str(BIN), os.environ.get("PATH", "/usr/bin:/bin")))
    sv.extra_env["PATH"] = path
    base = {"PATH": path, **QUIET}
    claude_env = {
        **base,
        "HOME": str(homes / "claude"),
        "CLAUDE_CONFIG_DIR": str(
            claude_config_dir(homes / "claude" / ".claude", sv.workspace("claude-1"), claude_key)
        ),
        "ANTHROPIC_BASE_URL": anthropic.base_url,
        "ANTHROPIC_API_KEY": claude_key,
    }
    (homes / "codex").mkdir(parents=True)
    # a fleet-given HOME is the agent's to write: under a root supervisor, its own uid's
    give_to(homes / "claude", "claude-1")
    give_to(homes / "codex", "codex-1")
    codex_env = {
        **base,
        "HOME": str(homes / "codex"),
        "OPENAI_BASE_URL": openai.base_url,
        "OPENAI_API_KEY": "sk-standin-not-a-key-0123456789",
    }
    # the samples' shape: a client, no command, no runner
    sv.write_fleet(
        [
            {"id": "claude-1", "client": "claude", "env": claude_env},
            {"id": "codex-1", "client": "codex", "env": codex_env},
        ],
        max_restarts=1000,  # a crash loop shows as restarts, never hides as `failed`
    )
    sv.start()
    agents = ("claude-1", "codex-1")

    def attached() -> dict[str, dict[str, Any]] | None:
        rows = sv.status()
        for agent_id in agents:
            row = rows[agent_id]
            assert row["restarts"] == 0 and row["state"] in ("starting", "running"), (
                row,
                screen(sv, agent_id) if row["state"] == "running" else "",
                sv.stderr()[-3000:],
            )
        if all(rows[a]["state"] == "running" and rows[a]["sessions"] > 0 for a in agents):
            return rows
        return None

    first = until(attached, 120, "both default agents running with their MCP servers attached")
    pids = {a: first[a]["pid"] for a in agents}
    # The spec is a duration: 30 s of monotonic time, each poll must see both still up.
    start = time.monotonic()
    polls = 0
    while time.monotonic() - start < OBSERVE:
        rows = sv.status()
        polls += 1
        for agent_id in agents:
            row = rows[agent_id]
            assert (row["state"], row["restarts"], row["pid"]) == ("running", 0, pids[agent_id]), (
                row,
                sv.stderr()[-3000:],
            )
            assert row["sessions"] > 0, row
        time.sleep(0.5)
    assert polls >= 2
    # every process of the Codex agent stayed in its tree: no detached app-server daemon
    assert daemons(sv.state / "agents" / "codex-1" / "codex") == []
    # Codex's pane: past its sign-in screen, on its prompt
    codex_screen = screen(sv, "codex-1")
    assert "OpenAI Codex" in codex_screen, codex_screen
    assert not any(text in codex_screen for text in SIGN_IN), codex_screen
    # Claude Code's pane: its interactive prompt, no onboarding or trust question
    claude_screen = screen(sv, "claude-1")
    assert "Claude Code" in claude_screen, claude_screen
    assert "trust" not in claude_screen.lower(), claude_screen
    # a graceful stop ends each agent's own tmux server with its session
    assert sv.terminate() == 0, sv.stderr()[-3000:]
    assert sorted((sv.state / "tmux").glob("*/tmux.sock")) == []
