"""The relay tools' input schemas (mcphost/relaytools/params.py): closed objects without null
unions, generated from the wire's models."""

from __future__ import annotations

from typing import Any

import pytest

from mcphost.relaytools import params


def _walk(schema: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(schema, dict):
        out.append((path, schema))
        for key, value in schema.items():
            out += _walk(value, f"{path}/{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            out += _walk(value, f"{path}/{i}")
    return out


ALL_SCHEMAS = {**params.TOOL_PARAMS, **{f"args:{k}": v for k, v in params.COMMAND_ARGS.items()}}


@pytest.mark.parametrize("name", sorted(ALL_SCHEMAS))
def test_schema_has_no_null_unions_and_closes_every_object(name: str) -> None:
    for path, node in _walk(ALL_SCHEMAS[name]):
        if isinstance(node.get("type"), list):
            raise AssertionError(f"{name}{path}: type union {node['type']}")
        assert node.get("type") != "null", f"{name}{path}"
        if node.get("type") == "object":
            assert node.get("additionalProperties") is False, f"{name}{path}"


def test_schemas_are_generated_from_the_models() -> None:
    """The wire's bodies state the types, defaults, bounds and enums (agentmux.operations); the
    schemas add the descriptions and what is required. Pinned for two tools, whole."""
    assert params.LOOK_PARAMS == {
        "type": "object",
        "properties": {
            "target_session": {"type": "string", "description": "The session to inspect, "
                               "fully qualified as <id>@<namespace>."},
            "lines": {"type": "integer", "format": "uint32", "minimum": 0,
                      "description": "Window size, 1..1000: tmux pane lines (default 120) or "
                      "ACP replay entries (default 50)."},
            "offset": {"type": "integer", "format": "uint32", "minimum": 0,
                       "description": "ACP only: entries to skip from the newest end, to walk "
                       "back."},
        },
        "required": ["target_session"],
        "additionalProperties": False,
    }  # fmt: skip
    send = params.SEND_PARAMS["properties"]
    assert send["targets"] == {
        "type": "array", "items": {"type": "string"}, "default": [],
        "description": "Recipients: a bare session id in the associated bundle, or "
        "<id>@<namespace>. Leave empty with broadcast=true.",
    }  # fmt: skip
    assert send["broadcast"]["default"] is False and "default" not in send["message"]
    assert params.CHOOSE_PARAMS["properties"]["outcome"]["enum"] == list(params.CHOOSE_OUTCOMES)
    # a meta-tool's args schema names every field of its model, and only those
    for model, args in (
        (params.ListPrincipalsArgs, params.LIST_PRINCIPALS_ARGS),
        (params.NewPeerArgs, params.NEW_PEER_ARGS),
        (params.ChangePskArgs, params.CHANGE_PSK_ARGS),
        (params.NoArgs, params.UPDOWN_ARGS),
        (params.HelpParams, params.HELP_PARAMS),
    ):
        assert list(args["properties"]) == list(model.model_fields)
