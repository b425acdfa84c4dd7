"""The relay's table of reason codes (mcphost/relay/reasons.py): each code's wire spelling is
pinned here, the table lists each once, and no module of the product writes one in place."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mcphost.relay import reasons as R

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "mcphost" / "relay" / "reasons.py"

# agentmux's spelling (acp.md §2-§6, reference §1.8): what clients and the relay tools match on
WIRE = {
    "ACP_INITIALIZE_FAILED": "runtime_acp_initialize_failed",
    "ACP_SESSION_LOAD_FAILED": "runtime_acp_session_load_failed",
    "ACP_SESSION_NEW_FAILED": "runtime_acp_session_new_failed",
    "ACP_MISSING_CAPABILITY": "validation_missing_acp_capability",
    "ACP_WORKER_UNAVAILABLE": "runtime_acp_worker_unavailable",
    "ACP_FLOOD": "runtime_acp_flood",
    "TRANSPORT_UNAVAILABLE": "transport_unavailable",
    "STARTUP_FAILED": "runtime_startup_failed",
    "SHUTDOWN_FAILED": "runtime_shutdown_failed",
    "CHOICES_QUEUE_FULL": "runtime_choices_queue_full",
    "CHOICE_ALREADY_RESOLVED": "runtime_choices_request_already_resolved",
    "CHOICE_CANCELLED": "runtime_choices_request_cancelled",
    "CHOICE_INVALIDATED_BY_RESPAWN": "runtime_choices_request_invalidated_by_respawn",
    "STALE_UNAVAILABLE": "acp_worker_unavailable",
    "STALE_RECOVERING": "acp_worker_recovering",
    "STALE_INITIALIZING": "acp_worker_initializing",
    "STALE_PRIME_TIMEOUT": "acp_snapshot_prime_timeout",
}


def _codes() -> dict[str, str]:
    return {k: v for k, v in vars(R).items() if k.isupper() and isinstance(v, str)}


def test_every_code_is_spelled_as_on_the_wire() -> None:
    assert _codes() == WIRE


def test_the_table_lists_every_code_once_in_one_group() -> None:
    assert sorted(R.CODES) == sorted(WIRE.values())
    assert len(set(R.CODES)) == len(R.CODES) == len(R.MEMBER) + len(R.CHOICES) + len(R.STALE)
    assert {"validation_missing_acp_capability"} == R.PERMANENT
    assert all(re.fullmatch(r"[a-z][a-z_]*[a-z]", code) for code in R.CODES)


def test_every_code_is_in_the_operators_guide() -> None:
    guide = (ROOT / "docs" / "relay.md").read_text()
    assert [code for code in R.CODES if f"`{code}`" not in guide] == []


def _written_in_place(path: Path, codes: set[str]) -> list[str]:
    """The string constants of `path` that are codes of the table, docstrings aside."""
    tree = ast.parse(path.read_text(), str(path))
    prose = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in codes and id(node) not in prose
    ]


def test_no_module_writes_a_code_of_the_table_in_place() -> None:
    """A code is read from the table (`R.CHOICE_CANCELLED`), never written where it is raised or
    reported: the relay's ACP member, its session and choices queue, the operations, the
    supervisor's runners and relay host (the test helpers pin spellings and are left aside)."""
    codes = set(R.CODES)
    found = []
    for path in sorted((ROOT / "mcphost").rglob("*.py")):
        if path != TABLE and "testing" not in path.relative_to(ROOT).parts:
            found += _written_in_place(path, codes)
    assert found == []
