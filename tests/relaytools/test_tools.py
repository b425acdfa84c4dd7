"""The relay tools' catalog (mcphost/relaytools/tools.py): registration order and kinds."""

from __future__ import annotations

from mcphost.relaytools import tools


def test_tool_specs_registration_order_and_kinds() -> None:
    assert [s.name for s in tools.tool_specs()] == list(tools.REGISTRATION_ORDER)
    assert [t for t in tools.INVENTORY_ORDER if tools.TOOLS[t].kind == "meta_tool"] == [
        "list",
        "updown",
        "new",
        "change",
    ]
