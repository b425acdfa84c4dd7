"""The ctl operations: what `mcphost ctl` can ask of a running supervisor, in one place.

Owns: `Operations`, the control socket's handler (`control.server.ControlHandler`): status,
start, stop, restart, reload, logs and exec, each resolving the agents' names to their slots
(under the agents' locks for start / stop / restart: a reconciliation in between has replaced or
removed one, never half), every name checked before anything is done to any (an id the fleet
lacks: `unknown_agent`, built by `control.protocol.unknown_agents`; one it could not set up:
`agent_not_running`), and mapping every failure to a row of `mcphost.supervisor.refusals`;
the `ctl exec` commands running (ended with their agent's generation: `end_execs`); each status
row's `usage` (usage.py's figures from one sample shared by every status, page update and scrape
within `USAGE_SAMPLE_SECONDS`, with the center calls the surfaces counted and the relay's queue
depth, both read live; and the counts of the limits the agent met, cgroups.py's
`LimitEvents`, read with the figures) and the sampling between statuses where a peak needs it
(`sample_usage_forever`); the status as a versioned `Snapshot` (a new version only when
something in it changed: what the page and the metrics build from it is built once per
version); and the event of a reload that applied nothing (`reload_failed`, for ctl and SIGHUP
alike).

Must never: start, stop or restart an agent without holding its lock, act on any agent of a
request that names one the fleet lacks, run a command as an agent that is not running (its
identity root must have a generation), register an exec'd command anywhere but the identity
registry (`identity.Identities`), or change a status it handed out (every reader of a snapshot
shares it: read it, never write it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mcphost import events
from mcphost.supervisor import refusals as R
from mcphost.supervisor.agents.homes import LOGS, HeldWorkspace, Home, agent_env
from mcphost.supervisor.agents.runner import AgentRunner
from mcphost.supervisor.agents.states import AgentState, AgentStatus
from mcphost.supervisor.confine.usage import Peaks, ProcTable, Usage, agent_usage, usage_json
from mcphost.supervisor.control.protocol import ControlError, unknown_agents
from mcphost.supervisor.identity import Identities

if TYPE_CHECKING:
    from mcphost.supervisor.agents.execs import Execution
    from mcphost.supervisor.center.link import Center
    from mcphost.supervisor.confine.cgroups import Cgroups, Limits
    from mcphost.supervisor.confine.fence import Fence
    from mcphost.supervisor.confine.kernel import Reaper
    from mcphost.supervisor.plan import AgentPlan, Fleet
    from mcphost.supervisor.records import ProcessRecords
    from mcphost.supervisor.serving.sessions import SessionHub
    from mcphost.supervisor.serving.streamable import HttpHub

# How old the usage figures of a status may be, in seconds: every status, page update, scrape and
# `ctl top` refresh within this age reads the same sample (each agent's group files, about 10 us
# an agent; or one scan of /proc for the agents without a group, ~12 ms for a fleet of 100:
# bench/usage.py), and where a peak is the supervisor's own (`Usage.sampled_peak`) a sample is
# taken at least this often.
USAGE_SAMPLE_SECONDS = 5.0
LIMIT_EVENTS = ("oom_kills", "pids_limit_hits", "oom_group_kills")  # cgroups.LimitEvents


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One `status()` answer and its `version`, which grows whenever anything in the answer
    changed (a state, a count, the center's health, a new usage sample); what is built from a
    snapshot (the page's JSON, the metrics' text) is built once per version. Shared: read only."""

    version: int
    status: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Figures:
    """One agent's usage as sampled, with the run it was read for and its sessions then: a new
    run, or the same run with other sessions (its pumps started or ended), is read anew, and so
    is a running agent read with no process in its group yet (a tmux pane still in its gate,
    outside the group it enters next): a figure of nothing is not kept for the sample's age."""

    pid: int | None
    generation: int | None
    sessions: int
    usage: Usage
    json: dict[str, object]

    def holds(self, status: AgentStatus, sessions: int) -> bool:
        """Whether these figures still stand for the agent's run `status` with `sessions`."""
        if (self.pid, self.generation, self.sessions) != (status.pid, status.generation, sessions):
            return False
        return self.pid is None or self.usage.processes != 0


class Slot(Protocol):
    """What the operations read of one agent's slot (`reconcile.Slot`)."""

    @property
    def plan(self) -> AgentPlan: ...
    @property
    def home(self) -> Home: ...
    @property
    def runner(self) -> AgentRunner: ...
    @property
    def workspace(self) -> HeldWorkspace: ...
    @property
    def fenced(self) -> dict[str, Any] | None: ...
    @property
    def sandbox(self) -> Fence | None: ...
    @property
    def uid(self) -> int: ...


class CenterCalls(Protocol):
    """The center calls the surfaces counted (`surfaces.Surfaces`)."""

    def center_calls(self, agent_id: str) -> tuple[int, int]: ...


class RelayQueues(Protocol):
    """The relay's delivery queues (`relayhost.RelayHost`)."""

    def queue_depth(self, bundle: str | None, agent_id: str) -> int | None: ...


class Supervised(Protocol):
    """What the operations read of the supervisor (`supervisor.Supervisor`): never imported, so
    the orchestrator stays above this module."""

    @property
    def slots(self) -> Mapping[str, Slot]: ...
    @property
    def unstarted(self) -> Mapping[str, str]: ...
    @property
    def fleet(self) -> Fleet: ...
    @property
    def hubs(self) -> Mapping[str, SessionHub]: ...
    @property
    def http(self) -> HttpHub: ...
    @property
    def center(self) -> Center: ...
    @property
    def stopping(self) -> asyncio.Event: ...
    @property
    def reaper(self) -> Reaper: ...
    @property
    def records(self) -> ProcessRecords: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def identities(self) -> Identities: ...
    @property
    def state_dir(self) -> str: ...
    @property
    def surfaces(self) -> CenterCalls: ...
    @property
    def relay(self) -> RelayQueues: ...
    @property
    def cgroups(self) -> Cgroups: ...
    def agent_held(self, *agent_ids: str) -> contextlib.AbstractAsyncContextManager[None]: ...
    async def reload(self, dry_run: bool = False) -> dict[str, Any]: ...


class Operations:
    """The supervisor as `mcphost ctl` sees it (module doc)."""

    def __init__(self, supervisor: Supervised) -> None:
        self.supervisor = supervisor
        self.execs: dict[int, Execution] = {}  # `ctl exec` commands by pid
        self.peaks = Peaks()  # each agent's largest memory seen, of its current generation
        # the last usage sample (monotonic time, each agent's figures) and the last snapshot
        self._sample: tuple[float, dict[str, _Figures]] | None = None
        self._scan: ProcTable | None = None  # /proc as the sample being taken read it
        self._snapshot = Snapshot(0, {})
        # each agent's last row and what it was made of (`_rows`)
        self._row_cache: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}

    async def reload(self, dry_run: bool = False) -> dict[str, Any]:
        try:
            return await self.supervisor.reload(dry_run=dry_run)
        except ControlError as exc:
            reload_failed(exc, "ctl")  # in the event log too, as a failed SIGHUP reload is
            raise

    def _slots_for(self, agent_ids: Sequence[str]) -> list[Slot]:
        """The slots of `agent_ids`, in order; every id checked before any slot is returned:
        `unknown_agent` naming (as `unknown_agents` does) each the fleet lacks,
        `agent_not_running` for one it has but could not set up (`unstarted`)."""
        supervisor = self.supervisor
        slots, unstarted = supervisor.slots, supervisor.unstarted
        unknown = [a for a in agent_ids if a not in slots and a not in unstarted]
        if unknown:
            raise unknown_agents(unknown, [*slots, *unstarted], self._fleet_json())
        for agent_id in agent_ids:
            if agent_id in unstarted:
                raise ControlError.row(
                    R.UNSTARTED,
                    {"agent": agent_id, "reason": unstarted[agent_id]},
                    agent=agent_id,
                    reason=unstarted[agent_id],
                )
        return [slots[agent_id] for agent_id in agent_ids]

    def _fleet_json(self) -> dict[str, Any]:
        """Where the fleet's agents come from: its file and `[center] fleet`."""
        fleet = self.supervisor.fleet
        return {"path": fleet.path, "agents_from": fleet.center.fleet}

    async def status(self) -> dict[str, Any]:
        """`{"center": <health>, "limits": <backend>, "fleet": {"path", "agents_from"},
        "agents": [<row>, ...]}` (the center first: it explains the rest when it is down;
        `limits`: cgroups.py's backend, its reason and the default limits; `fleet`: the fleet
        file and where its agents come from, `file` or `center`). The snapshot's: read only."""
        return self.snapshot().status

    def snapshot(self, max_age: float = USAGE_SAMPLE_SECONDS) -> Snapshot:
        """The status now, its usage figures at most `max_age` seconds old, as a `Snapshot`:
        the same one (same version) as long as nothing in it changed."""
        status = {
            "center": self.supervisor.center.health.as_json(),
            "limits": self.supervisor.cgroups.as_json(),
            "fleet": self._fleet_json(),
            "agents": self._rows(self._usage_sample(max_age)),
        }
        if status != self._snapshot.status:
            self._snapshot = Snapshot(self._snapshot.version + 1, status)
        return self._snapshot

    # -- usage: one sample for every reader within its age ---------------------------------
    def _usage_sample(self, max_age: float) -> dict[str, _Figures]:
        """Every agent's figures, read at most `max_age` seconds ago (read now otherwise)."""
        now = time.monotonic()
        if self._sample is not None and now - self._sample[0] <= max_age:
            return self._sample[1]
        sessions = self._sessions()
        try:
            figures = {
                agent_id: self._read_figures(agent_id, slot, sessions[agent_id])
                for agent_id, slot in list(self.supervisor.slots.items())
            }
        finally:
            self._scan = None
        self.peaks.keep_only(self.supervisor.slots)
        self._sample = (now, figures)
        return figures

    def _proc_table(self) -> ProcTable:
        """/proc, scanned once per sample and only if an agent without a group asks."""
        if self._scan is None:
            self._scan = ProcTable.scan()
        return self._scan

    def _sessions(self) -> Counter[str]:
        """Live sessions per agent, over both surfaces, pumped and over HTTP."""
        sessions: Counter[str] = Counter()
        for hub in self.supervisor.hubs.values():
            sessions.update(hub.counts())
        sessions.update(self.supervisor.http.counts())
        return sessions

    def _read_figures(self, agent_id: str, slot: Slot, sessions: int) -> _Figures:
        """usage.py's figures of one agent (`sessions` its live sessions now): its group's
        files, else its trees in /proc."""
        status = slot.runner.status()
        group = slot.runner.cgroup
        usage = agent_usage(
            agent_id,
            status.generation,
            self.supervisor.identities.of(agent_id) if status.pid is not None else (),
            table=self._proc_table,
            peaks=self.peaks,
            cgroup=group.usage_files if group is not None else None,
        )
        # how often it met its limits (cgroups.py `LimitEvents`; None: no group, none counted)
        events = group.events().as_json() if group is not None else dict.fromkeys(LIMIT_EVENTS)
        return _Figures(
            status.pid, status.generation, sessions, usage, {**usage.as_json(), **events}
        )

    def _needs_sampling(self) -> bool:
        """Whether a peak is the supervisor's own (`Usage.sampled_peak`): an agent running
        without a group that gives one, or last read without it."""
        sample = self._sample[1] if self._sample is not None else {}
        for agent_id, slot in self.supervisor.slots.items():
            group = slot.runner.cgroup
            if slot.runner.status().pid is not None and (group is None or not group.usage_files):
                return True
            seen = sample.get(agent_id)
            if seen is not None and seen.usage.sampled_peak:
                return True
        return False

    async def sample_usage_forever(self, every: float = USAGE_SAMPLE_SECONDS) -> None:
        """A usage sample at least every `every` seconds where a peak needs it (`Peaks`: the
        agents read from /proc); nothing otherwise: where the kernel keeps every group's peak
        (`Cgroups.keeps_peaks`) the task ends at once, so an idle supervisor reads no usage
        and wakes for none. A task of the supervisor's."""
        if self.supervisor.cgroups.keeps_peaks():
            return
        while True:
            await asyncio.sleep(every)
            if self._needs_sampling():
                self._usage_sample(every)

    def _figures(
        self,
        agent_id: str,
        slot: Slot,
        status: AgentStatus,
        sessions: int,
        sample: dict[str, _Figures],
    ) -> _Figures:
        """The sample's figures of the agent, read anew when they no longer hold (`_Figures`)."""
        figures = sample.get(agent_id)
        if figures is None or not figures.holds(status, sessions):
            figures = sample[agent_id] = self._read_figures(agent_id, slot, sessions)
            self._scan = None
        return figures

    def _rows(self, sample: dict[str, _Figures]) -> list[dict[str, Any]]:
        """One row per agent; an agent's row is the same object as in the last status while
        nothing it shows changed (`_row_cache`), so comparing two statuses costs little and
        what is built per row (the page's JSON) can be kept per row."""
        rows = []
        supervisor = self.supervisor
        surfaces, relay = supervisor.surfaces, supervisor.relay
        sessions = self._sessions()
        cache: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        for agent_id, slot in sorted(supervisor.slots.items()):
            status = slot.runner.status()
            group = slot.runner.cgroup
            fenced = slot.fenced
            key = (
                status,
                sessions[agent_id],
                tuple(fenced.items()) if fenced is not None else None,  # changed in place
                "none" if slot.sandbox is None else slot.sandbox.name,
                slot.plan.runner,
                self._figures(agent_id, slot, status, sessions[agent_id], sample),
                surfaces.center_calls(agent_id),
                relay.queue_depth(slot.plan.bundle, agent_id),
                None if group is None else group.limits,
                (slot.uid, identity_of(slot.plan, slot.uid)),
            )
            held = self._row_cache.get(agent_id)
            if held is None or held[0] != key:
                held = (key, _row(agent_id, *key))
            cache[agent_id] = held
            rows.append(held[1])
        self._row_cache = cache
        for agent_id, reason in sorted(supervisor.unstarted.items()):
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
                    "usage": usage_json(
                        None, {"center_calls": 0, "center_errors": 0, "relay_queue_depth": None}
                    ),
                }
            )
        return rows

    # start / stop / restart hold the agents' locks (`agent_held`) and find their slots only
    # then: a reconciliation in between has replaced or removed one, never half; every id is
    # checked before the first is acted on, and the locks are held until the last is done.
    async def _each(
        self, agent_ids: Sequence[str], act: Callable[[str, Slot], Awaitable[dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        async with self.supervisor.agent_held(*agent_ids):
            slots = self._slots_for(agent_ids)
            return [await act(a, slot) for a, slot in zip(agent_ids, slots, strict=True)]

    async def start(self, agent_ids: Sequence[str]) -> list[dict[str, Any]]:
        return await self._each(agent_ids, self._start)

    async def stop(self, agent_ids: Sequence[str]) -> list[dict[str, Any]]:
        return await self._each(agent_ids, self._stop)

    async def restart(self, agent_ids: Sequence[str]) -> list[dict[str, Any]]:
        return await self._each(agent_ids, self._restart)

    @staticmethod
    async def _start(agent_id: str, slot: Slot) -> dict[str, Any]:
        if slot.runner.status().state in (AgentState.RUNNING, AgentState.STARTING):
            return {"agent_id": agent_id, "already": "running"}
        await slot.runner.start()
        return {"agent_id": agent_id, "state": str(slot.runner.status().state)}

    @staticmethod
    async def _stop(agent_id: str, slot: Slot) -> dict[str, Any]:
        await slot.runner.stop()
        return {"agent_id": agent_id, "state": str(slot.runner.status().state)}

    @staticmethod
    async def _restart(agent_id: str, slot: Slot) -> dict[str, Any]:
        await slot.runner.restart()
        status = slot.runner.status()
        return {"agent_id": agent_id, "state": str(status.state), "generation": status.generation}

    async def logs(self, agent_id: str | None, lines: int, follow: bool) -> AsyncIterator[bytes]:
        """The agent's log (its pane's screen after it, for a tmux agent); `agent_id` None: the
        supervisor's own events (journal.py)."""
        from mcphost.supervisor.agents.logs import follow as follow_log
        from mcphost.supervisor.agents.logs import tail

        if agent_id is None:
            from mcphost.supervisor.operator import journal

            directory = os.path.join(self.supervisor.state_dir, LOGS)
            yield tail(directory, lines, journal.NAME)
            if follow:
                async for chunk in follow_log(directory, journal.NAME):
                    yield chunk
            return
        (slot,) = self._slots_for([agent_id])
        yield tail(slot.home.logs, lines)
        if slot.plan.runner == "tmux":  # a pane: its screen, captured now
            from mcphost.supervisor.agents.tmux import TmuxRunner

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
        from mcphost.supervisor.agents import execs
        from mcphost.supervisor.confine.kernel import resolve_user

        (slot,) = self._slots_for([agent_id])
        status = slot.runner.status()
        supervisor = self.supervisor
        if supervisor.stopping.is_set():
            raise ControlError.row(R.STOPPING)
        if status.state != AgentState.RUNNING or status.pid is None or status.generation is None:
            raise ControlError.row(
                R.NOT_RUNNING,
                {"agent": agent_id, "state": str(status.state)},
                agent=agent_id,
                state=status.state,
            )
        execution = execs.spawn(
            argv,
            fds,
            cwd=slot.workspace.cwd,
            env=agent_env(supervisor.env, slot.plan, slot.home),
            creds=resolve_user(slot.plan.user, slot.plan.uid),
            fence=slot.sandbox,
            reaper=supervisor.reaper,
            agent_id=agent_id,
            generation=status.generation,
            grace=slot.plan.stop_grace,
            group=slot.runner.cgroup,
        )
        supervisor.identities.add(agent_id, execution.root, status.generation)
        supervisor.records.started(execution.pid, execution.starttime, agent_id, "exec")
        self.execs[execution.pid] = execution
        execution.exit.add_done_callback(lambda _: self._exec_exited(execution))
        return execution

    def _exec_exited(self, execution: Execution) -> None:
        self.execs.pop(execution.pid, None)
        self.supervisor.identities.discard(execution.agent_id, execution.root, execution.generation)

    def end_execs(self, agent_id: str, below: int | None) -> None:
        """End the agent's exec'd commands of a generation below `below` (None: all of them)."""
        for execution in list(self.execs.values()):
            if execution.agent_id == agent_id and (below is None or execution.generation < below):
                execution.end()


def _row(
    agent_id: str,
    status: AgentStatus,
    sessions: int,
    fenced: tuple[tuple[str, Any], ...] | None,
    sandbox: str,
    runner: str,
    figures: _Figures,
    calls: tuple[int, int],
    queue_depth: int | None,
    limits: Limits | None,
    uid: tuple[int, str],
) -> dict[str, Any]:
    """One agent's `ctl status` row, from what `Operations._rows` keys it by."""
    return {
        "agent_id": agent_id,
        "state": str(status.state),
        "pid": status.pid,
        "generation": status.generation,
        "restarts": status.restarts,
        "started_at": status.started_at,
        "last_exit": status.last_exit,
        "last_reason": status.last_reason,
        "sessions": sessions,
        "fenced": dict(fenced) if fenced is not None else None,
        "sandbox": sandbox,
        "runner": runner,
        "protocol_state": status.protocol_state,
        "state_reason_code": status.state_reason_code,
        # usage.py's figures of the sample, the center calls and the relay queue (live)
        "usage": {
            **figures.json,
            "center_calls": calls[0],
            "center_errors": calls[1],
            "relay_queue_depth": queue_depth,
        },
        # the agent's cgroup limits (cgroups.py); None: no backend, no limits
        "limits": None if limits is None else limits.as_json(),
        # the uid its processes run as, and whose it is (`identity_of`)
        "uid": uid[0],
        "identity": uid[1],
    }


def identity_of(plan: AgentPlan, uid: int) -> str:
    """Whose uid the agent runs as: "own" (one of `[identity] uids`, its alone: uids.py),
    "user" (its `user =`'s, another than the supervisor's), or "shared" (the supervisor's own:
    an unprivileged supervisor's agents, or `user = "root"` under a root one)."""
    if plan.uid is not None:
        return "own"
    return "shared" if uid == os.geteuid() else "user"


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
