"""The supervisor: one process that runs a worker's fleet and serves every agent's MCP sessions.

Owns: `supervise`, which starts up (startup.py: the token, the state directory, the journal,
then the `Ground` the supervisor stands on) and runs a `Supervisor` built whole on it; and the
`Supervisor`: every part built in its constructor, none missing and none bound until `run()`,
and the run loop, in the order of start and shutdown: the link to the center (center/link.py:
the worker token read from the fleet's `token_file`, held only there and in one pooled, pinned
`AdminClient` shared by every session, whose target, pins and token a reload swaps for the next
call of every session; center/health.py: the center's health in `ctl status`), the control
socket (operations.py: what `mcphost ctl` asks), the two attach hubs (center tools, relay
tools: sessions.py, served as surfaces.py builds them), the relay host (relayhost.py: bundles in
tmux, `runner = "tmux"` agents, the relay socket), the signals (SIGHUP reloads), the operator's
listeners (`Listeners`: the metrics endpoint when `[metrics]` asks for one, the fleet page at the
`[page]` in force; metrics.py and page.py imported only then), and what follows an agent's
generations: a spawn registers its process as the agent's only root at that generation
(`Identities.spawned`) and ends the older generation's sessions and `ctl exec` commands, as its
exit does. The fleet in force, its slots, the agents' locks and every change of them are
reconciliation's (reconcile.py). Beside it: records.py (every process it runs, in the state
file, so a crash leaves none behind), reach.py (the attach points and each agent's fence, built
as the load-time checks plan them), identity.py (the identity roots and the one vouch rule).
Each part sees the supervisor through a protocol of what it reads, in its own module
(`Supervised` in reconcile.py, operations.py and surfaces.py; `Agents` in relayhost.py).

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
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from mcphost import events
from mcphost.mcpserve.budget import Budgets
from mcphost.supervisor import records, startup
from mcphost.supervisor.agents import reach
from mcphost.supervisor.agents.homes import LOGS
from mcphost.supervisor.agents.relayhost import RelayHost
from mcphost.supervisor.agents.runner import AgentRunner
from mcphost.supervisor.center.generations import Generations
from mcphost.supervisor.confine import kernel
from mcphost.supervisor.control.protocol import ControlError
from mcphost.supervisor.control.server import ControlServer
from mcphost.supervisor.identity import Identities
from mcphost.supervisor.operator import journal
from mcphost.supervisor.operator.journal import Journal
from mcphost.supervisor.operator.notify import Notifier
from mcphost.supervisor.operator.operations import Operations, reload_failed
from mcphost.supervisor.plan import Fleet, agent_uid, runs_apart
from mcphost.supervisor.reconcile import Reconciler, Slot
from mcphost.supervisor.serving.sessions import AGENT_HELD_BYTES, SessionHub
from mcphost.supervisor.serving.streamable import HttpHub
from mcphost.supervisor.serving.surfaces import CENTER, RELAY, Surfaces

if TYPE_CHECKING:
    from mcphost.supervisor.operator.metrics import Metrics, MetricsServer, RelayFigures
    from mcphost.supervisor.operator.page import FleetPage
    from mcphost.supervisor.values import Listen


async def supervise(fleet: Fleet, state_dir: str) -> int:
    """Start up (startup.py), then run the supervisor until it is stopped; the exit status (a
    refused start: its one line printed, and its status)."""
    state_dir = os.path.abspath(state_dir)
    started_at = time.time()
    notifier = Notifier.take(os.environ)  # before anything is spawned: no agent inherits it
    kernel.set_non_dumpable()  # before the token is read: no same-user process reads it
    kernel.set_child_subreaper()  # orphans of agents come back to us (reaped, fail closed)
    try:  # the token, then the state directory's lock, then its modes (startup.py)
        link = startup.open_link(fleet)
        lock_fd = startup.claim_state(state_dir, fleet)
    except startup.StartRefused as exc:
        print(exc.line, file=sys.stderr)  # the one line of a refused start
        return exc.status
    # the supervisor's own events, for `ctl logs --supervisor` too (journal.py)
    kept = journal.install(os.path.join(state_dir, LOGS))
    ground = await startup.open_ground(fleet, state_dir, link, lock_fd)
    return await Supervisor(
        fleet, state_dir, ground, kept, started_at=started_at, notifier=notifier
    ).run()


def run_supervisor(fleet: Fleet, state_dir: str) -> int:
    """`supervise` in a fresh event loop; its exit status."""
    return asyncio.run(supervise(fleet, state_dir))


class Supervisor:
    """Serve `fleet` from `state_dir` on what start-up opened (`ground`), its events kept by
    `journal`, until `stop()`: every part is built here, bound to nothing until `run()`
    (module doc)."""

    def __init__(
        self,
        fleet: Fleet,
        state_dir: str,
        ground: startup.Ground,
        journal: Journal,
        *,
        started_at: float,
        env: Mapping[str, str] | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.state_dir = os.path.abspath(state_dir)
        self.notifier = notifier or Notifier(None)  # systemd's Type=notify (notify.py)
        self.env = dict(os.environ if env is None else env)
        self.started_at = started_at
        self.stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()  # its own tasks (`spawn`)
        self._agent_uids: tuple[Fleet | None, frozenset[int]] = (None, frozenset())
        self.identities = Identities()  # the identity roots and the vouch rule (identity.py)
        self.generations = Generations()  # what the center said it has seen (center/generations.py)
        # what start-up opened (startup.py), each closed at shutdown
        self.center = ground.center  # the [center] in force, the token, the clients, the health
        self.store = ground.store
        self.records = ground.records  # every process we run, in the state file
        self.reaper = ground.reaper
        self.cgroups = ground.cgroups  # each agent's cgroup and limits (cgroups.py)
        self.journal = journal  # the supervisor's own events (journal.py)
        self._lock_fd = ground.lock_fd  # the state directory's lock (control.take_lock)
        # the fleet in force, its slots and the agents' locks (reconcile.py)
        self.reconciler = Reconciler(self, fleet)
        self.operations = Operations(self)  # what `mcphost ctl` asks (operations.py)
        # bundles in tmux, the relay wire (relayhost.py)
        self.relay = RelayHost(self.state_dir, self.env, self, watch=self.reaper.watch)
        self.listeners = Listeners(
            self.operations,
            self.relay,
            journal,
            metrics=fleet.metrics,
            started_at=started_at,
            agent_uids=self.agent_uids,
        )
        # what each session is served, and the relay connections they share (surfaces.py)
        self.surfaces = Surfaces(
            self,
            replace_fenced=self.reconciler.replace_fenced,
            on_center_call=self.listeners.on_center_call,
        )
        budgets = Budgets(AGENT_HELD_BYTES)  # one per agent, across both surfaces
        self.hubs = {
            name: SessionHub(
                self.path("run", f"{name}.sock"),
                identify=self.surfaces.identifier(name),
                surface_for=self.surfaces.factory(name),
                mode=self._socket_mode(),
                budgets=budgets,
            )
            for name in (CENTER, RELAY)
        }
        # MCP over HTTP (serving/streamable.py): bound by `attach_points` at the first agent that
        # asks for it (uvicorn and the SDK's HTTP transport load only then)
        self.http = HttpHub(
            identify=self.surfaces.identify_http,
            surface_for=self.surfaces.http_factory,
            serves=self.surfaces.serves_http,
            budgets=budgets,
        )
        self.control = ControlServer(
            self.path(reach.CONTROL), self.operations, locked=True, refuse_descendants=True
        )

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
        """Re-read the fleet file and apply it (`Reconciler.reload`, then `[page]` and
        `[metrics]`: `Listeners.reload`); `dry_run`: only say what applying it would do. Its
        `keys` name every changed key and what was (would be) done with it; a reload that
        applied is logged as `supervisor.reloaded` with them (SIGHUP's as ctl's)."""
        if not dry_run:
            self.notifier.reloading()
        try:
            outcome, wanted = await self.reconciler.reload(dry_run=dry_run)
            # applied: the fleet in force now (a reload that ran meanwhile may have replaced it)
            keys = await self.listeners.reload(wanted if dry_run else self.fleet, apply=not dry_run)
        finally:
            if not dry_run:  # failed or applied, the supervisor serves on
                self.notifier.ready(self.status_line())
        outcome["keys"] = outcome.get("keys", []) + keys
        if not dry_run:
            events.emit("supervisor.reloaded", keys=outcome["keys"])
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

    async def attach_points(self, fleet: Fleet) -> reach.AttachPoints:
        """What `fleet`'s agents' configs name: the pump and its sockets, and the HTTP listener,
        started here when the first agent asks for it (`mcp_transport = "http"`: the module
        that serves it, and uvicorn, load only then) and kept until shutdown."""
        attach = reach.attach_points(self.state_dir)
        if not self.http.started and any(a.mcp_transport == "http" for a in fleet.agents):
            await self.http.start()
        if not self.http.started:
            return attach
        return dataclasses.replace(attach, http_base=self.http.url(""))

    def path(self, *parts: str) -> str:
        return os.path.join(self.state_dir, *parts)

    # -- start and stop -------------------------------------------------------------------
    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT (or `stop()`); SIGHUP reloads. Returns the exit status:
        2 (the line printed, everything closed) when a listener cannot be served or the relay's
        configuration cannot be written."""
        loop = asyncio.get_running_loop()
        self.spawn(self.center.health.run())
        await self.control.start()
        if not await self.listeners.serve_metrics():
            await self._shutdown()
            return 2
        for hub in self.hubs.values():
            await hub.start()
        if not await self.listeners.start_page(self.fleet.page):
            await self._shutdown()
            return 2
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload_in_background)
        events.emit(  # the first line to read: where everything is
            "supervisor.started",
            fleet=self.fleet.path,
            state=self.state_dir,
            control=self.control.path,
            **self.listeners.addresses(),
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
        contained = self.cgroups.kind != "none"  # every agent's escapees in its group
        every = records.CONTAINED_SCAN_SECONDS if contained else records.ADOPTION_SCAN_SECONDS
        self.spawn(self.records.watch_adopted(self.reaper, every))
        self.spawn(self.operations.sample_usage_forever())  # the agents' memory peaks
        events.emit("supervisor.ready", agents=sorted(self.slots))
        self.notifier.ready(self.status_line())  # `systemctl start` returns now
        await self.stopping.wait()
        await self._shutdown()
        return 0

    def stop(self) -> None:
        self.stopping.set()

    def _socket_mode(self) -> int:
        """0600 while every agent runs as our uid; 0666 when some run as another user (the
        kernel-credential check is then the only gate, as it always is the real one)."""
        return 0o666 if any(runs_apart(a) for a in self.fleet.agents) else 0o600

    def status_line(self) -> str:
        """systemd's `STATUS=` (`systemctl status`, the StatusText property): the agents
        running, the page and the metrics addresses."""
        parts = [f"{len(self.slots)} agents", f"control {self.control.path}"]
        parts += [f"{name} {where}" for name, where in self.listeners.addresses().items()]
        return "; ".join(parts)

    async def _shutdown(self) -> None:
        self.notifier.stopping()  # systemd shows the unit deactivating from here
        events.emit("supervisor.stopping", agents=len(self.slots))
        for task in list(self._tasks):
            task.cancel()
        await self.control.aclose()
        await self.listeners.aclose()
        await asyncio.gather(*(slot.runner.aclose() for slot in self.slots.values()))
        await self.relay.aclose()
        for hub in self.hubs.values():
            await hub.aclose()
        await self.http.aclose()
        await self.surfaces.aclose()
        await self.reaper.kill_strays(max((a.stop_grace for a in self.fleet.agents), default=5))
        self.cgroups.close()
        await self.center.aclose()
        self.records.prune()
        self.store.close()
        os.close(self._lock_fd)  # the state directory's lock, released last
        events.emit("supervisor.stopped")
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


class Listeners:
    """The operator's own listeners, each there only while the fleet asks for it: the metrics
    endpoint of `[metrics]` and the fleet page of `[page]`, each at the address in force (a
    reload opens, moves or closes either: `reload`; the metrics' counters outlive a move).
    metrics.py and page.py are imported only then."""

    def __init__(
        self,
        operations: Operations,
        relay: RelayHost,
        journal: Journal,
        *,
        metrics: Listen | None,
        started_at: float,
        agent_uids: Callable[[], frozenset[int]],
    ) -> None:
        self._operations = operations
        self._relay = relay
        self._journal = journal
        self._started_at = started_at
        self._agent_uids = agent_uids
        self.page: FleetPage | None = None  # None: no `[page]` (or not open yet)
        self.metrics: MetricsServer | None = None  # None: no `[metrics]` (or none bound)
        self._figures: Metrics | None = None  # the counters, kept across moves of `[metrics]`
        self._moving = asyncio.Lock()  # one reload's moves at a time (SIGHUP beside ctl)
        if metrics is not None:  # built here, served by `serve_metrics`
            self.metrics = self._metrics_server(metrics)

    def on_center_call(self, agent_id: str, tool: str, outcome: str, seconds: float) -> None:
        """What every center call's end is told to (surfaces.py hands it to each center
        session): the metrics' counters, once `[metrics]` was asked for."""
        if self._figures is not None:
            self._figures.center_call(agent_id, tool, outcome, seconds)

    @property
    def metrics_config(self) -> Listen | None:
        """The `[metrics]` the open endpoint serves (None: none is open)."""
        return None if self.metrics is None else self.metrics.listen

    def _metrics_server(self, config: Listen) -> MetricsServer:
        """An endpoint at `config` (not bound) on the one set of counters; metrics.py is
        imported only then."""
        from mcphost.supervisor.operator.metrics import Metrics, MetricsServer

        if self._figures is None:
            self._figures = Metrics(self._operations.snapshot, self._relay_figures)
        return MetricsServer(self._figures, config, self._agent_uids)

    async def open_metrics(self, config: Listen | None) -> None:
        """The metrics endpoint at `config` (None: none), in place of the one open, with the
        counters kept. Raises `MetricsBindError`."""
        if self.metrics is not None:
            server, self.metrics = self.metrics, None
            await server.aclose()
        if config is None:
            return
        server = self._metrics_server(config)
        await server.start()
        self.metrics = server

    async def reload(self, fleet: Fleet, *, apply: bool) -> list[dict[str, Any]]:
        """Move, open or close the page and the metrics endpoint to `fleet`'s (`apply` False: a
        dry run, nothing is bound); each listener whose address differs from the one served,
        named as `Reconciler.reload` names a key (with `applied`, and the `problem` when its
        address could not be bound: nothing is served there then, and the next reload tries
        again)."""
        async with self._moving:
            return await self._move(fleet, apply)

    async def _move(self, fleet: Fleet, apply: bool) -> list[dict[str, Any]]:
        from mcphost.supervisor.fleet import reload_of

        found: list[dict[str, Any]] = []
        for name, served, opener in (
            ("page", self.page_config, self.open_page),
            ("metrics", self.metrics_config, self.open_metrics),
        ):
            wanted = getattr(fleet, name)
            if wanted == served:
                continue
            entry: dict[str, Any] = {"key": f"[{name}] listen", "reload": reload_of(name, "listen")}
            entry["listen"] = None if wanted is None else str(wanted)
            if apply:
                try:
                    await opener(wanted)
                    entry["applied"] = True
                except OSError as exc:  # a page's bind, or `MetricsBindError`
                    events.emit(f"supervisor.{name}_failed", level="error", error=str(exc))
                    entry |= {"applied": False, "problem": str(exc)}
            found.append(entry)
        return found

    @property
    def page_config(self) -> Listen | None:
        """The `[page]` the open page serves (None: none is open)."""
        return None if self.page is None else self.page.config

    def addresses(self) -> dict[str, str]:
        """Where the open listeners answer, for `supervisor.started`: `page` (its URL, or
        `unix:PATH`) and `metrics` (`http://ADDRESS/metrics`, or `unix:PATH`), each only when
        served."""
        out = {}
        if self.page is not None:
            out["page"] = self.page.url or str(self.page.config)  # no URL: a Unix socket
        if self.metrics is not None and self.metrics.server is not None:
            bound = self.metrics.server.bound
            if bound is not None:
                out["metrics"] = str(bound) if bound.path else f"http://{bound}/metrics"
        return out

    async def serve_metrics(self) -> bool:
        """Serve `[metrics]`, if set; False (the line printed) when its address cannot be
        served."""
        from mcphost.supervisor.operator.metrics import MetricsBindError

        if self.metrics is None:
            return True
        try:
            await self.metrics.start()
        except MetricsBindError as exc:
            print(f"mcphost supervise: {exc.line}", file=sys.stderr)
            return False
        return True

    def _relay_figures(self) -> RelayFigures | None:
        """The relay's deliveries by outcome and its queue now (None: no relay served)."""
        from mcphost.supervisor.operator.metrics import RelayFigures

        behaviour = self._relay.behaviour
        if behaviour is None:
            return None
        state = behaviour.state
        return RelayFigures(outcomes=state.outcome_counts, queued=state.queue_bounds.count)

    async def start_page(self, config: Listen | None) -> bool:
        """The page of the fleet the supervisor starts with; False (the line printed) when its
        address cannot be bound."""
        if config is None:
            return True
        try:  # at debug: `supervisor.started` names the page next
            await self.open_page(config, level="debug")
        except OSError as exc:
            print(f"mcphost supervise: [page] listen = {config}: {exc}", file=sys.stderr)
            return False
        return True

    async def open_page(self, config: Listen | None, level: str = "info") -> None:
        """The fleet page at `config` (None: none), in place of the one open, its
        `supervisor.page_listening` at `level`; page.py is imported only then. Raises `OSError`
        when the address cannot be bound."""
        if self.page is not None:
            page, self.page = self.page, None
            await page.aclose()
        if config is None:
            return
        from mcphost.supervisor.operator.page import FleetPage

        page = FleetPage(
            self._operations,
            config,
            started_at=self._started_at,
            journal=self._journal,
            agent_uids=self._agent_uids,
        )
        try:
            await page.start(level)
        except BaseException:
            await page.aclose()
            raise
        self.page = page

    async def aclose(self) -> None:
        """Close the page, then the metrics endpoint (at shutdown)."""
        await self.open_page(None)
        await self.open_metrics(None)
