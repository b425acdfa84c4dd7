"""The name grammars both sides check (mcphost/names.py): agentmux's session ids.

What a bad member id or session name does to the relay tools is
tests/relaytools/test_layout_member_ids.py's."""

from __future__ import annotations

from mcphost.names import is_session_id


def test_session_id_grammar() -> None:
    for good in ("alpha", "a", "Bravo-2", "c_3", "x" * 31):
        assert is_session_id(good), good
    for bad in ("", "1st", "-x", "_x", "a.b", "a/b", "..", "a b", "x" * 32, "ä", "alpha\n"):
        assert not is_session_id(bad), bad
