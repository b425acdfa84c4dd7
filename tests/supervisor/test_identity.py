"""The identity registry (mcphost/supervisor/identity.py), driven with real processes: the vouch
rule reads the kernel's word, so a test of it needs a real child."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from mcphost.peer import PeerCred
from mcphost.supervisor.confine.kernel import proc_starttime
from mcphost.supervisor.identity import Identities
from mcphost.supervisor.refusals import Refused


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
