"""The one table of refusals (mcphost/supervisor/refusals.py) and the identity registry.

Every refusal code of the control socket and the attach handshake is a row of the table, named in
docs/supervisor-internals.md, and no module under mcphost/supervisor/ raises a code written in
place (a second home for a message). The registry (identity.py) is driven with real processes:
the vouch rule reads the kernel's word, so a test of it needs a real child.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcphost.peer import PeerCred
from mcphost.supervisor import refusals
from mcphost.supervisor.identity import Identities
from mcphost.supervisor.kernel import proc_starttime
from mcphost.supervisor.refusals import Refusal, Refused

ROOT = Path(__file__).resolve().parents[2]
SUPERVISOR = ROOT / "mcphost" / "supervisor"
RAISERS = {"ControlError", "ControlInUse", "Refused"}


def _rows() -> dict[str, Refusal]:
    return {k: v for k, v in vars(refusals).items() if isinstance(v, Refusal)}


def test_every_row_is_listed_once_and_every_code_is_snake_case() -> None:
    rows = _rows()
    listed = [*refusals.ATTACH, *refusals.CONTROL]
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


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _refused(registry: Identities, cred: PeerCred, uid: int | None = None) -> str:
    with pytest.raises(Refused) as caught:
        registry.vouch(cred, lambda agent: os.getuid() if uid is None else uid)
    return caught.value.code


def test_the_registry_vouches_by_the_kernels_word_only(child: subprocess.Popen[bytes]) -> None:
    start = proc_starttime(child.pid)
    assert start is not None
    cred = PeerCred(child.pid, os.getuid(), os.getgid(), None)
    registry = Identities()
    assert _refused(registry, cred) == "not_in_fleet"
    registry.spawned("A", (child.pid, start), 3)
    assert registry.vouch(cred, lambda agent: os.getuid()) == ("A", 3)
    assert _refused(registry, cred, uid=os.getuid() + 1) == "uid_mismatch"
    with pytest.raises(Refused) as caught:
        registry.vouch(cred, lambda agent: None)
    assert caught.value.code == "agent_not_running"
    me = PeerCred(os.getpid(), os.getuid(), os.getgid(), None)
    assert _refused(registry, me) == "not_in_fleet"  # the supervisor itself: never an agent
    registry.spawned("A", (child.pid, start + 1), 4)  # a reused pid never matches
    assert _refused(registry, cred) == "not_in_fleet"


def test_the_registry_forgets_by_agent_and_generation() -> None:
    registry = Identities()
    registry.spawned("A", (10, 1), 1)
    registry.add("A", (11, 1), 1)  # an exec'd command of generation 1
    registry.spawned("B", (20, 1), 5)
    registry.add("B", (21, 1), 5)
    registry.discard("B", (21, 1), 4)  # not its generation: kept
    assert registry.roots[(21, 1)] == ("B", 5)
    registry.discard("B", (21, 1), 5)
    assert (21, 1) not in registry.roots
    registry.spawned("A", (12, 1), 2)  # a new spawn: the older roots are gone
    assert registry.of("A") == {(12, 1)}
    registry.add("A", (13, 1), 2)
    registry.ended("A", 2)
    assert registry.of("A") == set() and registry.roots == {(20, 1): ("B", 5)}
    registry.forget("B")
    assert registry.roots == {}
