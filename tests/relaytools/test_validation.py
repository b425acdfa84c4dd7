"""Pure request validation (mcphost/relaytools/validation.py): order and messages, totality, and
the body the relay reads back (agentmux.operations)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcphost.agentmux.operations import ChoicesPickRequest, LookRequest, SendRequest
from mcphost.agentmux.wire import RelayError
from mcphost.relaytools import validation as V
from mcphost.relaytools.errors import ToolFailure
from tests.thorough import examples


def fails(fn: Any, arguments: dict[str, Any]) -> ToolFailure:
    with pytest.raises(ToolFailure) as info:
        fn(arguments)
    return info.value


# -- validation ------------------------------------------------------------------------------


def test_send_validation_order() -> None:
    f = fails(V.validate_send, {"message": "", "targets": [], "broadcast": True, "bogus": 1})
    assert (f.code, f.details) == ("validation_invalid_params", {"fields": ["bogus"]})
    assert f.message == "unknown parameter(s) for send request: bogus"
    f = fails(V.validate_send, {"message": "  ", "targets": ["a"], "broadcast": True})
    assert (f.code, f.message) == ("validation_invalid_arguments", "message must be non-empty")
    assert f.details is None
    f = fails(V.validate_send, {"message": "hi", "targets": ["a"], "broadcast": True})
    assert f.code == "validation_conflicting_targets"
    f = fails(V.validate_send, {"message": "hi"})
    assert f.code == "validation_empty_targets"
    assert V.validate_send({"message": "hi", "broadcast": True}).broadcast is True
    for retired in ("quiescence_timeout_ms", "acp_turn_timeout_ms"):
        assert fails(V.validate_send, {"message": "hi", retired: 5}).details == {
            "fields": [retired]
        }


def test_type_errors_are_typed() -> None:
    f = fails(V.validate_look, {"target_session": "b@p", "lines": "x"})
    assert f.code == "validation_invalid_params"
    assert f.details == {"field": "lines", "expected": "a non-negative integer", "got": "string"}
    f = fails(V.validate_send, {"message": "hi", "targets": ["a", 3]})
    assert f.details and f.details["field"] == "targets"
    # the relay's body reader refuses a wrong type in the same words (one rule, both ends)
    for model, body in (
        (LookRequest, {"target_session": "b@p", "lines": "x"}),
        (SendRequest, {"message": "hi", "targets": ["a", 3]}),
    ):
        with pytest.raises(RelayError) as read:
            model.read(body)
        tool = fails(V.validate_look if model is LookRequest else V.validate_send, body)
        assert (read.value.code, read.value.message) == (tool.code, tool.message)
        assert read.value.details == tool.details


@pytest.mark.parametrize("lines", [0, 1001, -1])
def test_look_lines_bounds(lines: int) -> None:
    f = fails(V.validate_look, {"target_session": "bravo@party", "lines": lines})
    assert f.code == "validation_invalid_lines"
    assert f.message == "lines must be between 1 and 1000"
    assert f.details == {"lines": lines, "min": 1, "max": 1000}


def test_look_target_checked_before_lines() -> None:
    f = fails(V.validate_look, {"target_session": "  ", "lines": 0})
    assert (f.code, f.message, f.details) == (
        "validation_unknown_target",
        "target_session must be non-empty",
        None,
    )
    assert V.validate_look({"target_session": "b@p", "lines": 1000, "offset": 3}) == LookRequest(
        target_session="b@p", lines=1000, offset=3
    )


@pytest.mark.parametrize(
    ("arguments", "message", "details"),
    [
        (
            {"outcome": "cancelled"},
            "choice_request_id must be a non-empty string",
            {"field": "choice_request_id"},
        ),
        (
            {"choice_request_id": " "},
            "choice_request_id must be a non-empty string",
            {"field": "choice_request_id"},
        ),
        (
            {"choice_request_id": "c"},
            'outcome must be "selected" or "cancelled"',
            {"field": "outcome"},
        ),
        (
            {"choice_request_id": "c", "outcome": "maybe"},
            'outcome must be "selected" or "cancelled"',
            {"field": "outcome", "value": "maybe"},
        ),
        (
            {"choice_request_id": "c", "outcome": "selected"},
            "selected outcome requires explicit non-empty option_id",
            {"field": "option_id", "outcome": "selected"},
        ),
        (
            {"choice_request_id": "c", "outcome": "selected", "option_id": " "},
            "selected outcome requires explicit non-empty option_id",
            {"field": "option_id", "outcome": "selected"},
        ),
        (
            {"choice_request_id": "c", "outcome": "cancelled", "option_id": ""},
            "cancelled outcome must omit option_id",
            {"field": "option_id", "outcome": "cancelled"},
        ),
    ],
)
def test_choose_matrix(arguments: dict[str, Any], message: str, details: dict[str, Any]) -> None:
    f = fails(V.validate_choose, arguments)
    assert (f.code, f.message, f.details) == ("validation_invalid_params", message, details)


def test_choose_trims_and_refuses_identity_fields() -> None:
    ok = V.validate_choose(
        {"choice_request_id": " c-1 ", "outcome": " selected", "option_id": " a "}
    )
    assert ok == ChoicesPickRequest(choice_request_id="c-1", outcome="selected", option_id="a")
    for field in ("decided_by", "ui_session_id", "operator_session_id", "bundle_name"):
        f = fails(V.validate_choose, {"choice_request_id": "c", "outcome": "cancelled", field: "x"})
        assert f.details == {"fields": [field]}


def test_list_validation() -> None:
    f = fails(V.validate_list, {})
    assert f.message == 'command must be "principals" or "decisions"'
    assert f.details == {"command": None}
    assert fails(V.validate_list, {"command": "sessions"}).details == {"command": "sessions"}
    f = fails(V.validate_list, {"command": "principals", "bogus": 1})
    assert f.details == {"fields": ["bogus"]}
    f = fails(V.validate_list, {"command": "principals", "args": {"stowaway": 1}})
    assert f.details == {"fields": ["args.stowaway"]}
    assert f.message == "unknown parameter(s) for list principals command: args.stowaway"
    f = fails(V.validate_list, {"command": "principals", "args": '{"namespace":"x"}'})
    assert f.message == "invalid args for list command"
    assert f.details == {
        "reason": "args must be a JSON object, got string",
        "hint": "pass args as a JSON object; use help query 'list.principals' for exact schema",
    }
    for reserved in ("ALL", "EXTERNAL", "RELAY"):
        f = fails(V.validate_list, {"command": "principals", "args": {"namespace": reserved}})
        assert f.details == {"namespace": reserved}
    f = fails(V.validate_list, {"command": "principals", "args": {"namespace": "a/b"}})
    assert f.details == {"bundle_name": "a/b"}
    assert V.validate_list({"command": "principals", "args": None}) == V.ListPrincipals(None)
    assert V.validate_list(
        {"command": "principals", "args": {"namespace": ""}}
    ) == V.ListPrincipals(None)
    assert V.validate_list({"command": "principals", "args": {"namespace": "*"}}).namespace == "*"
    f = fails(V.validate_list, {"command": "decisions", "args": {"namespace": "x"}})
    assert f.message == "unknown parameter(s) for list decisions command: args.namespace"


def test_updown_and_credentials() -> None:
    f = fails(V.validate_updown, {"command": "sideways"})
    assert f.message == 'updown command must be "up" or "down"'
    f = fails(V.validate_updown, {"command": "up", "args": {"x": 1}})
    assert f.message == "unknown parameter(s) for updown up command: args.x"
    assert V.validate_updown({"command": "down", "args": {}}) == V.Updown("down")
    f = fails(V.validate_new, {"command": "peer", "args": {}})
    assert f.message == "principal_id is required for new peer"
    f = fails(V.validate_change, {"command": "psk"})
    assert f.message == "principal_id is required for change psk"
    assert fails(V.validate_change, {"command": "peer"}).message == 'change command must be "psk"'
    f = fails(V.validate_change, {"command": "psk", "args": []})
    assert f.message == "invalid args for change psk command"
    assert f.details and "help query 'change.psk'" in f.details["hint"]
    f = fails(V.validate_new, {"command": "peer", "args": {"x": 1}})
    assert f.message == "unknown parameter(s) for new peer command: args.x"
    assert fails(V.validate_new, {"command": "user", "args": {"principal_id": "w@p"}}).details == {
        "command": "user"
    }
    f = fails(
        V.validate_new,
        {
            "command": "peer",
            "args": {"principal_id": "w@p", "output_path": "", "write_to_config": True},
        },
    )
    assert f.code == "validation_invalid_params"
    assert f.details == {"fields": ["args.output_path", "args.write_to_config"]}
    new = V.validate_new({"command": "peer", "args": {"principal_id": "w@p", "output_path": ""}})
    assert new.destination == {"kind": "path", "path": ""}
    new = V.validate_new(
        {"command": "peer", "args": {"principal_id": "w@p", "write_to_config": True}}
    )
    assert new.destination == {"kind": "config"}
    change = V.validate_change(
        {"command": "psk", "args": {"principal_id": "w@p", "write_to_config": False}}
    )
    assert change.destination == {"kind": "response"}
    f = fails(V.validate_change, {"command": "psk", "args": {"principal_id": "w@p", "scope": "x"}})
    assert f.details == {"fields": ["args.scope"]}


def test_qualify_target() -> None:
    assert V.qualify_target("bravo", "party") == "bravo@party"
    assert V.qualify_target("op@GLOBAL", "party") == "op@GLOBAL"
    assert V.qualify_target("bravo@b!west", "party") == "bravo@b!west"
    with pytest.raises(ToolFailure) as info:
        V.qualify_target("bravo", None)
    assert info.value.code == "validation_unqualified_target"
    assert info.value.details == {"target": "bravo"}


# -- property: validation is total ----------------------------------------------------------


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2000) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_keys = st.sampled_from(
    [
        "message",
        "targets",
        "broadcast",
        "request_id",
        "target_session",
        "lines",
        "offset",
        "text",
        "no_enter",
        "choice_request_id",
        "outcome",
        "option_id",
        "command",
        "args",
        "query",
        "bogus",
    ]
)
_validators = [
    V.validate_list,
    V.validate_help,
    V.validate_send,
    V.validate_look,
    V.validate_raww,
    V.validate_choose,
    V.validate_updown,
    V.validate_new,
    V.validate_change,
]


@examples(full=300, quick=75)
@given(st.sampled_from(_validators), st.dictionaries(_keys, _json, max_size=5))
def test_validation_only_ever_raises_tool_failures(
    validate: Any, arguments: dict[str, Any]
) -> None:
    try:
        validate(arguments)
    except ToolFailure as failure:
        assert failure.rpc_code == -32602
        assert failure.details is None or isinstance(failure.details, dict)


@pytest.mark.parametrize(
    ("validate", "arguments"),
    [
        (V.validate_send, {"message": "hi", "targets": ["a@p"], "request_id": "r"}),
        (V.validate_send, {"message": "hi", "broadcast": True}),
        (V.validate_raww, {"target_session": " a@p ", "text": "ls", "no_enter": True}),
        (V.validate_look, {"target_session": "a@p", "lines": 5}),
        (V.validate_choose, {"choice_request_id": "c", "outcome": "selected", "option_id": "o"}),
        (V.validate_new, {"command": "peer", "args": {"principal_id": "w@RELAY", "scope": "x"}}),
        (V.validate_new, {"command": "peer", "args": {"principal_id": "w@p", "output_path": "/f"}}),
        (V.validate_change, {"command": "psk", "args": {"principal_id": "w@p"}}),
    ],
)
def test_the_relay_reads_back_the_body_the_tools_build(validate: Any, arguments: Any) -> None:
    """Both ends speak one model per operation (agentmux.operations): what the tools send is
    what the relay reads, field for field."""
    built = validate(arguments)
    assert type(built).read(built.wire()) == built
