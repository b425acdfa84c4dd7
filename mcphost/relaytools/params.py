"""Input schemas as data: each tool's parameters and each meta-tool command's `args`.

Owns: the JSON Schemas that `tools/list` advertises and `help` renders, and the constants they
are built from (commands, bounds). The schemas are also the source of truth for the unknown-field
and JSON-type checks in `validation`.

Rules every schema here keeps (upstream's "MiMo compatibility" and strictness rules):
- no `["x", "null"]` type unions anywhere: an optional field is a plain single type, just not
  `required`;
- every object schema, including `args`, has `additionalProperties: false`;
- meta-tool `command` fields are flat string enums (an unsupported value still reaches
  validation and gets `validation_invalid_params`).

The look bounds and choose outcomes are `mcphost.agentmux.operations`' own (their one home).

Must never: do I/O, or import anything of mcphost but `mcphost.agentmux` (import-linter).
"""

from __future__ import annotations

from typing import Any

from mcphost.agentmux.operations import CHOOSE_OUTCOMES, LOOK_LINES_MAX, LOOK_LINES_MIN

__all__ = ["CHOOSE_OUTCOMES", "LOOK_LINES_MAX", "LOOK_LINES_MIN"]  # and the schemas below

LIST_COMMANDS = ("principals", "decisions")
UPDOWN_COMMANDS = ("up", "down")
NEW_COMMANDS = ("peer",)
CHANGE_COMMANDS = ("psk",)

RESERVED_NAMESPACES = ("ALL", "EXTERNAL", "RELAY")
GLOBAL = "GLOBAL"
FAN_OUT = "*"

Schema = dict[str, Any]


def _string(description: str) -> Schema:
    return {"type": "string", "description": description}


def _object(
    properties: dict[str, Schema], required: tuple[str, ...] = (), description: str | None = None
) -> Schema:
    out: Schema = {"type": "object"}
    if description:
        out["description"] = description
    out["properties"] = properties
    if required:
        out["required"] = list(required)
    out["additionalProperties"] = False
    return out


# -- meta-tool args ----------------------------------------------------------------------------

_NAMESPACE = _string(
    'Which namespace to list: omit for the home bundle, a bundle name, "GLOBAL", '
    'or "*" for every configured bundle.'
)
_PRINCIPAL_ID = _string("The principal, fully qualified as <id>@<namespace>.")
_OUTPUT_PATH = _string(
    "Absolute path the relay writes the PSK to (mode 0600) instead of returning it; "
    "mutually exclusive with write_to_config."
)
_WRITE_TO_CONFIG = {
    "type": "boolean",
    "description": "Write the PSK to the session's own credential file; "
    "mutually exclusive with output_path.",
}

LIST_PRINCIPALS_ARGS = _object({"namespace": _NAMESPACE})
LIST_DECISIONS_ARGS = _object({})
UPDOWN_ARGS = _object({})
NEW_PEER_ARGS = _object(
    {
        "principal_id": _PRINCIPAL_ID,
        "scope": _string("Peer scope recorded on the principal (for @RELAY / @EXTERNAL)."),
        "output_path": _OUTPUT_PATH,
        "write_to_config": _WRITE_TO_CONFIG,
    },
    required=("principal_id",),
)
CHANGE_PSK_ARGS = _object(
    {
        "principal_id": _PRINCIPAL_ID,
        "output_path": _OUTPUT_PATH,
        "write_to_config": _WRITE_TO_CONFIG,
    },
    required=("principal_id",),
)

# command key ("list.principals") -> args schema
COMMAND_ARGS: dict[str, Schema] = {
    "list.principals": LIST_PRINCIPALS_ARGS,
    "list.decisions": LIST_DECISIONS_ARGS,
    "updown.up": UPDOWN_ARGS,
    "updown.down": UPDOWN_ARGS,
    "new.peer": NEW_PEER_ARGS,
    "change.psk": CHANGE_PSK_ARGS,
}


def _union_args(*schemas: Schema, description: str) -> Schema:
    properties: dict[str, Schema] = {}
    for schema in schemas:
        properties.update(schema["properties"])
    return _object(properties, description=description)


def _meta(commands: tuple[str, ...], command_help: str, args: Schema) -> Schema:
    return _object(
        {
            "command": {"type": "string", "enum": list(commands), "description": command_help},
            "args": args,
        },
        required=("command",),
    )


# -- tool parameters ---------------------------------------------------------------------------

LIST_PARAMS = _meta(
    LIST_COMMANDS,
    '"principals" lists sessions per namespace; "decisions" lists pending ACP choices.',
    _union_args(
        LIST_PRINCIPALS_ARGS,
        LIST_DECISIONS_ARGS,
        description="Command arguments; see help query 'list.principals'.",
    ),
)
UPDOWN_PARAMS = _meta(
    UPDOWN_COMMANDS,
    '"up" hosts the associated bundle; "down" unhosts it.',
    _union_args(UPDOWN_ARGS, description="No arguments; pass {} or omit."),
)
NEW_PARAMS = _meta(
    NEW_COMMANDS,
    '"peer" registers a principal and mints its PSK.',
    _union_args(NEW_PEER_ARGS, description="Command arguments; see help query 'new.peer'."),
)
NEW_PARAMS["properties"]["args"]["required"] = ["principal_id"]
CHANGE_PARAMS = _meta(
    CHANGE_COMMANDS,
    '"psk" rotates an existing principal\'s PSK.',
    _union_args(CHANGE_PSK_ARGS, description="Command arguments; see help query 'change.psk'."),
)
CHANGE_PARAMS["properties"]["args"]["required"] = ["principal_id"]

HELP_PARAMS = _object(
    {
        "query": _string(
            "Empty for the inventory; a tool ('list') or a command ('list.principals') "
            "for its schema."
        )
    }
)

SEND_PARAMS = _object(
    {
        "message": _string("The message body; must not be blank."),
        "targets": {
            "type": "array",
            "items": {"type": "string"},
            "default": [],
            "description": "Recipients: a bare session id in the associated bundle, "
            "or <id>@<namespace>. Leave empty with broadcast=true.",
        },
        "broadcast": {
            "type": "boolean",
            "default": False,
            "description": "Send to every other member of the associated bundle.",
        },
        "request_id": _string("Optional caller id echoed back in the result."),
    },
    required=("message",),
)

LOOK_PARAMS = _object(
    {
        "target_session": _string("The session to inspect, fully qualified as <id>@<namespace>."),
        "lines": {
            "type": "integer",
            "format": "uint32",
            "minimum": 0,
            "description": f"Window size, {LOOK_LINES_MIN}..{LOOK_LINES_MAX}: tmux pane lines "
            "(default 120) or ACP replay entries (default 50).",
        },
        "offset": {
            "type": "integer",
            "format": "uint32",
            "minimum": 0,
            "description": "ACP only: entries to skip from the newest end, to walk back.",
        },
    },
    required=("target_session",),
)

RAWW_PARAMS = _object(
    {
        "target_session": _string("The session to write to, fully qualified as <id>@<namespace>."),
        "text": _string("Raw text written to the target's input (at most 32 KiB)."),
        "no_enter": {
            "type": "boolean",
            "default": False,
            "description": "Do not press Enter after the text.",
        },
        "request_id": _string("Optional caller id."),
    },
    required=("target_session", "text"),
)

CHOOSE_PARAMS = _object(
    {
        "choice_request_id": _string("The pending choice, from list command='decisions'."),
        "outcome": {
            "type": "string",
            "enum": list(CHOOSE_OUTCOMES),
            "description": '"selected" (needs option_id) or "cancelled" (must omit option_id).',
        },
        "option_id": _string("The chosen option's id; only with outcome='selected'."),
    }
)

TOOL_PARAMS: dict[str, Schema] = {
    "list": LIST_PARAMS,
    "help": HELP_PARAMS,
    "send": SEND_PARAMS,
    "look": LOOK_PARAMS,
    "raww": RAWW_PARAMS,
    "choose": CHOOSE_PARAMS,
    "updown": UPDOWN_PARAMS,
    "new": NEW_PARAMS,
    "change": CHANGE_PARAMS,
}
