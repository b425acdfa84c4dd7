"""Issue 26: the real ACP adapters, Zed's `claude-code-acp` and `codex-acp`, driven as
subprocesses by the PyPI `agent-client-protocol` client, each against its loopback model
stand-in (acp_adapters.py says how each starts and what it is).

One prompt turn calls the `note` tool of an MCP server given in `session/new` (a stdio entry
{name, command, args, env}: acp_mcp_server.py, which records the call), then asks to run a
shell command that writes a file, which makes the adapter send `session/request_permission`,
then ends with a final message. No mcphost relay is involved: this pins what the relay's ACP
client will meet.

Measured (claude-code-acp 0.16.2 with its bundled Claude Code 2.1.44; codex-acp 0.16.0):
- Both advertise `loadSession`, and `session/load` in a new process replays the history
  (`user_message_chunk`, `agent_message_chunk`) before it answers; the next turn's model
  request carries the earlier turn. Neither echoes a live prompt as `user_message_chunk`.
- Both ask permission for an MCP tool too, in their default modes, unless the server is
  pre-approved (Claude Code: `permissions.allow` in its settings; Codex: the server's
  `default_tools_approval_mode = "approve"` in `config.toml`); Codex runs a tool annotated
  read-only (`readOnlyHint`) without asking, Claude Code asks for it all the same. Codex names
  a server's tools in the namespace `mcp__<server>` with `-` made `_` (`mcp__agent_center`).
- The permission requests: Claude Code's `toolCall` holds only `toolCallId`, `rawInput` and
  `title`, and its options are `allow_always` / `allow` / `reject` (kinds allow_always,
  allow_once, reject_once) for every tool; Codex's `toolCall` has `kind`, `status: pending`,
  `title`, `content` and `rawInput`, and its options depend on the action (a command:
  `approved` / `approved-execpolicy-amendment` / `abort`; an MCP tool: `approved` /
  `approved-for-session` / `approved-always` / `cancel`). Codex's JSON-RPC request ids are
  strings (UUIDs), Claude Code's integers.
- A refusal: Claude Code marks the tool call `failed` and goes on (`cancelled`: the model gets
  an error result and answers; `reject`: the turn ends at once), `stopReason: end_turn` either
  way. Codex ends the turn, `stopReason: cancelled`, the command never started.
- Codex sends no update at all for a command its sandbox refused a write (only the model
  sees its output); in the fenced run below a sandboxed command shows only there.
- Claude Code sends each tool call twice as `tool_call` (first with an empty `rawInput`, while
  the model streams it) and ends it with two `tool_call_update`s (the first with only `_meta`,
  the second with `status: completed`); Codex sends one of each, and its command's `tool_call`
  only once the command was approved.

The fenced run (`test_adapter_runs_fenced_as_an_agent`) starts each adapter as the agent would
run it, through `mcphost ctl exec` of a held agent of a real supervisor (its home, sign-in,
environment and fence, the supervisor's own preparation), with the agent's own center tools
(the attach entry) given in `session/new`: the center hears the call as the agent.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcphost.standin.anthropic import ModelStandIn, Say, ToolUse
from mcphost.standin.responses import Call, ResponsesStandIn, tool_outputs
from mcphost.supervisor.confine import probe as machine
from mcphost.testing import DevCenter
from tests.blackbox import acp_adapters as acp
from tests.blackbox.acp_adapters import (
    FINAL,
    Adapter,
    Chooser,
    Client,
    StdioServer,
    Transcript,
    frames_text,
)
from tests.blackbox.conftest import HOLD, QUIET
from tests.supervisor.supervise_harness import REPO, Supervised, center_heard

pytestmark = [
    pytest.mark.deep,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not acp.CLAUDE_ACP.exists() or not acp.codex_acp_binary().exists(),
        reason="the ACP adapters are missing: run `make node`",
    ),
]

CLIENTS: list[Client] = ["claude", "codex"]
COMMAND = "echo ran > ran.txt"
NOTE = {"text": "hello"}
# The options each adapter offers for a command, as (optionId, kind).
COMMAND_OPTIONS = {
    "claude": [
        ("allow_always", "allow_always"),
        ("allow", "allow_once"),
        ("reject", "reject_once"),
    ],
    "codex": [
        ("approved", "allow_once"),
        ("approved-execpolicy-amendment", "allow_always"),
        ("abort", "reject_once"),
    ],
}
MCP_OPTIONS = {
    "claude": COMMAND_OPTIONS["claude"],
    "codex": [
        ("approved", "allow_once"),
        ("approved-for-session", "allow_always"),
        ("approved-always", "allow_always"),
        ("cancel", "reject_once"),
    ],
}


@dataclass
class Place:
    """Where one adapter runs: its home, its workspace (the session's cwd), the record of the
    MCP server's calls, and its stderr log (not beneath /tmp: Codex's helpers, see
    `codex_adapter`)."""

    home: Path
    workspace: Path
    record: Path
    stderr: Path

    @property
    def server(self) -> StdioServer:
        return acp.notes_server(self.record)

    def notes(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]


@pytest.fixture
def place() -> Iterator[Place]:
    base = Path(tempfile.mkdtemp(prefix="acp-adapter-", dir="/var/tmp"))
    (base / "home").mkdir()
    (base / "workspace").mkdir()
    try:
        yield Place(base / "home", base / "workspace", base / "notes.jsonl", base / "stderr.log")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def turn(
    client: Client, place: Place, chooser: Chooser, *, preapproved: bool
) -> tuple[Transcript, Adapter]:
    """One scripted turn of `client` (acp_adapters.py's scripts) in `place`."""
    server = place.server
    if client == "claude":
        script, meanwhile = acp.claude_turns(server.tool("claude", "note"), NOTE, COMMAND)
        with ModelStandIn(script, meanwhile=meanwhile).running() as model:
            adapter = acp.claude_adapter(model, place.home, [server.name] if preapproved else ())
            return _run(adapter, place, chooser), adapter
    codex_script = acp.codex_turns(server, "note", NOTE, COMMAND)
    with ResponsesStandIn(FINAL, codex_script).running() as responses:
        adapter = acp.codex_adapter(responses, place.home, [server] if preapproved else ())
        return _run(adapter, place, chooser), adapter


def _run(adapter: Adapter, place: Place, chooser: Chooser) -> Transcript:
    return asyncio.run(
        acp.run_turn(
            adapter,
            cwd=place.workspace,
            servers=[place.server],
            chooser=chooser,
            stderr=place.stderr,
        )
    )


def options(request: dict[str, Any]) -> list[tuple[str, str]]:
    return [(o["optionId"], o["kind"]) for o in request["options"]]


def assert_command_request(client: Client, request: dict[str, Any], session_id: str) -> None:
    """The permission request for the shell command, as each adapter shapes it."""
    assert request["sessionId"] == session_id, request
    assert options(request) == COMMAND_OPTIONS[client], request
    call = request["toolCall"]
    if client == "claude":
        assert set(call) == {"toolCallId", "rawInput", "title"}, call
        assert call["rawInput"]["command"] == COMMAND and call["title"] == f"`{COMMAND}`", call
    else:
        assert call["kind"] == "execute" and call["status"] == "pending", call
        assert call["title"] == COMMAND and call["rawInput"]["command"][-1] == COMMAND, call


def mcp_call_id(transcript: Transcript) -> str:
    """The tool call id of the MCP `note` call (the first tool call of the turn)."""
    return str(
        next(u["toolCallId"] for u in transcript.updates if u["sessionUpdate"] == "tool_call")
    )


def assert_mcp_call_completed(transcript: Transcript, place: Place) -> None:
    assert [n["text"] for n in place.notes()] == ["hello"], place.notes()
    updates = transcript.tool_updates(mcp_call_id(transcript))
    assert updates[-1]["sessionUpdate"] == "tool_call_update", updates
    assert updates[-1]["status"] == "completed", updates
    assert "noted: hello" in json.dumps(updates[-1]), updates


@pytest.mark.parametrize("client", CLIENTS)
def test_adapter_runs_an_mcp_call_and_an_allowed_command(client: Client, place: Place) -> None:
    """The MCP server's tool (pre-approved) runs without asking; the command asks once, runs
    when allowed, and the turn ends with the model's final message."""
    transcript, _ = turn(client, place, acp.select("allow_once"), preapproved=True)
    frames = frames_text(transcript)
    assert transcript.stop_reason == "end_turn" and transcript.error is None, frames
    assert transcript.result_of("initialize")["agentCapabilities"]["loadSession"] is True
    assert_mcp_call_completed(transcript, place)
    (request,) = transcript.permission_requests
    assert_command_request(client, request, transcript.session_id)
    allowed = option_id(client, "allow_once")
    assert transcript.answers() == [{"outcome": {"optionId": allowed, "outcome": "selected"}}]
    assert (place.workspace / "ran.txt").read_text() == "ran\n", frames
    command = transcript.tool_updates(request["toolCall"]["toolCallId"])
    assert command[-1]["status"] == "completed", command
    assert transcript.agent_text().endswith(FINAL), frames
    kinds = transcript.update_kinds
    assert "user_message_chunk" not in kinds, kinds  # the live prompt is not echoed
    assert kinds[-1] in ("agent_message_chunk", "usage_update"), kinds


def option_id(client: Client, kind: str) -> str:
    return next(i for i, k in COMMAND_OPTIONS[client] if k == kind)


@pytest.mark.parametrize("answer", ["cancelled", "reject_once"])
@pytest.mark.parametrize("client", CLIENTS)
def test_adapter_shows_a_refusal_in_its_turn(client: Client, answer: str, place: Place) -> None:
    """A refused command never runs, and the turn shows it: Claude Code fails the tool call
    and ends the turn normally; Codex ends the turn `cancelled`."""
    chooser = acp.cancel if answer == "cancelled" else acp.select(answer)
    transcript, _ = turn(client, place, chooser, preapproved=True)
    frames = frames_text(transcript)
    assert_mcp_call_completed(transcript, place)
    (request,) = transcript.permission_requests
    assert not (place.workspace / "ran.txt").exists(), frames
    command = transcript.tool_updates(request["toolCall"]["toolCallId"])
    assert transcript.error is None, frames
    if client == "claude":
        assert transcript.stop_reason == "end_turn", frames
        assert command[-1]["status"] == "failed", command
        said = {"cancelled": "Tool use aborted", "reject_once": "User refused permission"}
        assert said[answer] in command[-1]["rawOutput"], command
        # cancelled: the model got the error as the tool's result and answered; rejected: the
        # turn was interrupted before the model was asked again
        assert transcript.agent_text().endswith(FINAL) == (answer == "cancelled"), frames
    else:
        assert transcript.stop_reason == "cancelled", frames
        assert command == [], command  # the command's tool call is only sent once approved
        assert FINAL not in transcript.agent_text(), frames


@pytest.mark.parametrize("client", CLIENTS)
def test_adapter_asks_for_an_mcp_tool_not_preapproved(client: Client, place: Place) -> None:
    """Without pre-approval, each adapter asks for the MCP tool as well, first."""
    transcript, _ = turn(client, place, acp.select("allow_once"), preapproved=False)
    frames = frames_text(transcript)
    assert transcript.stop_reason == "end_turn", frames
    mcp, command = transcript.permission_requests
    assert options(mcp) == MCP_OPTIONS[client], mcp
    call = mcp["toolCall"]
    assert call["toolCallId"] == mcp_call_id(transcript), call
    if client == "claude":
        assert call["title"] == "mcp__notes__note" and call["rawInput"] == NOTE, call
    else:
        assert call["title"] == "Approve MCP tool call", call
        assert call["rawInput"]["request"]["_meta"]["codex_approval_kind"] == "mcp_tool_call"
    assert_command_request(client, command, transcript.session_id)
    assert_mcp_call_completed(transcript, place)


@pytest.mark.parametrize("client", CLIENTS)
def test_adapter_asks_for_a_read_only_mcp_tool(client: Client, place: Place) -> None:
    """A tool annotated read-only (`readOnlyHint`, as the center's reading tools are): Claude
    Code asks for it all the same; Codex runs it without asking."""
    server = place.server
    if client == "claude":
        tool = server.tool("claude", "peek")
        script = [ToolUse(tool, NOTE, once_offered=True), Say(FINAL)]
        meanwhile = ToolUse("ToolSearch", {"query": f"select:{tool}"})
        with ModelStandIn(script, meanwhile=meanwhile).running() as model:
            transcript = _run(
                acp.claude_adapter(model, place.home), place, acp.select("allow_once")
            )
    else:
        codex_script = [Call("peek", NOTE, server.codex_namespace), Say(FINAL)]
        with ResponsesStandIn(FINAL, codex_script).running() as responses:
            adapter = acp.codex_adapter(responses, place.home)
            transcript = _run(adapter, place, acp.select("allow_once"))
    frames = frames_text(transcript)
    assert transcript.stop_reason == "end_turn", frames
    assert [n["tool"] for n in place.notes()] == ["peek"], frames
    assert len(transcript.permission_requests) == (1 if client == "claude" else 0), frames


@pytest.mark.parametrize("client", CLIENTS)
def test_adapter_loads_its_session_in_a_new_process(client: Client, place: Place) -> None:
    """`session/load` in a new process replays the first turn before its reply, and the next
    turn goes on from it (the model sees the first turn)."""
    first, second = "first answer", "second answer"
    if client == "claude":
        with ModelStandIn([Say(first), Say(second)]).running() as model:
            adapter = acp.claude_adapter(model, place.home)
            replayed, later = asyncio.run(_load_after_restart(adapter, place))
        last: Any = model.exchanges[-1].body
    else:
        with ResponsesStandIn(script=[Say(first), Say(second)]).running() as responses:
            adapter = acp.codex_adapter(responses, place.home)
            replayed, later = asyncio.run(_load_after_restart(adapter, place))
        last = responses.responses[-1]
    assert replayed == [("user_message_chunk", "one"), ("agent_message_chunk", first)], replayed
    assert later.stop_reason == "end_turn" and later.agent_text() == second
    assert first in json.dumps(last) and "one" in json.dumps(last), last


async def _load_after_restart(
    adapter: Adapter, place: Place
) -> tuple[list[tuple[str, str]], Transcript]:
    running = await acp.start(adapter, place.workspace, acp.cancel, place.stderr)
    try:
        await acp.initialize(running)
        session = await acp.new_session(running, place.workspace, [place.server])
        done = await acp.prompt(running, "one")
        assert done.stop_reason == "end_turn", frames_text(done)
    finally:
        await acp.stop(running)
    running = await acp.start(adapter, place.workspace, acp.cancel, place.stderr)
    try:
        await acp.initialize(running)
        await running.conn.load_session(
            cwd=str(place.workspace), session_id=session, mcp_servers=[place.server.acp()]
        )
        replayed = [
            (str(u["sessionUpdate"]), str(u.get("content", {}).get("text", "")))
            for u in running.transcript.updates
            if u["sessionUpdate"] != "available_commands_update"
        ]
        running.transcript.session_id = session
        running.transcript.frames.clear()
        return replayed, await acp.prompt(running, "two")
    finally:
        await acp.stop(running)


# -- fenced, as an agent ------------------------------------------------------------------------

GET_MY_WORK = "get_my_work"
SANDBOXED = "grep -E '^(NSpid|Seccomp):' /proc/self/status; echo x > sandboxed.txt"


@pytest.mark.skipif(
    machine.probe().missing() is not None, reason=f"no fence here: {machine.probe().missing()}"
)
@pytest.mark.parametrize("client", CLIENTS)
def test_adapter_runs_fenced_as_an_agent(
    client: Client, own_center: DevCenter, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Each adapter as a fenced agent runs it (`ctl exec` of a held agent: its home prepared
    and signed in by the supervisor, its environment, its fence), its own center tools given
    in `session/new` as the attach entry: the center hears the call as the agent, the
    command asks permission and runs in the workspace, the turn ends."""
    center = own_center
    agent = center.agent_id
    # not beneath /tmp: Codex's helpers (codex_adapter); the supervisor's stderr and fleet too
    sv = Supervised(tmp_path_factory.mktemp("acp-fenced"), center, state_parent="/var/tmp")
    attach = StdioServer(
        "agent-center",
        sys.executable,
        ("-I", "-S", f"{REPO}/mcphost/attach.py", str(sv.state / "run" / "center.sock")),
    )
    try:
        sandboxed = ""
        if client == "claude":
            script, meanwhile = acp.claude_turns(attach.tool("claude", GET_MY_WORK), {}, COMMAND)
            with ModelStandIn(script, meanwhile=meanwhile).running() as model:
                env = {
                    **QUIET,
                    "ANTHROPIC_BASE_URL": model.base_url,
                    "ANTHROPIC_API_KEY": acp.STANDIN_CLAUDE_KEY,
                }
                argv = (str(acp.CLAUDE_ACP),)
                transcript = _fenced_turn(sv, agent, client, env, argv, attach)
        else:
            codex_script = acp.codex_turns(attach, GET_MY_WORK, {}, COMMAND)
            # first a command in Codex's own sandbox (read-only: asks nothing, writes nothing)
            codex_script.insert(0, Call("exec_command", {"cmd": SANDBOXED}))
            with ResponsesStandIn(FINAL, codex_script).running() as responses:
                env = {
                    "OPENAI_API_KEY": acp.STANDIN_OPENAI_KEY,
                    "OPENAI_BASE_URL": responses.base_url,
                }
                argv = (str(acp.codex_acp_binary()),)
                transcript = _fenced_turn(sv, agent, client, env, argv, attach)
                sandboxed = tool_outputs(responses.responses[-1])[0]
        frames = frames_text(transcript)
        workspace = sv.workspace(agent)
        assert transcript.stop_reason == "end_turn", (frames, sv.base)
        assert center_heard(center, agent, GET_MY_WORK), frames
        # the supervisor's home pre-approves the agent's own servers' tools (Claude Code's
        # .claude/settings.json; Codex runs `get_my_work`, annotated read-only, unasked anyway):
        # each asks only for the command
        *mcp, command = transcript.permission_requests
        assert mcp == [], mcp
        assert_command_request(client, command, transcript.session_id)
        assert (workspace / "ran.txt").read_text() == "ran\n", frames
        assert transcript.agent_text().endswith(FINAL), frames
        if client == "codex":
            # Codex's sandbox inside the fence: a seccomp filter (the fence sets none), a PID
            # namespace below the agent's, the workspace read-only (the approved escalation ran
            # outside it, still fenced). A command its sandbox refused a write shows in no
            # `session/update`: only the model sees its output.
            assert "Seccomp:\t2" in sandboxed and "Read-only file system" in sandboxed
            nspid = next(x for x in sandboxed.splitlines() if x.startswith("NSpid"))
            assert len(nspid.split()) == 3, sandboxed
            assert not (workspace / "sandboxed.txt").exists()
            titles = [u.get("title") for u in transcript.updates]
            assert SANDBOXED not in titles, titles
    finally:
        sv.close()  # its state directory goes when the test session ends (STATE_DIRS)


def _fenced_turn(
    sv: Supervised,
    agent: str,
    client: Client,
    env: dict[str, str],
    argv: tuple[str, ...],
    attach: StdioServer,
) -> Transcript:
    """Hold `agent` under `sv` with `env`, then run `argv` through `ctl exec` as the agent."""
    entry = {"id": agent, "client": client, "runner": "process", "command": HOLD}
    sv.write_fleet([entry], restart="never", env=env)
    sv.start()
    row = sv.wait_running(agent)
    assert row["sandbox"].startswith("bwrap"), row
    prefix = [sys.executable, "-m", "mcphost", "ctl", "--state", str(sv.state), "exec", agent]
    adapter = Adapter(client, argv, sv.env(), sv.state)
    return asyncio.run(
        acp.run_turn(
            adapter,
            cwd=sv.workspace(agent),
            servers=[attach],
            chooser=acp.select("allow_once"),
            stderr=sv.base / "adapter.stderr.log",
            prefix=[*prefix, "--"],
        )
    )
