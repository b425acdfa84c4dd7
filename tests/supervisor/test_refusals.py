"""The one table of refusals (mcphost/supervisor/refusals.py).

Every refusal code of the control socket and the attach handshake is a row of the table, named in
docs/supervisor-internals.md, and no module under mcphost/supervisor/ raises a code written in
place (a second home for a message).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mcphost.supervisor import refusals
from mcphost.supervisor.refusals import Refusal, Refused

ROOT = Path(__file__).resolve().parents[2]
SUPERVISOR = ROOT / "mcphost" / "supervisor"
RAISERS = {"ControlError", "ControlInUse", "Refused"}


def _rows() -> dict[str, Refusal]:
    return {k: v for k, v in vars(refusals).items() if isinstance(v, Refusal)}


def test_every_row_is_listed_once_and_every_code_is_snake_case() -> None:
    rows = _rows()
    listed = [*refusals.ATTACH, *refusals.CONTROL, *refusals.HTTP]
    assert {id(r) for r in rows.values()} == {id(r) for r in listed}
    for name, row in rows.items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", row.code), name


def test_every_code_is_documented_and_every_documented_attach_code_is_in_the_table() -> None:
    doc = (ROOT / "docs" / "supervisor-internals.md").read_text()
    for row in _rows().values():
        assert f"`{row.code}`" in doc, f"{row.code} is not in docs/supervisor-internals.md"
    attach = doc.split("## Attach handshake", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`([a-z][a-z_]+)`", attach.split("Codes:", 1)[1]))
    assert documented == {row.code for row in refusals.ATTACH}


def test_no_refusal_code_is_written_in_place() -> None:
    """A refusal is raised from its row (`ControlError.row(R.X)`, `Refused.row(R.X)`), never with a
    code literal: the table is the one home of codes and messages."""
    found = []
    for path in sorted(SUPERVISOR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            first = node.args[0]
            if name in RAISERS and isinstance(first, ast.Constant | ast.JoinedStr):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_a_row_fills_its_message() -> None:
    refused = Refused.row(refusals.TOO_MANY_SESSIONS, agent="A", limit=32)
    assert refused.code == "too_many_sessions"
    assert refused.message.startswith("agent A already holds 32 sessions")
