"""The `help` tool's documents (mcphost/relaytools/help.py), composed without the relay."""

from __future__ import annotations

import pytest

from mcphost.relaytools import errors, help
from mcphost.relaytools.errors import ToolFailure


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
