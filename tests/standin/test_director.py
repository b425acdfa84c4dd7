"""The demo script (mcphost/standin/director.py): the prompt's grammar, the next step of a turn
from the conversation so far, and each API's request read as Claude Code and Codex send it.
Pure, except the last test, which asks a running `ClaudeDirector` and `CodexDirector` over HTTP."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from mcphost.standin.anthropic import Say, ToolUse
from mcphost.standin.director import (
    RECORDS_KEPT,
    ClaudeDirector,
    CodexDirector,
    Done,
    Step,
    Task,
    claude_turn,
    codex_turn,
    next_step,
    pick_option,
)
from mcphost.standin.responses import Call, Code

CENTER = "mcp__agent-center__get_my_work"
SEND = "mcp__agentmux__send"
PENDING = json.dumps(
    {
        "pending_requests": [
            {
                "choice_request_id": "c-1",
                "requested_details": {
                    "options": [
                        {"option_id": "reject", "kind": "reject_once"},
                        {"option_id": "once", "kind": "allow_once"},
                    ]
                },
            }
        ]
    }
)


def test_the_grammar_reads_send_run_and_choose_lines_and_a_relay_envelope() -> None:
    assert Task.read("send codex-1: send acp-1: run: echo hi") == Task(
        send=("codex-1", "send acp-1: run: echo hi")
    )
    # a relay delivery: the envelope's header lines, then the message
    delivered = "From: claude-1@party\nMessage-Id: x\n\nsend acp-1: run: echo ran > ran.txt"
    assert Task.read(delivered).send == ("acp-1", "run: echo ran > ran.txt")
    assert Task.read("please run: make test") == Task(run="make test")
    assert Task.read("choose") == Task(choose=True)
    assert Task.read("what is my work?") == Task()


def test_a_turn_calls_the_center_first_then_relays_then_answers() -> None:
    task = Task(send=("codex-1", "hello"))
    assert next_step(task, []) == Step("center", {})
    assert next_step(task, [Done("center", "{}")]) == Step(
        "send", {"targets": ["codex-1"], "message": "hello"}
    )
    answer = next_step(task, [Done("center", '{"tasks": []}'), Done("send", "queued")])
    assert answer == 'Done.\ncenter: {"tasks": []}\nsend: queued'
    # a command, and nothing to run when the task is a send
    assert next_step(Task(run="ls"), [Done("center", "")]) == Step("run", {"command": "ls"})


def test_choose_lists_the_decisions_and_takes_the_first_allow_once() -> None:
    done = [Done("center", "")]
    assert next_step(Task(choose=True), done) == Step("list", {"command": "decisions"})
    chosen = next_step(Task(choose=True), [*done, Done("list", PENDING)])
    assert chosen == Step(
        "choose", {"choice_request_id": "c-1", "outcome": "selected", "option_id": "once"}
    )
    # nothing pending: the answer says what the list said
    empty = next_step(Task(choose=True), [*done, Done("list", '{"pending_requests": []}')])
    assert isinstance(empty, str) and "pending_requests" in empty
    assert pick_option("not json") is None


def claude_body(*messages: dict[str, Any], tools: tuple[str, ...] = ("Bash",)) -> dict[str, Any]:
    return {"messages": list(messages), "tools": [{"name": n} for n in tools]}


def test_claude_code_requests_are_read_from_the_last_prompt_on() -> None:
    prompt = {"role": "user", "content": [{"type": "text", "text": "send codex-1: hi"}]}
    reminder = "<system-reminder>send nobody: x</system-reminder>"
    earlier = {"role": "user", "content": "choose"}
    first = claude_body(earlier, {"role": "assistant", "content": "Done."}, prompt)
    # a deferred tool is looked up with Claude Code's ToolSearch first, once
    assert claude_turn(first, set()) == ToolUse("ToolSearch", {"query": f"select:{CENTER}"})
    searched = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "ToolSearch", "input": {"query": f"select:{CENTER}"}}
    ]}  # fmt: skip
    found = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}
    assert claude_turn(claude_body(prompt, searched, found), set()) == ToolUse(CENTER, {})
    called = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t2", "name": CENTER, "input": {}}
    ]}  # fmt: skip
    result = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "{}"}]},
        {"type": "text", "text": reminder},
    ]}  # fmt: skip
    body = claude_body(prompt, called, result, tools=("Bash", SEND))
    assert claude_turn(body, {SEND}) == ToolUse(SEND, {"targets": ["codex-1"], "message": "hi"})


def codex_body(*items: dict[str, Any], code_mode: bool = False) -> dict[str, Any]:
    tools = [{"type": "custom", "name": "exec"}] if code_mode else [{"name": "exec_command"}]
    return {"input": list(items), "tools": tools}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_codex_requests_skip_its_own_context_and_follow_the_function_calls() -> None:
    context = user("<environment_context>run: no</environment_context>")
    first = codex_body(user("# AGENTS.md instructions"), user("run: echo ran"), context)
    assert codex_turn(first) == Call("get_my_work", {}, namespace="mcp__agent_center")
    call = {"type": "function_call", "name": "get_my_work", "call_id": "c1"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "{}"}
    escalate = codex_turn(codex_body(user("run: echo ran"), call, output))
    assert escalate == Call(
        "exec_command",
        {
            "cmd": "echo ran",
            "sandbox_permissions": "require_escalated",
            "justification": "The task asks to run it",
        },
    )


def test_the_codex_cli_gets_one_code_mode_script_then_the_answer() -> None:
    script = codex_turn(codex_body(user("send acp-1: run: x"), code_mode=True))
    assert isinstance(script, Code)
    assert "get_my_work" in script.source and '"targets": ["acp-1"]' in script.source
    ran = {"type": "custom_tool_call", "name": "exec", "call_id": "e1"}
    output = {"type": "custom_tool_call_output", "call_id": "e1", "output": "center: {}"}
    answer = codex_turn(codex_body(user("send acp-1: run: x"), ran, output, code_mode=True))
    assert answer == Say("Done.\nexec: center: {}")


def post(url: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return bytes(reply.read())


def test_both_directors_answer_over_http_from_the_conversation() -> None:
    with ClaudeDirector().running() as claude, CodexDirector().running() as codex:
        prompt = {"role": "user", "content": "send codex-1: hi"}
        answer = json.loads(
            post(f"{claude.base_url}/v1/messages", claude_body(prompt, tools=(CENTER,)))
        )
        assert answer["content"][0]["name"] == CENTER, answer
        # a second conversation, from another agent, at its own step
        other = json.loads(
            post(f"{claude.base_url}/v1/messages", claude_body(prompt, tools=(CENTER,)))
        )
        assert other["content"][0]["name"] == CENTER, other
        streamed = post(f"{codex.base_url}/responses", codex_body(user("choose"))).decode()
        # a director serves for as long as it runs: it keeps only the last requests on record
        for _ in range(RECORDS_KEPT):
            post(f"{claude.base_url}/v1/messages", claude_body(prompt, tools=(CENTER,)))
            post(f"{codex.base_url}/responses", codex_body(user("choose")))
        assert len(claude.exchanges) == len(codex.responses) == RECORDS_KEPT
        assert (
            '"name": "get_my_work"' in streamed and '"namespace": "mcp__agent_center"' in streamed
        )
