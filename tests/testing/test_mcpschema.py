"""The stdout validator of the raw drivers (`mcphost.testing.mcpschema`) catches what it should."""

from __future__ import annotations

from mcphost.testing.mcpschema import check_message


def test_valid_messages_pass() -> None:
    text = {"content": [{"type": "text", "text": "{}"}], "isError": False}
    assert check_message({"jsonrpc": "2.0", "id": 1, "result": text}, "tools/call") is None
    assert check_message({"jsonrpc": "2.0", "id": "a", "result": {}}, "ping") is None
    progress = {"progressToken": "t", "progress": 1, "total": 2}
    assert (
        check_message({"jsonrpc": "2.0", "method": "notifications/progress", "params": progress})
        is None
    )
    error = {"code": -32600, "message": "Invalid Request"}
    assert check_message({"jsonrpc": "2.0", "id": None, "error": error}) is None


def test_an_error_without_an_id_is_accepted_explicitly() -> None:
    """Schema-valid (the id could not be read); the SDK model alone would refuse it."""
    error = {"code": -32700, "message": "Parse error"}
    assert check_message({"jsonrpc": "2.0", "error": error}) is None
    assert check_message({"jsonrpc": "2.0", "error": {"code": "x"}}) is not None


def test_invalid_messages_are_reported() -> None:
    assert check_message({"jsonrpc": "1.0", "id": 1, "result": {}}) is not None
    assert check_message({"jsonrpc": "2.0", "id": 1.5, "result": {}}) is not None
    assert check_message({"jsonrpc": "2.0", "id": 1, "result": {"isError": False}}, "tools/call")
    assert check_message({"jsonrpc": "2.0", "id": 1, "result": {"tools": [{}]}}, "tools/list")
    assert check_message({"jsonrpc": "2.0", "method": "notifications/progress", "params": {}})
    assert check_message([1, 2]) is not None
