"""Black-box: the real ACP adapters as bundle members of a real `mcphost supervise` (issue 26).

The bundle `party`: A, a tmux echo agent (policy `lead`: list, look, send and choose in its
home), and B, Zed's `claude-code-acp` or `codex-acp` (`runner = "acp"`, `client = "claude"` or
`"codex"`, no command: the supervisor's defaults, `homes.agent_argv`), fenced, signed in by the
supervisor with a stand-in key (its `env`), against its loopback model stand-in
(acp_adapters.py's scripts), with its own sandbox and approvals on. A's relay tools are driven
from inside A's tree (`RelayDriver`: pump -> supervisor -> relay -> B's `AcpSession` over B's
pipes).

A sends B a task. B calls the center's `get_my_work` through its own MCP servers (the attach
entries given in `session/new`, preapproved by the supervisor: no question is asked for them;
the center hears agent B at B's generation), then asks permission to run a shell command in its
workspace. A sees the request in `list decisions` (the adapter's options) and `choose`s:
- selected (allow once): the command ran, the turn ends, B is available again, and B's `look`
  shows the user prompt, the center call and the command as completed invocations, and the
  agent's final message;
- cancelled: the command never ran and the turn ends all the same; Claude Code fails the tool
  call ("Tool use aborted") and the model answers; Codex ends the turn (`stopReason`
  cancelled) before the command's tool call is ever sent, and says nothing more.
Both turns run in one party per adapter, in this order (the model's script holds both).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from configgen.model import CENTER_NAME, RELAY_NAME
from mcphost.standin.anthropic import ModelStandIn, ToolUse
from mcphost.standin.responses import Call, ResponsesStandIn
from mcphost.supervisor.agents.homes import ACP_ADAPTERS, codex_acp_native
from mcphost.supervisor.confine import probe as machine
from mcphost.testing.devcenter import DevCenter
from mcphost.testing.fleet import left_running
from tests.blackbox import acp_adapters as acp
from tests.blackbox.acp_adapters import FINAL, Client, StdioServer
from tests.blackbox.conftest import QUIET
from tests.blackbox.test_acp_adapters import COMMAND, COMMAND_OPTIONS
from tests.supervisor.agents.test_relayhost import ECHO_AGENT
from tests.supervisor.supervise_harness import (
    CHOOSING_POLICIES,
    RelayDriver,
    Supervised,
    inline,
    inner,
)
from tests.waiting import until

# deep (make test-slow): the real adapters (node, Claude Code, Codex) under a real supervisor.
pytestmark = [
    pytest.mark.deep,
    pytest.mark.timeout(600),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
    pytest.mark.skipif(
        not acp.CLAUDE_ACP.exists() or not acp.codex_acp_binary().exists(),
        reason="the ACP adapters are missing: run `make node`",
    ),
    pytest.mark.skipif(
        machine.probe().missing() is not None, reason=f"no fence here: {machine.probe().missing()}"
    ),
]

CLIENTS: list[Client] = ["claude", "codex"]
CENTER_TOOL = "get_my_work"
REFUSED = "echo refused > refused.txt"  # the second turn's command, answered cancelled
NOTE = "note from B " + uuid.uuid4().hex[:8]  # what B sends A with its relay tools
WAIT = 180  # a deadline only a hang reaches: Claude Code starts slowly on a busy machine


@dataclass
class Party:
    client: Client
    sv: Supervised
    center: DevCenter
    driver: RelayDriver

    def row(self) -> dict[str, Any]:
        return self.sv.status()["B"]

    def available(self) -> dict[str, Any]:
        """B's status row while it runs with its ACP session available, else {}."""
        row = self.row()
        return row if (row["state"], row["protocol_state"]) == ("running", "available") else {}

    def pending(self) -> list[dict[str, Any]]:
        pending = self.driver.ok("list", command="decisions")["pending_requests"]
        return [p for p in pending if p["target_session"] == "B@party"]

    def entries(self) -> list[dict[str, Any]]:
        look = self.driver.ok("look", target_session="B@party", lines=200)
        assert look["snapshot_format"] == "structured_entries_v1", look
        found: list[dict[str, Any]] = look["snapshot_entries"]
        return found


def model_for(client: Client) -> ModelStandIn:
    """The model stand-in for both turns: call the center, send A a note through the relay,
    run `COMMAND`, say FINAL; then call the center, run `REFUSED` (and, once refused, say FINAL
    if asked again)."""
    note = {"targets": ["A"], "message": NOTE}
    if client == "claude":
        center_tool = f"mcp__{CENTER_NAME}__{CENTER_TOOL}"
        first, meanwhile = acp.claude_turns(center_tool, {}, COMMAND)
        first.insert(1, ToolUse(f"mcp__{RELAY_NAME}__send", note, once_offered=True))
        second, _ = acp.claude_turns(center_tool, {}, REFUSED)
        return ModelStandIn([*first, *second], meanwhile=meanwhile)
    center = StdioServer(CENTER_NAME, sys.executable)
    relay = StdioServer(RELAY_NAME, sys.executable)
    first_codex = acp.codex_turns(center, CENTER_TOOL, {}, COMMAND)
    first_codex.insert(1, Call("send", note, namespace=relay.codex_namespace))
    return ResponsesStandIn(
        FINAL, [*first_codex, *acp.codex_turns(center, CENTER_TOOL, {}, REFUSED)]
    )


def b_env(client: Client, model: ModelStandIn) -> dict[str, str]:
    """B's fleet `env`: the running model's address and the stand-in key (the supervisor's
    sign-in writes it into B's home: Claude Code's approved key, Codex's `auth.json`)."""
    if client == "claude":
        return {
            **QUIET,
            "ANTHROPIC_BASE_URL": model.base_url,
            "ANTHROPIC_API_KEY": acp.STANDIN_CLAUDE_KEY,
        }
    return {"OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": acp.STANDIN_OPENAI_KEY}


@pytest.fixture(scope="module", params=CLIENTS)
def party(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Party]:
    client: Client = request.param
    base = tmp_path_factory.mktemp(f"acp-members-{client}")
    operator = Path(tempfile.mkdtemp(prefix="mcphost-op-"))
    (operator / "policies.toml").write_text(CHOOSING_POLICIES)
    with DevCenter.start(base / "center") as center, model_for(client).running() as model:
        center.bind("w-1", "B")
        # not beneath /tmp: Codex's helpers (acp_adapters.codex_adapter)
        sv = Supervised(base, center, state_parent="/var/tmp")
        sv.extra_env["AGENTMUX_CONFIGURATION_DIRECTORY"] = str(operator)
        # the adapters as an operator installs them: on PATH (find_command)
        path = os.environ.get("PATH", os.defpath)
        sv.extra_env["PATH"] = f"{acp.TOOLS / '.bin'}{os.pathsep}{path}"
        sv.write_fleet(
            [
                {"id": "A", "runner": "tmux", "policy": "lead", "command": inline(ECHO_AGENT, "A")},
                {"id": "B", "runner": "acp", "client": client, "env": b_env(client, model)},
            ],
            bundle="party",
            restart="always",
        )
        driver: RelayDriver | None = None
        try:
            sv.start()
            sv.wait_running("A")
            driver = RelayDriver(sv, "A")
            yield Party(client, sv, center, driver)
            driver.close()
            driver = None
            # a clean stop ends the adapter's whole tree (codex-acp's binary run directly)
            assert sv.terminate() == 0, sv.stderr()[-3000:]
            assert left_running(sv.state) == []
        finally:
            if driver is not None:
                driver.close()
            sv.close()
            shutil.rmtree(operator, ignore_errors=True)


def said(entry: dict[str, Any]) -> str:
    return "\n".join(entry.get("lines") or [])


def turn_of(party: Party, marker: str) -> list[dict[str, Any]]:
    """B's entries from the prompt that holds `marker` on."""
    found = party.entries()
    mine = [i for i, e in enumerate(found) if e["kind"] == "user" and marker in said(e)]
    assert mine, found
    return found[mine[-1] :]


def invocations(turn: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """The turn's invocations whose call (the merged `tool_call` frames) mentions `text`."""
    return [e for e in turn if e["kind"] == "invocation" and text in json.dumps(e["invocation"])]


def ask(party: Party, command: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Send B a task (marked); wait for its permission request (the command's); the marker,
    the pending choice, and B's status row when it was sent."""
    row = until(party.available, WAIT, "B available")
    marker = uuid.uuid4().hex[:8]
    sent = party.driver.ok("send", targets=["B"], message=f"task {marker}: run `{command}`")
    assert "delivered" in json.dumps(sent) or "queued" in json.dumps(sent), sent
    (choice,) = until(party.pending, WAIT, "B's permission request")
    details = choice["requested_details"]
    offered = [(o["option_id"], o["kind"]) for o in details["options"]]
    assert offered == COMMAND_OPTIONS[party.client], choice
    assert command in json.dumps(details["raw"]["toolCall"]), choice
    return marker, choice, row


def decide(party: Party, choice: dict[str, Any], outcome: str, option_id: str | None) -> None:
    decision: dict[str, Any] = {
        "choice_request_id": choice["choice_request_id"],
        "outcome": outcome,
    }
    if option_id is not None:
        decision["option_id"] = option_id
    chosen = party.driver.ok("choose", **decision)
    assert chosen["outcome"] == outcome and chosen["decided_by"] == "A@party", chosen


def finished(party: Party, marker: str, generation: int) -> list[dict[str, Any]]:
    """B's turn once B is available again at the same generation (the turn ended; no restart)."""
    until(party.available, WAIT, "B available again after its turn")
    assert party.row()["generation"] == generation, party.row()
    assert party.pending() == []
    return turn_of(party, marker)


def center_calls(party: Party, since: int) -> list[dict[str, Any]]:
    return [
        r
        for r in party.center.requests(1000)[since:]
        if r["route"].endswith(f"/{CENTER_TOOL}") and r["body"]["agent_id"] == "B"
    ]


def assert_center_call(
    party: Party, turn: list[dict[str, Any]], since: int, generation: int
) -> None:
    """The center heard B's call at B's generation, and B's turn shows it completed."""
    heard = center_calls(party, since)
    assert len(heard) == 1, heard
    headers = {k.lower(): v for k, v in heard[0]["headers"].items()}
    assert headers.get("x-ac-mcp-generation") == str(generation), heard[0]
    (call,) = [e for e in invocations(turn, CENTER_TOOL) if "ToolSearch" not in json.dumps(e)]
    assert call["status"] == "Completed" and call["result"]["status"] == "completed", call


def test_an_allowed_command_runs_and_the_turn_shows_it(party: Party) -> None:
    since = len(party.center.requests(1000))
    marker, choice, row = ask(party, COMMAND)
    # B runs its client's adapter by default; codex-acp's own binary, not its node wrapper
    argv = Path(f"/proc/{inner(row['pid'])}/cmdline").read_bytes().decode().split("\0")
    adapter = str(acp.TOOLS / ".bin" / ACP_ADAPTERS[party.client])
    expected = codex_acp_native(adapter) if party.client == "codex" else adapter
    assert expected in argv, argv
    workspace = party.sv.workspace("B")
    assert not (workspace / "ran.txt").exists()
    allow = next(i for i, kind in COMMAND_OPTIONS[party.client] if kind == "allow_once")
    decide(party, choice, "selected", allow)
    turn = finished(party, marker, row["generation"])
    assert (workspace / "ran.txt").read_text() == "ran\n", turn
    kinds = [e["kind"] for e in turn]
    assert kinds[0] == "user" and f"task {marker}" in said(turn[0]), turn
    assert_center_call(party, turn, since, row["generation"])
    (command,) = invocations(turn, COMMAND)
    assert command["status"] == "Completed" and command["result"]["status"] == "completed"
    # its relay tools too ran unasked (`send`, not read-only): A's pane shows the note
    (note,) = invocations(turn, NOTE)
    assert note["status"] == "Completed" and note["result"]["status"] == "completed", note
    until(
        lambda: NOTE in json.dumps(party.driver.ok("look", target_session="A@party")),
        WAIT,
        "B's note in A's pane",
    )
    agent = [said(e) for e in turn if e["kind"] == "agent"]
    assert agent and agent[-1].endswith(FINAL), turn


def test_a_cancelled_choice_is_a_refusal_in_the_turn(party: Party) -> None:
    since = len(party.center.requests(1000))
    marker, choice, row = ask(party, REFUSED)
    decide(party, choice, "cancelled", None)
    turn = finished(party, marker, row["generation"])
    assert not (party.sv.workspace("B") / "refused.txt").exists(), turn
    assert_center_call(party, turn, since, row["generation"])
    command = invocations(turn, REFUSED)
    agent = "\n".join(said(e) for e in turn if e["kind"] == "agent")
    if party.client == "claude":
        # the tool call failed, the model was told and answered
        (call,) = command
        assert call["status"] == "Completed" and call["result"]["status"] == "failed", call
        assert "Tool use aborted" in json.dumps(call["result"]), call
        assert agent.endswith(FINAL), turn
    else:
        # Codex ended the turn (stopReason cancelled): the command's call was never sent, and
        # the model was not asked again
        assert command == [], command
        assert FINAL not in agent, turn
