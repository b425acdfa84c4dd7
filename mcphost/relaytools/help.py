"""The `help` tool's documents, composed from the catalog and the schemas; never reaches the relay.

Owns: the inventory document (empty query or "agentmux"), the meta-tool documents ("list", …),
the per-command/per-tool schema documents ("list.principals", "send", …), and the association
block.

Must never: do I/O, or expose anything about the relay beyond the association (bundle, session).
"""

from __future__ import annotations

from typing import Any

from mcphost.relaytools import errors
from mcphost.relaytools.params import COMMAND_ARGS, TOOL_PARAMS
from mcphost.relaytools.tools import INVENTORY_ORDER, TOOLS

SHAPE_HINTS = (
    "Meta-tools (list, updown, new, change) take {command, args}; args is a JSON object.",
    "Plain tools (send, look, raww, choose, help) take their fields at the top level.",
    "Query help with a tool name ('list') or a command ('list.principals') for its schema.",
)

_INVOKE_PARAMS: dict[str, dict[str, Any]] = {
    "choose": {"choice_request_id": "<uuid>", "outcome": "selected", "option_id": "<option-id>"},
    "new.peer": {"command": "peer", "args": {"principal_id": "<id>@<namespace>"}},
    "change.psk": {"command": "psk", "args": {"principal_id": "<id>@<namespace>"}},
}

QUERIES = (
    "agentmux",
    *(name for name in INVENTORY_ORDER if TOOLS[name].commands),
    *(c.key for name in INVENTORY_ORDER for c in TOOLS[name].commands),
    *(name for name in INVENTORY_ORDER if not TOOLS[name].commands),
)


def association_block(
    bundle: str | None, session: str | None, associated: bool, fault_code: str | None = None
) -> dict[str, Any]:
    if associated:
        return {"associated": True, "namespace": bundle, "session": session}
    block: dict[str, Any] = {"associated": False, "remedy": errors.REMEDY}
    if fault_code:
        block["startup_fault_code"] = fault_code
    return block


def _invoke(key: str) -> dict[str, Any]:
    tool, _, command = key.partition(".")
    if key in _INVOKE_PARAMS:
        return {"tool": tool, "params": _INVOKE_PARAMS[key]}
    if command:
        return {"tool": tool, "params": {"command": command, "args": {}}}
    return {"tool": tool, "params": {}}


def render(query: str, association: dict[str, Any]) -> dict[str, Any]:
    """The help document for `query`; `ToolFailure` for an unknown query."""
    if query in ("", "agentmux"):
        return {
            "namespace": "agentmux",
            "shape_hints": list(SHAPE_HINTS),
            "tools": [
                {"tool": name, "kind": TOOLS[name].kind, "description": TOOLS[name].description}
                for name in INVENTORY_ORDER
            ],
            "invoke": {"tool": "help", "params": {"query": "list"}},
            "association": association,
        }
    tool = TOOLS.get(query)
    if tool is not None and tool.commands:
        first = tool.commands[0].key
        return {
            "tool": tool.name,
            "kind": "meta_tool",
            "description": tool.description,
            "commands": [{"command": c.key, "description": c.description} for c in tool.commands],
            "invoke": _invoke(first),
        }
    if tool is not None:
        return {
            "command": tool.name,
            "description": tool.description,
            "args_schema": TOOL_PARAMS[tool.name],
            "invoke": _invoke(tool.name),
        }
    if query in COMMAND_ARGS:
        name = query.partition(".")[0]
        description = next(c.description for c in TOOLS[name].commands if c.key == query)
        return {
            "command": query,
            "description": description,
            "args_schema": COMMAND_ARGS[query],
            "invoke": _invoke(query),
        }
    raise errors.invalid_params(
        "unknown help query; try empty query, " + ", ".join(f"'{q}'" for q in QUERIES),
        {"query": query},
    )
