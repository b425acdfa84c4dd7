"""`mcphost demo [host]` (`make demo-host`): a real MCP client drives a real host against a real center.

`mcphost demo fleet` (`make demo-fleet`) is the supervisor's demo: mcphost/demofleet.py, which
reuses this module's `Transcript`; `mcphost demo model` serves the model stand-in
(mcphost/demomodel.py) and `mcphost demo agents` (`make demo-agents`) runs the real CLIs
against it (mcphost/demoagents.py).

Owns: the guided transcript of the standalone host, the `Transcript` both demos print with, and
the dispatch between the demos. It starts the reference center in a temporary directory, launches
`mcphost host` as a subprocess with the official MCP SDK client over stdio, walks a task through
its life, shows a spoofed `agent_id` refused, prints what the center actually received, and
cleans up. Exit 0 when every step behaved as shown, 1 otherwise.
Must never: leave a process or a temporary directory behind.
"""

from __future__ import annotations

import json
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from mcphost.transcript import Transcript


def _short(text: str, width: int = 96) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


async def _drive(center: Any, out: Transcript) -> None:
    from mcp import Client, StdioServerParameters

    env = {**center.binding_env("unix"), "MCPHOST_LOG_LEVEL": "error"}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "mcphost.cli", "host"], env=env
    )

    async def call(client: Any, tool: str, args: dict[str, Any]) -> tuple[bool, Any]:
        out.say(f"-> {tool} {json.dumps(args)}")
        result = await client.call_tool(tool, args)
        text = result.content[0].text
        out.say(f"<- {'ERROR ' if result.is_error else ''}{_short(text)}")
        try:
            return result.is_error, json.loads(text)
        except ValueError:
            return result.is_error, text

    async with Client(params, mode="legacy") as client:
        out.step("The host starts and lists its tools (tiered: core tools + search_tools)")
        tools = await client.list_tools()
        names = [t.name for t in tools.tools]
        out.say(textwrap.fill(", ".join(names), 96, initial_indent="   ", subsequent_indent="   "))
        out.expect("search_tools" in names and "subscribe" not in names, "deferred tools hidden")

        out.step("A task's life: create, read, start, discuss, complete")
        failed, created = await call(
            client,
            "create_task",
            {"project_id": "p-1", "title": "Write the release notes", "assignee": center.agent_id},
        )
        task_id = created.get("task_id") if isinstance(created, dict) else None
        out.expect(not failed and bool(task_id), "create_task returned a task_id")
        _, task = await call(client, "get_task", {"task_id": task_id})
        out.expect(isinstance(task, dict) and task.get("status") == "open", "the task is open")
        _, beat = await call(client, "heartbeat", {"task_id": task_id})
        out.expect(isinstance(beat, dict) and beat.get("status") == "running", "now running")
        await call(client, "post_task_message", {"task_id": task_id, "content": "Drafted."})
        _, done = await call(
            client, "complete_task", {"task_id": task_id, "summary": "Notes are in NOTES.md"}
        )
        out.expect(isinstance(done, dict) and done.get("status") == "completed", "completed")
        _, work = await call(client, "get_my_work", {})
        out.expect(isinstance(work, dict) and work.get("tasks") == [], "no work left")

        out.step("A model tries to act as another agent")
        failed, refused = await call(
            client, "get_task", {"task_id": task_id, "agent_id": "agent-2"}
        )
        out.expect(
            failed and isinstance(refused, dict) and refused.get("error") == "invalid_arguments",
            "the smuggled agent_id is refused before any request is made",
        )

        out.step("Deferred tools are one search away (and callable even without a list refresh)")
        _, found = await call(client, "search_tools", {"query": "subscribe"})
        loaded = [t["name"] for t in found.get("loaded", [])] if isinstance(found, dict) else []
        out.expect("subscribe" in loaded, "search_tools loaded subscribe")
        failed, _ = await call(client, "subscribe", {"task_id": task_id})
        out.expect(not failed, "the loaded tool works")

    out.step("What the center received (agent_id is always the binding's)")
    seen = [r for r in center.requests(100) if str(r.get("route", "")).startswith("/admin/")]
    ids = sorted({str((r.get("body") or {}).get("agent_id")) for r in seen})
    for entry in seen:
        out.say(f"   {entry.get('route')}  agent_id={(entry.get('body') or {}).get('agent_id')}")
    out.expect(ids == [center.agent_id], f"every request carried agent_id={center.agent_id}")


USAGE = """usage: mcphost demo [fleet [--agents N] | agents | model [--port N] | host]

  fleet   the main job: the devcenter, `mcphost supervise` with stand-in agents in a tmux
          bundle, `ctl status`, a kill and its restart, a relay send, a clean stop
  agents  real Claude Code and Codex CLIs under `mcphost supervise` against the model stand-in
  model   the model stand-in for Claude Code and Codex, and the env lines for a fleet file
  host    the standalone host (`mcphost host`) driven by a real MCP client (the default)
"""


def main(argv: list[str]) -> int:
    if argv and argv[0] == "fleet":
        from mcphost.demofleet import main as fleet

        return fleet(argv[1:])
    if argv and argv[0] == "model":
        from mcphost.demomodel import main as model

        return model(argv[1:])
    if argv and argv[0] == "agents":
        from mcphost.demoagents import main as agents

        return agents(argv[1:])
    if argv and argv[0] == "host":
        argv = argv[1:]
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE + "\n" + (__doc__ or "").split("\n\n")[0], file=sys.stderr)
        return 0
    if argv:
        print(USAGE, file=sys.stderr)
        return 2
    import anyio

    from mcphost.testing import DevCenter

    out = Transcript()
    with tempfile.TemporaryDirectory(prefix="mcphost-demo-") as tmp:
        out.say(f"Starting the reference center in {tmp} ...")
        with DevCenter.start(Path(tmp), unix=True, control=True) as center:
            out.say(f"Center up on unix:{center.socket_path}; agent {center.agent_id}.")
            anyio.run(_drive, center, out)
    if out.failures:
        out.say(f"\nDemo finished with {len(out.failures)} unexpected result(s).")
        return 1
    out.say("\nDemo finished: every step behaved as shown. Everything was cleaned up.")
    return 0
