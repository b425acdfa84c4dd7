"""`mcphost.errors.CodedFailure`: one base under every (code, message, details) failure, each
class keeping its own wire rendering."""

from __future__ import annotations

from mcphost.agentmux.wire import RelayError
from mcphost.devcenter.errors import ApiError
from mcphost.errors import CodedFailure, ToolFailure
from mcphost.relay.tmux import TmuxError
from mcphost.relaytools.errors import ClaimConflict
from mcphost.relaytools.errors import ToolFailure as RelayToolFailure
from mcphost.relaytools.layout import ConfigError
from mcphost.settings import SettingError
from mcphost.supervisor.agents.homes import HomeError
from mcphost.supervisor.control.protocol import ControlError
from mcphost.supervisor.refusals import Refused


def test_every_coded_failure_shares_the_base_and_keeps_its_wire() -> None:
    failures: list[CodedFailure] = [
        ToolFailure("a_code", "do this", {"k": 1}),
        RelayToolFailure("a_code", "do this", {"k": 1}),
        ClaimConflict("a_code", "do this", {"k": 1}),
        RelayError("a_code", "do this", {"k": 1}),
        TmuxError("a_code", "do this", {"k": 1}),
        ControlError("a_code", "do this", {"k": 1}),
        ApiError(409, "a_code", "do this", k=1),
    ]
    for failure in failures:
        assert isinstance(failure, CodedFailure)
        assert (failure.code, failure.message, failure.details) == ("a_code", "do this", {"k": 1})
    host, tools, _, relay, _, control, api = failures
    assert host.payload() == {"error": "a_code", "message": "do this", "details": {"k": 1}}
    assert tools.data() == {"code": "a_code", "message": "do this", "details": {"k": 1}}
    assert relay.wire() == {"code": "a_code", "message": "do this", "details": {"k": 1}}
    assert control.wire()["error"] == {"code": "a_code", "message": "do this", "details": {"k": 1}}
    assert api.body() == {"error": "a_code", "message": "do this", "k": 1}
    assert (str(host), str(control), str(relay), str(api)) == (
        "a_code: do this",
        "a_code: do this",
        "do this",
        "409 a_code: do this",
    )


def test_details_none_and_empty_stay_apart_where_a_wire_tells_them_apart() -> None:
    assert RelayToolFailure("c", "m").data()["details"] is None
    assert "details" not in RelayError("c", "m").wire()
    assert ToolFailure("c", "m").details == {} and ControlError("c", "m").details == {}


def test_failures_without_details_take_the_base_too() -> None:
    for failure, code in [
        (Refused("not_an_agent", "start it from the fleet"), "not_an_agent"),
        (ConfigError("config_invalid", "fix the file"), "config_invalid"),
        (HomeError("/x is a symlink; remove it"), "home_unsafe"),
    ]:
        assert isinstance(failure, CodedFailure) and failure.code == code
        assert failure.details is None and str(failure) == failure.message


def test_a_setting_error_is_coded_and_its_details_name_the_setting() -> None:
    err = SettingError("AC_MCP_GENERATION", "'-1'", "an integer >= 0")
    assert isinstance(err, CodedFailure) and isinstance(err, ValueError)
    assert err.code == "bad_setting" and err.message == str(err)
    assert err.details == {
        "variable": "AC_MCP_GENERATION",
        "problem": "is '-1'",
        "expected": "an integer >= 0",
    }


def test_a_seam_passes_the_triple_on() -> None:
    tmux = TmuxError("tmux_failed", "tmux said no", {"status": 1})
    relay = RelayError.of(tmux)
    assert type(relay) is RelayError
    assert relay.wire() == {
        "code": "tmux_failed",
        "message": "tmux said no",
        "details": {"status": 1},
    }
