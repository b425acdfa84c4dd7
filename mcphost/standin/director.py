"""The demo script: what the stand-in model does with a prompt, decided from the conversation.

Owns: the prompt's small grammar (`Task.read`), the pure next step of a turn (`next_step`:
which tool to call next, or the answer, from the prompt and the tool results so far), and the two
stand-ins that follow it, one per model API: `ClaudeDirector` (Anthropic's Messages API, as
Claude Code and claude-code-acp ask it) and `CodexDirector` (OpenAI's Responses API, as Codex
and codex-acp ask it).

The script, for every prompt (a relay delivery is a prompt too):
1. call the center's `get_my_work` (the agent's own work, as the agent: the center sees it);
2. then, if a line says `send PEER: MESSAGE`, call the relay's `send` with MESSAGE to PEER;
   otherwise, if a line says `run: COMMAND`, run COMMAND with the client's shell tool (Claude
   Code's Bash; Codex's `exec_command`, asking to leave its sandbox, which asks permission);
3. then, if a line is `choose`, call the relay's `list` (`decisions`) and `choose` the first
   pending request's first `allow_once` option (or its first option);
4. answer with one line per result.
A prompt with none of these lines gets step 1 and the answer. The step is read from the request
every time (the tool calls since the prompt and their results), never from a counter, so one
stand-in serves any number of agents and conversations at once.

How each client names the tools: Claude Code `mcp__agent-center__get_my_work`, `mcp__agentmux__send`
(a tool Claude Code defers is looked up with its own ToolSearch first); codex-acp's function
tools by name in their MCP namespace (`mcp__agent_center`, `mcp__agentmux`); the Codex CLI 0.171
offers one `exec` tool ("code mode": JavaScript calling the nested tools), so its whole turn is
one script calling steps 1 and 2 (step 3 needs a result read between calls, and is not offered
there: a Claude Code or codex-acp agent chooses).

Must never: decide from wall-clock time or a request counter, or reach the network.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mcphost.standin.anthropic import ModelStandIn, Say, ToolUse, Turn
from mcphost.standin.responses import Call, Code, CodexTurn, ResponsesStandIn

CENTER_TOOL = "get_my_work"
CENTER_SERVER = "agent-center"  # configgen.model.CENTER_NAME, as every client config names it
RELAY_SERVER = "agentmux"  # configgen.model.RELAY_NAME
RECORDS_KEPT = 64  # requests a director keeps on record: it serves for as long as it runs

_SEND = re.compile(r"\bsend ([A-Za-z0-9_.@-]+):\s*(\S.*)")
_RUN = re.compile(r"\brun:\s*(\S.*)")
_CHOOSE = re.compile(r"^\W*choose\W*$")
_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.S)


@dataclass(frozen=True)
class Task:
    """What a prompt asks, by the grammar above."""

    send: tuple[str, str] | None = None  # (peer, message)
    run: str | None = None
    choose: bool = False

    @classmethod
    def read(cls, prompt: str) -> Task:
        send = run = None
        choose = False
        for line in prompt.splitlines():
            if send is None and run is None and (found := _SEND.search(line)):
                send = (found.group(1), found.group(2).strip())
            elif send is None and run is None and (found := _RUN.search(line)):
                run = found.group(1).strip()
            if _CHOOSE.match(line.strip().lower()):
                choose = True
        return cls(send, run, choose)


@dataclass(frozen=True)
class Step:
    """One tool call the script wants: `kind` is center, send, run, list or choose."""

    kind: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Done:
    """A tool call made since the prompt: its kind and its result as text."""

    kind: str
    result: str


def pick_option(listed: str) -> dict[str, Any] | None:
    """`choose`'s arguments for the first pending request in `list` (`decisions`)'s result: its
    first `allow_once` option, else its first option; None when nothing is pending."""
    try:
        pending = json.loads(listed)["pending_requests"]
        first = pending[0]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    options = (first.get("requested_details") or {}).get("options") or []
    allow = [o for o in options if o.get("kind") == "allow_once"] or options
    decision: dict[str, Any] = {
        "choice_request_id": first["choice_request_id"],
        "outcome": "selected" if allow else "cancelled",
    }
    if allow:
        decision["option_id"] = allow[0]["option_id"]
    return decision


def answer(done: Sequence[Done]) -> str:
    """The turn's last message: one short line per result."""
    lines = [f"{d.kind}: {' '.join(d.result.split())[:160]}" for d in done]
    return "Done.\n" + "\n".join(lines) if lines else "Done."


def next_step(task: Task, done: Sequence[Done]) -> Step | str:
    """The next tool call of the turn, or its answer (a str), from what was done so far."""
    kinds = [d.kind for d in done]
    if "center" not in kinds:
        return Step("center", {})
    if task.send is not None and "send" not in kinds:
        peer, message = task.send
        return Step("send", {"targets": [peer], "message": message})
    if task.run is not None and task.send is None and "run" not in kinds:
        return Step("run", {"command": task.run})
    if task.choose and "list" not in kinds:
        return Step("list", {"command": "decisions"})
    if task.choose and "choose" not in kinds:
        listed = next(d.result for d in done if d.kind == "list")
        decision = pick_option(listed)
        if decision is not None:
            return Step("choose", decision)
    return answer(done)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


# -- Claude Code (the Messages API) ---------------------------------------------------------------

CLAUDE_TOOLS = {
    "center": f"mcp__{CENTER_SERVER}__{CENTER_TOOL}",
    "send": f"mcp__{RELAY_SERVER}__send",
    "list": f"mcp__{RELAY_SERVER}__list",
    "choose": f"mcp__{RELAY_SERVER}__choose",
    "run": "Bash",
}
_CLAUDE_KINDS = {name: kind for kind, name in CLAUDE_TOOLS.items()}


def claude_turn(body: dict[str, Any], offered: set[str]) -> Turn:
    """The next turn for a Messages request: the prompt is the last user message that carries
    no tool result; the calls since then and their results say where the script is."""
    messages = body.get("messages") or []
    start = 0
    for i, message in enumerate(messages):
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        returned = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        if message.get("role") == "user" and not returned:
            start = i
    prompt = _REMINDER.sub("", _text(messages[start].get("content"))) if messages else ""
    calls: dict[str, str] = {}  # tool_use id -> name
    results: dict[str, str] = {}
    searched: set[str] = set()  # ToolSearch queries
    for message in messages[start + 1 :]:
        for block in message.get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                calls[str(block.get("id"))] = str(block.get("name"))
                if block.get("name") == "ToolSearch":
                    searched.add(str((block.get("input") or {}).get("query")))
            elif block.get("type") == "tool_result":
                results[str(block.get("tool_use_id"))] = _text(block.get("content"))
    done = [
        Done(_CLAUDE_KINDS[name], results.get(use, ""))
        for use, name in calls.items()
        if name in _CLAUDE_KINDS
    ]
    step = next_step(Task.read(prompt), done)
    if isinstance(step, str):
        return Say(step)
    name = CLAUDE_TOOLS[step.kind]
    if step.kind == "run":
        return ToolUse(name, {"command": step.arguments["command"], "description": "The task"})
    if name not in offered and f"select:{name}" not in searched:
        return ToolUse("ToolSearch", {"query": f"select:{name}"})
    return ToolUse(name, step.arguments)


class ClaudeDirector(ModelStandIn):
    """The Messages API stand-in, following the demo script per conversation."""

    def __init__(self) -> None:
        super().__init__([Say("Done.")])
        self.keep = RECORDS_KEPT

    def choose(self, body: dict[str, Any], offered: set[str]) -> tuple[Turn, int | None]:
        return claude_turn(body, offered), None


# -- Codex (the Responses API) ----------------------------------------------------------------------

CODEX_TOOLS = {
    "center": (CENTER_TOOL, "mcp__" + re.sub(r"[^A-Za-z0-9_]", "_", CENTER_SERVER)),
    "send": ("send", f"mcp__{RELAY_SERVER}"),
    "list": ("list", f"mcp__{RELAY_SERVER}"),
    "choose": ("choose", f"mcp__{RELAY_SERVER}"),
    "run": ("exec_command", None),
}
_CODEX_KINDS = {name: kind for kind, (name, _) in CODEX_TOOLS.items()}


def _is_prompt(item: dict[str, Any]) -> bool:
    """A user message that is the operator's or a peer's text, not Codex's own context
    (`<environment_context>`, `<user_instructions>`, AGENTS.md's `# AGENTS.md ...`)."""
    if item.get("type", "message") != "message" or item.get("role") != "user":
        return False
    text = _text(item.get("content")).lstrip()
    return bool(text) and not text.startswith(("<", "# AGENTS.md"))


def code_mode_source(task: Task) -> str:
    """The Codex CLI's one `exec` script: steps 1 and 2, each result appended as text."""
    calls: list[tuple[str, str, dict[str, Any]]] = [("center", CENTER_TOOL, {})]
    if task.send is not None:
        calls.append(("send", "send", {"targets": [task.send[0]], "message": task.send[1]}))
    elif task.run is not None:
        calls.append(("run", "exec_command", {"cmd": task.run}))
    lines = [
        "const names = ALL_TOOLS.map(t => t.name);",
        "const find = (n) => names.find(m => m === n || m.endsWith('__' + n) || m.endsWith('.' + n));",
    ]
    for kind, tool, arguments in calls:
        lines.append(
            f"try {{ text({json.dumps(kind + ': ')} + JSON.stringify(await tools[find("
            f"{json.dumps(tool)})]({json.dumps(arguments)}))); }} "
            f"catch (e) {{ text({json.dumps(kind + ': failed: ')} + e); }}"
        )
    return "\n".join(lines)


def codex_turn(body: dict[str, Any]) -> CodexTurn:
    """The next turn for a Responses request, from its `input` since the last prompt."""
    items = [i for i in body.get("input") or [] if isinstance(i, dict)]
    start = max((n for n, item in enumerate(items) if _is_prompt(item)), default=0)
    prompt = _text(items[start].get("content")) if items else ""
    task = Task.read(prompt)
    outputs = {
        str(i.get("call_id")): _text(i.get("output"))
        for i in items[start:]
        if str(i.get("type", "")).endswith("_call_output")
    }
    calls: list[dict[str, Any]] = [
        i for i in items[start:] if i.get("type") in ("function_call", "custom_tool_call")
    ]
    code_mode = any(t.get("name") == "exec" for t in body.get("tools") or [] if isinstance(t, dict))
    if code_mode:
        if any(c.get("name") == "exec" for c in calls):
            ran = [outputs.get(str(c.get("call_id")), "") for c in calls]
            return Say(answer([Done("exec", text) for text in ran]))
        return Code(code_mode_source(task))
    done = [
        Done(_CODEX_KINDS[str(c.get("name"))], outputs.get(str(c.get("call_id")), ""))
        for c in calls
        if c.get("name") in _CODEX_KINDS
    ]
    step = next_step(task, done)
    if isinstance(step, str):
        return Say(step)
    name, namespace = CODEX_TOOLS[step.kind]
    if step.kind == "run":
        escalate = {
            "cmd": step.arguments["command"],
            "sandbox_permissions": "require_escalated",
            "justification": "The task asks to run it",
        }
        return Call(name, escalate)
    return Call(name, step.arguments, namespace=namespace)


class CodexDirector(ResponsesStandIn):
    """The Responses API stand-in, following the demo script per conversation."""

    def __init__(self) -> None:
        super().__init__()
        self.keep = RECORDS_KEPT

    def next_turn(self, body: dict[str, Any]) -> CodexTurn:
        return codex_turn(body)
