"""The supervisor: one process that runs a worker's fleet and serves every agent's MCP sessions.

Owns: the run loop and the wiring of its parts, in the order of start-up and shutdown: the link
to the center (center/link.py: the worker token read from the fleet's `token_file`, held only
there and in one pooled, pinned `AdminClient` shared by every session, whose target, pins and
token a reload swaps for the next call of every session; center/health.py: the center's health
in `ctl status`), the two attach hubs (center tools, relay tools: sessions.py, served as
surfaces.py builds them), the control socket (operations.py: what `mcphost ctl` asks), the
relay host (relayhost.py: bundles in tmux, `runner = "tmux"` agents, the relay socket), the
signals (SIGHUP reloads), the metrics endpoint when `[metrics]` asks for one (metrics.py,
imported only then), and what follows an agent's generations: a spawn registers its
process as the agent's only root at that generation (`Identities.spawned`) and ends the older
generation's sessions and `ctl exec` commands, as its exit does. The fleet in force, its slots,
the agents' locks and every change of them are reconciliation's (reconcile.py). Beside it:
startup.py (the token and the state directory, before anything else), records.py (every
process it runs, in the state file, so a crash leaves none behind), reach.py (the attach points
and each agent's fence, built as the load-time checks plan them), identity.py (the identity
roots and the one vouch rule), and with `[page]` the read-only fleet page (page.py).

Identity: a pump is served as the agent the registry vouches for. Sessions of an older
generation are closed the moment a newer spawn registers (and when an agent exits), and the
center fences the older generation anyway (`stale_generation`).

Must never: start, stop or replace an agent itself (reconciliation and the ctl operations do,
under the agent's lock), hand the token, the token file's path or the admin URL to a child
(environment, argv, files under an agent's home), log the token, or take an agent's identity
from anything a process can choose (its environment, its arguments, its claims on the wire).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from mcphost import events
from mcphost.mcpserve.budget import Budgets
from mcphost.supervisor import startup
from mcphost.supervisor.agents import reach
from mcphost.supervisor.agents.homes import LOGS
from mcphost.supervisor.agents.relayhost import RelayHost
from mcphost.supervisor.agents.runner import AgentRunner
from mcphost.supervisor.center.generations import Generations
from mcphost.supervisor.confine import cgroups, kernel
from mcphost.supervisor.confine import fence as fences
from mcphost.supervisor.control.protocol import ControlError
from mcphost.supervisor.control.server import ControlServer
from mcphost.supervisor.identity import Identities
from mcphost.supervisor.operator import journal
from mcphost.supervisor.operator.operations import Operations, reload_failed
from mcphost.supervisor.plan import Fleet, agent_uid, runs_apart
from mcphost.supervisor.reconcile import Reconciler, Slot
from mcphost.supervisor.records import ProcessRecords
from mcphost.supervisor.serving.sessions import AGENT_HELD_BYTES, SessionHub
from mcphost.supervisor.serving.surfaces import CENTER, RELAY, Surfaces
from mcphost.supervisor.state import StateStore

if TYPE_CHECKING:
    from mcphost.admin.client import AdminClient
    from mcphost.errors import ToolFailure
    from mcphost.supervisor.center.health import CenterHealth
    from mcphost.supervisor.center.link import CenterLink
    from mcphost.supervisor.confine.cgroups import Cgroups
    from mcphost.supervisor.operator.metrics import MetricsServer, RelayFigures
    from mcphost.supervisor.operator.page import FleetPage
    from mcphost.supervisor.values import Listen

# Exchanges one agent may have in flight on the shared admin (and runtime) client, of its 64:
# the rest of its calls wait their turn, round-robin with other agents' (mcphost.admin.slots).
CENTER_CALLS_PER_AGENT = 16


class Supervisor:
    """Run `fleet` with state under `state_dir` until `stop()`; see the module docstring."""

    def __init__(self, fleet: Fleet, state_dir: str, *, env: dict[str, str] | None = None):
        self.state_dir = os.path.abspath(state_dir)
        self.env = dict(os.environ if env is None else env)
        self.identities = Identities()  # the identity roots and the vouch rule (identity.py)
        self.generations = Generations()  # what the center said it has seen (center/generations.py)
        self.stopping = asyncio.Event()
        self.started_at = time.time()
        # the fleet in force, its slots and the agents' locks (reconcile.py)
        self.reconciler = Reconciler(self, fleet)
        # what each session is served, and the relay connections they share (surfaces.py)
        self.surfaces = Surfaces(self, replace_fenced=self.reconciler.replace_fenced)
        self.operations = Operations(self)  # what `mcphost ctl` asks (operations.py)
        self.link: CenterLink | None = None  # the [center] in force and the token
        self.health: CenterHealth | None = None
        self.admin: AdminClient | None = None
        self.runtime: AdminClient | None = None
        self.hubs: dict[str, SessionHub] = {}
        self.control: ControlServer | None = None
        self.store: StateStore | None = None
        self.reaper: kernel.Reaper | None = None
        self.records: ProcessRecords | None = None  # every process we run, in the state file
        self.relay: RelayHost | None = None  # bundles in tmux, the relay wire (relayhost.py)
        self.cgroups: Cgroups | None = None  # each agent's cgroup and limits (cgroups.py)
        self.page: FleetPage | None = None  # the read-only fleet page, with `[page]` (page.py)
        # `[metrics]` (metrics.py, imported only then): the endpoint, and every center call's
        # end told to it (surfaces.py hands this to each center session; None: nobody listens)
        self.metrics: MetricsServer | None = None
        self.on_center_call: Callable[[str, str, str, float], None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._lock_fd: int | None = None  # the state directory's lock (control.take_lock)
        self._agent_uids: tuple[Fleet | None, frozenset[int]] = (None, frozenset())
        self.journal: journal.Journal | None = None  # the supervisor's own events (journal.py)

    # -- what reconciliation holds, as the operations, the relay and the surfaces read it ---
    @property
    def fleet(self) -> Fleet:
        return self.reconciler.fleet

    @property
    def slots(self) -> Mapping[str, Slot]:
        return self.reconciler.slots

    @property
    def unstarted(self) -> Mapping[str, str]:
        return self.reconciler.unstarted

    def agent_held(self, *agent_ids: str) -> contextlib.AbstractAsyncContextManager[None]:
        """The agents' locks, for the relay's up / down (relayhost.py) as for ctl."""
        return self.reconciler.locks.held(agent_ids)

    async def reload(self, dry_run: bool = False) -> dict[str, Any]:
        """Re-read the fleet file and apply it (`Reconciler.reload`, `[page]` included;
        `dry_run`: only say what applying it would do)."""
        outcome = await self.reconciler.reload(dry_run=dry_run)
        if dry_run:
            return outcome
        if self.page is None or self.fleet.page != self.page.config:
            try:
                await self._open_page(self.fleet.page)
            except OSError as exc:
                events.emit("supervisor.page_failed", level="error", error=str(exc))
        return outcome

    def agent_uids(self) -> frozenset[int]:
        """The agents' own uids (those not the supervisor's): the page and `/metrics` close
        every connection one of them owns (loopback.py). Looked up once per fleet in force."""
        fleet = self.fleet
        if self._agent_uids[0] is not fleet:
            uids = set()
            for agent in fleet.agents:  # its own uid (uids.py), or its `user`'s
                with contextlib.suppress(KeyError):  # a user gone since the load runs nothing
                    uids.add(agent_uid(agent))
            self._agent_uids = (fleet, frozenset(uids - {os.geteuid()}))
        return self._agent_uids[1]

    def path(self, *parts: str) -> str:
        return os.path.join(self.state_dir, *parts)

    # -- start and stop -------------------------------------------------------------------
    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT (or `stop()`); SIGHUP reloads. Returns the exit status."""
        kernel.set_non_dumpable()  # before the token is read: no same-user process reads it
        kernel.set_child_subreaper()  # orphans of agents come back to us (reaped, fail closed)
        try:  # the token, then the state directory's lock, then its modes (startup.py)
            self.link = startup.open_link(self.fleet)
            self._lock_fd = startup.claim_state(self.state_dir, self.fleet)
        except startup.StartRefused as exc:
            print(exc.line, file=sys.stderr)  # the one line of a refused start
            return exc.status
        # the supervisor's own events, for `ctl logs --supervisor` too (journal.py)
        self.journal = journal.install(self.path(LOGS))
        startup.raise_descriptor_limit()  # soft RLIMIT_NOFILE to its hard limit, logged
        loop = asyncio.get_running_loop()
        events.bound_accept_errors(loop)  # asyncio's EMFILE tracebacks: one line per 10 s
        fences.probe()  # forks and waits for its own child: before the Reaper owns waitpid
        self.store = StateStore(self.path("state.sqlite3"))
        lost = self.store.record_lost_runs()  # before any runner reads its agent's last exit
        if lost:
            events.emit(
                "supervisor.lost_runs_recorded",
                level="warning",
                agents={record.agent_id: record.generation for record in lost},
            )
        self.records = ProcessRecords(self.store)
        self.reaper = kernel.Reaper()
        self.reaper.install(loop)
        # what a crashed supervisor left running, before any spawn
        await self.records.end_leftovers(
            max((plan.stop_grace for plan in self.fleet.agents), default=10.0)
        )
        # each agent in a cgroup of its own (and what a crashed supervisor left there ended)
        self.cgroups = cgroups.open_cgroups(self.state_dir)
        self.relay = RelayHost(self.state_dir, self.env, self, watch=self.reaper.watch)
        self._open_admin()
        self.control = ControlServer(
            self.path(reach.CONTROL), self.operations, locked=True, refuse_descendants=True
        )
        await self.control.start()
        if self.fleet.metrics is not None and not await self._serve_metrics():
            await self._shutdown()
            return 2
        budgets = Budgets(AGENT_HELD_BYTES)  # one per agent, across both surfaces
        for name in (CENTER, RELAY):
            self.hubs[name] = SessionHub(
                self.path("run", f"{name}.sock"),
                identify=self.surfaces.identifier(name),
                surface_for=self.surfaces.factory(name),
                mode=self._socket_mode(),
                budgets=budgets,
            )
            await self.hubs[name].start()
        try:
            await self._open_page(self.fleet.page)
        except OSError as exc:
            assert self.fleet.page is not None
            print(
                f"mcphost supervise: [page] listen = {self.fleet.page}: {exc}",
                file=sys.stderr,
            )
            await self._shutdown()
            return 2
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
            await self.reconciler.start()
        except ControlError as exc:  # the relay's configuration could not be written
            print(f"mcphost supervise: {exc.message}", file=sys.stderr)
            await self._shutdown()
            return 2
        if self.fleet.center.fleet == "center":
            self.spawn(self.reconciler.poll_center())
        self.spawn(self.records.watch_adopted())
        self.spawn(self.operations.sample_usage_forever())  # the agents' memory peaks
        events.emit("supervisor.ready", agents=sorted(self.slots))
        await self.stopping.wait()
        await self._shutdown()
        return 0

    def stop(self) -> None:
        self.stopping.set()

    async def _serve_metrics(self) -> bool:
        """Serve `[metrics]` (read at start: a reload keeps the endpoint it found); False (the
        line printed) when its address cannot be served."""
        from mcphost.supervisor.operator.metrics import Metrics, MetricsBindError, MetricsServer

        listen = self.fleet.metrics
        assert listen is not None
        metrics = Metrics(self.operations.snapshot, self._relay_figures)
        server = MetricsServer(metrics, listen, self.agent_uids)
        try:
            await server.start()
        except MetricsBindError as exc:
            print(f"mcphost supervise: {exc.line}", file=sys.stderr)
            return False
        self.metrics, self.on_center_call = server, metrics.center_call
        return True

    def _relay_figures(self) -> RelayFigures | None:
        """The relay's deliveries by outcome and its queue now (None: no relay served)."""
        from mcphost.supervisor.operator.metrics import RelayFigures

        behaviour = self.relay.behaviour if self.relay is not None else None
        if behaviour is None:
            return None
        state = behaviour.state
        return RelayFigures(outcomes=state.outcome_counts, queued=state.queue_bounds.count)

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _socket_mode(self) -> int:
        """0600 while every agent runs as our uid; 0666 when some run as another user (the
        kernel-credential check is then the only gate, as it always is the real one)."""
        return 0o666 if any(runs_apart(a) for a in self.fleet.agents) else 0o600

    async def _open_page(self, config: Listen | None) -> None:
        """The fleet page at `config` (None: none), in place of the one open; page.py is
        imported only then. Raises `OSError` when the address cannot be bound."""
        if self.page is not None:
            page, self.page = self.page, None
            await page.aclose()
        if config is None:
            return
        from mcphost.supervisor.operator.page import FleetPage

        assert self.journal is not None  # installed first thing in `run`
        page = FleetPage(
            self.operations,
            config,
            started_at=self.started_at,
            journal=self.journal,
            agent_uids=self.agent_uids,
        )
        try:
            await page.start()
        except BaseException:
            await page.aclose()
            raise
        self.page = page

    def _open_admin(self) -> None:
        from mcphost.admin.client import AdminClient
        from mcphost.admin.target import AdminTarget
        from mcphost.host.server import call_timeout_from_env
        from mcphost.supervisor.center.health import CenterHealth

        center = self.fleet.center
        assert self.link is not None
        self.admin = self.link.client(
            call_timeout=call_timeout_from_env(),
            on_failure=self._center_failure,
            per_lane=CENTER_CALLS_PER_AGENT,
        )
        self.health = CenterHealth(self.admin)
        self.spawn(self.health.run())
        if center.runtime_socket:
            self.runtime = AdminClient(
                AdminTarget(kind="unix", path=center.runtime_socket),
                per_lane=CENTER_CALLS_PER_AGENT,
            )

    def _center_failure(self, failure: ToolFailure) -> ToolFailure:
        """Every failure of the shared client: named in fleet keys (what an operator of the
        supervisor can change), and a probe of the center when it says something about it."""
        from mcphost.supervisor.center.health import worth_a_probe
        from mcphost.supervisor.center.link import for_operator

        if self.health is not None and worth_a_probe(failure):
            self.health.poke()
        return for_operator(failure)

    async def _shutdown(self) -> None:
        events.emit("supervisor.stopping", agents=len(self.slots))
        for task in list(self._tasks):
            task.cancel()
        if self.control is not None:
            await self.control.aclose()
        await self._open_page(None)
        if self.metrics is not None:
            await self.metrics.aclose()
        await asyncio.gather(*(slot.runner.aclose() for slot in self.slots.values()))
        if self.relay is not None:
            await self.relay.aclose()
        for hub in self.hubs.values():
            await hub.aclose()
        await self.surfaces.aclose()
        if self.reaper is not None:
            await self.reaper.kill_strays(max((a.stop_grace for a in self.fleet.agents), default=5))
        if self.cgroups is not None:
            self.cgroups.close()
        for client in (self.admin, self.runtime):
            if client is not None:
                await client.aclose()
        if self.store is not None:
            if self.records is not None:
                self.records.prune()
            self.store.close()
        self._release_lock()
        events.emit("supervisor.stopped")
        if self.journal is not None:
            self.journal.close()

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run `coro` as a task of the supervisor's own (cancelled at shutdown)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _reload_in_background(self) -> None:
        async def reload() -> None:
            try:
                await self.reload()
            except ControlError as exc:
                reload_failed(exc, "sighup")

        self.spawn(reload())

    # -- an agent's generations -----------------------------------------------------------
    def spawned(self, runner: AgentRunner, pid: int, starttime: int, generation: int) -> None:
        """A runner's new process: the agent's only identity root, at `generation`; whatever
        an older generation holds (sessions, `ctl exec` commands) ends."""
        slot = self.slots.get(runner.plan.agent_id)
        if slot is None or slot.runner is not runner:
            # Never happens (a runner leaves its slot only closed, and a closed runner never
            # spawns); if it did, raising makes the runner kill the unregistered process.
            raise RuntimeError(f"a runner of {runner.plan.agent_id} outside the fleet spawned")
        self.identities.spawned(runner.plan.agent_id, (pid, starttime), generation)
        self.operations.end_execs(runner.plan.agent_id, below=generation)
        self.surfaces.close_older(runner.plan.agent_id, generation)
        if self.records is not None:
            self.records.started(pid, starttime, runner.plan.agent_id, "agent")

    def exited(self, runner: AgentRunner, generation: int) -> None:
        """A runner's process exited: its generation's roots, sessions and commands end."""
        slot = self.slots.get(runner.plan.agent_id)
        if slot is None or slot.runner is not runner:
            return
        self.identities.ended(runner.plan.agent_id, generation)
        self.operations.end_execs(runner.plan.agent_id, below=generation + 1)
        self.surfaces.close_older(runner.plan.agent_id, generation + 1)

    def left(self, agent_id: str) -> None:
        """The agent left the fleet (or its slot was replaced): nothing of it is served."""
        self.identities.forget(agent_id)
        self.operations.end_execs(agent_id, below=None)
        self.surfaces.forget(agent_id)


def run_supervisor(fleet: Fleet, state_dir: str) -> int:
    """Run the supervisor in a fresh event loop; its exit status."""
    return asyncio.run(Supervisor(fleet, state_dir).run())
