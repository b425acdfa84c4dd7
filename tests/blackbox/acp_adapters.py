"""The real ACP adapters as tests run them: Zed's `claude-code-acp` (Claude Code) and
`codex-acp` (Codex), each against its loopback model stand-in, driven by the PyPI
`agent-client-protocol` SDK's client over the process's own pipes.

Owns: how each adapter is started here (`claude_adapter`, `codex_adapter`: the command, the
environment, and what its home needs), the model scripts that make one prompt turn call a tool
of an MCP server given in `session/new`, then ask permission to write a file, then end with
`FINAL` (`claude_turns`, `codex_turns`), and one recorded turn (`run_turn`): every frame both
ways, the permission requests as sent, the `session/update` kinds in order, the stop reason or
the error the prompt ended with.

What each adapter is (measured with the versions in tools/package.json):
- `claude-code-acp` (node) embeds the Claude Agent SDK, which runs the Claude Code CLI bundled
  with it (`@anthropic-ai/claude-agent-sdk/cli.js`, Claude Code 2.1.44 for SDK 0.2.44) with
  `node`, not the `claude` of tools/package.json: `CLAUDE_CODE_EXECUTABLE` would choose
  another, but Claude Code 2.1.332 ends a turn whose permission was refused with an error
  result this adapter turns into a JSON-RPC error on `session/prompt`. The CLI reads the model
  API's address and key from the environment (`ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`) and
  its settings from `$HOME/.claude/settings.json` (the adapter loads user, project and local
  settings); a `permissions.allow` rule there (`mcp__<server>`) pre-approves a server's tools.
  It exits when its stdin closes.
- `codex-acp` is a Rust binary with Codex's core inside (not the `codex` of
  tools/package.json). The npm package's `bin` is a node wrapper that runs it with `spawnSync`
  and forwards no signal, so a signal to the wrapper orphans the binary: run the platform
  package's binary itself (`codex_acp_binary`). It reads `$CODEX_HOME/config.toml`
  (`openai_base_url`, `mcp_servers`) and `$CODEX_HOME/auth.json`, the files the supervisor
  writes (homes.py). It does not exit when its stdin closes: end it with a signal.
  A server given in `session/new` replaces the command of a `config.toml` entry of the same
  name but keeps its `default_tools_approval_mode = "approve"`, which pre-approves its tools.

Inside the fence (test_acp_adapters.py runs both through `mcphost ctl exec` of a held agent,
with the supervisor's own home, sign-in and environment, unchanged): both need only what a
fenced agent has: `HOME` its home (writable), the private `/tmp`, `node` on `PATH` and
tools/node_modules readable through the read-only `/`, the attach pump's socket. Codex's
`CODEX_HOME` must not be beneath the temporary directory (as for the CLI). Codex's own sandbox
runs there (read-only mode by default: seccomp, its PID namespace, the workspace read-only);
an approved escalation runs outside it, still fenced. Claude Code's sandbox is off by default
(nothing in the adapter or the supervisor's home enables it), so an allowed Bash command runs
fenced only. Measured by hand, not pinned: with `sandbox.enabled` in `$HOME/.claude/settings.json`
the bundled Claude Code 2.1.44 runs Bash without asking (so no permission request comes);
under a root supervisor it needs `sandbox.enableWeakerNestedSandbox` ("Can't mount proc"
without it, nothing runs), and with it the command runs sandboxed (the home refused, a deeper
PID namespace, but no seccomp filter) and still fails: its cwd file in `/tmp/claude-<uid>` is
read-only there.

Must never: reach the network (both model stand-ins bind loopback), use a bypass of either
CLI's approvals or sandbox, or wait on wall-clock time (the turn ends when the agent says so).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomli_w
from acp import PROTOCOL_VERSION, RequestError, text_block
from acp.client.connection import ClientSideConnection
from acp.connection import StreamEvent
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    EnvVariable,
    FileSystemCapabilities,
    Implementation,
    McpServerStdio,
    PermissionOption,
    RequestPermissionResponse,
    ToolCallUpdate,
)

from mcphost.standin.anthropic import ModelStandIn, Say, ToolUse, Turn
from mcphost.standin.responses import Call, CodexTurn, ResponsesStandIn
from mcphost.supervisor.agents.homes import npm_platform
from tests.blackbox.conftest import QUIET, project_root

Client = Literal["claude", "codex"]
TOOLS = project_root() / "tools" / "node_modules"
CLAUDE_ACP = TOOLS / ".bin" / "claude-code-acp"
FINAL = "All done."  # the model's last message in every script
STANDIN_CLAUDE_KEY = "sk-ant-standin-not-a-key"
STANDIN_OPENAI_KEY = "sk-standin-not-a-key-0123456789"
# what a turn's reader takes in one line (an update carries whole tool outputs)
LINE_LIMIT = 16 << 20


def codex_acp_binary() -> Path:
    """The `codex-acp` binary of this platform's npm package (`@zed-industries/codex-acp-<os>-
    <arch>`, what the package's node wrapper would run)."""
    return TOOLS / "@zed-industries" / f"codex-acp-{npm_platform()}" / "bin" / "codex-acp"


@dataclass(frozen=True)
class StdioServer:
    """An MCP server an ACP client gives in `session/new` (ACP's stdio entry)."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def acp(self) -> McpServerStdio:
        env = [EnvVariable(name=k, value=v) for k, v in self.env]
        return McpServerStdio(name=self.name, command=self.command, args=list(self.args), env=env)

    def tool(self, client: Client, name: str) -> str:
        """How `client`'s model names this server's tool `name` (Claude Code:
        `mcp__<server>__<tool>`; Codex: `name`, in the namespace `codex_namespace`)."""
        return f"mcp__{self.name}__{name}" if client == "claude" else name

    @property
    def codex_namespace(self) -> str:
        """The namespace Codex offers this server's tools in: `mcp__` and the server's name,
        each character outside [A-Za-z0-9_] made `_` (`agent-center`: `mcp__agent_center`)."""
        return "mcp__" + re.sub(r"[^A-Za-z0-9_]", "_", self.name)


def notes_server(record: Path) -> StdioServer:
    """The test's own MCP server (acp_mcp_server.py): its `note` tool appends to `record`."""
    script = Path(__file__).with_name("acp_mcp_server.py")
    return StdioServer("notes", sys.executable, (str(script), str(record)))


@dataclass(frozen=True)
class Adapter:
    """How to start one adapter: `argv`, its whole environment, and its home (prepared)."""

    client: Client
    argv: tuple[str, ...]
    env: Mapping[str, str]
    home: Path


def _base_env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(home), "LANG": "C.UTF-8"}


def claude_adapter(model: ModelStandIn, home: Path, preapproved: Sequence[str] = ()) -> Adapter:
    """`claude-code-acp` signed in with a stand-in key to `model`; each server named in
    `preapproved` allowed in the user settings (`permissions.allow: ["mcp__<name>"]`)."""
    if preapproved:
        settings = home / ".claude" / "settings.json"
        settings.parent.mkdir(parents=True, exist_ok=True)
        allow = [f"mcp__{name}" for name in preapproved]
        settings.write_text(json.dumps({"permissions": {"allow": allow}}, indent=2) + "\n")
    env = {
        **_base_env(home),
        **QUIET,
        "ANTHROPIC_BASE_URL": model.base_url,
        "ANTHROPIC_API_KEY": STANDIN_CLAUDE_KEY,
    }
    return Adapter("claude", (str(CLAUDE_ACP),), env, home)


def codex_config(base_url: str, preapproved: Sequence[StdioServer] = ()) -> bytes:
    """`config.toml` for `codex-acp`: the model API's address, and an entry approving every
    tool of each `preapproved` server (the server is given again in `session/new`)."""
    servers = {
        s.name: {
            "command": s.command,
            "args": list(s.args),
            **({"env": dict(s.env)} if s.env else {}),
            "default_tools_approval_mode": "approve",
        }
        for s in preapproved
    }
    config: dict[str, Any] = {"openai_base_url": base_url}
    if servers:
        config["mcp_servers"] = servers
    return tomli_w.dumps(config).encode()


def codex_adapter(
    model: ResponsesStandIn, home: Path, preapproved: Sequence[StdioServer] = ()
) -> Adapter:
    """`codex-acp` with `CODEX_HOME` = `<home>/codex`: `config.toml` (`codex_config`) and the
    stand-in key's `auth.json` as `codex login --with-api-key` (and the supervisor) write it.
    `home` must not be beneath the temporary directory (Codex then refuses its sandbox's
    helper links; tests/blackbox/test_fenced_codex.py)."""
    codex = home / "codex"
    codex.mkdir(parents=True, exist_ok=True)
    (codex / "config.toml").write_bytes(codex_config(model.base_url, preapproved))
    auth = {"auth_mode": "apikey", "OPENAI_API_KEY": STANDIN_OPENAI_KEY}
    (codex / "auth.json").write_text(json.dumps(auth) + "\n")
    (codex / "auth.json").chmod(0o600)
    env = {**_base_env(home), "CODEX_HOME": str(codex)}
    return Adapter("codex", (str(codex_acp_binary()),), env, home)


# -- the model's scripts ------------------------------------------------------------------------


def claude_turns(tool: str, arguments: dict[str, Any], command: str) -> tuple[list[Turn], Turn]:
    """Claude Code's script and its `meanwhile` turn: call `tool` (once offered: a deferred
    MCP tool is looked up with Claude Code's ToolSearch meanwhile), run `command` with Bash
    (which asks permission), say `FINAL`."""
    script: list[Turn] = [
        ToolUse(tool, arguments, once_offered=True),
        ToolUse("Bash", {"command": command, "description": "Write the file"}),
        Say(FINAL),
    ]
    return script, ToolUse("ToolSearch", {"query": f"select:{tool}"})


def codex_turns(
    server: StdioServer, tool: str, arguments: dict[str, Any], command: str
) -> list[CodexTurn]:
    """Codex's script: call `server`'s `tool`, run `command` asking to leave the sandbox
    (`require_escalated`, which asks permission), say `FINAL`."""
    escalate = {
        "cmd": command,
        "sandbox_permissions": "require_escalated",
        "justification": "Write the file",
    }
    return [
        Call(tool, arguments, namespace=server.codex_namespace),
        Call("exec_command", escalate),
        Say(FINAL),
    ]


# -- one recorded turn ------------------------------------------------------------------------

Chooser = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def option_of(params: dict[str, Any], kind: str) -> str:
    """The `optionId` of the first option of `kind` (allow_once, reject_once, ...)."""
    return next(str(o["optionId"]) for o in params["options"] if o.get("kind") == kind)


def select(kind: str) -> Chooser:
    """A chooser that selects the first option of `kind`."""

    async def choose(params: dict[str, Any]) -> dict[str, Any]:
        return {"outcome": "selected", "optionId": option_of(params, kind)}

    return choose


async def cancel(params: dict[str, Any]) -> dict[str, Any]:
    """A chooser that answers every request `cancelled`."""
    return {"outcome": "cancelled"}


@dataclass
class Transcript:
    """What one session's turn showed: the frames both ways (raw JSON-RPC objects) in order."""

    frames: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    session_id: str = ""
    stop_reason: str | None = None
    error: dict[str, Any] | None = None  # the JSON-RPC error that ended the prompt instead

    def incoming(self, method: str) -> list[dict[str, Any]]:
        return [m for d, m in self.frames if d == "incoming" and m.get("method") == method]

    def result_of(self, method: str) -> dict[str, Any]:
        """The result of the client's first `method` request."""
        sent = next(
            m["id"] for d, m in self.frames if d == "outgoing" and m.get("method") == method
        )
        return next(
            m["result"]
            for d, m in self.frames
            if d == "incoming" and "method" not in m and m.get("id") == sent
        )

    @property
    def permission_requests(self) -> list[dict[str, Any]]:
        """The params of each `session/request_permission`, as sent."""
        return [m["params"] for m in self.incoming("session/request_permission")]

    @property
    def updates(self) -> list[dict[str, Any]]:
        """Each `session/update`'s `update`, in order."""
        return [m["params"]["update"] for m in self.incoming("session/update")]

    @property
    def update_kinds(self) -> list[str]:
        return [str(u.get("sessionUpdate")) for u in self.updates]

    def answers(self) -> list[dict[str, Any]]:
        """The client's answers to the permission requests (their `result`)."""
        asked = {json.dumps(m.get("id")) for m in self.incoming("session/request_permission")}
        return [
            m["result"]
            for d, m in self.frames
            if d == "outgoing" and "result" in m and json.dumps(m.get("id")) in asked
        ]

    def agent_text(self) -> str:
        """The agent's message chunks, joined."""
        return "".join(
            str(u.get("content", {}).get("text", ""))
            for u in self.updates
            if u.get("sessionUpdate") == "agent_message_chunk"
        )

    def tool_updates(self, call_id: str) -> list[dict[str, Any]]:
        """The `tool_call` and `tool_call_update` updates of `call_id`, in order."""
        return [u for u in self.updates if u.get("toolCallId") == call_id]


class RecordingClient:
    """The ACP client side: no file system, no terminal; permission requests answered by
    `chooser` (dicts as on the wire); updates recorded by the transcript's stream observer."""

    def __init__(self, chooser: Chooser) -> None:
        self.chooser = chooser

    async def request_permission(
        self,
        options: list[PermissionOption],
        session_id: str,
        tool_call: ToolCallUpdate,
        **kwargs: Any,
    ) -> RequestPermissionResponse:
        params = {
            "sessionId": session_id,
            "toolCall": tool_call.model_dump(by_alias=True, exclude_none=True),
            "options": [o.model_dump(by_alias=True, exclude_none=True) for o in options],
        }
        answer = await self.chooser(params)
        if answer["outcome"] == "selected":
            outcome = AllowedOutcome(option_id=answer["optionId"], outcome="selected")
            return RequestPermissionResponse(outcome=outcome)
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        return None


@dataclass
class Running:
    """An adapter process and the client connection over its pipes."""

    proc: asyncio.subprocess.Process
    conn: ClientSideConnection
    transcript: Transcript


async def start(
    adapter: Adapter,
    cwd: Path,
    chooser: Chooser,
    stderr: Path,
    prefix: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Running:
    """Spawn `prefix + adapter.argv` (in a session of its own, stderr to `stderr`) and connect
    a client to its pipes; `env` replaces the adapter's (a prefix that runs it as an agent
    brings the agent's)."""
    transcript = Transcript()

    def observe(event: StreamEvent) -> None:
        transcript.frames.append((event.direction.value, event.message))

    with stderr.open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            *prefix,
            *adapter.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            cwd=cwd,
            env=dict(adapter.env if env is None else env),
            start_new_session=True,
            limit=LINE_LIMIT,
        )
    assert proc.stdin is not None and proc.stdout is not None
    conn = ClientSideConnection(
        RecordingClient(chooser), proc.stdin, proc.stdout, observers=[observe]
    )
    return Running(proc, conn, transcript)


async def stop(running: Running) -> int:
    """Close the connection and stdin, end the process group (codex-acp does not exit at end
    of input; Claude Code, the adapter's child, is in it too), reap the leader, and wait until
    no process of the group is left (Claude Code writes its session file as it ends); the
    leader's exit status."""
    await running.conn.close()
    if running.proc.stdin is not None:
        running.proc.stdin.close()
    group = running.proc.pid
    _signal_group(group, signal.SIGTERM)
    status = await running.proc.wait()
    while _signal_group(group, 0):
        await asyncio.sleep(0.01)
    return status


def _signal_group(group: int, sig: int) -> bool:
    """Send `sig` to the process group; False when no process of it is left."""
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        return False
    return True


async def initialize(running: Running) -> None:
    """`initialize`, as the relay's client will send it: no file system, no terminal."""
    caps = ClientCapabilities(
        fs=FileSystemCapabilities(read_text_file=False, write_text_file=False), terminal=False
    )
    await running.conn.initialize(
        protocol_version=PROTOCOL_VERSION,
        client_capabilities=caps,
        client_info=Implementation(name="mcphost-tests", version="0"),
    )


async def new_session(running: Running, cwd: Path, servers: Sequence[StdioServer]) -> str:
    response = await running.conn.new_session(cwd=str(cwd), mcp_servers=[s.acp() for s in servers])
    running.transcript.session_id = response.session_id
    return response.session_id


async def prompt(running: Running, text: str) -> Transcript:
    """One prompt turn to its end: `stop_reason`, or `error` when the agent answered the
    prompt with a JSON-RPC error."""
    transcript = running.transcript
    try:
        response = await running.conn.prompt(
            session_id=transcript.session_id, prompt=[text_block(text)]
        )
    except RequestError as exc:
        transcript.error = exc.to_error_obj()
    else:
        transcript.stop_reason = response.stop_reason
    return transcript


async def run_turn(
    adapter: Adapter,
    *,
    cwd: Path,
    servers: Sequence[StdioServer],
    chooser: Chooser,
    stderr: Path,
    text: str = "Do the task.",
    prefix: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Transcript:
    """Start `adapter`, `initialize`, `session/new` with `servers`, one prompt, stop it."""
    running = await start(adapter, cwd, chooser, stderr, prefix, env)
    try:
        await initialize(running)
        await new_session(running, cwd, servers)
        return await prompt(running, text)
    finally:
        await stop(running)


def frames_text(transcript: Transcript) -> str:
    """The transcript's frames, one JSON line each (for an assertion's message)."""
    return "\n".join(f"{d[:3]} {json.dumps(m)[:600]}" for d, m in transcript.frames)
