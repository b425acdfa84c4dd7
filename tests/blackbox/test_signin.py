"""Issue 25 (part 4): default agents start signed in, with the real Claude Code and Codex.

A real `mcphost supervise` (fenced, the default) runs agents with no `command` and no `env`:
each is the interactive client in a tmux pane of its own, with its own home as `HOME`. The
supervisor's `HOME` is a fake operator's: Claude Code signed in there (`.claude.json` with the
onboarding and account keys beside a history of the operator's own folders, and
`.claude/.credentials.json` with a fake OAuth token beside an MCP server's token), and Codex
signed in with an API key (`.codex/auth.json`). The model APIs are loopback stand-ins
(`mcphost/standin/anthropic.py`, `mcphost/standin/responses.py`) that record the credential of each request.

- Signed in as the operator: two default claude agents start on Claude Code's prompt (no
  onboarding, no trust question, no sign-in screen); a line typed into one's pane reaches the
  stand-in with the operator's OAuth token; after the operator's sign-in is refreshed and the
  supervisor restarted, the other agent's next turn uses the refreshed token. Each agent reads
  its own copy; neither home holds the operator's history, the MCP server's token or the other
  agent's session, and one agent cannot see the other's home.
- A key in `[defaults].env` (no operator sign-in): the default claude agent starts past Claude
  Code's "use this API key?" question and its turn reaches the stand-in with that key.
- A default codex agent whose `env` gives only the stand-in's address starts past Codex's
  sign-in screen with the operator's `auth.json`, and its turn reaches the stand-in with the
  operator's key.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mcphost.standin.anthropic import ModelStandIn, Say
from mcphost.standin.responses import ResponsesStandIn
from mcphost.supervisor.agents import signin
from mcphost.testing import DevCenter
from tests.blackbox.conftest import QUIET, needs_clis, project_root
from tests.supervisor.supervise_harness import Supervised
from tests.waiting import until

BIN = project_root() / "tools" / "node_modules" / ".bin"
CLAUDE, CODEX = BIN / "claude", BIN / "codex"
SIGN_IN = ("Sign in with ChatGPT", "Sign in with Device Code", "Provide your own API key")
CLAUDE_FIRST_RUN = ("trust this folder", "Select login method", "Choose the text style", "API key")
TOKEN = "sk-ant-oat01-operator-fake-access-token"
SECRETS = (b"secret-project", b"hunter2", b"mcp-server-token", b"operator-history-line")

# deep (make test-slow): the real Claude Code and Codex TUIs, each through a turn.
pytestmark = needs_clis(CLAUDE, CODEX)


def credentials(token: str) -> dict[str, Any]:
    return {
        "claudeAiOauth": {
            "accessToken": token,
            "refreshToken": "sk-ant-ort01-operator-fake-refresh",
            "expiresAt": 4102444800000,  # far ahead: no refresh is tried
            "scopes": ["user:inference", "user:profile"],
            "subscriptionType": "max",
        },
        "mcpOAuth": {"private|0": {"accessToken": "mcp-server-token"}},
    }


def operator_home(root: Path, *, claude: bool = True, codex_key: str | None = None) -> Path:
    """A fake operator's HOME: Claude Code signed in (with history), Codex signed in with a key."""
    home = root / "operator"
    (home / ".claude" / "projects" / "-srv-secret-project").mkdir(parents=True)
    if claude:
        record = {
            "hasCompletedOnboarding": True,
            "lastOnboardingVersion": "2.1.332",
            "userID": "operator-user-id",
            "oauthAccount": {
                "accountUuid": "00000000-0000-4000-8000-000000000001",
                "emailAddress": "operator@example.com",
                "organizationUuid": "00000000-0000-4000-8000-000000000002",
                "organizationName": "Operator's org",
            },
            "projects": {
                "/srv/secret-project": {
                    "hasTrustDialogAccepted": True,
                    "history": [{"display": "the password is hunter2"}],
                }
            },
        }
        (home / ".claude.json").write_text(json.dumps(record))
        (home / ".claude" / ".credentials.json").write_text(json.dumps(credentials(TOKEN)))
    (home / ".claude" / "history.jsonl").write_text('{"display": "operator-history-line"}\n')
    session = home / ".claude" / "projects" / "-srv-secret-project" / "s.jsonl"
    session.write_text('{"message": "secret-project hunter2"}\n')
    if codex_key is not None:
        (home / ".codex").mkdir()
        auth = {"auth_mode": "apikey", "OPENAI_API_KEY": codex_key}
        (home / ".codex" / "auth.json").write_text(json.dumps(auth))
    return home


@pytest.fixture
def sv(
    own_center: DevCenter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Supervised]:
    for name in ("CLAUDE_CONFIG_DIR", "CODEX_HOME", *signin.INHERITED):
        monkeypatch.delenv(name, raising=False)  # the test's own sign-in stays out
    supervised = Supervised(tmp_path, own_center)
    # the default commands are found on the supervisor's PATH, as a worker installs them
    supervised.extra_env.update(PATH=os.pathsep.join((str(BIN), os.environ["PATH"])), **QUIET)
    try:
        yield supervised
    finally:
        supervised.close()
        shutil.rmtree(supervised.state, ignore_errors=True)


def screen(sv: Supervised, agent_id: str) -> str:
    return sv.ctl("logs", agent_id, "--lines", "200", check=False).stdout


def on_prompt(sv: Supervised, agent_id: str, ready: str) -> str:
    """Wait for `agent_id` to run with its MCP servers attached and its pane to show `ready`."""

    def shown() -> str | None:
        row = sv.status()[agent_id]
        assert row["restarts"] == 0, (row, screen(sv, agent_id), sv.stderr()[-3000:])
        if row["state"] != "running" or not row["sessions"]:
            return None
        text = screen(sv, agent_id)
        return text if ready in text else None

    return until(shown, 120, f"{agent_id} on its prompt, attached")


def type_until(sv: Supervised, agent_id: str, line: str, seen: Callable[[], bool]) -> None:
    """Type `line` and Enter into the agent's pane until `seen()` (a TUI may drop keys typed
    while it still starts)."""
    sock = str(sv.state / "tmux" / agent_id / "tmux.sock")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        subprocess.run(["tmux", "-S", sock, "send-keys", "-t", agent_id, "-l", line], check=True)
        time.sleep(0.3)
        subprocess.run(["tmux", "-S", sock, "send-keys", "-t", agent_id, "Enter"], check=True)
        try:
            until(seen, 20, f"{agent_id}'s turn at the stand-in")
            return
        except AssertionError:
            continue
    raise AssertionError(f"{agent_id}'s turn never reached the stand-in:\n{screen(sv, agent_id)}")


def files_of(root: Path) -> dict[str, bytes]:
    found = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            found[str(path.relative_to(root))] = path.read_bytes()
    return found


def test_default_claude_agents_start_signed_in_as_the_operator_each_with_its_own_copy(
    sv: Supervised, tmp_path: Path
) -> None:
    with ModelStandIn([Say("hello from the stand-in")]).running() as model:
        operator = operator_home(tmp_path)
        sv.extra_env.update(HOME=str(operator), ANTHROPIC_BASE_URL=model.base_url)
        agents = ("claude-1", "claude-2")
        sv.write_fleet([{"id": a, "client": "claude"} for a in agents], max_restarts=1000)
        sv.start()
        for agent_id in agents:
            text = on_prompt(sv, agent_id, "Claude Code")
            assert not any(s.lower() in text.lower() for s in CLAUDE_FIRST_RUN), text
        # a turn of claude-1 reaches the model as the operator's sign-in
        type_until(sv, "claude-1", "marker-claude-1-prompt", lambda: bool(model.credentials))
        assert set(model.credentials) == {f"Bearer {TOKEN}"}, model.credentials
        until(lambda: "hello from the stand-in" in screen(sv, "claude-1"), 60, "the answer")

        homes = {a: sv.state / "agents" / a for a in agents}
        mine = files_of(homes["claude-1"])
        assert any(b"marker-claude-1-prompt" in data for data in mine.values())  # its history
        for agent_id, home in homes.items():
            copy = json.loads((home / ".claude" / ".credentials.json").read_text())
            assert copy == {"claudeAiOauth": credentials(TOKEN)["claudeAiOauth"]}
            record = json.loads((home / ".claude.json").read_text())
            assert record["oauthAccount"]["emailAddress"] == "operator@example.com"
            assert list(record["projects"]) == [str(home / "workspace")], record["projects"]
            for name, data in files_of(home).items():
                assert not any(s in data for s in SECRETS), (agent_id, name)
        for name, data in files_of(homes["claude-2"]).items():
            assert b"marker-claude-1-prompt" not in data, name
        # from inside claude-2: its own copy is there, claude-1's home is not
        inside = sv.ctl(
            "exec", "claude-2", "--", "sh", "-c",
            f'cat "$HOME/.claude/.credentials.json"; ls {homes["claude-1"]} 2>&1; '
            f"ls {operator} 2>&1; true",
        ).stdout  # fmt: skip
        assert TOKEN in inside and "mcp-server-token" not in inside, inside
        assert inside.count("No such file or directory") == 2, inside

        # The operator's sign-in is refreshed; at the next start each agent gets the new one.
        refreshed = "sk-ant-oat01-operator-refreshed-token"
        (operator / ".claude" / ".credentials.json").write_text(json.dumps(credentials(refreshed)))
        assert sv.terminate() == 0, sv.stderr()[-3000:]
        sv.start()
        on_prompt(sv, "claude-2", "Claude Code")
        before = len(model.credentials)
        type_until(sv, "claude-2", "marker-claude-2", lambda: len(model.credentials) > before)
        assert set(model.credentials[before:]) == {f"Bearer {refreshed}"}, model.credentials


def test_a_key_in_the_fleet_signs_a_default_claude_agent_in_without_a_question(
    sv: Supervised, tmp_path: Path
) -> None:
    key = "sk-ant-api03-standin-not-a-key-0123456789"
    with ModelStandIn([Say("answered with the key")]).running() as model:
        empty = tmp_path / "nobody-signed-in"
        empty.mkdir()
        sv.extra_env["HOME"] = str(empty)
        env = {"ANTHROPIC_API_KEY": key, "ANTHROPIC_BASE_URL": model.base_url}
        sv.write_fleet([{"id": "claude-1", "client": "claude"}], max_restarts=1000, env=env)
        sv.start()
        text = on_prompt(sv, "claude-1", "Claude Code")
        assert not any(s.lower() in text.lower() for s in CLAUDE_FIRST_RUN), text
        type_until(sv, "claude-1", "hello", lambda: bool(model.credentials))
        assert set(model.credentials) == {f"x-api-key {key}"}, model.credentials
        home = sv.state / "agents" / "claude-1"
        assert not (home / ".claude" / ".credentials.json").exists()
        record = json.loads((home / ".claude.json").read_text())
        assert record["customApiKeyResponses"]["approved"] == [key[-20:]]


def test_a_default_codex_agent_starts_signed_in_with_the_operator_s_auth(
    sv: Supervised, tmp_path: Path
) -> None:
    key = "sk-operator-codex-key-not-a-key-0123456789"
    with ResponsesStandIn("answered for the operator").running() as model:
        sv.extra_env["HOME"] = str(operator_home(tmp_path, claude=False, codex_key=key))
        agent = {"id": "codex-1", "client": "codex", "env": {"OPENAI_BASE_URL": model.base_url}}
        sv.write_fleet([agent], max_restarts=1000)
        sv.start()
        text = on_prompt(sv, "codex-1", "OpenAI Codex")
        assert not any(s in text for s in SIGN_IN), text
        type_until(sv, "codex-1", "hello", lambda: bool(model.credentials))
        assert set(model.credentials) == {f"Bearer {key}"}, model.credentials
        auth = sv.state / "agents" / "codex-1" / "codex" / "auth.json"
        assert json.loads(auth.read_text()) == {"auth_mode": "apikey", "OPENAI_API_KEY": key}
        assert (auth.stat().st_mode & 0o777) == 0o600
