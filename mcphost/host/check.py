"""`mcphost check`: launch preflight for operators and worker daemons.

Owns: `probe` (one harmless call through a given client, timed and classified; the supervisor's
center health uses it too), reading the binding exactly as the host does, dialling the center (the pin is verified on
the TLS handshake), making one harmless read (`get_my_work`, built like every host request by
`mcphost.host.requests.RequestBuilder`, so it carries the binding's agent and generation), checking the workspace root and
runtime socket, and printing a human report to stderr (`--json` prints a JSON report to stdout
instead). Exit 0 when the host would work, 1 when something needs fixing, 2 on a bad binding.
Every outcome is a classified result, in text and with `--json` alike: a bad binding is
`bad_binding` with the variable in its details, and a failure nobody foresaw is
`internal_unexpected_failure` naming only the exception's type, never a traceback.
Must never: print the token (only whether one is configured), or echo an unknown argument.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
import time
from typing import TYPE_CHECKING, Any

from mcphost.binding import AgentBinding, BindingError
from mcphost.cliargs import Parser
from mcphost.errors import ToolFailure, WorkspaceRootUnset

if TYPE_CHECKING:
    from mcphost.admin.client import AdminClient, AdminRequest


def _socket_state(path: str) -> str:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    return "ok" if stat.S_ISSOCK(mode) else "not a socket"


def _workspace(binding: AgentBinding) -> tuple[bool, str]:
    """Whether the file tools can use the workspace root (an unset root is allowed)."""
    from mcphost.host.workspace import workspace_problem

    problem = workspace_problem(binding)
    if problem is None:
        return True, f"{binding.agent_root}: ok"
    if isinstance(problem, WorkspaceRootUnset):
        return True, "unset (file tools will answer workspace_root_unset)"
    return False, f"{problem.code}: {problem.message}"


async def probe(client: AdminClient, request: AdminRequest) -> dict[str, Any]:
    """One harmless call through `client` (the pin is verified on the handshake): `{"ok": true,
    "ms", "reply"}` or `{"ok": false, "error", "message", "details"}`. Shared with the
    supervisor's center health (`mcphost.supervisor.center.health`)."""
    started = time.perf_counter()
    try:
        reply = await client.call(request)
    except ToolFailure as failure:
        return {"ok": False, **failure.payload()}
    return {"ok": True, "ms": round((time.perf_counter() - started) * 1000, 1), "reply": reply}


async def _probe(binding: AgentBinding) -> dict[str, Any]:
    from mcphost.admin.client import AdminClient
    from mcphost.host.requests import RequestBuilder

    client = AdminClient(binding.target, token=binding.token.reveal(), pins=binding.pins)
    try:
        result = await probe(client, RequestBuilder(binding).probe())
    finally:
        await client.aclose()
    if not result["ok"]:
        return result
    try:
        tasks = len(json.loads(result["reply"].body).get("tasks", []))
    except (ValueError, RecursionError, AttributeError, TypeError):  # an odd reply: count unknown
        tasks = None
    return {"ok": True, "ms": result["ms"], "open_tasks": tasks}


def main(argv: list[str]) -> int:
    parser = Parser(prog="mcphost check", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print a JSON report on stdout")
    args = parser.parse_args(argv)
    try:
        return _check(args.json)
    except Exception as exc:  # a bug: still a classified result, never a traceback
        message = (
            f"the check failed unexpectedly ({type(exc).__name__}); "
            "rerun with MCPHOST_LOG_LEVEL=debug and report it"
        )
        failure = {
            "ok": False,
            "error": "internal_unexpected_failure",
            "message": message,
            "details": {"exception": type(exc).__name__},
        }
        if args.json:
            print(json.dumps(failure))
        print(f"mcphost check: internal_unexpected_failure: {message}", file=sys.stderr)
        return 1


def _check(as_json: bool) -> int:
    try:
        binding = AgentBinding.from_env()
    except BindingError as exc:
        if as_json:
            failure = {
                "ok": False,
                "error": exc.code,
                "message": str(exc),
                "details": exc.details,
            }
            print(json.dumps(failure, ensure_ascii=False))
        for line in exc.lines():  # one line per bad variable
            print(f"mcphost check: {line}", file=sys.stderr)
        return 2

    center = asyncio.run(_probe(binding))
    root_ok, root_text = _workspace(binding)
    from mcphost.host.workspace import root_ancestor_warnings

    root_warnings = root_ancestor_warnings(binding)  # a warning: does not change `ok`
    runtime = _socket_state(binding.runtime_socket) if binding.runtime_socket else "unset"
    ok = center["ok"] and root_ok and runtime in ("ok", "unset")
    report = {
        "ok": ok,
        "agent_id": binding.agent_id,
        "target": str(binding.target),
        "token": "configured" if binding.token else "missing",
        "pins": len(binding.pins),
        "tier_tools": binding.tier_tools,
        "generation": binding.generation,
        "center": center,
        "workspace": root_text,
        "workspace_warnings": root_warnings,
        "runtime_socket": runtime,
    }
    if as_json:
        print(json.dumps(report, ensure_ascii=False))
        return 0 if ok else 1
    if center["ok"]:
        center_line = f"ok ({center['ms']} ms, {center['open_tasks']} open task(s) for this agent)"
    else:
        center_line = f"FAILED {center['error']}: {center['message']}"
    lines = [
        f"mcphost check: {'OK' if ok else 'PROBLEMS FOUND'}",
        f"  agent          {binding.agent_id} (generation {binding.generation})",
        f"  center         {binding.target}"
        + (f", {len(binding.pins)} pinned certificate(s)" if binding.target.kind == "tcp" else ""),
        f"  token          {report['token']}"
        + (f" (from {binding.token_file})" if binding.token_file else ""),
        f"  call           {center_line}",
        f"  workspace      {root_text}",
        *(f"  workspace      WARNING {w['code']}: {w['message']}" for w in root_warnings),
        f"  runtime socket {binding.runtime_socket + ' ' if binding.runtime_socket else ''}{runtime}",
        f"  tools          {'core + search_tools' if binding.tier_tools else 'full catalog'}",
    ]
    print("\n".join(lines), file=sys.stderr)
    return 0 if ok else 1
