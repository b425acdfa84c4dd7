"""Pure parts of the relay tools: validation order and messages, schemas, help, errors, layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcphost.agentmux.inscriptions import Inscriptions, log_path, sanitize
from mcphost.agentmux.operations import ChoicesPickRequest, LookRequest, SendRequest
from mcphost.agentmux.wire import RelayError
from mcphost.relaytools import errors, help, layout, params, tools
from mcphost.relaytools import validation as V
from mcphost.relaytools.errors import ToolFailure
from mcphost.testing.relayharness import Env
from tests.thorough import examples


def fails(fn: Any, arguments: dict[str, Any]) -> ToolFailure:
    with pytest.raises(ToolFailure) as info:
        fn(arguments)
    return info.value


# -- schemas ---------------------------------------------------------------------------------


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


def test_tool_specs_registration_order_and_kinds() -> None:
    assert [s.name for s in tools.tool_specs()] == list(tools.REGISTRATION_ORDER)
    assert [t for t in tools.INVENTORY_ORDER if tools.TOOLS[t].kind == "meta_tool"] == [
        "list",
        "updown",
        "new",
        "change",
    ]


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


# -- help ------------------------------------------------------------------------------------


def test_help_documents() -> None:
    block = help.association_block("party", "alpha", True)
    inventory = help.render("", block)
    assert inventory["tools"][0]["tool"] == "list"
    assert inventory["tools"][0]["kind"] == "meta_tool"
    assert len(inventory["tools"]) == 9
    assert inventory["association"] == {
        "associated": True,
        "namespace": "party",
        "session": "alpha",
    }
    assert help.render("agentmux", block) == inventory
    listing = help.render("list", block)
    assert [c["command"] for c in listing["commands"]] == ["list.principals", "list.decisions"]
    doc = help.render("list.principals", block)
    assert doc["args_schema"]["properties"].keys() == {"namespace"}
    assert doc["args_schema"]["additionalProperties"] is False
    assert help.render("choose", block)["invoke"]["params"]["outcome"] == "selected"
    assert help.render("new.peer", block)["invoke"] == {
        "tool": "new",
        "params": {"command": "peer", "args": {"principal_id": "<id>@<namespace>"}},
    }
    for query in help.QUERIES:
        help.render(query, block)
    with pytest.raises(ToolFailure) as info:
        help.render("nope", block)
    assert info.value.code == "validation_invalid_params"
    assert info.value.details == {"query": "nope"}
    assert help.association_block(None, None, False) == {
        "associated": False,
        "remedy": errors.REMEDY,
    }


# -- errors ----------------------------------------------------------------------------------


def test_rpc_codes() -> None:
    assert errors.rpc_code_for("validation_unknown_target") == -32602
    assert errors.rpc_code_for("authorization_forbidden") == -32602
    for code in ("relay_unavailable", "runtime_choices_queue_full", "internal_principal_store"):
        assert errors.rpc_code_for(code) == -32603


@pytest.mark.parametrize(
    ("exc", "code", "kind"),
    [
        (FileNotFoundError(2, "x"), "relay_unavailable", "NotFound"),
        (ConnectionRefusedError(), "relay_unavailable", "ConnectionRefused"),
        (ConnectionResetError(), "relay_unavailable", "ConnectionReset"),
        (BrokenPipeError(), "relay_unavailable", "BrokenPipe"),
        (errors.RelayIOError("UnexpectedEof", "eof"), "relay_unavailable", "UnexpectedEof"),
        (TimeoutError(), "relay_timeout", "TimedOut"),
        (PermissionError(13, "denied"), "internal_unexpected_failure", "PermissionDenied"),
        (OSError("weird"), "internal_unexpected_failure", "Other"),
    ],
)
def test_relay_io_classification(exc: BaseException, code: str, kind: str) -> None:
    failure = errors.relay_io_failure("/s/relay.sock", exc)
    assert failure.code == code
    assert failure.details is not None
    assert failure.details["relay_socket"] == "/s/relay.sock"
    assert failure.details["io_error_kind"] == kind
    assert set(failure.details) == {"relay_socket", "io_error_kind", "cause"}


def test_relay_error_passthrough_keeps_code_and_details() -> None:
    f = errors.from_relay_error({"code": "runtime_x", "message": "m"})
    assert f.data() == {"code": "runtime_x", "message": "m", "details": None}
    assert f.rpc_code == -32603


# -- layout ----------------------------------------------------------------------------------


def test_roots_precedence(tmp_path: Path) -> None:
    env = {"HOME": "/h", "XDG_CONFIG_HOME": "/xc", "XDG_STATE_HOME": "/xs"}
    assert layout.configuration_roots([], env) == (Path("/xc/agentmux"),)
    assert layout.state_root(None, env) == Path("/xs/agentmux")
    assert layout.state_root(None, {"HOME": "/h"}) == Path("/h/.local/state/agentmux")
    env["AGENTMUX_CONFIGURATION_DIRECTORY"] = "/a:/b"
    env["AGENTMUX_STATE_DIRECTORY"] = "/st"
    assert layout.configuration_roots([], env) == (Path("/a"), Path("/b"))
    assert layout.state_root(None, env) == Path("/st")
    assert layout.configuration_roots(["/f"], env) == (Path("/f"),)
    assert layout.state_root("/g", env) == Path("/g")


def test_association(env: Env) -> None:
    base = {"configuration_flags": [str(env.config)], "state_flag": str(env.state)}
    ok = layout.resolve(bundle_flag="party", session_flag="alpha", env={}, **base)
    assert ok.associated and ok.principal_id == "alpha@party"
    assert [m.transport for m in ok.members] == ["tmux", "tmux", "acp"]
    assert ok.socket_path == env.state / "relay.sock"
    assert ok.inscriptions_root == env.state / "inscriptions"
    via_env = layout.resolve(env={"AGENTMUX_BUNDLE": "party", "AGENTMUX_SESSION": "bravo"}, **base)
    assert via_env.principal_id == "bravo@party"
    bare = layout.resolve(env={}, **base)
    assert not bare.associated and bare.fault is None and bare.reason == "no_bundle"
    by_cwd = layout.resolve(
        env={"AGENTMUX_BUNDLE": "party"}, cwd=str(env.root / "work/charlie"), **base
    )
    assert by_cwd.session == "charlie"
    outsider = layout.resolve(bundle_flag="party", session_flag="zed", env={}, **base)
    assert outsider.fault and outsider.fault.code == "validation_unknown_sender"
    unknown = layout.resolve(bundle_flag="nope", session_flag="alpha", env={}, **base)
    assert unknown.fault and unknown.fault.code == "validation_unknown_bundle"
    implicit = layout.resolve(default_bundle="nope", env={}, **base)
    assert implicit.fault is None and not implicit.associated
    (env.config / "mcp.toml").write_text('bundle_name = "party"\nsession_name = "bravo"\n')
    from_file = layout.resolve(env={}, **base)
    assert from_file.principal_id == "bravo@party"
    assert layout.resolve(env={}, **base).configured_bundles() == ["alpha", "party", "zeta"]


def test_identity_token(env: Env) -> None:
    lay = layout.resolve(
        bundle_flag="party",
        session_flag="alpha",
        configuration_flags=[str(env.config)],
        state_flag=str(env.state),
        env={},
    )
    assert lay.identity_token() == "socket-trust"
    psk = env.state / "bundles/party/sessions/alpha/identity.psk"
    psk.parent.mkdir(parents=True)
    psk.write_text("  c2VjcmV0\n")
    assert lay.identity_token() == "c2VjcmV0"


def test_inscriptions(tmp_path: Path) -> None:
    assert sanitize("a/b c") == "a_b_c"
    assert sanitize("") == "unknown"
    assert log_path(tmp_path, None, None) == tmp_path / "mcp/unassociated.log"
    path = log_path(tmp_path, "p", "s")
    sink = Inscriptions(path)
    sink.write("mcp.startup", x=1)
    sink.close()
    import json

    record = json.loads(path.read_text())
    assert set(record) == {"timestamp", "pid", "event", "details"}
    assert record["timestamp"].endswith("Z")
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "bundles").stat().st_mode & 0o777 == 0o700


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
