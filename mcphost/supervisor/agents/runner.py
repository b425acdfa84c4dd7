"""One `AgentRunner` per agent: spawn, output, exit, restart policy, backoff, intensity, stop.

Owns: the agent's process. Each spawn takes a new generation from the StateStore (committed
first; at least the one the supervisor's `reserve` got from the center, awaited before; or the
one `start` was given, reserved and committed with a whole start-up's by reconcile.py), starts
the agent in its own session and process group (`start_new_session`) with its output piped
into the agent's `RotatingLog` (after a `--- <id>, generation <n>, spawned (<UTC>) ---`
line), arms the parent-death signal (after switching user when the plan names one, and
fencing it: `fence`, fence.py; it and `reserve` are given at construction), registers the pid with the Reaper (the
spawn and the watch are `procs.spawn`, mcphost/procs.py) and
calls `on_spawn` -- all with no `await` in between, so the supervisor knows the new identity
root before the agent can attach
and the exit status cannot be reaped before it is watched. On exit: `on_exit`, then whatever is
left of the agent's process group is ended (SIGTERM, SIGKILL after `stop_grace`), then the
policy: `always` | `on-failure` (a non-zero exit, a signal we did not send, or a spawn that
failed) | `never`; exponential backoff `restart_delay * 2**k` capped at `restart_max_delay`
(k back to 0 once a run lasted longer than `restart_window`); more than `max_restarts` restarts
after a failure within `restart_window` s -> `failed` until `start()`/`restart()` (an `always`
agent's clean exit is restarted with the backoff and never counted). The window is measured on
the agent's own clock, the time it ran and was being spawned, without the backoff waits: on the
wall clock the doubling delays (1, 2, 4 ... 60 s by default) spread a crash loop so thin that no
60 s ever held 6 restarts, and an agent OOM-killed or crashing in a loop was restarted forever
(issue #34). The backoff still paces the restarts; the intensity says when to stop. When the policy ends the
runner (no restart), the state is `failed` after a failure and `stopped` after a clean exit (as
systemd does). There is no readiness signal: `running` means the process exists.
The pure policy parts (`should_restart`, `backoff_delay`, `Intensity`) are unit-tested alone.
The process-specific part is small and overridable, so another host of the agent's process
reuses the rest (policy, backoff, intensity, generations, group stop): `_launch` (one spawn:
`_reserve_generation` (the center's say, when a `reserve` was given), `_new_generation`, then
`_register` or `_spawn_failed`) and `_run_ended` (after each run);
`tmux.TmuxRunner` runs the agent as a tmux pane that way. Every kind is built one way, from
its plan, its home and its `Collaborators` (`hosted`, from the supervisor's table of kinds), and
answers the relay host as a member (`endpoint`, `ready`: none and its process running here).
The agent's states are states.py's.
`start()` and `stop()` run one at a time (a stop waits for a launch in progress, then ends what
it launched; a relaunch the policy began when the stop came is ended the same way), and a
runner that `aclose()` began closing never spawns again: a `restart()` whose stop overlapped the
close, or any later `start()`, does nothing (issue #18: an overlapping reload otherwise left a
second, unregistered agent running the old plan).
Must never: wait for a child any other way than through the Reaper, yield between `Popen`
returning and `on_spawn`, restart an agent stopped by `stop()`, spawn once closed, or pass
anything to the agent but its argv and the env it was given (the runner adds nothing).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mcphost import procs
from mcphost.events import emit
from mcphost.supervisor.agents.logs import RotatingLog
from mcphost.supervisor.agents.states import AgentState, AgentStatus
from mcphost.supervisor.confine.kernel import (
    Reaper,
    child_setup,
    describe_status,
    end_group,
    group_alive,
    killpg_quietly,
    proc_starttime,
    resolve_user,
)
from mcphost.supervisor.state import GenerationExhausted, StateStore, generation_after
from mcphost.supervisor.values import format_size

if TYPE_CHECKING:
    from mcphost.relay.members import Endpoint
    from mcphost.supervisor.confine.cgroups import AgentGroup
    from mcphost.supervisor.confine.fence import Fence
    from mcphost.supervisor.plan import AgentPlan


class Plan(Protocol):
    """What the runner reads of an AgentPlan (fleet.py)."""

    @property
    def agent_id(self) -> str: ...
    @property
    def restart(self) -> str: ...
    @property
    def restart_delay(self) -> float: ...
    @property
    def restart_max_delay(self) -> float: ...
    @property
    def max_restarts(self) -> int: ...
    @property
    def restart_window(self) -> float: ...
    @property
    def stop_grace(self) -> float: ...
    @property
    def log_max_bytes(self) -> int: ...
    @property
    def log_keep(self) -> int: ...
    @property
    def user(self) -> str | None: ...
    @property
    def uid(self) -> int | None: ...


class HomeDirs(Protocol):
    """What the runner reads of a Home (homes.py)."""

    @property
    def workspace(self) -> str | os.PathLike[str]: ...
    @property
    def logs(self) -> str | os.PathLike[str]: ...


# -- pure policy ----------------------------------------------------------------------------


def is_failure(exit_code: int | None) -> bool:
    """A failed spawn (None), a non-zero exit or a signal (negative, as waitstatus_to_exitcode)."""
    return exit_code is None or exit_code != 0


def should_restart(policy: str, exit_code: int | None, stopped_by_us: bool) -> bool:
    """Restart after this end of a run? `exit_code` as `os.waitstatus_to_exitcode` gives it
    (negative: killed by that signal), None when the spawn itself failed."""
    if stopped_by_us:
        return False
    if policy == "always":
        return True
    if policy == "on-failure":
        return is_failure(exit_code)
    if policy == "never":
        return False
    raise ValueError(f"unknown restart policy {policy!r}")


def backoff_delay(k: int, base: float, cap: float) -> float:
    """`base * 2**k`, capped at `cap` (k >= 0: the k-th consecutive quick restart)."""
    if k < 0:
        raise ValueError("k must be >= 0")
    try:
        return min(cap, math.ldexp(base, k))
    except OverflowError:
        return cap


class Intensity:
    """Restart intensity: at most `max_restarts` restarts in any `window` seconds.

    A restart at time t counts during [t, t + window): at exactly t + window it no longer
    does. `allow(now)` records the restart and returns True, or returns False (nothing recorded)
    when it would be restart number `max_restarts + 1` within the window.
    """

    def __init__(self, max_restarts: int, window: float) -> None:
        self.max_restarts = max_restarts
        self.window = window
        self._times: deque[float] = deque()

    def _prune(self, now: float) -> None:
        while self._times and now - self._times[0] >= self.window:
            self._times.popleft()

    def count(self, now: float) -> int:
        self._prune(now)
        return len(self._times)

    def allow(self, now: float) -> bool:
        if self.count(now) + 1 > self.max_restarts:
            return False
        self._times.append(now)
        return True

    def reset(self) -> None:
        self._times.clear()


def exit_reason(exit_code: int, stopped_by_us: bool) -> str:
    if stopped_by_us:
        return "stopped by the supervisor"
    if exit_code >= 0:
        return f"exited with status {exit_code}"
    try:
        name = signal.Signals(-exit_code).name
    except ValueError:
        name = f"signal {-exit_code}"
    return f"killed by {name}"


# -- the runner -----------------------------------------------------------------------------


@dataclass(slots=True)
class _Run:
    proc: subprocess.Popen[bytes] | None  # None: not our child (a tmux pane, agents/tmux.py)
    pid: int
    generation: int
    exit: asyncio.Future[int]
    started: float  # loop time


class _LogPipe(asyncio.Protocol):
    def __init__(self, log: RotatingLog, done: Callable[[asyncio.BaseTransport], None]) -> None:
        self.log = log
        self.done = done
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.log.write(data)
        except OSError as exc:
            emit("supervisor.log_write_failed", level="error", path=self.log.path, error=str(exc))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.done(self.transport)


OnSpawn = Callable[["AgentRunner", int, int, int], None]
OnExit = Callable[["AgentRunner", int], None]
# (agent_id, the next local generation) -> the generation to use, at least that (the center's)
Reserve = Callable[[str, int], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class Collaborators:
    """What every kind of runner is given at construction besides its plan and home (the
    supervisor's reconciliation makes one per slot: `AgentRunner.hosted`). `cwd`: where the
    agent starts, default `home.workspace`; the supervisor passes its held workspace
    (`HeldWorkspace.cwd`), so the spawn never walks a path the agent owns. `fence`: applied in
    the child after the user switch (fence.py; None: unfenced, changed only by `refence`);
    `reserve`: asks the center for each spawn's generation (None: the local counter alone)."""

    store: StateStore
    reaper: Reaper
    on_spawn: OnSpawn
    on_exit: OnExit
    argv: Sequence[str]
    env: dict[str, str]
    cwd: str | None = None
    fence: Fence | None = None
    reserve: Reserve | None = None


class AgentRunner:
    """Runs one agent under its plan. Use from the event loop's thread only."""

    # the child's stdin, stdout, stderr: no input, its output (both streams) into its log; a
    # runner that talks to its agent over stdio (agents/acp.py) pipes all three
    STDIO: tuple[int, int, int] = (subprocess.DEVNULL, subprocess.PIPE, subprocess.STDOUT)

    def __init__(self, plan: Plan, home: HomeDirs, given: Collaborators) -> None:
        """The runner of `plan`'s agent in `home`, with every collaborator `given` (the one
        way to build a runner: a kind that needs more takes its own keywords after these)."""
        if not given.argv:
            raise ValueError("argv is empty")
        store = given.store
        self.plan = plan
        self.home = home
        self._cwd = os.fspath(home.workspace) if given.cwd is None else given.cwd
        self.agent_id = plan.agent_id
        self._store = store
        self._reaper = given.reaper
        self._on_spawn = given.on_spawn
        self._on_exit = given.on_exit
        self._argv = list(given.argv)
        self._env = dict(given.env)
        self._creds = resolve_user(plan.user, plan.uid)  # KernelError now, not at spawn time
        self._fence = given.fence
        self._state = AgentState.STOPPED
        self._want = False
        self._closed = False  # `aclose()` began: this runner never spawns again
        self._exhausted: str | None = None  # no generation left (`_launch_or_fail`)
        self._ops = asyncio.Lock()  # start / stop one at a time (a stop waits for a launch)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._run: _Run | None = None
        self._generation = store.generation(plan.agent_id)
        self._reserve = given.reserve
        self._reserved = 1
        self._committed: int | None = None  # the next spawn's generation, committed (`start`)
        self._restarts = 0
        self._started_at: float | None = None
        self._k = 0
        self._intensity = Intensity(plan.max_restarts, plan.restart_window)
        self._waited = 0.0  # seconds of backoff so far: the intensity's clock leaves them out
        self._log: RotatingLog | None = None
        self._pipes: set[asyncio.BaseTransport] = set()
        previous = store.last_exit(plan.agent_id)
        self._last_exit = previous.exit if previous else None
        self._last_reason = previous.reason if previous else None
        # the agent's cgroup (cgroups.py), set by the supervisor's reconciliation: each run
        # enters it before exec, its OOM kills name the exit, it is removed (what is left in
        # it killed) once the runner stops running the agent (stopped, failed, closed)
        self.cgroup: AgentGroup | None = None
        self._oom_mark = 0

    @classmethod
    def hosted(
        cls, plan: AgentPlan, home: HomeDirs, given: Collaborators, site: Any
    ) -> AgentRunner:
        """This kind of runner as the supervisor builds it (its table of kinds,
        `reconcile.RUNNERS`): from what every runner is given and, for a kind that needs more
        of its host, from `site` (the supervisor's reconciliation; such a kind overrides this
        and states what it reads of `site` as a Protocol of its module: tmux.Site)."""
        return cls(plan, home, given)

    # -- as a relay member (relayhost.py asks; a kind of runner that is one overrides) ------
    def endpoint(self) -> Endpoint | None:
        """What the relay's kind of member reaches this agent through (`members.Endpoint`:
        one type per kind); None: no kind can (a process agent speaks only through its relay
        tools, and nothing delivers to it)."""
        return None

    def ready(self) -> bool:
        """Whether the agent takes deliveries as a relay member: its process runs."""
        return self.status().running

    # -- public ---------------------------------------------------------------------------
    def status(self) -> AgentStatus:
        run = self._run
        alive = run is not None and not run.exit.done()
        return AgentStatus(
            agent_id=self.agent_id,
            state=self._state,
            pid=run.pid if alive and run is not None else None,
            generation=self._generation,
            restarts=self._restarts,
            started_at=self._started_at if alive else None,
            last_exit=self._last_exit,
            last_reason=self._last_reason,
        )

    @property
    def fence(self) -> Fence | None:
        """The fence every spawn enters (None: `sandbox = "none"`)."""
        return self._fence

    def update_policy(self, plan: Plan) -> None:
        """Apply `plan`, which differs from the runner's only in what the running agent never
        sees (`fleet.IN_PLACE`: the restart policy, its timings, `stop_grace`, the log limits):
        from the next exit, stop and log write on, with the restarts already counted kept."""
        self.plan = plan
        self._intensity.max_restarts = plan.max_restarts
        self._intensity.window = plan.restart_window
        if self._log is not None:
            self._log.max_bytes = plan.log_max_bytes
            self._log.keep = plan.log_keep

    def refence(self, fence: Fence | None) -> None:
        """The fence of every later spawn (a reload moved what it must hide: the supervisor's
        reconciliation then restarts a running agent into it)."""
        self._fence = fence

    @property
    def closed(self) -> bool:
        """`aclose()` was called: the runner will never spawn again."""
        return self._closed

    async def start(self, generation: int | None = None) -> None:
        """Spawn now (unless already running or in backoff) and keep the agent up per policy.

        From `failed` or `stopped` this starts afresh: backoff and intensity are reset. Waits
        for a `stop()` in progress; does nothing once the runner is closed. `generation`: one
        already reserved and committed for this start's first spawn (a fleet's start-up commits
        all of them at once: reconcile.py, `StateStore.next_generations`); None: its own.
        """
        async with self._ops:
            if self._closed or (self._task is not None and not self._task.done()):
                return
            self._committed = generation
            self._want = True
            self._wake = asyncio.Event()
            self._exhausted = None
            self._k = 0
            self._intensity.reset()
            first = await self._launch_or_fail()  # Popen, watch, on_spawn with no await between
            self._task = asyncio.get_running_loop().create_task(
                self._supervise(first), name=f"agent:{self.agent_id}"
            )

    async def stop(self) -> None:
        """SIGTERM the agent's process group, SIGKILL it after `stop_grace`; no restart.
        Waits for a `start()` in progress (then stops what it launched)."""
        self._want = False
        self._wake.set()
        async with self._ops:
            self._want = False
            self._wake.set()
            run = self._run
            if run is not None and not run.exit.done():
                self._state = AgentState.STOPPING
                emit("supervisor.agent_stopping", agent_id=self.agent_id, pid=run.pid)
                await self._end_group(run.pid, run.exit)
            task, self._task = self._task, None
            if task is not None:
                await task
            self._state = AgentState.STOPPED
            emit("supervisor.agent_stopped", agent_id=self.agent_id)

    async def restart(self) -> None:
        """Stop, then start afresh (out of `failed` too): a new generation. Once the runner is
        closed (also while this waits for the stop), the start does nothing."""
        await self.stop()
        await self.start()

    async def aclose(self) -> None:
        """Close for good, stop, and forget: no start after this spawns anything (a `restart()`
        waiting on the stop included); the output pipes are closed (even if an escaped process
        holds them)."""
        self._closed = True
        await self.stop()
        for transport in list(self._pipes):
            transport.close()
        self._pipes.clear()
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- one run --------------------------------------------------------------------------
    def _ensure_log(self) -> RotatingLog:
        if self._log is None:
            self._log = RotatingLog(
                os.fspath(self.home.logs),
                max_bytes=self.plan.log_max_bytes,
                keep=self.plan.log_keep,
            )
        return self._log

    async def _launch_or_fail(self) -> _Run | None:
        """`_launch`, with no generation left (`GenerationExhausted`) a failed spawn whose
        reason no restart can mend (`_given_up`)."""
        try:
            return await self._launch()
        except GenerationExhausted as exc:
            self._exhausted = f"{exc.code}: {exc}"
            self._run = None
            self._last_exit, self._last_reason = None, self._exhausted
            emit(
                "supervisor.agent_spawn_failed",
                level="error",
                agent_id=self.agent_id,
                code=exc.code,
                reason=self._exhausted,
            )
            return None

    async def _launch(self) -> _Run | None:
        """One spawn (None when it failed). A subclass hosting the process elsewhere overrides
        this (agents/tmux.py); past the reservation it never awaits, so `_spawn` stays atomic."""
        await self._reserve_generation()
        if not self._want:  # stopped while the center answered
            return None
        return self._spawn()

    async def _reserve_generation(self) -> None:
        """Before `_new_generation`: the generation the center hands out for this spawn (above
        every one it has seen), when the supervisor gave a way to ask (`reserve`)."""
        self._reserved = 1
        if self._reserve is not None and self._committed is None:
            local = generation_after(self._store.generation(self.agent_id))
            self._reserved = await self._reserve(self.agent_id, local)

    def _new_generation(self) -> int:
        self._state = AgentState.STARTING
        generation, self._committed = self._committed, None
        if generation is None:
            generation = self._store.next_generation(self.agent_id, at_least=self._reserved)
        self._generation = generation
        self._ensure_log()
        return generation

    def _spawn_failed(self, generation: int, reason: str) -> None:
        self._run = None
        self._last_exit, self._last_reason = None, reason
        self._store.record_exit(self.agent_id, generation, None, reason)
        emit(
            "supervisor.agent_spawn_failed",
            level="error",
            agent_id=self.agent_id,
            generation=generation,
            reason=reason,
        )

    def _register(self, run: _Run, starttime: int | None) -> None:
        """The run is the agent's now: state, then `on_spawn` (an unregistered run is killed)."""
        self._run = run
        self._state = AgentState.RUNNING
        self._started_at = time.time()
        try:
            # An unreaped child always has /proc/<pid>/stat; 0 never matches a real start time.
            self._on_spawn(self, run.pid, starttime or 0, run.generation)
        except Exception as exc:
            emit(
                "supervisor.on_spawn_failed", level="error", agent_id=self.agent_id, error=repr(exc)
            )
            killpg_quietly(run.pid, signal.SIGKILL)  # unregistered: it must not run
        emit(
            "supervisor.agent_spawned",
            agent_id=self.agent_id,
            pid=run.pid,
            generation=run.generation,
            argv0=self._argv[0],
        )

    async def _run_ended(self, run: _Run) -> None:
        """After a run's exit (and its group's end): nothing here; agents/tmux.py cleans up."""

    def _spawn(self) -> _Run | None:
        """Generation, Popen, watch, on_spawn: synchronous on purpose (see the module doc)."""
        generation = self._new_generation()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:  # a separator before the run's output, as tmux agents have at each exit
            self._ensure_log().write(
                f"--- {self.agent_id}, generation {generation}, spawned ({stamp}) ---\n".encode()
            )
        except OSError as exc:
            emit("supervisor.log_write_failed", level="error", error=str(exc))
        try:
            setup = child_setup(
                self._argv,
                cwd=self._cwd,
                env=self._env,
                creds=self._creds,
                fence=self._fence,
                cgroup=self.enter_group(),
            )
            stdin, stdout, stderr = self.STDIO
            child = procs.spawn(
                setup.argv,
                cwd=setup.cwd,
                env=self._env,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                new_session=True,
                preexec=setup.preexec,
                watch=self._reaper.watch,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self._spawn_failed(generation, procs.spawn_failure_reason(self._argv[0], exc))
            return None
        starttime = proc_starttime(child.pid)
        loop = asyncio.get_running_loop()
        run = _Run(child.proc, child.pid, generation, child.exit, loop.time())
        self._register(run, starttime)
        return run

    async def _attach_output(self, run: _Run) -> None:
        stdout = run.proc.stdout if run.proc is not None else None
        if stdout is None:
            return
        loop = asyncio.get_running_loop()
        log = self._ensure_log()
        transport, _ = await loop.connect_read_pipe(
            lambda: _LogPipe(log, self._pipes.discard), stdout
        )
        self._pipes.add(transport)

    async def _wait_exit(self, run: _Run) -> tuple[int, float]:
        status = await asyncio.shield(run.exit)
        code = os.waitstatus_to_exitcode(status)  # run.proc's returncode is set (procs.py)
        loop = asyncio.get_running_loop()
        uptime = loop.time() - run.started
        stopped_by_us = not self._want
        self._last_exit = describe_status(status)
        self._last_reason = self._exit_reason(code, stopped_by_us)
        group = self.cgroup
        if (
            not stopped_by_us
            and code != 0
            and group is not None
            and group.oom_kills() > self._oom_mark
        ):
            self._last_reason = self._out_of_memory()
        self._store.record_exit(self.agent_id, run.generation, self._last_exit, self._last_reason)
        emit(
            "supervisor.agent_exited",
            level="info" if stopped_by_us or code == 0 else "warning",
            agent_id=self.agent_id,
            pid=run.pid,
            generation=run.generation,
            exit=self._last_exit,
            reason=self._last_reason,
            uptime=round(uptime, 3),
        )
        try:
            self._on_exit(self, run.generation)
        except Exception as exc:
            emit(
                "supervisor.on_exit_failed", level="error", agent_id=self.agent_id, error=repr(exc)
            )
        return code, uptime

    def _exit_reason(self, code: int, stopped_by_us: bool) -> str:
        """Why the run ended, in the operator's words (a subclass that ended its agent for a
        reason of its own, agents/acp.py's failed handshake, says that instead)."""
        return exit_reason(code, stopped_by_us)

    # -- the agent's cgroup (cgroups.py) ------------------------------------------------------
    def enter_group(self) -> tuple[str, ...]:
        """The entry files a run's first process writes itself to (the group made with its
        limits, its usage counters started over); none without a group. OSError when it cannot
        be made."""
        if self.cgroup is None:
            return ()
        placement = self.cgroup.ensure(new_run=True)
        self._oom_mark = self.cgroup.oom_kills()  # the group outlives a restart: count anew
        return placement

    def _out_of_memory(self) -> str:
        from mcphost.supervisor.confine.cgroups import OOM_REASON

        limit = self.cgroup.limits.memory_max if self.cgroup is not None else None
        return OOM_REASON if limit is None else f"{OOM_REASON} (memory_max = {format_size(limit)})"

    def _given_up(self) -> str | None:
        """A reason the agent must not be restarted whatever the policy (None: the policy
        decides); a subclass that met a failure no restart can mend says it here (after
        asking this one: no generation left)."""
        return self._exhausted

    async def _end_group(self, pgid: int, leader: asyncio.Future[int]) -> None:
        """SIGTERM the group; once `stop_grace` passed with the leader or a member alive,
        SIGKILL it; return when the leader is reaped and the group is empty."""
        if await end_group(pgid, leader, self.plan.stop_grace):
            emit("supervisor.agent_killed", agent_id=self.agent_id, pgid=pgid)

    async def _supervise(self, first: _Run | None) -> None:
        try:
            await self._keep_up(first)
        except Exception as exc:  # a bug or a broken state file: say so, do not die silently
            self._fail(f"supervision failed: {type(exc).__name__}: {exc}")
        finally:
            if self.cgroup is not None:  # no more runs: the group goes, with what is left in it
                await self.cgroup.remove()

    async def _keep_up(self, first: _Run | None) -> None:
        run: _Run | None = first
        loop = asyncio.get_running_loop()
        while True:
            code: int | None = None
            uptime = 0.0
            if run is not None:
                await self._attach_output(run)
                if not self._want:  # stopped while it was being launched: it must not run
                    await self._end_group(run.pid, run.exit)
                code, uptime = await self._wait_exit(run)
                if self._want and group_alive(run.pid):
                    await self._end_group(run.pid, run.exit)  # what the agent left behind
                await self._run_ended(run)
            if not self._want:
                return
            permanent = self._given_up()
            if permanent is not None:
                self._fail(permanent)
                return
            policy = self.plan.restart
            if not should_restart(policy, code, stopped_by_us=False):
                if is_failure(code):
                    self._fail(f"{self._last_reason} (restart = {policy})")
                else:
                    self._state = AgentState.STOPPED
                return
            if uptime > self.plan.restart_window:
                self._k = 0
            # The intensity limit counts failures: an `always` agent's clean exit is a run that
            # ended, restarted with the backoff however often it comes (never `failed`).
            if is_failure(code) and not self._intensity.allow(loop.time() - self._waited):
                self._fail(
                    f"{self._last_reason}; more than {self.plan.max_restarts} restarts "
                    f"within {self.plan.restart_window:g} s"
                )
                return
            delay = backoff_delay(self._k, self.plan.restart_delay, self.plan.restart_max_delay)
            self._k += 1
            self._state = AgentState.BACKOFF
            emit("supervisor.agent_backoff", agent_id=self.agent_id, delay=delay, attempt=self._k)
            began = loop.time()
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except TimeoutError:
                pass
            self._waited += loop.time() - began
            if not self._want or self._closed:
                return
            self._restarts += 1
            run = await self._launch_or_fail()

    def _fail(self, reason: str) -> None:
        self._state = AgentState.FAILED
        self._last_reason = reason
        emit("supervisor.agent_failed", level="error", agent_id=self.agent_id, reason=reason)
