"""The supervisor: one process that runs a worker's fleet and serves every agent's MCP sessions.

Owns: the link to the center (centerlink.py: the worker token read from the fleet's
`token_file`, held only there and in one pooled, pinned `AdminClient` shared by every session,
whose target, pins and token a reload swaps for the next call of every session; centerhealth.py:
the center's health in `ctl status`), the fleet in force (`Fleet`) and its
reconciliation (start what is new, stop what is gone, restart what changed, leave the rest
alone; every fallible write -- the relay's configuration, the homes -- before anything is
stopped, so a failed relay write is `reload_failed` with nothing changed), one lock per agent
that reconciliation and every start / stop / restart of that agent (ctl, the relay's up / down)
hold, finding the agent's slot only under it (a `ctl restart` racing a reload once reached the
runner the reload discarded and started a hidden second agent), the two attach hubs (center
tools, relay tools), the control socket, the relay host (relayhost.py: bundles in tmux,
`runner = "tmux"` agents, the relay socket), the one relay connection each agent generation's
relay tools sessions share (the relay allows one per principal), and the order of start-up and
shutdown. Beside it: startup.py (the token and the state directory, before anything else),
records.py (every process it runs, in the state file, so a crash leaves none behind),
reach.py (the attach points and each agent's fence, built as the load-time checks plan them),
identity.py (the identity roots and the one vouch rule), operations.py (what `mcphost ctl`
asks, served on the control socket).

Identity: every spawn registers its process as the agent's only root, at the generation of that
spawn (`Identities.spawned`); a pump is served as the agent the registry vouches for. Sessions of
an older generation are closed the moment a newer spawn registers (and when an agent exits),
and the center fences the older generation anyway (`stale_generation`).

Must never: start, stop or replace an agent without holding its lock, hand the token, the token
file's path or the admin URL to a child (environment, argv, files under an agent's home), log
the token, or take an agent's identity from anything a process can choose (its environment, its
arguments, its claims on the wire).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mcphost import events, peer
from mcphost.mcpserve.budget import Budgets
from mcphost.settings import SettingError
from mcphost.supervisor import fence as fences
from mcphost.supervisor import kernel, reach, startup
from mcphost.supervisor import refusals as R
from mcphost.supervisor.centerfleet import Generations
from mcphost.supervisor.control.protocol import ControlError
from mcphost.supervisor.control.server import ControlServer
from mcphost.supervisor.fence import Fence
from mcphost.supervisor.fleet import load_fleet
from mcphost.supervisor.homes import (
    AttachPoints,
    HeldWorkspace,
    Home,
    HomeError,
    agent_argv,
    agent_env,
    hold_home,
)
from mcphost.supervisor.identity import Identities
from mcphost.supervisor.lifecycle import AgentRunner, AgentState, Intensity
from mcphost.supervisor.operations import Operations, reload_failed
from mcphost.supervisor.plan import AgentPlan, Fleet, check_sandbox, check_users, user_uid
from mcphost.supervisor.records import ProcessRecords
from mcphost.supervisor.refusals import Refused
from mcphost.supervisor.relayhost import RelayHost
from mcphost.supervisor.sessions import AGENT_HELD_BYTES, Attached, SessionHub
from mcphost.supervisor.signin import (
    Operator,
    claude_home_is_its_own,
    claude_source,
    codex_auth,
    read_operator,
)
from mcphost.supervisor.state import StateStore

if TYPE_CHECKING:
    from mcphost.admin.client import AdminClient
    from mcphost.errors import ToolFailure
    from mcphost.relaytools.stream import SharedStream
    from mcphost.supervisor.centerhealth import CenterHealth
    from mcphost.supervisor.centerlink import CenterLink
    from mcphost.surface import Surface

CENTER, RELAY = "center", "relay"
# Sessions one agent may hold open per surface: a real client opens one or two; the cap keeps a
# runaway agent from holding the supervisor's memory (each session is bounded on its own).
MAX_SESSIONS_PER_AGENT = 32
# Exchanges one agent may have in flight on the shared admin (and runtime) client, of its 64:
# the rest of its calls wait their turn, round-robin with other agents' (mcphost.admin.slots).
CENTER_CALLS_PER_AGENT = 16


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


class Supervisor:
    """Run `fleet` with state under `state_dir` until `stop()`; see the module docstring."""

    def __init__(self, fleet: Fleet, state_dir: str, *, env: dict[str, str] | None = None):
        self.fleet = fleet
        self.state_dir = os.path.abspath(state_dir)
        self.env = dict(os.environ if env is None else env)
        self.slots: dict[str, Slot] = {}
        self.unstarted: dict[str, str] = {}  # agent -> why its home could not be prepared
        self.identities = Identities()  # the identity roots and the vouch rule (identity.py)
        self.stopping = asyncio.Event()
        self.started_at = time.time()
        self._reload_lock = asyncio.Lock()
        # One lock per agent: reconciliation and every start / stop / restart of an agent (ctl,
        # the relay's up / down) take it, so they never interleave (see `_agents_held`).
        self._agent_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self.link: CenterLink | None = None  # the [center] in force and the token
        self.health: CenterHealth | None = None
        self.admin: AdminClient | None = None
        self.runtime: AdminClient | None = None
        self.hubs: dict[str, SessionHub] = {}
        self.control: ControlServer | None = None
        self.operations = Operations(self)  # what `mcphost ctl` asks (operations.py)
        self.store: StateStore | None = None
        self.reaper: kernel.Reaper | None = None
        self.records: ProcessRecords | None = None  # every process we run, in the state file
        self._tasks: set[asyncio.Task[Any]] = set()
        self.relay: RelayHost | None = None  # bundles in tmux, the relay wire (relayhost.py)
        # per agent: (generation, the relay connection its relay tools sessions share)
        self._relay_shares: dict[str, tuple[int, SharedStream]] = {}
        self.generations = Generations()  # what the center said it has seen (centerfleet.py)
        self._lock_fd: int | None = None  # the state directory's lock (control.take_lock)

    # -- paths ----------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return os.path.join(self.state_dir, *parts)

    def attach_points(self) -> AttachPoints:
        return reach.attach_points(self.state_dir)

    # -- start and stop -------------------------------------------------------------------
    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT (or `stop()`); SIGHUP reloads. Returns the exit status."""
        kernel.set_non_dumpable()  # before the token is read: no same-user process reads it
        kernel.set_child_subreaper()  # orphans of agents come back to us (reaped, fail closed)
        try:  # the token, then the state directory's lock, then its modes (startup.py)
            self.link = startup.open_link(self.fleet)
            self._lock_fd = startup.claim_state(self.state_dir, self.fleet)
        except startup.StartRefused as exc:
            print(exc.line, file=sys.stderr)
            return exc.status
        loop = asyncio.get_running_loop()
        fences.probe()  # forks and waits for its own child: before the Reaper owns waitpid
        self.store = StateStore(self.path("state.sqlite3"))
        self.records = ProcessRecords(self.store)
        self.reaper = kernel.Reaper()
        self.reaper.install(loop)
        # what a crashed supervisor left running, before any spawn
        await self.records.end_leftovers(
            max((plan.stop_grace for plan in self.fleet.agents), default=10.0)
        )
        self.relay = RelayHost(self.state_dir, self.env, self, watch=self.reaper.watch)
        self._open_admin()
        self.control = ControlServer(
            self.path(reach.CONTROL), self.operations, locked=True, refuse_descendants=True
        )
        await self.control.start()
        budgets = Budgets(AGENT_HELD_BYTES)  # one per agent, across both surfaces
        for name in (CENTER, RELAY):
            self.hubs[name] = SessionHub(
                self.path("run", f"{name}.sock"),
                identify=self._identifier(name),
                surface_for=self._surface_factory(name),
                mode=self._socket_mode(),
                budgets=budgets,
            )
            await self.hubs[name].start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload_in_background)
        events.emit(
            "supervisor.started",
            state=self.state_dir,
            fleet=self.fleet.path,
            agents=len(self.fleet.agents),
            pid=os.getpid(),
        )
        try:
            async with self._reload_lock:
                await self._reconcile(self.fleet)
        except ControlError as exc:  # the relay's configuration could not be written
            print(f"mcphost supervise: {exc.message}", file=sys.stderr)
            await self._shutdown()
            return 2
        if self.fleet.center.fleet == "center":
            self._spawn(self._poll_center())
        self._spawn(self.records.watch_adopted())
        events.emit("supervisor.ready", agents=sorted(self.slots))
        await self.stopping.wait()
        await self._shutdown()
        return 0

    def stop(self) -> None:
        self.stopping.set()

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _share_state(self, fleet: Fleet) -> None:
        """The first agent of another user (a reload may bring it): `<state>`, `run/` and
        `agents/` 0711 and the attach sockets 0666, as a start with it sets them; never
        narrowed while running."""
        if not any(a.user for a in fleet.agents) or all(
            hub.mode == 0o666 for hub in self.hubs.values()
        ):
            return
        try:
            startup.prepare_state_dir(self.state_dir, fleet)
            for hub in self.hubs.values():
                os.chmod(hub.path, 0o666)
                hub.mode = 0o666
        except (SettingError, OSError) as exc:
            events.emit("supervisor.state_share_failed", level="error", problem=str(exc))

    def _socket_mode(self) -> int:
        """0600 while every agent runs as our uid; 0666 when some run as another user (the
        kernel-credential check is then the only gate, as it always is the real one)."""
        return 0o666 if any(a.user for a in self.fleet.agents) else 0o600

    def _open_admin(self) -> None:
        from mcphost.admin.client import AdminClient
        from mcphost.admin.target import AdminTarget
        from mcphost.host.server import call_timeout_from_env
        from mcphost.supervisor.centerhealth import CenterHealth

        center = self.fleet.center
        assert self.link is not None
        self.admin = self.link.client(
            call_timeout=call_timeout_from_env(),
            on_failure=self._center_failure,
            per_lane=CENTER_CALLS_PER_AGENT,
        )
        self.health = CenterHealth(self.admin)
        self._spawn(self.health.run())
        if center.runtime_socket:
            self.runtime = AdminClient(
                AdminTarget(kind="unix", path=center.runtime_socket),
                per_lane=CENTER_CALLS_PER_AGENT,
            )

    def _center_failure(self, failure: ToolFailure) -> ToolFailure:
        """Every failure of the shared client: named in fleet keys (what an operator of the
        supervisor can change), and a probe of the center when it says something about it."""
        from mcphost.supervisor.centerhealth import worth_a_probe
        from mcphost.supervisor.centerlink import for_operator

        if self.health is not None and worth_a_probe(failure):
            self.health.poke()
        return for_operator(failure)

    async def _shutdown(self) -> None:
        events.emit("supervisor.stopping", agents=len(self.slots))
        for task in list(self._tasks):
            task.cancel()
        if self.control is not None:
            await self.control.aclose()
        await asyncio.gather(*(slot.runner.aclose() for slot in self.slots.values()))
        if self.relay is not None:
            await self.relay.aclose()
        for hub in self.hubs.values():
            await hub.aclose()
        shares, self._relay_shares = self._relay_shares, {}
        await asyncio.gather(*(share.aclose() for _, share in shares.values()))
        if self.reaper is not None:
            await self.reaper.kill_strays(max((a.stop_grace for a in self.fleet.agents), default=5))
        for client in (self.admin, self.runtime):
            if client is not None:
                await client.aclose()
        if self.store is not None:
            if self.records is not None:
                self.records.prune()
            self.store.close()
        self._release_lock()
        events.emit("supervisor.stopped")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the fleet ------------------------------------------------------------------------
    def agent_held(self, agent_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """The agent's lock, for the relay's up / down (relayhost.py) as for ctl."""
        return self._agents_held([agent_id])

    @contextlib.asynccontextmanager
    async def _agents_held(self, agent_ids: Iterable[str]) -> AsyncIterator[None]:
        """Hold the locks of `agent_ids` (in sorted order, so two holders never deadlock)."""
        async with contextlib.AsyncExitStack() as stack:
            for agent_id in sorted(set(agent_ids)):
                lock = self._agent_locks.get(agent_id)
                if lock is None:
                    lock = self._agent_locks[agent_id] = asyncio.Lock()
                await stack.enter_async_context(lock)
            yield

    async def _reconcile(self, fleet: Fleet, *, quiet: bool = False) -> dict[str, list[str]]:
        """Make the running set match `fleet`: start new, stop removed, restart changed
        (`quiet`: a reconcile that changes nothing is logged at debug, not info).

        Called with `_reload_lock` held (the only writer of `slots`); it holds the lock of every
        agent it touches, so a ctl or relay start / stop / restart of one waits for it (and it
        for them). Every fallible write (the relay's configuration, the homes' configs) comes
        before anything is stopped: a failed relay write is `reload_failed` with nothing changed
        (a home that cannot be prepared fails that agent only, as before)."""
        wanted = {plan.agent_id: plan for plan in fleet.agents}
        removed = [a for a in self.slots if a not in wanted]
        changed = [a for a, p in wanted.items() if a in self.slots and self.slots[a].plan != p]
        added = [a for a in wanted if a not in self.slots]
        unchanged = [a for a in wanted if a in self.slots and a not in changed]
        async with self._agents_held(removed + changed + added):
            return await self._apply(fleet, wanted, removed, changed, added, unchanged, quiet=quiet)

    async def _apply(
        self,
        fleet: Fleet,
        wanted: dict[str, AgentPlan],
        removed: list[str],
        changed: list[str],
        added: list[str],
        unchanged: list[str],
        *,
        quiet: bool = False,
    ) -> dict[str, list[str]]:
        if self.relay is not None:
            await self._configure_relay(fleet)
        self._share_state(fleet)
        # Homes next, in threads (each config write is fsynced twice), so the loop only forks.
        starting = changed + added
        attach = self.attach_points()
        # The operator's own sign-in, read fresh at each preparation (signin.py).
        operator = await asyncio.to_thread(read_operator, self.env) if starting else None
        homes = await asyncio.gather(
            *(
                asyncio.to_thread(hold_home, self.state_dir, wanted[agent_id], attach, operator)
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
            self._forget(slot)
        self.unstarted = {a: r for a, r in self.unstarted.items() if a in wanted}
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
            await slot.runner.start()
        outcome = {"added": added, "removed": removed, "changed": changed, "unchanged": unchanged}
        events.emit(
            "supervisor.reconciled",
            level="debug" if quiet and not (added or removed or changed) else "info",
            added=added,
            removed=removed,
            changed=changed,
            unchanged=len(unchanged),
        )
        return outcome

    async def _configure_relay(self, fleet: Fleet) -> None:
        """The relay's generated configuration for `fleet` (and serving, once a bundle exists);
        a failure is `reload_failed` (nothing is stopped before this)."""
        from mcphost.agentmux.wire import RelayError
        from mcphost.relay.server import RelayBindError

        assert self.relay is not None
        try:
            await self.relay.configure(fleet)
        except (OSError, RelayError, RelayBindError) as exc:
            problem = str(exc) if not isinstance(exc, RelayError) else exc.message
            events.emit("supervisor.relay_configure_failed", level="error", problem=problem)
            directory = str(self.relay.config)
            raise ControlError.row(
                R.RELAY_UNWRITABLE,
                {"file": fleet.path, "directory": directory, "problem": problem},
                problem=problem,
                directory=directory,
            ) from None

    def _slot(self, plan: AgentPlan, home: Home, workspace: HeldWorkspace) -> Slot:
        assert self.store is not None and self.reaper is not None

        sandbox = self._fence(plan, home)

        def reserve(agent_id: str, local: int) -> Awaitable[int]:
            return self.generations.next(self.admin, agent_id, local)

        runner: AgentRunner
        if plan.runner == "tmux":  # a pane: of its bundle's tmux server, or of its own
            from mcphost.supervisor.tmuxrunner import TmuxRunner, agent_server

            if plan.bundle is not None and self.relay is not None:
                server = self.relay.tmux_server(plan.bundle)
            else:
                server = agent_server(self.state_dir, plan.agent_id, self.env, self.reaper.watch)
            runner = TmuxRunner(
                plan,
                home,
                self.store,
                self.reaper,
                server=server,
                on_spawn=self._on_spawn,
                on_exit=self._on_exit,
                argv=agent_argv(plan, home),
                env=agent_env(self.env, plan, home),
                cwd=workspace.cwd,
                fence=sandbox,
                reserve=reserve,
            )
        else:
            runner = AgentRunner(
                plan,
                home,
                self.store,
                self.reaper,
                on_spawn=self._on_spawn,
                on_exit=self._on_exit,
                argv=agent_argv(plan, home),
                env=agent_env(self.env, plan, home),
                cwd=workspace.cwd,
                fence=sandbox,
                reserve=reserve,
            )
        return Slot(
            plan=plan,
            home=home,
            runner=runner,
            uid=user_uid(plan.user),
            workspace=workspace,
            sandbox=sandbox,
        )

    def _fence(self, plan: AgentPlan, home: Home) -> Fence | None:
        """The agent's fence (reach.py builds it as the load-time checks plan it)."""
        return reach.agent_fence(self.fleet, self.state_dir, plan, home)

    def _forget(self, slot: Slot) -> None:
        agent_id = slot.plan.agent_id
        self.identities.forget(agent_id)
        self.operations.end_execs(agent_id, below=None)
        for hub in self.hubs.values():
            hub.close_where(lambda a: a.agent_id == agent_id)
        self._close_relay(agent_id, None)
        slot.workspace.close()  # open sessions hold their own duplicates

    def _on_spawn(self, runner: AgentRunner, pid: int, starttime: int, generation: int) -> None:
        slot = self.slots.get(runner.plan.agent_id)
        if slot is None or slot.runner is not runner:
            # Never happens (a runner leaves its slot only closed, and a closed runner never
            # spawns); if it did, raising makes the runner kill the unregistered process.
            raise RuntimeError(f"a runner of {runner.plan.agent_id} outside the fleet spawned")
        self.identities.spawned(runner.plan.agent_id, (pid, starttime), generation)
        self.operations.end_execs(runner.plan.agent_id, below=generation)
        self._close_older(runner.plan.agent_id, generation)
        if self.records is not None:
            self.records.started(pid, starttime, runner.plan.agent_id, "agent")

    def _on_exit(self, runner: AgentRunner, generation: int) -> None:
        slot = self.slots.get(runner.plan.agent_id)
        if slot is None or slot.runner is not runner:
            return
        self.identities.ended(runner.plan.agent_id, generation)
        self.operations.end_execs(runner.plan.agent_id, below=generation + 1)
        self._close_older(runner.plan.agent_id, generation + 1)

    def _close_older(self, agent_id: str, generation: int) -> None:
        self._close_relay(agent_id, generation)
        closed = sum(
            hub.close_where(lambda a: a.agent_id == agent_id and a.generation < generation)
            for hub in self.hubs.values()
        )
        if closed:
            events.emit(
                "supervisor.sessions_closed",
                agent_id=agent_id,
                below_generation=generation,
                sessions=closed,
            )

    async def reload(self) -> dict[str, Any]:
        """Re-read the fleet file (and the token file); a file that fails validation changes
        nothing. A changed `[center]` or token applies to the next call of every session."""
        async with self._reload_lock:
            try:
                fleet = load_fleet(self.fleet.path, env=self.env)
                check_users(fleet)
                check_sandbox(fleet, fences.probe().missing())
                reach.check_reach(fleet, self.state_dir)
            except SettingError as exc:
                raise ControlError.row(
                    R.FLEET_INVALID,
                    {"problems": [p.details for p in exc.problems], "file": self.fleet.path},
                    problem=exc,
                ) from None
            await self._apply_center(fleet)
            if fleet.center.fleet == "center":
                outcome = await self._reload_from_center()
            else:
                outcome = await self._reconcile(fleet)
            await self._refence()
            return outcome

    async def _refence(self) -> None:
        """After a reload that moved `[center] token_file`, a fence planned with the old path
        (and reused by restarts) would leave the new file readable: every fenced agent whose
        plan differs now gets the new one, and a running one is restarted into it."""
        for agent_id, slot in list(self.slots.items()):
            if slot.sandbox is None:
                continue
            async with self.agent_held(agent_id):
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
                    await slot.runner.restart()

    async def _apply_center(self, fleet: Fleet) -> None:
        """Make `fleet.center` (and its token file's token) the one the next call of every
        session uses: no session is rebuilt, no agent restarted. Refused, changing nothing, when
        the token file cannot be read or `[center] fleet` (where the agents come from) changed."""
        import dataclasses

        from mcphost.binding import BindingError
        from mcphost.supervisor.centerlink import read_token

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
        assert self.link is not None
        changed = self.link.apply(center, token, stamp)
        old_runtime = self.fleet.center.runtime_socket
        self.fleet = dataclasses.replace(self.fleet, center=center)
        if (
            self.runtime is not None
            and center.runtime_socket
            and center.runtime_socket != old_runtime
        ):
            from mcphost.admin.client import AdminAccess
            from mcphost.admin.target import AdminTarget

            self.runtime.rebind(AdminAccess(AdminTarget(kind="unix", path=center.runtime_socket)))
            changed.append("runtime_socket")
        if changed:
            events.emit("supervisor.center_changed", changed=changed)
            if self.health is not None:
                self.health.poke()

    def _reload_in_background(self) -> None:
        async def reload() -> None:
            try:
                await self.reload()
            except ControlError as exc:
                reload_failed(exc, "sighup")

        self._spawn(reload())

    async def _reload_from_center(self, polled: bool = False) -> dict[str, Any]:
        from mcphost.errors import ToolFailure
        from mcphost.supervisor.centerfleet import fetch_fleet
        from mcphost.supervisor.plan import fleet_with_agents

        assert self.admin is not None
        try:
            assigned = await fetch_fleet(self.admin)
            fleet = fleet_with_agents(self.fleet, assigned.ids)
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
                problem=exc,
            ) from None
        for agent_id, generation in assigned.generations.items():
            self.generations.saw(agent_id, generation)
        return await self._reconcile(fleet, quiet=polled)

    async def _poll_center(self) -> None:
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

    # -- identity and sessions ------------------------------------------------------------
    def uid_of(self, agent_id: str) -> int | None:
        """The uid agent `agent_id` runs as; None when it is not in the fleet (identity.py)."""
        slot = self.slots.get(agent_id)
        return None if slot is None else slot.uid

    def _identifier(self, surface: str) -> Callable[[peer.PeerCred], Attached]:
        """The hub's `identify`: the kernel's word (`Identities.vouch`), then this surface's
        bounds (sessions per agent, relay tools only for an agent with a bundle)."""

        def identify(cred: peer.PeerCred) -> Attached:
            if self.stopping.is_set():
                raise Refused.row(R.STOPPING)
            agent_id, generation = self.identities.vouch(cred, self.uid_of)
            slot = self.slots[agent_id]  # vouch found it, and nothing awaited since
            if self.hubs[surface].count(agent_id) >= MAX_SESSIONS_PER_AGENT:
                raise Refused.row(R.TOO_MANY_SESSIONS, agent=agent_id, limit=MAX_SESSIONS_PER_AGENT)
            if surface == RELAY and slot.plan.bundle is None:
                raise Refused.row(R.NO_BUNDLE, agent=agent_id)
            return Attached(agent_id=agent_id, generation=generation)

        return identify

    def _surface_factory(self, surface: str) -> Callable[[Attached], Surface]:
        def build(attached: Attached) -> Surface:
            slot = self.slots[attached.agent_id]
            if surface == CENTER:
                return self._center_surface(slot, attached.generation)
            return self._relay_surface(slot, attached.generation)

        return build

    def _center_surface(self, slot: Slot, generation: int) -> Surface:
        """The center tools for one session; the file tools' root is a duplicate of the held
        workspace (never `agent_root` reopened by path: the agent owns that path)."""
        from mcphost.binding import AgentBinding, Secret
        from mcphost.host.server import HostSurface
        from mcphost.host.workspace import HeldRoot

        center = self.fleet.center
        binding = AgentBinding(
            agent_id=slot.plan.agent_id,
            target=center.admin_url,
            pins=center.pins,
            token=Secret(""),  # the shared client holds it (centerlink.py), never a session
            token_file=None,
            agent_root=slot.home.workspace,
            runtime_socket=center.runtime_socket,
            tier_tools=slot.plan.tier_tools,
            generation=generation,
        )
        agent_id = slot.plan.agent_id
        workspace = HeldRoot(binding, slot.workspace.dup())
        return HostSurface(
            binding,
            admin=self.admin,
            runtime=self.runtime,
            workspace=workspace,
            on_failure=lambda failure: self._center_failed(agent_id, generation, failure),
        )

    def _center_failed(self, agent_id: str, generation: int, failure: ToolFailure) -> None:
        """A call of `agent_id`'s session (of `generation`) failed: if the center fenced that
        generation and it is the agent's current one, show it and replace the agent."""
        from mcphost.errors import StaleGeneration
        from mcphost.supervisor.centerfleet import is_generation

        if not isinstance(failure, StaleGeneration):
            return
        current = failure.details.get("current_generation")
        if not is_generation(current):
            current = None  # a center that does not say: the next local generation is tried
        else:
            self.generations.saw(agent_id, current)
        slot = self.slots.get(agent_id)
        if slot is None or slot.runner.status().generation != generation:
            return  # gone, or a newer local spawn exists: its sessions are closed anyway
        if slot.fenced is not None and slot.fenced["generation"] == generation:
            return  # already being replaced
        slot.fenced = {
            "code": failure.code,
            "generation": generation,
            "center_generation": current,
            "at": time.time(),
        }
        events.emit(
            "supervisor.agent_fenced",
            level="warning",
            agent_id=agent_id,
            generation=generation,
            center_generation=current,
        )
        self._spawn(self._replace_fenced(slot, generation))

    async def _replace_fenced(self, slot: Slot, generation: int) -> None:
        """Restart a fenced agent with a generation above the center's (under the reload lock
        and the agent's lock, so neither a reconcile nor a ctl operation sees it half done);
        past `max_restarts` fences within `restart_window`, stop it instead (another host keeps
        taking it over)."""
        agent_id = slot.plan.agent_id
        async with self._reload_lock, self.agent_held(agent_id):
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

    def _relay_surface(self, slot: Slot, generation: int) -> Surface:
        """The relay tools for one session of `slot`'s agent. All sessions of one agent
        generation share one relay session (the relay allows one per principal; in process
        when we serve the relay, relayhost.py): opened with the first, closed with the last, or
        when the generation ends or the agent leaves (`_close_relay`)."""
        from mcphost.relaytools import layout as layout_mod
        from mcphost.relaytools.cli import make_stream
        from mcphost.relaytools.stream import SharedStream, StreamHandle

        open_stream = self.relay.tools_stream if self.relay is not None else make_stream
        from mcphost.relaytools.surface import RelayToolsSurface

        agent_id = slot.plan.agent_id
        layout = layout_mod.resolve(
            bundle_flag=slot.plan.bundle,
            session_flag=agent_id,
            env=self.relay.tools_env(self.env) if self.relay is not None else self.env,
            cwd=slot.home.workspace,
        )

        def handle(
            layout: layout_mod.Layout,
            on_events: Callable[[int], None],
            on_note: Callable[..., None],
        ) -> StreamHandle:
            current = self._relay_shares.get(agent_id)
            if current is None or current[0] != generation or current[1].closed:
                self._close_relay(agent_id, None)
                share = SharedStream(lambda events, note: open_stream(layout, events, note))
                current = self._relay_shares[agent_id] = (generation, share)
            return current[1].handle(on_events, on_note)

        return RelayToolsSurface(layout, handle)

    def _close_relay(self, agent_id: str, below: int | None) -> None:
        """Close the agent's shared relay connection of a generation below `below` (None: any)."""
        current = self._relay_shares.get(agent_id)
        if current is not None and (below is None or current[0] < below):
            del self._relay_shares[agent_id]
            self._spawn(current[1].aclose())


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


def run_supervisor(fleet: Fleet, state_dir: str) -> int:
    """Run the supervisor in a fresh event loop; its exit status."""
    return asyncio.run(Supervisor(fleet, state_dir).run())
