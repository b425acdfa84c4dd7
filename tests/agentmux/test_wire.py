"""The relay's wire frames (mcphost/agentmux/wire.py), pure: parse, build, encode, errors."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcphost.agentmux import wire
from mcphost.agentmux.wire import Hello, RelayError, Request, parse_frame, parse_principal
from tests.thorough import examples

PARSE = ("validation_invalid_arguments", "failed to parse relay request")


def line(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def hello(**over: Any) -> dict[str, Any]:
    frame = {
        "frame": "hello",
        "schema_version": "1",
        "principal_id": "alpha@party",
        "identity_token": "socket-trust",
    }
    frame.update(over)
    return frame


def refusal(raw: bytes) -> RelayError:
    with pytest.raises(RelayError) as caught:
        parse_frame(raw)
    return caught.value


# -- hello -------------------------------------------------------------------------------------


def test_hello_parses_and_keeps_the_token_out_of_repr() -> None:
    got = parse_frame(line(hello(identity_token="s3cr3t-psk")))
    assert got == Hello("1", "alpha@party", "s3cr3t-psk")
    assert "s3cr3t-psk" not in repr(got) and "s3cr3t-psk" not in str(got)


def test_unknown_fields_are_ignored_and_the_newline_is_optional() -> None:
    got = parse_frame(json.dumps(hello(client_class="agent")).encode())
    assert isinstance(got, Hello) and got.principal_id == "alpha@party"


@pytest.mark.parametrize("version", ["2", "", "1.0", "01"])
def test_another_schema_version_is_refused_with_the_supported_one(version: str) -> None:
    err = refusal(line(hello(schema_version=version)))
    assert err.code == "validation_invalid_schema_version"
    assert err.details == {"schema_version": version, "supported_schema_version": "1"}
    assert err.wire()["details"] == err.details


@pytest.mark.parametrize(
    "principal",
    [
        "alpha",
        "@party",
        "alpha@",
        "@",
        "",
        "al pha@party",
        "alpha@par\tty",
        "a\x00@p",
        "a" * 300 + "@p",
    ],
)
def test_a_malformed_principal_id_is_refused(principal: str) -> None:
    err = refusal(line(hello(principal_id=principal)))
    assert err.code == "validation_invalid_principal_id"
    assert err.details is not None and err.details["principal_id"] == principal[:256]


# -- principals --------------------------------------------------------------------------------

_part = st.text(
    st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp", "Cf", "Co", "Cn")),
    min_size=1,
    max_size=20,
).filter(lambda s: all(c.isprintable() and not c.isspace() for c in s))


@given(_part, _part.filter(lambda s: "@" not in s))
def test_principal_ids_split_at_the_last_at(name: str, namespace: str) -> None:
    p = parse_principal(f"{name}@{namespace}")
    assert (p.id, p.name, p.namespace, p.verified) == (
        f"{name}@{namespace}",
        name,
        namespace,
        False,
    )
    expected = {"GLOBAL": "user", "EXTERNAL": "application", "RELAY": "relay"}.get(
        namespace, "session"
    )
    assert p.kind == expected


@pytest.mark.parametrize(
    ("text", "kind"),
    [("alpha@party", "session"), ("user@GLOBAL", "user"), ("app@EXTERNAL", "application"),
     ("west@RELAY", "relay"), ("a@b@party", "session")],
)  # fmt: skip
def test_namespace_classifies_the_kind(text: str, kind: str) -> None:
    assert parse_principal(text).kind == kind


# -- requests ----------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


@examples(full=500, quick=60)
@given(
    request_id=st.none() | st.text(max_size=40),
    namespace=st.none() | st.text(max_size=20),
    operation=st.sampled_from(sorted(wire.OPERATIONS)),
    extra=st.dictionaries(
        st.text(max_size=10).filter(lambda k: k != "operation"), _json, max_size=4
    ),
    with_nulls=st.booleans(),
)
def test_request_round_trip(
    request_id: str | None,
    namespace: str | None,
    operation: str,
    extra: dict[str, Any],
    with_nulls: bool,
) -> None:
    frame: dict[str, Any] = {"frame": "request"}
    if request_id is not None or with_nulls:
        frame["request_id"] = request_id
    if namespace is not None or with_nulls:
        frame["namespace"] = namespace
    body = {"operation": operation, **extra}
    frame["request"] = body
    got = parse_frame(wire.encode(frame))
    assert got == Request(request_id, namespace, operation, body)


@examples(full=500, quick=60)
@given(
    request_id=st.none() | st.text(max_size=40), body=st.dictionaries(st.text(max_size=8), _json)
)
def test_response_frames_round_trip_and_omit_an_absent_request_id(
    request_id: str | None, body: dict[str, Any]
) -> None:
    body = {**body, "kind": "list"}
    data = wire.encode(wire.response(request_id, body))
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    decoded = json.loads(data)
    assert decoded["frame"] == "response" and decoded["response"] == body
    assert ("request_id" in decoded) == (request_id is not None)
    if request_id is not None:
        assert decoded["request_id"] == request_id


@examples(full=2000, quick=200)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_line_parses_or_is_a_relay_error(raw: bytes) -> None:
    try:
        got = parse_frame(raw)
    except RelayError as err:
        assert err.code in {
            "validation_invalid_arguments",
            "validation_invalid_schema_version",
            "validation_invalid_principal_id",
        }
        return
    assert isinstance(got, Hello | Request)


def _deep(levels: int) -> bytes:
    return (
        b'{"frame":"request","request":{"operation":"list","x":'
        + b"[" * levels
        + b"]" * levels
        + b"}}"
    )


@pytest.mark.parametrize(
    ("raw", "cause"),
    [
        (b"not json", "Expecting value"),
        (b"[1,2]", "must be a JSON object"),
        (b'"hello"', "must be a JSON object"),
        (b"{}", "missing field `frame`"),
        (b'{"frame":"hello_ack"}', "unknown frame `hello_ack`"),
        (b'{"frame":7}', "unknown frame `int`"),
        (line({"frame": "hello", "schema_version": "1", "principal_id": "a@p"}), "identity_token"),
        (line(hello(schema_version=1)), "schema_version"),
        (line(hello(principal_id=None)), "missing field `principal_id`"),
        (b'{"frame":"request"}', "missing field `request`"),
        (b'{"frame":"request","request":[]}', "expected an object"),
        (b'{"frame":"request","request":{}}', "missing field `operation`"),
        (b'{"frame":"request","request":{"operation":"chat"}}', "unknown operation `chat`"),
        (b'{"frame":"request","request":{"operation":5}}', "`operation`"),
        (b'{"frame":"request","request_id":5,"request":{"operation":"up"}}', "`request_id`"),
        (b'{"frame":"request","namespace":[],"request":{"operation":"up"}}', "`namespace`"),
        (b'{"frame":"request","frame":"hello"}', "duplicate field `frame`"),
        (b'{"frame":"request","request":{"operation":"up","x":NaN}}', "NaN"),
        (b'{"frame":"request","request":{"operation":"up","x":-Infinity}}', "Infinity"),
        (b'{"frame":"request","request":{"operation":"up","x":"\\ud800"}}', "lone surrogate"),
        (b'{"frame":"request","request":{"operation":"up","x":"\xff"}}', "not valid UTF-8"),
        (_deep(70), "nesting deeper than 64"),
        (_deep(200_000), "nesting deeper than 64"),
        (b" " * (wire.MAX_FRAME_BYTES + 1), "longer than"),
    ],
)
def test_every_parse_failure_is_the_one_error(raw: bytes, cause: str) -> None:
    err = refusal(raw)
    assert (err.code, err.message) == PARSE
    assert err.details is not None and list(err.details) == ["cause"]
    assert cause in err.details["cause"]
    assert len(err.details["cause"]) <= 200


def test_a_frame_at_the_limit_parses_and_nesting_at_the_bound_is_accepted() -> None:
    pad = wire.MAX_FRAME_BYTES - len(b'{"frame":"request","request":{"operation":"up","x":""}}')
    raw = b'{"frame":"request","request":{"operation":"up","x":"' + b"a" * pad + b'"}}'
    assert len(raw) == wire.MAX_FRAME_BYTES
    assert isinstance(parse_frame(raw + b"\n"), Request)
    assert isinstance(parse_frame(_deep(61)), Request)  # 61 + frame + request + x's list


def test_a_null_request_id_reads_as_absent() -> None:
    got = parse_frame(b'{"frame":"request","request_id":null,"request":{"operation":"up"}}')
    assert isinstance(got, Request) and got.request_id is None and got.namespace is None


# -- relay -> client frames --------------------------------------------------------------------


def test_hello_ack_shape() -> None:
    assert wire.encode(wire.hello_ack("alpha@party")) == (
        b'{"frame":"hello_ack","schema_version":"1","principal_id":"alpha@party"}\n'
    )


def test_error_frames_omit_absent_details_and_request_id() -> None:
    assert wire.encode(wire.error_response(None, RelayError("x_code", "boom"))) == (
        b'{"frame":"response","response":{"kind":"error","error":{"code":"x_code","message":"boom"}}}\n'
    )
    framed = wire.error_response("r1", RelayError("x_code", "boom", {"a": 1}))
    assert framed == {
        "frame": "response",
        "request_id": "r1",
        "response": {
            "kind": "error",
            "error": {"code": "x_code", "message": "boom", "details": {"a": 1}},
        },
    }
    assert "null" not in wire.encode(framed).decode()


def test_event_frame_shape() -> None:
    frame = wire.event("delivery_outcome", "alpha@party", {"message_id": "m", "phase": "routed"})
    assert list(frame) == ["frame", "event"]
    assert list(frame["event"]) == ["event_type", "target_session", "created_at", "payload"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", frame["event"]["created_at"])
    fixed = wire.event("x", "a@b", {}, created_at="2026-05-01T10:00:05Z")
    assert fixed["event"]["created_at"] == "2026-05-01T10:00:05Z"


def test_encode_is_compact_one_line_utf8_and_refuses_what_json_cannot_carry() -> None:
    assert wire.encode({"a": "é\nb"}) == '{"a":"é\\nb"}\n'.encode()
    for bad in ({"x": float("nan")}, {"x": "\ud800"}, {"x": object()}):
        with pytest.raises(ValueError):
            wire.encode(bad)


def test_relay_error_wire_and_repr() -> None:
    err = RelayError("c", "m")
    assert err.wire() == {"code": "c", "message": "m"} and str(err) == "m"
    assert "c" in repr(err)
