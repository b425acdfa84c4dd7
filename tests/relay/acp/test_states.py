"""The ACP member's states (mcphost/relay/acp/states.py): their wire spelling, the one readiness
rule, and no module of the ACP side or the agents' wing spelling a state in place."""

from __future__ import annotations

from pathlib import Path

from mcphost.relay.acp import states as S
from tests.relay.test_reasons import _written_in_place

ROOT = Path(__file__).resolve().parents[3]
READERS = ("mcphost/relay/acp", "mcphost/relay/members", "mcphost/supervisor/agents")


def test_the_states_are_spelled_as_on_the_wire() -> None:
    assert S.STATES == ("initializing", "available", "busy", "recovering", "unavailable")
    assert S.READY_STATES == ("available", "busy")


def test_available_and_busy_are_ready_and_nothing_else_is() -> None:
    assert [state for state in (*S.STATES, None) if S.ready(state)] == ["available", "busy"]


def test_no_reader_spells_a_state_in_place() -> None:
    found = [
        hit
        for folder in READERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.name != "states.py"
        for hit in _written_in_place(path, set(S.STATES))
    ]
    assert found == []
