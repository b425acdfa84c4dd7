"""Reconciliation's own parts, in process: the one table of runner kinds (every runner a plan
can resolve to has a kind, and each kind builds itself with every collaborator given at
construction), and the agents' locks. Reconciling a running fleet (reload, the center's list,
refence, a fenced generation replaced) is driven through `mcphost supervise` itself:
test_supervise_reload_events.py, test_supervise_centerfleet.py, test_supervise_generations.py,
test_supervise_races.py and confine/test_fence.py."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mcphost.relay.members.tmux import TmuxEndpoint
from mcphost.relay.tmux import TmuxServer
from mcphost.supervisor import plan as plans
from mcphost.supervisor.agents.runner import AgentRunner, Collaborators
from mcphost.supervisor.agents.tmux import TmuxRunner
from mcphost.supervisor.confine.kernel import Reaper
from mcphost.supervisor.plan import AgentDefaults, apply_defaults
from mcphost.supervisor.reconcile import RUNNERS, AgentLocks
from mcphost.supervisor.state import StateStore
from tests.supervisor.agents.test_runner import StubHome
from tests.supervisor.confine.test_kernel import until_async


def test_every_runner_a_plan_resolves_to_has_one_kind() -> None:
    resolved = set(typing.get_args(plans.Runner)) - {"auto"}  # "auto" is resolved in the plan
    assert set(RUNNERS) == resolved
    assert all(issubclass(kind, AgentRunner) for kind in RUNNERS.values())


def _given(tmp_path: Path, store: StateStore) -> Collaborators:
    async def reserve(agent_id: str, local: int) -> int:
        return local

    return Collaborators(
        store=store,
        reaper=Reaper(),  # never installed: nothing is spawned here
        on_spawn=lambda *a: None,
        on_exit=lambda *a: None,
        argv=["true"],
        env={"PATH": os.defpath},
        cwd=str(tmp_path),
        fence=None,
        reserve=reserve,
    )


def test_each_kind_is_built_with_what_it_is_given(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path / "state.sqlite3"))
    home = StubHome(str(tmp_path), str(tmp_path / "logs"))
    site = SimpleNamespace(state_dir=str(tmp_path / "state"), env={}, relay=None)
    given = _given(tmp_path, store)
    for runner in ("process", "tmux"):
        base = apply_defaults(AgentDefaults(client="command", command=("true",)), "a")
        plan = dataclasses.replace(base, runner=runner)
        built = RUNNERS[runner].hosted(plan, home, given, site)
        assert type(built) is RUNNERS[runner]
        assert built.plan is plan and built.fence is None and not built.closed
        assert (built.endpoint() is None) == (runner == "process")  # a member or not
    store.close()


def test_a_tmux_kind_takes_its_bundles_server_or_one_of_its_own(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path / "state.sqlite3"))
    home = StubHome(str(tmp_path), str(tmp_path / "logs"))
    given = _given(tmp_path, store)
    bundled = apply_defaults(AgentDefaults(bundle="party", runner="tmux"), "a")
    bundles: dict[str, TmuxServer] = {"party": TmuxServer(str(tmp_path / "party"))}
    relay: Any = SimpleNamespace(tmux_server=bundles.__getitem__)  # the relay host's answer
    with_relay = SimpleNamespace(state_dir=str(tmp_path / "state"), env={}, relay=relay)
    runner = TmuxRunner.hosted(bundled, home, given, with_relay)
    assert isinstance(runner, TmuxRunner) and runner.server is bundles["party"]
    assert runner.endpoint() == TmuxEndpoint(bundles["party"], "a")  # the relay's member
    alone = SimpleNamespace(state_dir=str(tmp_path / "state"), env={}, relay=None)
    runner = TmuxRunner.hosted(bundled, home, given, alone)
    assert isinstance(runner, TmuxRunner)
    assert runner.server.runtime_dir == str(tmp_path / "state" / "tmux" / "a")
    store.close()


def test_agent_locks_serialise_one_agent_and_never_deadlock_two_holders() -> None:
    async def scenario() -> list[str]:
        locks = AgentLocks()
        order: list[str] = []
        first_in = asyncio.Event()
        release = asyncio.Event()

        async def holder(name: str, agents: list[str]) -> None:
            async with locks.held(agents):
                order.append(f"{name} in")
                first_in.set()
                await release.wait()
                order.append(f"{name} out")

        one = asyncio.ensure_future(holder("one", ["b", "a"]))
        await first_in.wait()
        two = asyncio.ensure_future(holder("two", ["a", "b"]))  # the other order: no deadlock
        other = asyncio.ensure_future(holder("other", ["c"]))
        await until_async(lambda: "other in" in order, "an agent nobody holds, at once")
        assert "two in" not in order
        release.set()
        await asyncio.gather(one, two, other)
        return order

    order = asyncio.run(scenario())
    assert order.index("one out") < order.index("two in")
