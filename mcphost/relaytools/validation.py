"""Pure request validation: arguments in, a typed request out, or a `ToolFailure`.

Owns: the upstream validation order for every tool (size bounds -> unknown fields -> JSON
types -> per-tool rules; a wrong JSON type is refused in the wire's words,
`agentmux.operations.invalid_type`), the exact codes, messages and details (for `send`, `raww`, `look`,
`choose`, `new` and `change` the body's rules are the wire's own: `mcphost.agentmux.operations`, which the relay reads the
same bodies with, so they are written once), the meta-tool `args` parsing
rules, the `new`/`change` destination mapping, and `send` target qualification.

Size bounds come first (`mcphost.argbounds`, shared with the center-tools host): an arguments
object over a limit is refused unread with `validation_invalid_params` and
`details.reason = "arguments_too_large"` (the code agentmux uses for every malformed-arguments
refusal made on the MCP side), and an unknown-field refusal names at most
`MAX_REPORTED_FIELDS` fields (each cut short) plus `details.omitted_fields`. Below those limits
agentmux's exact message and `details: {"fields": [...]}` are kept.

Validation runs before the association guard and before any relay traffic, so a malformed call
never touches the relay and gets the same answer whether or not the server is associated.

Must never: do I/O, consult the association (the caller passes the bundle where needed), or
perform authorization (the relay is the sole decision point).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

from mcphost.agentmux.operations import (
    EXPECTED,
    NON_STRING_ITEM,
    ChangePskRequest,
    ChoicesPickRequest,
    LookRequest,
    NewPeerRequest,
    RawwRequest,
    SendRequest,
    WireRequest,
    invalid_type,
)
from mcphost.agentmux.wire import RelayError, json_type
from mcphost.argbounds import Oversize, oversize, report_names
from mcphost.names import is_bundle_name
from mcphost.relaytools import params as P
from mcphost.relaytools.errors import (
    ToolFailure,
    invalid_args,
    invalid_params,
    unknown_fields,
)

R = TypeVar("R")
W = TypeVar("W", bound=WireRequest)

# -- typed requests --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ListPrincipals:
    namespace: str | None  # None = the home bundle


@dataclass(frozen=True, slots=True)
class ListDecisions:
    pass


@dataclass(frozen=True, slots=True)
class Updown:
    command: str


@dataclass(frozen=True, slots=True)
class Help:
    query: str


# -- generic checks --------------------------------------------------------------------------


def too_large(tool: str, found: Oversize) -> ToolFailure:
    """An arguments object over a limit of `mcphost.argbounds`, refused without being walked."""
    return invalid_params(
        f"arguments too large for {tool} request: {found.message}; pass only the fields of "
        "the tool's input schema",
        {**found.details(), "hint": f"use help query '{tool}' for exact schema"},
    )


def bounded(
    tool: str,
) -> Callable[[Callable[[Mapping[str, Any]], R]], Callable[[Mapping[str, Any]], R]]:
    """Run the size bounds before a tool's validator; everything after sees bounded input."""

    def wrap(validate: Callable[[Mapping[str, Any]], R]) -> Callable[[Mapping[str, Any]], R]:
        @wraps(validate)
        def checked(arguments: Mapping[str, Any]) -> R:
            found = oversize(arguments)
            if found is not None:
                raise too_large(tool, found)
            return validate(arguments)

        return checked

    return wrap


def unknown(context: str, extra: list[str]) -> ToolFailure:
    """agentmux's unknown-field refusal, verbatim while short; else cut to a few names + a count."""
    names = sorted(extra)  # at most MAX_KEYS_PER_OBJECT of them: the bounds ran first
    shown, omitted = report_names(names, len(names))
    if shown == names:
        return unknown_fields(context, names)
    message = f"unknown parameter(s) for {context}: {', '.join(shown)}"
    details: dict[str, Any] = {"fields": shown}
    if omitted:
        message += f" and {omitted} more"
        details["omitted_fields"] = omitted
    return invalid_params(message, details)


def _matches(value: Any, schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "object":
        return isinstance(value, dict)
    return True


def _type_mismatch(
    values: Mapping[str, Any], schema: Mapping[str, Any]
) -> tuple[str, str, str] | None:
    """The first (field, expected, got) whose JSON type is wrong; null counts as absent."""
    for name, spec in schema["properties"].items():
        value = values.get(name)
        if value is None or _matches(value, spec):
            continue
        got = json_type(value)
        if spec.get("type") == "array" and isinstance(value, list):
            got = NON_STRING_ITEM
        return name, EXPECTED.get(spec.get("type", ""), "a value"), got
    return None


def known_fields(arguments: Mapping[str, Any], tool: str) -> None:
    """Unknown top-level fields of one tool's parameters are refused, before anything else."""
    extra = [k for k in arguments if k not in P.TOOL_PARAMS[tool]["properties"]]
    if extra:
        raise unknown(f"{tool} request", extra)


def check_fields(arguments: Mapping[str, Any], tool: str) -> None:
    """Unknown top-level fields, then JSON types, for one tool's parameters."""
    known_fields(arguments, tool)
    mismatch = _type_mismatch(arguments, P.TOOL_PARAMS[tool])
    if mismatch is not None:
        raise ToolFailure.of(invalid_type(*mismatch))


def parse_args(
    raw: Any, schema: Mapping[str, Any], context: str, label: str, help_query: str
) -> dict[str, Any]:
    """A meta-tool's `args`: null/absent/{} -> {}; a non-object or bad field is refused."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise invalid_args(label, f"args must be a JSON object, got {json_type(raw)}", help_query)
    extra = [f"args.{k}" for k in raw if k not in schema["properties"]]
    if extra:
        raise unknown(context, extra)
    mismatch = _type_mismatch(raw, schema)
    if mismatch is not None:
        name, expected, got = mismatch
        raise invalid_args(label, f"args.{name}: expected {expected}, got {got}", help_query)
    return {k: v for k, v in raw.items() if v is not None}


def _command(arguments: Mapping[str, Any], allowed: tuple[str, ...], message: str) -> str:
    command = arguments.get("command")
    if not isinstance(command, str) or command not in allowed:
        raise invalid_params(message, {"command": command})
    return command


def _blank(value: Any) -> bool:
    return not isinstance(value, str) or not value.strip()


# -- per tool --------------------------------------------------------------------------------


@bounded("list")
def validate_list(arguments: Mapping[str, Any]) -> ListPrincipals | ListDecisions:
    known_fields(arguments, "list")
    command = _command(arguments, P.LIST_COMMANDS, 'command must be "principals" or "decisions"')
    if command == "decisions":
        parse_args(
            arguments.get("args"),
            P.LIST_DECISIONS_ARGS,
            "list decisions command",
            "list decisions",
            "list.decisions",
        )
        return ListDecisions()
    args = parse_args(
        arguments.get("args"),
        P.LIST_PRINCIPALS_ARGS,
        "list principals command",
        "list",
        "list.principals",
    )
    namespace = args.get("namespace") or None
    if namespace is None:
        return ListPrincipals(None)
    if namespace in P.RESERVED_NAMESPACES:
        raise invalid_params(
            'namespace must be a bundle name, "GLOBAL", or "*"', {"namespace": namespace}
        )
    if namespace not in (P.GLOBAL, P.FAN_OUT) and not is_bundle_name(namespace):
        raise invalid_params(
            "bundle_name contains unsupported characters", {"bundle_name": namespace}
        )
    return ListPrincipals(namespace)


@bounded("help")
def validate_help(arguments: Mapping[str, Any]) -> Help:
    check_fields(arguments, "help")
    query = arguments.get("query")
    return Help(query.strip() if isinstance(query, str) else "")


def wire_request(model: type[W], fields: Mapping[str, Any]) -> W:
    """Checked tool arguments as the operation's wire body, by agentmux's one reader (its rules,
    codes and messages are the relay's too); a refusal is carried as a ToolFailure unchanged."""
    try:
        return model.read(fields)
    except RelayError as err:
        raise ToolFailure.of(err) from None


@bounded("send")
def validate_send(arguments: Mapping[str, Any]) -> SendRequest:
    check_fields(arguments, "send")
    return wire_request(SendRequest, arguments)


def _stripped(arguments: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The arguments with these string fields trimmed: the tools are lenient with whitespace."""
    fields = dict(arguments)
    for name in names:
        if isinstance(fields.get(name), str):
            fields[name] = fields[name].strip()
    return fields


@bounded("look")
def validate_look(arguments: Mapping[str, Any]) -> LookRequest:
    check_fields(arguments, "look")
    return wire_request(LookRequest, _stripped(arguments, "target_session"))


@bounded("raww")
def validate_raww(arguments: Mapping[str, Any]) -> RawwRequest:
    check_fields(arguments, "raww")
    return wire_request(RawwRequest, _stripped(arguments, "target_session"))


@bounded("choose")
def validate_choose(arguments: Mapping[str, Any]) -> ChoicesPickRequest:
    """The tool trims what it is given (an outcome only when that makes it valid, so a refusal
    still shows the value as passed); the rules are the wire's."""
    check_fields(arguments, "choose")
    fields = _stripped(arguments, "choice_request_id", "option_id")
    outcome = fields.get("outcome")
    if isinstance(outcome, str) and outcome.strip() in P.CHOOSE_OUTCOMES:
        fields["outcome"] = outcome.strip()
    return wire_request(ChoicesPickRequest, fields)


@bounded("updown")
def validate_updown(arguments: Mapping[str, Any]) -> Updown:
    known_fields(arguments, "updown")
    command = _command(arguments, P.UPDOWN_COMMANDS, 'updown command must be "up" or "down"')
    parse_args(
        arguments.get("args"),
        P.UPDOWN_ARGS,
        f"updown {command} command",
        "updown",
        f"updown.{command}",
    )
    return Updown(command)


def destination(args: Mapping[str, Any]) -> dict[str, Any]:
    """`output_path` present (even "") -> path; `write_to_config` true -> config; else response."""
    has_path = "output_path" in args
    to_config = bool(args.get("write_to_config"))
    if has_path and to_config:
        raise invalid_params(
            "output_path and write_to_config are mutually exclusive; pass at most one",
            {"fields": ["args.output_path", "args.write_to_config"]},
        )
    if has_path:
        return {"kind": "path", "path": args["output_path"]}
    if to_config:
        return {"kind": "config"}
    return {"kind": "response"}


def _credential_args(
    arguments: Mapping[str, Any], tool: str, commands: tuple[str, ...], schema: Mapping[str, Any]
) -> tuple[dict[str, Any], str]:
    """`new peer` and `change psk` alike: unknown fields, the one command, its `args`, then a
    non-blank `principal_id` (returned trimmed, with the args)."""
    known_fields(arguments, tool)
    (command,) = commands
    _command(arguments, commands, f'{tool} command must be "{command}"')
    named = f"{tool} {command}"
    args = parse_args(arguments.get("args"), schema, f"{named} command", named, f"{tool}.{command}")
    principal = args.get("principal_id")
    if _blank(principal):
        raise invalid_params(
            f"principal_id is required for {named}", {"field": "args.principal_id"}
        )
    assert isinstance(principal, str)
    return args, principal.strip()


@bounded("new")
def validate_new(arguments: Mapping[str, Any]) -> NewPeerRequest:
    args, principal = _credential_args(arguments, "new", P.NEW_COMMANDS, P.NEW_PEER_ARGS)
    fields = {
        "principal_id": principal,
        "scope": args.get("scope"),
        "destination": destination(args),
    }
    return wire_request(NewPeerRequest, fields)


@bounded("change")
def validate_change(arguments: Mapping[str, Any]) -> ChangePskRequest:
    args, principal = _credential_args(arguments, "change", P.CHANGE_COMMANDS, P.CHANGE_PSK_ARGS)
    return wire_request(
        ChangePskRequest, {"principal_id": principal, "destination": destination(args)}
    )


# -- target qualification --------------------------------------------------------------------


def qualify_target(target: str, bundle: str | None) -> str:
    """`id@ns` passes verbatim; a bare id borrows the associated bundle; no bundle -> refused."""
    if "@" in target:
        return target
    if not bundle:
        raise ToolFailure(
            "validation_unqualified_target",
            "target must be a fully-qualified principal id (id@namespace); a relay-wide "
            "MCP server cannot infer a bundle namespace",
            {"target": target},
        )
    return f"{target}@{bundle}"
