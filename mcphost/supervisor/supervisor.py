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
runner the reload discarded and started a hidden second agent), the identity roots
(`(pid, starttime)` of every agent process it spawned, with the generation of that spawn), the
two attach hubs (center tools, relay tools), the control socket, the relay host (relayhost.py:
bundles in tmux, `runner = "tmux"` agents, the relay socket), the one relay connection each
agent generation's relay tools sessions share (the relay allows one per principal), and the
order of start-up and shutdown.

Start-up, in this order: non-dumpable and child subreaper; the token (a bad token file: exit 2,
one line); the state directory's lock (`control.take_lock` on `<state>/control.sock.lock`,
creating `<state>` 0700 if it is missing and touching nothing else: another supervisor holding
it is exit `EXIT_STATE_IN_USE`, one line naming the directory and its pid); only then the modes
of `<state>`, `run/`, `agents/`, the state file; then the processes a crashed supervisor left
(recorded in the state file, `kernel.end_leftovers`) are ended, before anything is spawned.
Every process started (agents, `ctl exec`) or adopted (escapees reparented to us, looked for
every `ADOPTION_SCAN_SECONDS`) is recorded there while it runs.

Identity: a pump is served as agent A only if the kernel says the connecting process descends
from A's current process (`peer.find_root` over `SO_PEERCRED`'s pid, stopping at this process:
we are the child subreaper, so an escaped or orphaned process's ancestry ends here and fails
closed), its uid is the agent's, and it is still the same process after the walk (pidfd or
start time). The generation is the one of the spawn the ancestry reached; sessions of an older
generation are closed the moment a newer spawn registers (and when an agent exits), and the
center fences the older generation anyway (`stale_generation`).

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
import sqlite3
import stat
import sys
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcphost import events, peer
from mcphost.mcpserve.budget import Budgets
from mcphost.settings import SettingError
from mcphost.supervisor import fence as fences
from mcphost.supervisor import kernel
from mcphost.supervisor.control import ControlError, ControlInUse, ControlServer, take_lock
from mcphost.supervisor.execs import Execution
from mcphost.supervisor.fence import Fence
from mcphost.supervisor.fleet import AgentPlan, Fleet, check_sandbox, check_users, load_fleet
from mcphost.supervisor.homes import (
    AttachPoints,
    HeldWorkspace,
    Home,
    HomeError,
    agent_argv,
    agent_env,
    hold_home,
)
from mcphost.supervisor.lifecycle import AgentRunner, AgentState, Intensity
from mcphost.supervisor.relayhost import RelayHost
from mcphost.supervisor.sessions import AGENT_HELD_BYTES, Attached, Refused, SessionHub
from mcphost.supervisor.state import ProcessRecord, StateStore

if TYPE_CHECKING:
    from mcphost.admin.client import AdminClient
    from mcphost.errors import ToolFailure
    from mcphost.relaytools.stream import SharedStream
    from mcphost.supervisor.centerhealth import CenterHealth
    from mcphost.supervisor.centerlink import CenterLink
    from mcphost.surface import Surface

CENTER, RELAY = "center", "relay"
# After the center could not be reached for a generation, spawns use the local counter (and the
# center's last word) without asking again for this long: a hung center must not hold a fleet.
RESERVE_PAUSE = 30.0
# `mcphost supervise`'s exit status when another supervisor holds the state directory's lock.
EXIT_STATE_IN_USE = 3
# Sessions one agent may hold open per surface: a real client opens one or two; the cap keeps a
# runaway agent from holding the supervisor's memory (each session is bounded on its own).
MAX_SESSIONS_PER_AGENT = 32
# How often the supervisor looks for children it did not spawn (escapees reparented to it) to
# record them: a crash within this long after an escape leaves that escapee unrecorded.
ADOPTION_SCAN_SECONDS = 1.0
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
    roots: set[tuple[int, int]] = field(default_factory=set)
    fenced: dict[str, Any] | None = None  # the last fence the center put on it (status rows)
    fences: Intensity | None = None  # replacements of fenced generations, bounded like restarts
    sandbox: Fence | None = None  # the agent's fence (fence.py); None: `sandbox = "none"`


def attach_script() -> str:
    """The pump's path inside the installed package (a plain `pip install` puts it there)."""
    return str(Path(__file__).resolve().parent.parent / "attach.py")


def uid_of(user: str | None) -> int:
    if user is None:
        return os.getuid()
    import pwd

    return pwd.getpwnam(user).pw_uid


class Supervisor:
    """Run `fleet` with state under `state_dir` until `stop()`; see the module docstring."""

    def __init__(self, fleet: Fleet, state_dir: str, *, env: dict[str, str] | None = None):
        self.fleet = fleet
        self.state_dir = os.path.abspath(state_dir)
        self.env = dict(os.environ if env is None else env)
        self.slots: dict[str, Slot] = {}
        self.unstarted: dict[str, str] = {}  # agent -> why its home could not be prepared
        self.roots: dict[tuple[int, int], tuple[str, int]] = {}
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
        self.control: Any = None
        self.store: StateStore | None = None
        self.reaper: kernel.Reaper | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.execs: dict[int, Execution] = {}  # `ctl exec` commands by pid
        self.relay: RelayHost | None = None  # bundles in tmux, the relay wire (relayhost.py)
        # per agent: (generation, the relay connection its relay tools sessions share)
        self._relay_shares: dict[str, tuple[int, SharedStream]] = {}
        # the highest generation the center said it has seen, per agent (its list, its 409s)
        self.center_generations: dict[str, int] = {}
        self._reserve_paused_until = 0.0  # loop time: the center was unreachable, don't wait
        self._lock_fd: int | None = None  # the state directory's lock (control.take_lock)
        self._recorded: set[tuple[int, int]] = set()  # (pid, starttime) in the state file

    # -- paths ----------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return os.path.join(self.state_dir, *parts)

    def attach_points(self) -> AttachPoints:
        return AttachPoints(
            interpreter=sys.executable,
            script=attach_script(),
            center_socket=self.path("run", "center.sock"),
            relay_socket=self.path("run", "relay.sock"),
        )

    # -- start and stop -------------------------------------------------------------------
    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT (or `stop()`); SIGHUP reloads. Returns the exit status."""
        kernel.set_non_dumpable()  # before the token is read: no same-user process reads it
        kernel.set_child_subreaper()  # orphans of agents come back to us (reaped, fail closed)
        from mcphost.binding import BindingError
        from mcphost.supervisor.centerlink import CenterLink, read_token

        try:
            self.link = CenterLink(self.fleet.center, *read_token(self.fleet.center.token_file))
        except BindingError as exc:  # one line, like every start-up refusal (cli.py)
            print(
                f"mcphost supervise: {self.fleet.path}: center.token_file {exc.problem}: "
                f"expected {exc.expected}",
                file=sys.stderr,
            )
            return 2
        try:
            # The lock before anything else under <state>: a second supervisor must change
            # nothing (modes, files, processes) of the one that runs there.
            self._own_dir(self.state_dir)
            self._lock_fd = take_lock(self.path("control.sock"))
            self._prepare_state_dir()
        except (SettingError, ControlInUse) as exc:
            in_use = isinstance(exc, ControlInUse)
            problem = exc.message if isinstance(exc, ControlInUse) else str(exc)
            print(
                f"mcphost supervise: {self.state_dir}: {problem}"
                + (" (control_in_use)" if in_use else ""),
                file=sys.stderr,
            )
            self._release_lock()
            return EXIT_STATE_IN_USE if in_use else 2
        loop = asyncio.get_running_loop()
        fences.probe()  # forks and waits for its own child: before the Reaper owns waitpid
        self.store = StateStore(self.path("state.sqlite3"))
        self.reaper = kernel.Reaper()
        self.reaper.install(loop)
        await self._end_leftovers()  # what a crashed supervisor left running, before any spawn
        self.relay = RelayHost(self.state_dir, self.env, self, watch=self.reaper.watch)
        self._open_admin()
        self.control = ControlServer(
            self.path("control.sock"), Control(self), locked=True, refuse_descendants=True
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
        self._spawn(self._watch_adopted())
        events.emit("supervisor.ready", agents=sorted(self.slots))
        await self.stopping.wait()
        await self._shutdown()
        return 0

    def stop(self) -> None:
        self.stopping.set()

    @staticmethod
    def _own_dir(directory: str) -> None:
        """Create `directory` (0700) if missing; refuse it unless it is a directory of ours."""
        os.makedirs(directory, mode=0o700, exist_ok=True)
        info = os.lstat(directory)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise SettingError(
                directory,
                None,
                "a directory owned by the supervisor's user",
                problem="is a symlink, not a directory, or someone else's",
            )

    def _prepare_state_dir(self) -> None:
        """`<state>`, `run/` and `agents/`: ours, not symlinks, 0700 (0711 where agents running
        as another user must pass through to reach their home and the attach sockets). Only
        once the state lock is held: the modes are the running supervisor's to set."""
        shared = any(plan.user for plan in self.fleet.agents)
        for directory in (self.state_dir, self.path("run"), self.path("agents")):
            self._own_dir(directory)
            os.chmod(directory, 0o711 if shared else 0o700)

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- what a crashed supervisor left running (kernel.end_leftovers) ----------------------
    async def _end_leftovers(self) -> None:
        """End every recorded process still running (SIGTERM, SIGKILL after the fleet's longest
        `stop_grace`): a supervisor that was killed could not stop its agents, their escapees or
        what ignored the parent-death signal."""
        assert self.store is not None
        records = self.store.processes()
        if records:
            grace = max((plan.stop_grace for plan in self.fleet.agents), default=10.0)
            ended = await kernel.end_leftovers(records, grace)
            if ended:
                events.emit("supervisor.leftovers_ended", level="warning", pids=ended)
            self._prune_records()
        self._recorded = {(r.pid, r.starttime) for r in self.store.processes()}

    def _record(self, stat: peer.ProcStat, agent_id: str | None, kind: str) -> None:
        """Remember a process we started or adopted (committed), for `_end_leftovers`."""
        if self.store is None or (stat.pid, stat.starttime) in self._recorded:
            return
        record = ProcessRecord(stat.pid, stat.starttime, stat.pgrp, stat.session, agent_id, kind)
        try:
            self.store.record_process(record)
        except sqlite3.Error as exc:  # the process runs anyway; a crash would leave it behind
            events.emit("supervisor.record_failed", level="error", pid=stat.pid, error=str(exc))
            return
        self._recorded.add((stat.pid, stat.starttime))

    def _record_started(self, pid: int, starttime: int, agent_id: str, kind: str) -> None:
        stat = peer.read_stat(pid)
        if stat is not None and stat.starttime == starttime:
            self._record(stat, agent_id, kind)
            self._prune_records()

    def _prune_records(self) -> None:
        """Forget the recorded processes that are gone with their whole process group."""
        assert self.store is not None
        try:
            gone = [
                (r.pid, r.starttime) for r in self.store.processes() if not kernel.still_running(r)
            ]
            self.store.forget_processes(gone)
        except sqlite3.Error as exc:
            events.emit("supervisor.record_failed", level="error", error=str(exc))
            return
        self._recorded.difference_update(gone)

    async def _watch_adopted(self) -> None:
        """Record every child we did not spawn (an escapee reparented to us, the subreaper)."""
        own_session = os.getsid(0)
        while True:
            await asyncio.sleep(ADOPTION_SCAN_SECONDS)
            adopted = False
            try:
                children = kernel.own_children()
            except OSError as exc:  # /proc unreadable for a moment: look again next time
                events.emit("supervisor.adoption_scan_failed", level="warning", error=str(exc))
                continue
            for pid in children:
                stat = peer.read_stat(pid)
                # Our own session: a helper we run (the tmux CLI); agents and what escaped
                # them are always in another session.
                if stat is None or stat.session == own_session:
                    continue
                if (stat.pid, stat.starttime) not in self._recorded:
                    self._record(stat, None, "adopted")
                    events.emit("supervisor.process_adopted", pid=pid, session=stat.session)
                    adopted = True
            if adopted:
                self._prune_records()

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
            self._prune_records()
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
        # Homes next, in threads (each config write is fsynced twice), so the loop only forks.
        starting = changed + added
        attach = self.attach_points()
        homes = await asyncio.gather(
            *(
                asyncio.to_thread(hold_home, self.state_dir, wanted[agent_id], attach)
                for agent_id in starting
            ),
            return_exceptions=True,
        )
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
            raise ControlError(
                "reload_failed",
                f"the relay's configuration could not be written, so the fleet was not applied "
                f"(nothing was stopped): {problem}; fix {self.relay.config}, then reload (or start "
                "the supervisor again)",
                {"file": fleet.path, "directory": str(self.relay.config), "problem": problem},
            ) from None

    def _slot(self, plan: AgentPlan, home: Home, workspace: HeldWorkspace) -> Slot:
        assert self.store is not None and self.reaper is not None

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
            )
        runner.reserve = self._reserve_generation
        runner.fence = sandbox = self._fence(plan, home)
        return Slot(
            plan=plan,
            home=home,
            runner=runner,
            uid=uid_of(plan.user),
            workspace=workspace,
            sandbox=sandbox,
        )

    def _fence(self, plan: AgentPlan, home: Home) -> Fence | None:
        """The agent's fence (fence.py): its home and attach sockets visible, the state, the
        token and fleet files and the user's runtime directory hidden; None with
        `sandbox = "none"`. `check_sandbox` refused "auto" at load where it cannot be built."""
        if plan.sandbox == "none":
            return None
        attach = self.attach_points()
        env = dict(plan.env)
        runtime = f"/run/user/{uid_of(plan.user)}"
        plan_ = fences.plan(
            state_dir=self.state_dir,
            home=home.root,
            sockets=tuple(s for s in (attach.center_socket, attach.relay_socket) if s),
            secrets=(self.fleet.center.token_file, self.fleet.path),
            given=tuple(env[k] for k in ("HOME", "CLAUDE_CONFIG_DIR") if k in env),
            hidden=(runtime,) if os.path.isdir(runtime) else (),
        )
        return Fence(plan_, fences.probe().landlock_abi)

    async def _reserve_generation(self, agent_id: str, local: int) -> int:
        """The generation of the agent's next spawn: the center's reservation (above every
        generation it has seen), else at least one above what it last said it has seen."""
        from mcphost.errors import AdminUnavailable, ToolFailure
        from mcphost.supervisor.centerfleet import reserve_generation

        at_least = max(local, self.center_generations.get(agent_id, 0) + 1)
        loop = asyncio.get_running_loop()
        if self.admin is None or loop.time() < self._reserve_paused_until:
            return at_least
        try:
            generation = await reserve_generation(self.admin, agent_id, at_least)
        except ToolFailure as exc:
            if isinstance(exc, AdminUnavailable) or exc.code == "admin_timeout":
                self._reserve_paused_until = loop.time() + RESERVE_PAUSE
            events.emit(
                "supervisor.generation_unreserved",
                level="info",
                agent_id=agent_id,
                generation=at_least,
                code=exc.code,
                status=exc.status,
            )
            return at_least
        self.center_generations[agent_id] = max(
            generation, self.center_generations.get(agent_id, 0)
        )
        return generation

    def _forget(self, slot: Slot) -> None:
        for root in slot.roots:
            self.roots.pop(root, None)
        slot.roots.clear()
        agent_id = slot.plan.agent_id
        self._end_execs(agent_id, below=None)
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
        for root in slot.roots:
            self.roots.pop(root, None)
        slot.roots = {(pid, starttime)}
        self.roots[(pid, starttime)] = (runner.plan.agent_id, generation)
        self._end_execs(runner.plan.agent_id, below=generation)
        self._close_older(runner.plan.agent_id, generation)
        self._record_started(pid, starttime, runner.plan.agent_id, "agent")

    def _on_exit(self, runner: AgentRunner, generation: int) -> None:
        slot = self.slots.get(runner.plan.agent_id)
        if slot is None or slot.runner is not runner:
            return
        for root in [r for r in slot.roots if self.roots.get(r, ("", -1))[1] == generation]:
            self.roots.pop(root, None)
            slot.roots.discard(root)
        self._end_execs(runner.plan.agent_id, below=generation + 1)
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
            except SettingError as exc:
                raise ControlError(
                    "reload_failed",
                    f"the fleet file was not applied: {exc}",
                    {"problems": [p.details() for p in exc.problems], "file": self.fleet.path},
                ) from None
            await self._apply_center(fleet)
            if fleet.center.fleet == "center":
                return await self._reload_from_center()
            return await self._reconcile(fleet)

    async def _apply_center(self, fleet: Fleet) -> None:
        """Make `fleet.center` (and its token file's token) the one the next call of every
        session uses: no session is rebuilt, no agent restarted. Refused, changing nothing, when
        the token file cannot be read or `[center] fleet` (where the agents come from) changed."""
        import dataclasses

        from mcphost.binding import BindingError
        from mcphost.supervisor.centerlink import read_token

        center = fleet.center
        if center.fleet != self.fleet.center.fleet:
            raise ControlError(
                "reload_failed",
                "[center] fleet changed (where the agents come from); it takes effect only when "
                "the supervisor restarts (nothing was applied)",
                {"file": fleet.path, "key": "[center] fleet"},
            )
        try:
            token, stamp = await asyncio.to_thread(read_token, center.token_file)
        except BindingError as exc:
            raise ControlError(
                "reload_failed",
                f"[center] token_file {center.token_file} {exc.problem}: expected "
                f"{exc.expected} (nothing was applied)",
                {"file": fleet.path, "key": "[center] token_file"},
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
        from mcphost.supervisor.fleet import fleet_with_agents

        assert self.admin is not None
        try:
            assigned = await fetch_fleet(self.admin)
            fleet = fleet_with_agents(self.fleet, assigned.ids)
        except ToolFailure as exc:
            raise ControlError(
                "reload_failed",
                f"the center's agent list could not be read ({exc.code}): {exc.message}",
                {"center_code": exc.code},
            ) from None
        except SettingError as exc:
            raise ControlError(
                "reload_failed",
                f"the center's agent list was not applied: {exc}",
                {"problems": [p.details() for p in exc.problems]},
            ) from None
        for agent_id, generation in assigned.generations.items():
            self._center_saw(agent_id, generation)
        return await self._reconcile(fleet, quiet=polled)

    def _center_saw(self, agent_id: str, generation: int) -> None:
        if generation > self.center_generations.get(agent_id, 0):
            self.center_generations[agent_id] = generation

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
    def _identifier(self, surface: str) -> Callable[[peer.PeerCred], Attached]:
        def identify(cred: peer.PeerCred) -> Attached:
            if self.stopping.is_set():
                raise Refused("supervisor_stopping", "the supervisor is shutting down")
            hit = peer.find_root(cred.pid, self.roots, stop={os.getpid()})
            if hit is None:
                raise Refused(
                    "not_in_fleet",
                    f"process {cred.pid} does not run inside any agent this supervisor "
                    "started; attach entries work only from within an agent's process tree",
                )
            agent_id, generation = hit
            slot = self.slots.get(agent_id)
            if slot is None:
                raise Refused("agent_not_running", f"agent {agent_id} is no longer in the fleet")
            if cred.uid != slot.uid:
                raise Refused(
                    "uid_mismatch",
                    f"process {cred.pid} runs as uid {cred.uid}, agent {agent_id} as {slot.uid}",
                )
            stat = peer.read_stat(cred.pid)
            if stat is None or not peer.still_same(cred, stat):
                raise Refused("peer_gone", f"process {cred.pid} exited while it was identified")
            if self.hubs[surface].count(agent_id) >= MAX_SESSIONS_PER_AGENT:
                raise Refused(
                    "too_many_sessions",
                    f"agent {agent_id} already holds {MAX_SESSIONS_PER_AGENT} sessions on this "
                    "surface; close one (end its MCP client) before attaching another",
                )
            if surface == RELAY and slot.plan.bundle is None:
                raise Refused(
                    "surface_unavailable",
                    f"agent {agent_id} has no bundle in the fleet file, so no relay tools",
                )
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
            self._center_saw(agent_id, current)
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
        generation share one relay connection (the relay allows one per principal): opened
        with the first, closed with the last, or when the generation ends or the agent leaves
        (`_close_relay`)."""
        from mcphost.relaytools import layout as layout_mod
        from mcphost.relaytools.cli import make_stream
        from mcphost.relaytools.stream import SharedStream, StreamHandle
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
                share = SharedStream(lambda events, note: make_stream(layout, events, note))
                current = self._relay_shares[agent_id] = (generation, share)
            return current[1].handle(on_events, on_note)

        return RelayToolsSurface(layout, handle)

    def _close_relay(self, agent_id: str, below: int | None) -> None:
        """Close the agent's shared relay connection of a generation below `below` (None: any)."""
        current = self._relay_shares.get(agent_id)
        if current is not None and (below is None or current[0] < below):
            del self._relay_shares[agent_id]
            self._spawn(current[1].aclose())

    # -- what `mcphost ctl` asks (served through `Control`) ------------------------------
    def _slot_for(self, agent_id: str | None) -> Slot:
        slot = self.slots.get(agent_id or "")
        if slot is None:
            raise ControlError(
                "unknown_agent",
                f"there is no agent {agent_id!r} in the fleet; `mcphost ctl status` lists them",
                {"agent": agent_id, "known": sorted(self.slots)},
            )
        return slot

    async def status(self) -> list[dict[str, Any]]:
        rows = []
        for agent_id, slot in sorted(self.slots.items()):
            status = slot.runner.status()
            rows.append(
                {
                    "agent_id": agent_id,
                    "state": str(status.state),
                    "pid": status.pid,
                    "generation": status.generation,
                    "restarts": status.restarts,
                    "started_at": status.started_at,
                    "last_exit": status.last_exit,
                    "last_reason": status.last_reason,
                    "sessions": sum(hub.count(agent_id) for hub in self.hubs.values()),
                    "fenced": slot.fenced,
                    "sandbox": "none" if slot.sandbox is None else slot.sandbox.name,
                }
            )
        for agent_id, reason in sorted(self.unstarted.items()):
            rows.append(
                {
                    "agent_id": agent_id,
                    "state": str(AgentState.FAILED),
                    "pid": None,
                    "generation": None,
                    "restarts": 0,
                    "started_at": None,
                    "last_exit": None,
                    "last_reason": reason,
                    "sessions": 0,
                    "fenced": None,
                    "sandbox": None,
                }
            )
        return rows

    # start / stop / restart hold the agent's lock (`_agents_held`) and find its slot only
    # then: a reconciliation in between has replaced or removed it, never half.
    async def start(self, agent_id: str) -> dict[str, Any]:
        async with self._agents_held([agent_id]):
            slot = self._slot_for(agent_id)
            if slot.runner.status().state in (AgentState.RUNNING, AgentState.STARTING):
                return {"agent_id": agent_id, "already": "running"}
            await slot.runner.start()
            return {"agent_id": agent_id, "state": str(slot.runner.status().state)}

    async def stop_agent(self, agent_id: str) -> dict[str, Any]:
        async with self._agents_held([agent_id]):
            slot = self._slot_for(agent_id)
            await slot.runner.stop()
            return {"agent_id": agent_id, "state": str(slot.runner.status().state)}

    async def restart(self, agent_id: str) -> dict[str, Any]:
        async with self._agents_held([agent_id]):
            slot = self._slot_for(agent_id)
            await slot.runner.restart()
            status = slot.runner.status()
            return {
                "agent_id": agent_id,
                "state": str(status.state),
                "generation": status.generation,
            }

    async def logs(self, agent_id: str, lines: int, follow: bool) -> AsyncIterator[bytes]:
        from mcphost.supervisor.logs import follow as follow_log
        from mcphost.supervisor.logs import tail

        slot = self._slot_for(agent_id)
        yield tail(slot.home.logs, lines)
        if slot.plan.runner == "tmux":  # a pane: its screen, captured now
            from mcphost.supervisor.tmuxrunner import TmuxRunner

            if isinstance(slot.runner, TmuxRunner):
                yield await slot.runner.live_screen(lines)
        if follow:
            async for chunk in follow_log(slot.home.logs):
                yield chunk

    def exec(self, agent_id: str, argv: list[str], fds: list[int]) -> Execution:
        """Run `argv` as `agent_id` (`ctl exec`): the agent's env, workspace and user, its own
        process group, `fds` as 0/1/2; an identity root at the agent's current generation until
        it exits, ended when the agent gets a new generation or stops. Synchronous: the root is
        registered before the command can attach."""
        from mcphost.supervisor import execs
        from mcphost.supervisor.kernel import resolve_user

        slot = self._slot_for(agent_id)
        status = slot.runner.status()
        if self.stopping.is_set():
            raise ControlError("supervisor_stopping", "the supervisor is shutting down")
        if status.state != AgentState.RUNNING or status.pid is None or status.generation is None:
            raise ControlError(
                "agent_not_running",
                f"agent {agent_id} is {status.state}, not running: a command runs as an agent "
                f"only while the agent runs; `mcphost ctl start {agent_id}` and retry",
                {"agent": agent_id, "state": str(status.state)},
            )
        assert self.reaper is not None
        execution = execs.spawn(
            argv,
            fds,
            cwd=slot.workspace.cwd,
            env=agent_env(self.env, slot.plan, slot.home),
            creds=resolve_user(slot.plan.user),
            fence=slot.sandbox,
            reaper=self.reaper,
            agent_id=agent_id,
            generation=status.generation,
            grace=slot.plan.stop_grace,
        )
        self.roots[execution.root] = (agent_id, status.generation)
        slot.roots.add(execution.root)
        self._record_started(execution.pid, execution.starttime, agent_id, "exec")
        self.execs[execution.pid] = execution
        execution.exit.add_done_callback(lambda _: self._exec_exited(slot, execution))
        return execution

    def _exec_exited(self, slot: Slot, execution: Execution) -> None:
        self.execs.pop(execution.pid, None)
        if self.roots.get(execution.root) == (execution.agent_id, execution.generation):
            self.roots.pop(execution.root, None)
        slot.roots.discard(execution.root)

    def _end_execs(self, agent_id: str, below: int | None) -> None:
        """End the agent's exec'd commands of a generation below `below` (None: all of them)."""
        for execution in list(self.execs.values()):
            if execution.agent_id == agent_id and (below is None or execution.generation < below):
                execution.end()


class Control:
    """The supervisor as `mcphost.supervisor.control.ControlHandler` sees it."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    async def status(self) -> dict[str, Any]:
        """`{"center": <health>, "agents": [<row>, ...]}` (the center first: it explains the
        rest when it is down)."""
        health = self.supervisor.health
        return {
            "center": health.as_json() if health is not None else None,
            "agents": await self.supervisor.status(),
        }

    async def start(self, agent: str) -> dict[str, Any]:
        return await self.supervisor.start(agent)

    async def stop(self, agent: str) -> dict[str, Any]:
        return await self.supervisor.stop_agent(agent)

    async def restart(self, agent: str) -> dict[str, Any]:
        return await self.supervisor.restart(agent)

    async def reload(self) -> dict[str, Any]:
        try:
            return await self.supervisor.reload()
        except ControlError as exc:
            reload_failed(exc, "ctl")  # in the event log too, as a failed SIGHUP reload is
            raise

    def logs(self, agent: str, lines: int, follow: bool) -> AsyncIterator[bytes]:
        return self.supervisor.logs(agent, lines, follow)

    def exec(self, agent: str, argv: list[str], fds: list[int]) -> Execution:
        return self.supervisor.exec(agent, argv, fds)


def reload_failed(exc: ControlError, trigger: str) -> None:
    """The event of a reload that applied nothing (`trigger`: "sighup" or "ctl")."""
    events.emit(
        "supervisor.reload_failed",
        level="error",
        trigger=trigger,
        code=exc.code,
        message=exc.message,
        details=exc.details,
    )


def run_supervisor(fleet: Fleet, state_dir: str) -> int:
    """Run the supervisor in a fresh event loop; its exit status."""
    return asyncio.run(Supervisor(fleet, state_dir).run())
