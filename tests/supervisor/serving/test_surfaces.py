"""The surfaces, in process: each hub's `identify` (the kernel's word for a real child process,
then the surface's bounds: a stopping supervisor, sessions per agent, relay tools only with a
bundle), a `stale_generation` from the center handed to reconciliation once per generation, and
the sessions of an ended generation closed. The hubs here only count and close (the sessions
themselves are sessions.py's, tests/supervisor/serving/test_sessions.py); serving the surfaces through
`mcphost supervise` is test_supervise.py, test_supervise_relay.py and test_supervise_center.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from mcphost.errors import AdminUnavailable, StaleGeneration
from mcphost.peer import PeerCred
from mcphost.procfs import read_stat
from mcphost.supervisor.center.generations import Generations
from mcphost.supervisor.identity import Identities
from mcphost.supervisor.plan import AgentDefaults, Transport, apply_defaults
from mcphost.supervisor.refusals import Refused
from mcphost.supervisor.serving.sessions import Attached
from mcphost.supervisor.serving.surfaces import CENTER, MAX_SESSIONS_PER_AGENT, RELAY, Surfaces


@dataclass
class Hub:
    """A hub's sessions as the surfaces see them: counted and closed."""

    sessions: list[Attached] = field(default_factory=list)

    def count(self, agent_id: str) -> int:
        return sum(a.agent_id == agent_id for a in self.sessions)

    def close_where(self, predicate: Callable[[Attached], bool]) -> int:
        closed = [a for a in self.sessions if predicate(a)]
        self.sessions = [a for a in self.sessions if not predicate(a)]
        return len(closed)


@dataclass
class Supervisor:
    """What the surfaces read of the supervisor (surfaces.Supervised)."""

    slots: dict[str, Any] = field(default_factory=dict)
    hubs: dict[str, Hub] = field(default_factory=lambda: {CENTER: Hub(), RELAY: Hub()})
    identities: Identities = field(default_factory=Identities)
    generations: Generations = field(default_factory=Generations)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    center: Any = None
    relay: Any = None
    env: dict[str, str] = field(default_factory=dict)
    fleet: Any = None
    # an HTTP listener holding no session (serving/test_streamable.py tests the real one)
    http: Any = field(
        default_factory=lambda: SimpleNamespace(
            count=lambda agent, surface: 0, close_where=lambda pred: 0
        )
    )
    spawned: list[Coroutine[Any, Any, Any]] = field(default_factory=list)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.spawned.append(coro)


async def not_replaced(slot: Any, generation: int) -> None:
    raise AssertionError("nothing here is fenced")


def slot(
    agent_id: str,
    generation: int,
    bundle: str | None = None,
    uid: int | None = None,
    transport: Transport = "pump",
) -> Any:
    defaults = AgentDefaults(
        client="command", command=("x",), bundle=bundle, mcp_transport=transport
    )
    plan = apply_defaults(defaults, agent_id)
    runner = SimpleNamespace(status=lambda: SimpleNamespace(generation=generation, pid=1))
    return SimpleNamespace(
        plan=plan, runner=runner, uid=os.getuid() if uid is None else uid, fenced=None
    )


@pytest.fixture
def agent_process() -> Iterator[PeerCred]:
    """A real child process, as an agent's pump is one: the kernel vouches for its ancestry."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        yield PeerCred(pid=child.pid, uid=os.getuid(), gid=os.getgid(), pidfd=None)
    finally:
        child.communicate()


def test_identify_is_the_kernels_word_then_the_surfaces_bounds(agent_process: PeerCred) -> None:
    supervisor = Supervisor()
    surfaces = Surfaces(supervisor, replace_fenced=not_replaced)
    stat = read_stat(agent_process.pid)
    assert stat is not None
    supervisor.identities.spawned("a", (agent_process.pid, stat.starttime), 3)
    supervisor.slots["a"] = slot("a", 3)
    center, relay = surfaces.identifier(CENTER), surfaces.identifier(RELAY)

    assert center(agent_process) == Attached(agent_id="a", generation=3)
    with pytest.raises(Refused) as refused:
        relay(agent_process)
    assert refused.value.code == "surface_unavailable"  # no bundle: no relay tools
    supervisor.slots["a"] = slot("a", 3, bundle="party")
    assert relay(agent_process) == Attached(agent_id="a", generation=3)

    supervisor.hubs[CENTER].sessions = [Attached("a", 3)] * MAX_SESSIONS_PER_AGENT
    with pytest.raises(Refused) as refused:
        center(agent_process)
    assert refused.value.code == "too_many_sessions"
    assert relay(agent_process) == Attached(agent_id="a", generation=3)  # per surface

    supervisor.stopping.set()
    with pytest.raises(Refused) as refused:
        relay(agent_process)
    assert refused.value.code == "supervisor_stopping"


def test_a_fenced_generation_is_handed_to_reconciliation_once() -> None:
    supervisor = Supervisor()
    replaced: list[tuple[str, int]] = []

    async def replace(slot: Any, generation: int) -> None:
        replaced.append((slot.plan.agent_id, generation))

    surfaces = Surfaces(supervisor, replace_fenced=replace)
    supervisor.slots["a"] = fenced = slot("a", 5)
    stale = StaleGeneration("stale_generation", "a newer host", {"current_generation": 9})

    surfaces._center_failed("a", 4, stale)  # an older generation: its sessions close anyway
    surfaces._center_failed("a", 5, AdminUnavailable("admin_unavailable", "down"))
    assert supervisor.spawned == [] and fenced.fenced is None
    surfaces._center_failed("a", 5, stale)
    surfaces._center_failed("a", 5, stale)  # already being replaced
    assert fenced.fenced["generation"] == 5 and fenced.fenced["center_generation"] == 9
    assert supervisor.generations.seen == {"a": 9}  # the next spawn goes above the center's
    for coro in supervisor.spawned:
        asyncio.run(coro)
    assert replaced == [("a", 5)]


def test_an_ended_generations_sessions_close_and_a_departed_agents_all() -> None:
    supervisor = Supervisor()
    surfaces = Surfaces(supervisor, replace_fenced=not_replaced)
    supervisor.hubs[CENTER].sessions = [Attached("a", 1), Attached("a", 2), Attached("b", 1)]
    supervisor.hubs[RELAY].sessions = [Attached("a", 1)]
    surfaces.close_older("a", 2)
    assert supervisor.hubs[CENTER].sessions == [Attached("a", 2), Attached("b", 1)]
    assert supervisor.hubs[RELAY].sessions == []
    surfaces.forget("a")
    assert supervisor.hubs[CENTER].sessions == [Attached("b", 1)]


def test_over_http_a_uid_names_the_one_http_agent_that_owns_it() -> None:
    supervisor = Supervisor()
    surfaces = Surfaces(supervisor, replace_fenced=not_replaced)
    own = os.geteuid() + 70000  # never the supervisor's
    supervisor.slots["a"] = slot("a", 4, uid=own, transport="http")
    supervisor.slots["p"] = slot("p", 1, uid=own + 1)  # a pump agent
    supervisor.slots["s1"] = slot("s1", 1, uid=own + 2, transport="http")
    supervisor.slots["s2"] = slot("s2", 1, uid=own + 2, transport="http")
    supervisor.slots["me"] = slot("me", 1, uid=os.geteuid(), transport="http")

    assert surfaces.identify_http(CENTER, own) == Attached("a", 4)
    assert surfaces.serves_http(own)
    for uid, code in (
        (own + 1, "not_an_http_agent"),  # its agent uses the pump
        (own + 2, "uid_shared"),  # two agents: the uid names neither
        (os.geteuid(), "uid_shared"),  # the supervisor's own: shared with it
        (own + 3, "not_an_http_agent"),  # nobody's
    ):
        with pytest.raises(Refused) as refused:
            surfaces.identify_http(CENTER, uid)
        assert refused.value.code == code, uid
        assert not surfaces.serves_http(uid)
    with pytest.raises(Refused) as refused:
        surfaces.identify_http(RELAY, own)  # no bundle: no relay tools, over HTTP as by pump
    assert refused.value.code == "surface_unavailable"


def test_an_agents_sessions_count_over_pumps_and_http_together(
    agent_process: PeerCred,
) -> None:
    supervisor = Supervisor()
    surfaces = Surfaces(supervisor, replace_fenced=not_replaced)
    stat = read_stat(agent_process.pid)
    assert stat is not None
    supervisor.identities.spawned("a", (agent_process.pid, stat.starttime), 3)
    supervisor.slots["a"] = slot("a", 3, transport="http")
    held = {"http": MAX_SESSIONS_PER_AGENT - 1}
    supervisor.http = SimpleNamespace(
        count=lambda agent, surface: held["http"], close_where=lambda pred: 0
    )
    supervisor.hubs[CENTER].sessions = [Attached("a", 3)]  # one pump: 32 in all
    with pytest.raises(Refused) as refused:
        surfaces.identifier(CENTER)(agent_process)  # a pump more
    assert refused.value.code == "too_many_sessions"
    with pytest.raises(Refused) as refused:
        surfaces.http_factory(CENTER, Attached("a", 3))  # an HTTP session more
    assert refused.value.code == "too_many_sessions"
    held["http"] -= 1  # one closed: room for one more of either
    assert surfaces.identifier(CENTER)(agent_process) == Attached("a", 3)
