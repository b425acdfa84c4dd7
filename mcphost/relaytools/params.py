"""Input schemas: each tool's parameters and each meta-tool command's `args`, generated from models.

Owns: the JSON Schemas that `tools/list` advertises and `help` renders, generated from typed
models (`schema`): a tool that sends one relay operation's body is that operation's
`mcphost.agentmux.operations` model (send, look, raww, choose), its fields' types, defaults and
stated facts (`lines` a uint32, `outcome` one of `CHOOSE_OUTCOMES`) the model's; the meta-tools'
`args` and `help` have their own models here (`ListPrincipalsArgs`, `NewPeerArgs`, ...). What a
schema adds is the relay tools' own: which fields a tool exposes, in which order, what each says
to the model (the descriptions) and which are required. The constants the schemas are built
from (commands) are here too. The schemas are also the source of truth for the unknown-field and
JSON-type checks in `validation`.

Rules every schema here keeps (upstream's "MiMo compatibility" and strictness rules):
- no `["x", "null"]` type unions anywhere: an optional field is a plain single type, just not
  `required`;
- every object schema, including `args`, has `additionalProperties: false`;
- meta-tool `command` fields are flat string enums (an unsupported value still reaches
  validation and gets `validation_invalid_params`).

The look bounds and choose outcomes are `mcphost.agentmux.operations`' own (their one home).

Generating (`schema(model, fields, required)`): a field's JSON type from its annotation (str,
bool, int, a list of them; `X | None` is X: an optional field is not required, never a null
union), then what the field states (`json_schema_extra`), then its default when it has a real
one (not None, not the empty string a model uses for "absent, refused by the rules"), then the
description. pydantic's own `model_json_schema` is not used: it writes `anyOf` null unions,
titles and `$defs` the wire's schemas never had.

Must never: do I/O, or import anything of mcphost but `mcphost.agentmux` (import-linter).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo

from mcphost.agentmux.operations import (
    CHOOSE_OUTCOMES,
    LOOK_LINES_MAX,
    LOOK_LINES_MIN,
    ChoicesPickRequest,
    LookRequest,
    RawwRequest,
    SendRequest,
)

__all__ = ["CHOOSE_OUTCOMES", "LOOK_LINES_MAX", "LOOK_LINES_MIN"]  # and the schemas below

LIST_COMMANDS = ("principals", "decisions")
UPDOWN_COMMANDS = ("up", "down")
NEW_COMMANDS = ("peer",)
CHANGE_COMMANDS = ("psk",)

RESERVED_NAMESPACES = ("ALL", "EXTERNAL", "RELAY")
GLOBAL = "GLOBAL"
FAN_OUT = "*"

Schema = dict[str, Any]
_JSON_TYPES: dict[Any, str] = {str: "string", bool: "boolean", int: "integer"}


def _type(annotation: Any) -> Schema:
    """The JSON Schema type of a field's annotation (module doc)."""
    if get_origin(annotation) in (Union, types.UnionType):
        (inner,) = (a for a in get_args(annotation) if a is not type(None))
        return _type(inner)
    if get_origin(annotation) is list:
        (item,) = get_args(annotation)
        return {"type": "array", "items": _type(item)}
    return {"type": _JSON_TYPES[annotation]}


def _property(info: FieldInfo, description: str) -> Schema:
    out = _type(info.annotation)
    if isinstance(info.json_schema_extra, dict):
        out.update(info.json_schema_extra)
    default = info.get_default(call_default_factory=True)
    if not info.is_required() and default is not None and default != "":
        out["default"] = default
    out["description"] = description
    return out


def schema(
    model: type[BaseModel], fields: Mapping[str, str], required: tuple[str, ...] = ()
) -> Schema:
    """The object schema of `model`'s `fields` (name -> description, in the order given)."""
    properties = {name: _property(model.model_fields[name], text) for name, text in fields.items()}
    return _object(properties, required)


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


class Args(BaseModel):
    """A meta-tool command's `args` (or `help`'s parameters): the typed shape its schema is
    generated from."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ListPrincipalsArgs(Args):
    namespace: str | None = None


class NoArgs(Args):
    pass


class NewPeerArgs(Args):
    principal_id: str | None = None
    scope: str | None = None
    output_path: str | None = None
    write_to_config: bool | None = None


class ChangePskArgs(Args):
    principal_id: str | None = None
    output_path: str | None = None
    write_to_config: bool | None = None


class HelpParams(Args):
    query: str | None = None


_PRINCIPAL_ID = "The principal, fully qualified as <id>@<namespace>."
_OUTPUT_PATH = (
    "Absolute path the relay writes the PSK to (mode 0600) instead of returning it; "
    "mutually exclusive with write_to_config."
)
_WRITE_TO_CONFIG = (
    "Write the PSK to the session's own credential file; mutually exclusive with output_path."
)

LIST_PRINCIPALS_ARGS = schema(
    ListPrincipalsArgs,
    {
        "namespace": 'Which namespace to list: omit for the home bundle, a bundle name, "GLOBAL", '
        'or "*" for every configured bundle.'
    },
)
LIST_DECISIONS_ARGS = schema(NoArgs, {})
UPDOWN_ARGS = schema(NoArgs, {})
NEW_PEER_ARGS = schema(
    NewPeerArgs,
    {
        "principal_id": _PRINCIPAL_ID,
        "scope": "Peer scope recorded on the principal (for @RELAY / @EXTERNAL).",
        "output_path": _OUTPUT_PATH,
        "write_to_config": _WRITE_TO_CONFIG,
    },
    required=("principal_id",),
)
CHANGE_PSK_ARGS = schema(
    ChangePskArgs,
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

HELP_PARAMS = schema(
    HelpParams,
    {
        "query": "Empty for the inventory; a tool ('list') or a command ('list.principals') "
        "for its schema."
    },
)

SEND_PARAMS = schema(
    SendRequest,
    {
        "message": "The message body; must not be blank.",
        "targets": "Recipients: a bare session id in the associated bundle, "
        "or <id>@<namespace>. Leave empty with broadcast=true.",
        "broadcast": "Send to every other member of the associated bundle.",
        "request_id": "Optional caller id echoed back in the result.",
    },
    required=("message",),
)

LOOK_PARAMS = schema(
    LookRequest,
    {
        "target_session": "The session to inspect, fully qualified as <id>@<namespace>.",
        "lines": f"Window size, {LOOK_LINES_MIN}..{LOOK_LINES_MAX}: tmux pane lines "
        "(default 120) or ACP replay entries (default 50).",
        "offset": "ACP only: entries to skip from the newest end, to walk back.",
    },
    required=("target_session",),
)

RAWW_PARAMS = schema(
    RawwRequest,
    {
        "target_session": "The session to write to, fully qualified as <id>@<namespace>.",
        "text": "Raw text written to the target's input (at most 32 KiB).",
        "no_enter": "Do not press Enter after the text.",
        "request_id": "Optional caller id.",
    },
    required=("target_session", "text"),
)

CHOOSE_PARAMS = schema(
    ChoicesPickRequest,
    {
        "choice_request_id": "The pending choice, from list command='decisions'.",
        "outcome": '"selected" (needs option_id) or "cancelled" (must omit option_id).',
        "option_id": "The chosen option's id; only with outcome='selected'.",
    },
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
