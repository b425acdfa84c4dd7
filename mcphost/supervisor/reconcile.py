"""Reconciliation: the fleet in force, and every change of it.

Owns: the fleet in force (`Reconciler.fleet`), its slots (`Slot`: one agent's plan, home,
runner, uid, held workspace and fence) and the agents whose home could not be prepared
(`unstarted`); the reload lock and one lock per agent (`AgentLocks`) that reconciliation and
every start / stop / restart of that agent (ctl, the relay's up / down, a fenced agent's
replacement) hold, finding the agent's slot only under it (a `ctl restart` racing a reload once
reached the runner the reload discarded and started a hidden second agent); `reconcile` (start
what is new, stop what is gone, restart what changed how it runs, apply a changed restart
policy, stop grace or log limit in place, leave the rest alone; every fallible
write -- the relay's configuration, the homes -- before anything is stopped, so a failed relay
write is `reload_failed` with nothing changed); `reload` (the fleet file and the token file
again: `[center]` and the token apply to the next call of every session, through the
supervisor's one link; with every changed key named with what the reload did with it, as the
fleet model declares: `key_changes`), the fleet the center assigns (`poll_center`), `refence` (a fence that a
reload made stale) and the replacement of a generation the center fenced (`replace_fenced`).
A slot's runner is built by the kind its plan names, from one table (`RUNNERS`: a new kind of
runner is a class with `hosted` and one line there), with every collaborator given at
construction (`runner.Collaborators`): the fence, the center's reservation of generations,
and the supervisor's `spawned` / `exited` callbacks.

Must never: start, stop or replace an agent without holding its lock, change `slots` without
the reload lock, stop anything before every fallible write of a reconciliation succeeded, serve
a session or decide an identity (the supervisor and its surfaces do: surfaces.py), or hand the
token, its file's path or the admin URL to an agent (homes and fences are built from the plan,
never from the link).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import weakref
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mcphost import events
from mcphost.settings import SettingError
from mcphost.supervisor import refusals as R
from mcphost.supervisor import startup
from mcphost.supervisor.agents import reach
from mcphost.supervisor.agents.acp import AcpRunner
from mcphost.supervisor.agents.homes import (
    AttachPoints,
    HeldWorkspace,
    Home,
    HomeError,
    agent_argv,
    agent_env,
    hold_home,
    reclaim_home,
)
from mcphost.supervisor.agents.runner import AgentRunner, Collaborators, Intensity
from mcphost.supervisor.agents.signin import (
    Operator,
    claude_home_is_its_own,
    claude_source,
    codex_auth,
    read_operator,
)
from mcphost.supervisor.agents.states import AgentState
from mcphost.supervisor.agents.tmux import TmuxRunner
from mcphost.supervisor.confine.fence import Fence
from mcphost.supervisor.confine.probe import probe
from mcphost.supervisor.control.protocol import ControlError
from mcphost.supervisor.fleet import IN_PLACE, CenterSection, load_fleet, reload_of, table_of
from mcphost.supervisor.plan import (
    AgentDefaults,
    AgentPlan,
    Fleet,
    agent_uid,
    check_sandbox,
    check_users,
    needs_restart,
    runs_apart,
    wants_own_uid,
)
from mcphost.supervisor.values import Reload

if TYPE_CHECKING:
    from mcphost.supervisor.agents.relayhost import RelayHost
    from mcphost.supervisor.center.generations import Generations
    from mcphost.supervisor.center.link import Center
    from mcphost.supervisor.confine.cgroups import AgentGroup, Cgroups
    from mcphost.supervisor.confine.kernel import Reaper
    from mcphost.supervisor.state import StateStore

# `plan.runner` -> the kind of runner that runs it (each builds itself: `AgentRunner.hosted`).
RUNNERS: dict[str, type[AgentRunner]] = {
    "process": AgentRunner,
    "tmux": TmuxRunner,
    "acp": AcpRunner,
}


@dataclass
class Slot:
    """One agent of the fleet in force: its plan, home, runner and the uid its processes run as;
    `workspace`: the workspace directory held open (homes.py): sessions and spawns use it,
    never the path, which the agent owns."""

    plan: AgentPlan
    home: Home
    runner: AgentRunner
    uid: int
    workspace: HeldWorkspace
    fenced: dict[str, Any] | None = None  # the last fence the center put on it (status rows)
    fences: Intensity | None = None  # replacements of fenced generations, bounded like restarts
    sandbox: Fence | None = None  # the agent's fence (fence.py); None: `sandbox = "none"`


class AgentLocks:
    """One lock per agent, held around every start / stop / restart of it (module doc)."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    @contextlib.asynccontextmanager
    async def held(self, agent_ids: Iterable[str]) -> AsyncIterator[None]:
        """Hold the locks of `agent_ids` (in sorted order, so two holders never deadlock)."""
        async with contextlib.AsyncExitStack() as stack:
            for agent_id in sorted(set(agent_ids)):
                lock = self._locks.get(agent_id)
                if lock is None:
                    lock = self._locks[agent_id] = asyncio.Lock()
                await stack.enter_async_context(lock)
            yield


class AttachSocket(Protocol):
    """An attach hub as the reconcile sees it: its socket's path and mode (widened to 0666 when
    the first agent of another user arrives)."""

    path: str
    mode: int


class Supervised(Protocol):
    """What reconciliation reads of the supervisor (`supervisor.Supervisor`): never imported,
    so the orchestrator stays above this module."""

    @property
    def state_dir(self) -> str: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def store(self) -> StateStore: ...
    @property
    def reaper(self) -> Reaper: ...
    @property
    def relay(self) -> RelayHost: ...
    @property
    def center(self) -> Center: ...
    @property
    def hubs(self) -> Mapping[str, AttachSocket]: ...
    @property
    def generations(self) -> Generations: ...
    @property
    def cgroups(self) -> Cgroups: ...
    async def attach_points(self, fleet: Fleet) -> AttachPoints: ...
    def spawned(self, runner: AgentRunner, pid: int, starttime: int, generation: int) -> None: ...
    def exited(self, runner: AgentRunner, generation: int) -> None: ...
    def left(self, agent_id: str) -> None: ...


class Reconciler:
    """The fleet in force and its slots, changed only here (module doc)."""

    def __init__(self, supervisor: Supervised, fleet: Fleet) -> None:
        self.supervisor = supervisor
        self.fleet = fleet
        self.started = fleet  # what a key a reload cannot apply stays at (`key_changes`)
        self.slots: dict[str, Slot] = {}
        self.unstarted: dict[str, str] = {}  # agent -> why its home could not be prepared
        self.locks = AgentLocks()
        self._reload_lock = asyncio.Lock()

    # -- reconciliation -------------------------------------------------------------------
    async def start(self) -> None:
        """The first reconciliation, of the fleet the supervisor started with."""
        async with self._reload_lock:
            await self._reconcile(self.fleet)

    def _changes(self, fleet: Fleet) -> dict[str, list[str]]:
        """What reconciling with `fleet` would do, by agent: `removed` (stopped), `added`
        (started), `changed` (restarted: how it runs changed, `plan.needs_restart`), `updated`
        (its runner's policy changed in place: `fleet.IN_PLACE`) and `unchanged`."""
        wanted = {plan.agent_id: plan for plan in fleet.agents}
        kept = [a for a in wanted if a in self.slots]
        changed = [a for a in kept if needs_restart(self.slots[a].plan, wanted[a], IN_PLACE)]
        updated = [a for a in kept if a not in changed and self.slots[a].plan != wanted[a]]
        return {
            "removed": [a for a in self.slots if a not in wanted],
            "added": [a for a in wanted if a not in self.slots],
            "changed": changed,
            "updated": updated,
            "unchanged": [a for a in kept if a not in changed and a not in updated],
        }

    async def _reconcile(self, fleet: Fleet, *, quiet: bool = False) -> dict[str, list[str]]:
        """Make the running set match `fleet`: start new, stop removed, restart changed, update
        the policy of the rest in place (`quiet`: a reconcile that changes nothing is logged at
        debug, not info).

        Called with `_reload_lock` held (the only writer of `slots`); it holds the lock of every
        agent it touches, so a ctl or relay start / stop / restart of one waits for it (and it
        for them). Every fallible write (the relay's configuration, the homes' configs) comes
        before anything is stopped: a failed relay write is `reload_failed` with nothing changed
        (a home that cannot be prepared fails that agent only, as before)."""
        fleet = self._identified(fleet)
        await self._keep_uids(fleet)
        changes = self._changes(fleet)
        touched = changes["removed"] + changes["changed"] + changes["updated"] + changes["added"]
        async with self.locks.held(touched):
            return await self._apply(fleet, changes, quiet=quiet)

    def _identified(self, fleet: Fleet) -> Fleet:
        """`fleet` with each agent that wants a uid of its own (`wants_own_uid`) given one
        (uids.py: the uid the state keeps for it, else a free one); nothing is kept yet
        (`_keep_uids`). `reload_failed` when the range has too few free uids."""
        from mcphost.supervisor import uids

        wanted = [plan.agent_id for plan in fleet.agents if wants_own_uid(plan)]
        recorded = self.supervisor.store.uids()
        if not wanted and not recorded:
            return fleet
        try:
            assigned = uids.allocate(wanted, recorded, fleet.uids)
        except uids.UidsExhausted as exc:
            problem = SettingError(
                f"{fleet.path}: identity.uids", repr(str(fleet.uids)), uids.RANGE_EXPECTED,
                problem=str(exc),
            )  # fmt: skip
            raise ControlError.row(
                R.FLEET_INVALID,
                {"problems": [problem.details], "file": fleet.path},
                problem=problem.text(),
            ) from None
        plans = tuple(
            dataclasses.replace(plan, uid=assigned.get(plan.agent_id)) for plan in fleet.agents
        )
        return dataclasses.replace(fleet, agents=plans)

    async def _keep_uids(self, fleet: Fleet) -> None:
        """Make the state hold exactly the uids `fleet`'s agents were given (`_identified`): a
        uid whose agent left is released; an agent moved to another uid (a changed `[identity]
        uids`) first has its home back (`_reclaim`), so the preparation hands it whole to the
        new uid (homes.hold_home)."""
        store = self.supervisor.store
        assigned = {plan.agent_id: plan.uid for plan in fleet.agents if plan.uid is not None}
        recorded = store.uids()
        for agent_id, uid in assigned.items():
            if recorded.get(agent_id, uid) != uid:
                await self._reclaim(agent_id)
        store.keep_uids(assigned)

    async def _apply(
        self, fleet: Fleet, changes: dict[str, list[str]], *, quiet: bool = False
    ) -> dict[str, list[str]]:
        supervisor = self.supervisor
        wanted = {plan.agent_id: plan for plan in fleet.agents}
        removed, changed, added = changes["removed"], changes["changed"], changes["added"]
        await self._configure_relay(fleet)
        self._share_state(fleet)
        # Homes next, in threads (each config write is fsynced twice), so the loop only forks.
        starting = changed + added
        attach = await supervisor.attach_points(fleet)  # with the HTTP listener, if wanted
        # The operator's own sign-in, read fresh at each preparation (signin.py).
        operator = await asyncio.to_thread(read_operator, supervisor.env) if starting else None
        homes = await asyncio.gather(
            *(
                asyncio.to_thread(
                    hold_home, supervisor.state_dir, wanted[agent_id], attach, operator
                )
                for agent_id in starting
            ),
            return_exceptions=True,
        )
        if operator is not None:
            _signed_out(operator, [wanted[agent_id] for agent_id in starting])
        for home in homes:
            if isinstance(home, BaseException) and not isinstance(home, HomeError | OSError):
                raise home  # a bug, not an unsafe home: before anything is stopped
        self.fleet = fleet
        for agent_id in removed + changed:
            slot = self.slots.pop(agent_id)
            await slot.runner.aclose()
            supervisor.left(agent_id)
            slot.workspace.close()  # open sessions hold their own duplicates
            if agent_id in removed and slot.plan.uid is not None:
                # its uid is released (`_keep_uids`): nothing of it stays that uid's
                await self._reclaim(agent_id)
        for agent_id in changes["updated"]:
            slot = self.slots[agent_id]
            slot.plan = wanted[agent_id]
            slot.runner.update_policy(slot.plan)
            if slot.fences is not None:
                slot.fences = Intensity(slot.plan.max_restarts, slot.plan.restart_window)
        self.unstarted = {a: r for a, r in self.unstarted.items() if a in wanted}
        prepared = [a for a, home in zip(starting, homes, strict=True) if isinstance(home, tuple)]
        firsts = await self._first_generations(prepared)
        for agent_id, home in zip(starting, homes, strict=True):
            if isinstance(home, BaseException):
                # One unsafe home (e.g. a symlink the agent planted) fails that agent only.
                self.unstarted[agent_id] = f"its home could not be prepared: {home}"
                events.emit(
                    "supervisor.home_failed", level="error", agent_id=agent_id, problem=str(home)
                )
                continue
            self.unstarted.pop(agent_id, None)
            self.slots[agent_id] = slot = self._slot(wanted[agent_id], *home)
            await slot.runner.start(firsts.get(agent_id))
        busy = added or removed or changed or changes["updated"]
        events.emit(
            "supervisor.reconciled",
            level="debug" if quiet and not busy else "info",
            added=added,
            removed=removed,
            changed=changed,
            updated=changes["updated"],
            unchanged=len(changes["unchanged"]),
        )
        return changes

    async def _first_generations(self, agent_ids: list[str]) -> dict[str, int]:
        """The first spawn's generation of each agent that starts now (more than one: a fleet's
        start-up, a reload that adds several), reserved at the center all at once and committed
        in one transaction (`StateStore.next_generations`: one fsync, not one per spawn); empty
        for one agent, or when one of them has none left (each runner then takes its own, and
        says so as it always did)."""
        from mcphost.supervisor.state import GenerationExhausted, generation_after

        if len(agent_ids) < 2:
            return {}
        supervisor = self.supervisor
        store = supervisor.store
        try:
            local = {a: generation_after(store.generation(a)) for a in agent_ids}
        except GenerationExhausted:
            return {}
        admin = supervisor.center.admin
        reserved = await asyncio.gather(
            *(supervisor.generations.next(admin, a, local[a]) for a in agent_ids)
        )
        try:
            return store.next_generations(dict(zip(agent_ids, reserved, strict=True)))
        except GenerationExhausted:
            return {}

    async def _reclaim(self, agent_id: str) -> None:
        """The agent's home back to the supervisor (`homes.reclaim_home`, in a thread); a
        failure is logged, never fatal to the reload."""
        try:
            await asyncio.to_thread(reclaim_home, self.supervisor.state_dir, agent_id)
        except (HomeError, OSError) as exc:
            events.emit(
                "supervisor.home_reclaim_failed", level="error", agent_id=agent_id, problem=str(exc)
            )

    async def _configure_relay(self, fleet: Fleet) -> None:
        """The relay's generated configuration for `fleet` (and serving, once a bundle exists);
        a failure is `reload_failed` (nothing is stopped before this)."""
        from mcphost.agentmux.wire import RelayError
        from mcphost.relay.server import RelayBindError

        relay = self.supervisor.relay
        try:
            await relay.configure(fleet)
        except (OSError, RelayError, RelayBindError) as exc:
            problem = str(exc) if not isinstance(exc, RelayError) else exc.message
            events.emit("supervisor.relay_configure_failed", level="error", problem=problem)
            directory = str(relay.config)
            raise ControlError.row(
                R.RELAY_UNWRITABLE,
                {"file": fleet.path, "directory": directory, "problem": problem},
                problem=problem,
                directory=directory,
            ) from None

    def _share_state(self, fleet: Fleet) -> None:
        """The first agent of another user (a reload may bring it): `<state>`, `run/` and
        `agents/` 0711 and the attach sockets 0666, as a start with it sets them; never
        narrowed while running."""
        hubs = self.supervisor.hubs.values()
        if not any(runs_apart(a) for a in fleet.agents) or all(hub.mode == 0o666 for hub in hubs):
            return
        try:
            startup.prepare_state_dir(self.supervisor.state_dir, fleet)
            for hub in hubs:
                os.chmod(hub.path, 0o666)
                hub.mode = 0o666
        except (SettingError, OSError) as exc:
            events.emit("supervisor.state_share_failed", level="error", problem=str(exc))

    def _slot(self, plan: AgentPlan, home: Home, workspace: HeldWorkspace) -> Slot:
        """The agent's slot, its runner of the kind `plan.runner` names (`RUNNERS`)."""
        supervisor = self.supervisor
        sandbox = self._fence(plan, home)

        def reserve(agent_id: str, local: int) -> Awaitable[int]:
            return supervisor.generations.next(supervisor.center.admin, agent_id, local)

        given = Collaborators(
            store=supervisor.store,
            reaper=supervisor.reaper,
            on_spawn=supervisor.spawned,
            on_exit=supervisor.exited,
            argv=agent_argv(plan, home),
            env=agent_env(supervisor.env, plan, home),
            cwd=workspace.cwd,
            fence=sandbox,
            reserve=reserve,
        )
        runner = RUNNERS[plan.runner].hosted(plan, home, given, supervisor)
        runner.cgroup = self._group(plan)
        return Slot(
            plan=plan,
            home=home,
            runner=runner,
            uid=agent_uid(plan),
            workspace=workspace,
            sandbox=sandbox,
        )

    def _group(self, plan: AgentPlan) -> AgentGroup | None:
        """The agent's own cgroup, with its limits (cgroups.py); None without a backend."""
        cgroups = self.supervisor.cgroups
        return cgroups.group(plan.agent_id, cgroups.limits_of(plan))

    def _fence(self, plan: AgentPlan, home: Home, fleet: Fleet | None = None) -> Fence | None:
        """The agent's fence (reach.py builds it as the load-time checks plan it) in `fleet`
        (None: the one in force), with the sign-in of the supervisor's environment hidden and the
        agent's own cgroups shown."""
        supervisor = self.supervisor
        group = self._group(plan)
        return reach.agent_fence(
            fleet or self.fleet,
            supervisor.state_dir,
            plan,
            home,
            env=supervisor.env,
            cgroups=group.unique_dirs if group is not None else (),
        )

    # -- reload ---------------------------------------------------------------------------
    async def reload(self, dry_run: bool = False) -> tuple[dict[str, Any], Fleet]:
        """Re-read the fleet file (and the token file); a file that fails validation changes
        nothing. A changed `[center]` or token applies to the next call of every session.
        `dry_run`: the file's checks, then what a reload would stop, start, restart and update
        (`_changes`; with `[center] fleet = "center"`, against the center's list), with nothing
        applied. Either way `keys`: every changed key with what the reload does (did) with it,
        as the fleet model declares (`key_changes`); and the fleet file's fleet (its `[page]`
        and `[metrics]` are the supervisor's listeners' to apply)."""
        async with self._reload_lock:
            fleet = self._checked_file()
            before = self.fleet, {a: slot.plan for a, slot in self.slots.items()}
            if dry_run:
                wanted = fleet
                if fleet.center.fleet == "center" and self.fleet.center.fleet == "center":
                    wanted = (await self._center_fleet(fleet))[0]
                wanted = self._identified(wanted)
                plans = {plan.agent_id: plan for plan in wanted.agents}
                keys = key_changes(self.started, *before, wanted, plans)
                for key in keys:
                    if key["reload"] == Reload.REFENCES:
                        key["agents"] = self._refenced(wanted)
                return {"dry_run": True, **self._changes(wanted), "keys": keys}, fleet
            await self._apply_center(fleet)
            if fleet.center.fleet == "center":
                outcome = await self._reload_from_center(base=fleet)
            else:
                outcome = await self._reconcile(fleet)
            plans = {a: slot.plan for a, slot in self.slots.items()}
            keys = key_changes(self.started, *before, self.fleet, plans)
            refenced = await self._refence()
            for key in keys:
                key["applied"] = key["reload"] != Reload.RESTART_SUPERVISOR
                if key["reload"] == Reload.REFENCES:
                    key["agents"] = refenced
            return {**outcome, "keys": keys}, fleet

    def _checked_file(self) -> Fleet:
        """The fleet file as it is now, checked against this machine (`reload_failed` with
        every problem it has)."""
        try:
            fleet = load_fleet(self.fleet.path, env=self.supervisor.env)
            check_users(fleet)
            check_sandbox(fleet, probe().missing())
            reach.check_reach(fleet, self.supervisor.state_dir)
        except SettingError as exc:
            raise ControlError.row(
                R.FLEET_INVALID,
                {"problems": [p.details for p in exc.problems], "file": self.fleet.path},
                problem=exc.text(),
            ) from None
        return fleet

    def _refenced(self, fleet: Fleet) -> list[str]:
        """The running fenced agents, kept as they run, whose fence under `fleet` differs (a
        reload to `fleet` restarts them into it: `_refence`)."""
        return sorted(
            agent_id
            for agent_id, slot in self.slots.items()
            if slot.sandbox is not None
            and not needs_restart(slot.plan, _planned(fleet, slot.plan), IN_PLACE)
            and self._fence(slot.plan, slot.home, fleet) != slot.sandbox
            and slot.runner.status().state in (AgentState.STARTING, AgentState.RUNNING)
        )

    async def _refence(self) -> list[str]:
        """After a reload that moved `[center] token_file` (or another path the fence hides:
        `reach.secrets`), a fence planned with the old path (and reused by restarts) would leave
        the new one readable: every fenced agent whose plan differs now gets the new one, and a
        running one is restarted into it. The agents restarted."""
        restarted: list[str] = []
        for agent_id, slot in list(self.slots.items()):
            if slot.sandbox is None:
                continue
            async with self.locks.held([agent_id]):
                if self.slots.get(agent_id) is not slot:
                    continue
                fence = self._fence(slot.plan, slot.home)
                if fence == slot.sandbox:
                    continue
                slot.sandbox = fence
                slot.runner.refence(fence)
                running = slot.runner.status().state in (AgentState.STARTING, AgentState.RUNNING)
                events.emit("supervisor.agent_refenced", agent_id=agent_id, restarted=running)
                if running:
                    restarted.append(agent_id)
                    await slot.runner.restart()
        return sorted(restarted)

    async def _apply_center(self, fleet: Fleet) -> None:
        """Make `fleet.center` (and its token file's token) the one the next call of every
        session uses: no session is rebuilt, no agent restarted. Refused, changing nothing, when
        the token file cannot be read or `[center] fleet` (where the agents come from) changed."""
        from mcphost.binding import BindingError
        from mcphost.supervisor.center.link import read_token

        center = fleet.center
        if center.fleet != self.fleet.center.fleet:
            raise ControlError.row(
                R.CENTER_FLEET_CHANGED, {"file": fleet.path, "key": "[center] fleet"}
            )
        try:
            token, stamp = await asyncio.to_thread(read_token, center.token_file)
        except BindingError as exc:
            raise ControlError.row(
                R.TOKEN_UNREADABLE,
                {"file": fleet.path, "key": "[center] token_file"},
                path=center.token_file,
                problem=exc.problem,
                expected=exc.expected,
            ) from None
        changed = self.supervisor.center.apply(center, token, stamp)  # a change: probed
        self.fleet = dataclasses.replace(self.fleet, center=center)
        if changed:
            events.emit("supervisor.center_changed", changed=changed)

    # -- the fleet the center assigns (`[center] fleet = "center"`) ------------------------
    async def _center_fleet(self, base: Fleet | None = None) -> tuple[Fleet, dict[str, int]]:
        """The fleet of the center's list for this worker, each agent planned from `base`'s
        `[defaults]` (None: the fleet in force's; a reload gives the file's), and the
        generations it has seen."""
        from mcphost.errors import ToolFailure
        from mcphost.supervisor.center.generations import fetch_fleet
        from mcphost.supervisor.plan import fleet_with_agents

        try:
            assigned = await fetch_fleet(self.supervisor.center.admin)
            fleet = base or self.fleet
            return fleet_with_agents(fleet, assigned.ids), dict(assigned.generations)
        except ToolFailure as exc:
            raise ControlError.row(
                R.CENTER_LIST_UNREADABLE,
                {"center_code": exc.code},
                code=exc.code,
                problem=exc.message,
            ) from None
        except SettingError as exc:
            raise ControlError.row(
                R.CENTER_LIST_INVALID,
                {"problems": [p.details for p in exc.problems]},
                problem=exc.text(),
            ) from None

    async def _reload_from_center(
        self, polled: bool = False, base: Fleet | None = None
    ) -> dict[str, Any]:
        fleet, generations = await self._center_fleet(base)
        for agent_id, generation in generations.items():
            self.supervisor.generations.saw(agent_id, generation)
        return await self._reconcile(fleet, quiet=polled)

    async def poll_center(self) -> None:
        """Reconcile with the center's list every `[center] poll_seconds`, until cancelled."""
        while True:
            try:
                async with self._reload_lock:
                    await self._reload_from_center(polled=True)
            except ControlError as exc:
                events.emit(
                    "supervisor.center_fleet_failed",
                    level="warning",
                    code=exc.code,
                    message=exc.message,
                )
            await asyncio.sleep(self.fleet.center.poll_seconds)

    # -- a generation the center fenced ---------------------------------------------------
    async def replace_fenced(self, slot: Slot, generation: int) -> None:
        """Restart a fenced agent with a generation above the center's (under the reload lock
        and the agent's lock, so neither a reconcile nor a ctl operation sees it half done);
        past `max_restarts` fences within `restart_window`, stop it instead (another host keeps
        taking it over)."""
        agent_id = slot.plan.agent_id
        async with self._reload_lock, self.locks.held([agent_id]):
            if (
                self.slots.get(agent_id) is not slot
                or slot.runner.status().generation != generation
            ):
                return
            if slot.fences is None:
                slot.fences = Intensity(slot.plan.max_restarts, slot.plan.restart_window)
            assert slot.fenced is not None
            if slot.fences.allow(asyncio.get_running_loop().time()):
                slot.fenced["action"] = "restarted"
                await slot.runner.restart()
            else:
                slot.fenced["action"] = "stopped"
                events.emit("supervisor.agent_fenced_stopped", level="error", agent_id=agent_id)
                await slot.runner.stop()


def _planned(fleet: Fleet, plan: AgentPlan) -> AgentPlan:
    """The plan `fleet` has for `plan`'s agent (`plan` itself when `fleet` has none)."""
    return next((p for p in fleet.agents if p.agent_id == plan.agent_id), plan)


def key_changes(
    started: Fleet,
    before: Fleet,
    plans: Mapping[str, AgentPlan],
    after: Fleet,
    planned: Mapping[str, AgentPlan],
) -> list[dict[str, Any]]:
    """Every key of `[center]`, `[identity]`, `[defaults]` and `[[agent]]` that differs from
    `before` (the fleet in force, `plans` its agents') to `after` (`planned`), each with the
    reload behaviour its field declares (`fleet.reload_of`): `{"key": "[center] admin_url",
    "reload": "live", "agents": [...]}` (`agents`: those whose plan it changes). A key a reload
    cannot apply (`restart_supervisor`) is compared with `started`, the fleet the supervisor
    started with, so every reload names it until a restart. An agent key changed in
    `[defaults]` is named there, else in `[[agent]]`. Pure. `[page]` and `[metrics]` are the
    listeners' (supervisor.py)."""
    found: list[dict[str, Any]] = []

    def add(section: str, key: str, kind: Reload, agents: list[str] | None = None) -> None:
        entry: dict[str, Any] = {"key": f"{table_of(section)} {key}", "reload": kind}
        if agents is not None:
            entry["agents"] = agents
        found.append(entry)

    for key in CenterSection.model_fields:
        attr = "pins" if key == "fingerprint" else key
        then, was, now = (getattr(f.center, attr) for f in (started, before, after))
        kind = reload_of("center", key, toggled=(then is None) != (now is None))
        if (then if kind == Reload.RESTART_SUPERVISOR else was) != now:
            add("center", key, kind)
    kept = sorted(a for a in plans if a in planned)
    if before.uids != after.uids:
        moved = [a for a in kept if plans[a].uid != planned[a].uid]
        add("identity", "uids", reload_of("identity", "uids"), moved)
    for key in AgentDefaults.__dataclass_fields__:
        touched = [a for a in kept if getattr(plans[a], key) != getattr(planned[a], key)]
        section = "defaults"
        if getattr(before.defaults, key) == getattr(after.defaults, key):
            if not touched:
                continue
            section = "agent"
        add(section, key, reload_of(section, key), touched)
    return found


def _signed_out(operator: Operator, plans: list[AgentPlan]) -> None:
    """One warning per client kind whose starting agents get no sign-in (signin.py), and one
    per operator file not read; paths and agent ids only, never a secret."""
    claude = [
        p.agent_id
        for p in plans
        if claude_home_is_its_own(p) and claude_source(p, operator) is None
    ]
    codex = [p.agent_id for p in plans if p.client == "codex" and codex_auth(p, operator) is None]
    for client, agents in (("claude", claude), ("codex", codex)):
        if agents:
            events.emit(
                "supervisor.signed_out", level="warning", client=client, agents=agents,
                user=operator.user,
            )  # fmt: skip
    for problem in operator.problems:
        events.emit("supervisor.sign_in_not_copied", level="warning", problem=problem)
