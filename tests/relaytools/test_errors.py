"""The relay tools' error taxonomy (mcphost/relaytools/errors.py): JSON-RPC codes, I/O
classification, the relay's errors passed through."""

from __future__ import annotations

import pytest

from mcphost.relaytools import errors


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
