"""AcpSession (mcphost/relay/acp/session.py) against the stand-in ACP agent
(mcphost/testing/acp_agent.py) as a real subprocess over real pipes: bootstrap (new, load with
its replay, the failure codes), turns, permission requests, and the agent failing.

No sleeps: every wait is for an event the session sets (`turn_done`, a chooser being called, the
process's exit) or a polled condition (`settled`); the 30 s guard only catches a hang.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from mcphost.agentmux.wire import RelayError
from mcphost.relay.acp.choices import ChoicesQueue
from mcphost.relay.acp.session import AcpSession, stdio_server

pytestmark = pytest.mark.anyio

GUARD = 30.0  # only a hang reaches it
AGENT = [sys.executable, "-m", "mcphost.testing.acp_agent"]
TINY_MCP_SERVER = """
import os
from mcp.server.mcpserver import MCPServer
server = MCPServer("tiny")
@server.tool()
def shout(what: str) -> str:
    return f"shout {os.environ['TINY_WORD']} {what}"
server.run()
"""


class Agent:
    """One stand-in agent process and the session over its pipes, with what the session said."""

    def __init__(self, proc: asyncio.subprocess.Process, session: AcpSession) -> None:
        self.proc = proc
        self.session = session
        self.states: list[tuple[str, str | None]] = []
        session.on_state = lambda state, code: self.states.append((state, code))

    async def turn(self, text: str) -> list[dict[str, Any]]:
        """Prompt, wait for the turn's end; the entries the turn added after the prompt's."""
        before = self.session.entries.total
        assert await self.session.prompt(text) is True
        await guard(self.session.turn_done.wait())
        return self.session.entries.window(1000)[0][before + 1 :]


async def guard(awaitable: Awaitable[Any]) -> Any:
    return await asyncio.wait_for(awaitable, GUARD)


@asynccontextmanager
async def spawned(*flags: str, argv: list[str] | None = None) -> AsyncIterator[Agent]:
    proc = await asyncio.create_subprocess_exec(
        *(argv or [*AGENT, *flags]),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdin is not None
    agent = Agent(proc, AcpSession(proc.stdout, proc.stdin, target_session="alpha@party"))
    try:
        yield agent
    finally:
        await agent.session.close()
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


@asynccontextmanager
async def ready(*flags: str) -> AsyncIterator[Agent]:
    async with spawned(*flags) as agent:
        await guard(agent.session.bootstrap(os.getcwd()))
        yield agent


async def settled(condition: Callable[[], bool]) -> None:
    """`tests.waiting.until` for the loop's own state: poll without blocking the loop."""
    while not condition():
        await asyncio.sleep(0.01)


def texts(entries: list[dict[str, Any]], kind: str = "agent") -> list[str]:
    return [line for entry in entries if entry["kind"] == kind for line in entry["lines"]]


async def test_bootstrap_new_makes_the_session_available() -> None:
    async with spawned() as agent:
        session = agent.session
        assert session.state == "initializing" and session.last_frame_at is None
        session_id = await guard(session.bootstrap(os.getcwd()))
        assert session_id.startswith("sess-") and session.session_id == session_id
        assert (session.can_load, session.can_prompt) == (True, True)
        assert session.state == "available" and agent.states == [("available", None)]
        assert session.last_frame_at is not None and session.entries.total == 0
        with pytest.raises(RuntimeError):
            await session.bootstrap(os.getcwd())


async def test_a_prompt_is_delivered_once_written_and_the_turn_ends_available() -> None:
    async with ready() as agent:
        session = agent.session
        assert await session.prompt("hello\nthere") is True
        assert session.state == "busy" and not session.turn_done.is_set()
        assert session.entries.window(1)[0] == [
            {"kind": "user", "lines": ["hello", "there"], "origin": "relay"}
        ]
        await guard(session.turn_done.wait())
        assert session.state == "available" and session.last_stop_reason == "end_turn"
        entries, total = session.entries.window(50)
        assert total == 3
        assert entries[1:] == [
            {"kind": "agent", "lines": ["echo: hello", "there"]},
            {"kind": "cognition", "lines": ["thought about 2 line(s)"]},
        ]
        assert agent.states == [("available", None), ("busy", None), ("available", None)]
        assert texts(await agent.turn("again"), "agent") == ["echo: again"]


async def test_a_prompt_answered_with_an_error_still_ends_the_turn() -> None:
    async with ready("--fail", "session/prompt") as agent:
        [ended] = await agent.turn("hello")  # the failure, as the relay's turn_end entry
        assert ended["kind"] == "update" and ended["update_kind"] == "turn_end"
        assert ended["lines"][0].startswith("the turn failed: RequestError")
        assert agent.session.state == "available" and agent.session.last_stop_reason is None
        assert not agent.session.needs_respawn


async def test_one_turn_at_a_time() -> None:
    async with ready() as agent:
        session = agent.session
        assert await session.prompt("ACP-SLOW\nslow one") is True
        assert await session.prompt("second") is False  # busy: not written
        agent.proc.send_signal(signal.SIGUSR1)  # the slow turn goes on
        await guard(session.turn_done.wait())
        assert session.state == "available"
        assert texts(session.entries.window(50)[0]) == ["echo: slow one"]
        assert [e["kind"] for e in session.entries.window(50)[0]].count("user") == 1


async def test_updates_are_ingested_raw_in_frame_order() -> None:
    """Kinds the SDK's models refuse are kept (read from the frame, not the model)."""
    future_kind = {"sessionUpdate": "some_future_kind", "detail": {"text": "new"}}
    plan = {"sessionUpdate": "plan", "entries": [{"content": "step", "status": "pending"}]}
    async with ready() as agent:
        script = "\n".join(f"ACP-UPDATE: {json.dumps(u)}" for u in (future_kind, plan))
        added = await agent.turn(script + "\nACP-UPDATE: " + json.dumps(future_kind))
        assert added == [
            {"kind": "update", "update_kind": "some_future_kind", "lines": ["new"]},
            {"kind": "update", "update_kind": "plan", "lines": []},
            {"kind": "update", "update_kind": "some_future_kind", "lines": ["new"]},
        ]


async def test_load_replays_the_history_into_the_entries(tmp_path: Path) -> None:
    history = str(tmp_path / "history.jsonl")
    async with ready("--history", history) as first:
        session_id = first.session.session_id
        await first.turn("remember me")
    async with spawned("--history", history) as second:
        loaded = await guard(second.session.bootstrap(os.getcwd(), load_session_id=session_id))
        assert loaded == session_id and second.session.state == "available"
        entries, _ = second.session.entries.window(50)
        assert entries == [
            {"kind": "user", "lines": ["remember me"], "origin": "agent"},
            {"kind": "agent", "lines": ["echo: remember me"]},
            {"kind": "cognition", "lines": ["thought about 1 line(s)"]},
        ]
        assert texts(await second.turn("and more")) == ["echo: and more"]


async def test_a_load_that_fails_has_no_fallback(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    async with spawned("--history", str(history)) as agent:
        with pytest.raises(RelayError) as caught:
            await guard(agent.session.bootstrap(os.getcwd(), load_session_id="sess-unknown"))
        assert caught.value.code == "runtime_acp_session_load_failed"
        assert caught.value.details is not None
        assert caught.value.details["method"] == "session/load"
        assert caught.value.details["target_session"] == "alpha@party"
        assert agent.session.state == "unavailable" and agent.session.needs_respawn
        assert agent.states == [("unavailable", "runtime_acp_session_load_failed")]
        assert not history.exists()  # no session/new was tried


@pytest.mark.parametrize(
    ("method", "code"),
    [
        ("initialize", "runtime_acp_initialize_failed"),
        ("session/new", "runtime_acp_session_new_failed"),
    ],
)
async def test_a_failing_bootstrap_request_has_its_code(method: str, code: str) -> None:
    async with spawned("--fail", method) as agent:
        with pytest.raises(RelayError) as caught:
            await guard(agent.session.bootstrap(os.getcwd()))
        assert caught.value.code == code and agent.session.state_reason_code == code
        assert agent.session.needs_respawn


async def test_an_agent_that_never_answers_fails_initialize_at_the_timeout() -> None:
    silent = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    async with spawned(argv=silent) as agent:
        agent.session.request_timeout = 0.2
        with pytest.raises(RelayError) as caught:
            await guard(agent.session.bootstrap(os.getcwd()))
        assert caught.value.code == "runtime_acp_initialize_failed"
        assert caught.value.details is not None and caught.value.details["timeout_ms"] == 200


async def test_load_without_the_load_capability_is_refused() -> None:
    async with spawned("--no-load") as agent:
        with pytest.raises(RelayError) as caught:
            await guard(agent.session.bootstrap(os.getcwd(), load_session_id="sess-x"))
        assert caught.value.code == "validation_missing_acp_capability"
        assert caught.value.details == {
            "target_session": "alpha@party",
            "required_capability": "session/load",
            "reason": "the agent does not advertise loadSession in initialize",
        }
        assert agent.session.state == "unavailable" and not agent.session.needs_respawn


async def test_an_agent_without_the_prompt_capability_is_refused() -> None:
    async with spawned("--no-prompt") as agent:
        with pytest.raises(RelayError) as caught:
            await guard(agent.session.bootstrap(os.getcwd()))
        assert caught.value.code == "validation_missing_acp_capability"
        assert caught.value.details is not None
        assert caught.value.details["required_capability"] == "session/prompt"
        assert agent.session.state_reason_code == "validation_missing_acp_capability"
        assert not agent.session.needs_respawn
        assert await agent.session.prompt("x") is False


def chooser_of(answer: dict[str, Any]) -> tuple[list[tuple[dict[str, Any], Any]], Any]:
    asked: list[tuple[dict[str, Any], Any]] = []

    async def chooser(params: dict[str, Any], acp_request_id: Any) -> dict[str, Any]:
        asked.append((params, acp_request_id))
        return answer

    return asked, chooser


@pytest.mark.parametrize(
    ("answer", "said", "status"),
    [
        ({"outcome": "selected", "optionId": "allow"}, "selected:allow", "completed"),
        ({"outcome": "selected", "optionId": "reject"}, "selected:reject", "failed"),
        ({"outcome": "cancelled"}, "cancelled", "failed"),
    ],
)
async def test_a_permission_request_reaches_the_chooser(
    answer: dict[str, Any], said: str, status: str
) -> None:
    async with ready() as agent:
        asked, agent.session.chooser = chooser_of(answer)
        added = await agent.turn("ACP-ASK: rm -rf build")
        (params, request_id), *more = asked
        assert more == [] and isinstance(request_id, int)
        assert params["sessionId"] == agent.session.session_id
        assert params["toolCall"] == {
            "toolCallId": "call-1",
            "title": "rm -rf build",
            "kind": "execute",
        }
        assert [o["optionId"] for o in params["options"]] == ["allow", "reject"]
        invocation = next(e for e in added if e["kind"] == "invocation")
        assert invocation["status"] == "Completed" and invocation["result"]["status"] == status
        assert texts(added) == [said]
        assert agent.session.state == "available"


async def test_the_choices_queue_decides_what_the_agent_sees() -> None:
    requested = asyncio.Event()
    queue = ChoicesQueue(on_requested=lambda _: requested.set())
    async with ready() as agent:
        agent.session.chooser = lambda params, rid: queue.ask("alpha@party", "m-1", params, rid)
        assert await agent.session.prompt("ACP-ASK: deploy") is True
        await guard(requested.wait())
        (record,) = queue.pending()
        assert record["requested_details"]["tool_call_title"] == "deploy"
        assert record["requested_details"]["raw"]["toolCall"]["toolCallId"] == "call-1"
        with pytest.raises(RelayError):
            queue.decide(record["choice_request_id"], "selected", "always", "ui@party")
        assert agent.session.state == "busy"  # still waiting on the decision
        queue.decide(record["choice_request_id"], "selected", "allow", "ui@party")
        await guard(agent.session.turn_done.wait())
        assert texts(agent.session.entries.window(50)[0]) == ["selected:allow"]


async def test_without_a_chooser_the_agent_is_answered_cancelled() -> None:
    async with ready() as agent:
        assert agent.session.chooser is None
        assert texts(await agent.turn("ACP-ASK: anything")) == ["cancelled"]
        assert agent.session.state == "available"


async def test_a_failing_chooser_answers_cancelled() -> None:
    async with ready() as agent:

        async def broken(params: dict[str, Any], rid: Any) -> dict[str, Any]:
            return {"outcome": "maybe"}  # not an ACP outcome

        agent.session.chooser = broken
        assert texts(await agent.turn("ACP-ASK: anything")) == ["cancelled"]


async def test_the_agent_dying_mid_turn_makes_the_session_unavailable_for_respawn() -> None:
    async with ready() as agent:
        assert await agent.session.prompt("ACP-DIE") is True
        await guard(agent.session.turn_done.wait())
        assert agent.session.state == "unavailable" and agent.session.needs_respawn
        assert agent.states[-1] == ("unavailable", "transport_unavailable")
        assert await agent.session.prompt("anyone?") is False


async def test_the_agent_dying_while_asking_drops_the_pending_request() -> None:
    waiting = asyncio.Event()
    never: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    async def chooser(params: dict[str, Any], rid: Any) -> dict[str, Any]:
        waiting.set()
        return await never

    async with ready() as agent:
        agent.session.chooser = chooser
        assert await agent.session.prompt("ACP-DIE: rm everything") is True
        await guard(agent.session.turn_done.wait())
        assert agent.session.state == "unavailable" and agent.session.needs_respawn
        assert waiting.is_set()
        await guard(agent.proc.wait())
    assert never.cancelled()  # the chooser's wait was cancelled with the connection


async def test_a_closed_agent_found_at_the_next_prompt_is_not_written() -> None:
    async with ready() as agent:
        agent.proc.kill()
        await guard(agent.proc.wait())
        stdout = agent.proc.stdout
        assert stdout is not None
        await guard(settled(stdout.at_eof))  # the session's reader saw the EOF
        assert await agent.session.prompt("hello?") is False
        assert agent.session.state == "unavailable" and agent.session.needs_respawn


async def test_a_stdin_write_error_makes_the_session_unavailable_for_respawn() -> None:
    async with ready() as agent:
        assert agent.proc.stdin is not None
        agent.proc.stdin.close()  # the pipe fails under the session
        await guard(agent.proc.stdin.wait_closed())
        with pytest.raises(RelayError) as caught:
            await guard(agent.session.prompt("lost?"))
        assert caught.value.code == "transport_unavailable"
        assert agent.session.state == "unavailable" and agent.session.needs_respawn
        assert agent.session.turn_done.is_set()


async def test_close_during_a_turn_is_unavailable_without_respawn() -> None:
    async with ready() as agent:
        assert await agent.session.prompt("ACP-SLOW") is True
        await agent.session.close()
        assert agent.session.turn_done.is_set()
        assert agent.session.state == "unavailable" and not agent.session.needs_respawn


async def test_the_mcp_servers_reach_the_agent() -> None:
    """The stdio entry reaches the agent, whose stdlib MCP client calls a real SDK server."""
    server = stdio_server("tiny", sys.executable, ["-c", TINY_MCP_SERVER], {"TINY_WORD": "hi"})
    async with spawned() as agent:
        await guard(agent.session.bootstrap(os.getcwd(), [server]))
        added = await agent.turn(f"ACP-MCP: shout {json.dumps({'what': 'x'})}")
        assert texts(added) == ["mcp:shout hi x"]


def test_the_sdk_is_imported_on_first_use_not_by_a_supervisor() -> None:
    """A supervisor without an ACP member never loads `acp` (its schema: ~0.4 s of CPU a start)."""
    code = "import sys, mcphost.supervisor.supervisor\nprint('acp' in sys.modules)\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
