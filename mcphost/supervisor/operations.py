"""The ctl operations: what `mcphost ctl` can ask of a running supervisor, in one place.

Owns: `Operations`, the control socket's handler (`control.server.ControlHandler`): status,
start, stop, restart, reload, logs and exec, each resolving the agents' names to their slots
(under the agents' locks for start / stop / restart: a reconciliation in between has replaced or
removed one, never half), every name checked before anything is done to any (an id the fleet
lacks: `unknown_agent`, built by `control.protocol.unknown_agents`; one it could not set up:
`agent_not_running`), and mapping every failure to a row of `mcphost.supervisor.refusals`;
the `ctl exec` commands running (ended with their agent's generation: `end_execs`); each status
row's `usage` (usage.py: one /proc scan per status, the agents' memory peaks, with the center
calls the surfaces counted and the relay's queue depth) and the sampling of the peaks between
two statuses (`sample_usage`); and the event of a reload that applied nothing (`reload_failed`,
for ctl and SIGHUP alike).

Must never: start, stop or restart an agent without holding its lock, act on any agent of a
request that names one the fleet lacks, run a command as an agent
that is not running (its identity root must have a generation), or register an exec'd command
anywhere but the identity registry (`identity.Identities`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from mcphost import events
from mcphost.supervisor import refusals as R
from mcphost.supervisor.control.protocol import ControlError, unknown_agents
from mcphost.supervisor.homes import LOGS, HeldWorkspace, Home, agent_env
from mcphost.supervisor.identity import Identities
from mcphost.supervisor.lifecycle import AgentRunner, AgentState
from mcphost.supervisor.usage import Peaks, ProcTable, agent_usage, usage_json

if TYPE_CHECKING:
    from mcphost.supervisor.centerhealth import CenterHealth
    from mcphost.supervisor.cgroups import Cgroups
    from mcphost.supervisor.execs import Execution
    from mcphost.supervisor.fence import Fence
    from mcphost.supervisor.kernel import Reaper
    from mcphost.supervisor.plan import AgentPlan, Fleet
    from mcphost.supervisor.records import ProcessRecords
    from mcphost.supervisor.sessions import SessionHub

# Seconds between two samples of every agent's usage (the memory peaks from /proc): one scan
# of /proc, a few milliseconds for a fleet of 100 (bench/usage.py).
USAGE_SAMPLE_SECONDS = 5.0
# How old a scan of /proc may be and still answer a status: the page's polls, the scrapes and
# `ctl top` within this share one scan (a scan of a 100-agent fleet costs ~12 ms of CPU).
USAGE_MAX_AGE_SECONDS = 2.0


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


class CenterCalls(Protocol):
    """The center calls the surfaces counted (`surfaces.Surfaces`)."""

    def center_calls(self, agent_id: str) -> tuple[int, int]: ...


class RelayQueues(Protocol):
    """The relay's delivery queues (`relayhost.RelayHost`)."""

    def queue_depth(self, bundle: str | None, agent_id: str) -> int | None: ...


class Supervised(Protocol):
    """The supervisor as the operations see it (`supervisor.Supervisor`): never imported, so
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
    def health(self) -> CenterHealth | None: ...
    @property
    def stopping(self) -> asyncio.Event: ...
    @property
    def reaper(self) -> Reaper | None: ...
    @property
    def records(self) -> ProcessRecords | None: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def identities(self) -> Identities: ...
    @property
    def state_dir(self) -> str: ...
    @property
    def surfaces(self) -> CenterCalls: ...
    @property
    def relay(self) -> RelayQueues | None: ...
    @property
    def cgroups(self) -> Cgroups | None: ...
    def agent_held(self, *agent_ids: str) -> contextlib.AbstractAsyncContextManager[None]: ...
    async def reload(self, dry_run: bool = False) -> dict[str, Any]: ...


class Operations:
    """The supervisor as `mcphost ctl` sees it (module doc)."""

    def __init__(self, supervisor: Supervised) -> None:
        self.supervisor = supervisor
        self.execs: dict[int, Execution] = {}  # `ctl exec` commands by pid
        self.peaks = Peaks()  # each agent's largest memory seen, of its current generation
        self._scan: tuple[float, ProcTable] | None = None  # the last /proc scan, and when

    def _table(self, max_age: float = USAGE_MAX_AGE_SECONDS) -> ProcTable:
        """A scan of /proc at most `max_age` seconds old (one scan serves every agent's row,
        and every status asked for within that age)."""
        now = time.monotonic()
        if self._scan is None or now - self._scan[0] > max_age:
            self._scan = (now, ProcTable.scan())
        return self._scan[1]

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
        `limits`: cgroups.py's backend, its reason and the default limits, or None before it is
        detected; `fleet`: the fleet file and where its agents come from, `file` or
        `center`)."""
        health = self.supervisor.health
        cgroups = self.supervisor.cgroups
        return {
            "center": health.as_json() if health is not None else None,
            "limits": cgroups.as_json() if cgroups is not None else None,
            "fleet": self._fleet_json(),
            "agents": self._rows(),
        }

    def _usage(self, agent_id: str, slot: Slot, table: ProcTable) -> dict[str, Any]:
        """The row's `usage`: usage.py's figures, the center calls, the relay queue depth."""
        supervisor = self.supervisor
        status = slot.runner.status()
        calls, errors = supervisor.surfaces.center_calls(agent_id)
        relay = supervisor.relay
        figures = agent_usage(
            agent_id,
            status.generation,
            supervisor.identities.of(agent_id) if status.pid is not None else (),
            table=table,
            peaks=self.peaks,
            cgroup=self._v2_group(agent_id),
        )
        return usage_json(
            figures,
            {
                "center_calls": calls,
                "center_errors": errors,
                "relay_queue_depth": (
                    relay.queue_depth(slot.plan.bundle, agent_id) if relay is not None else None
                ),
            },
        )

    def _v2_group(self, agent_id: str) -> str | None:
        """The agent's own cgroup v2 group, whose files usage.py reads; None on v1 (its files
        differ: the agent's processes in /proc are the source there) and without limits."""
        groups = self.supervisor.cgroups
        return groups.cgroup_of(agent_id) if groups is not None and groups.kind == "v2" else None

    def sample_usage(self) -> None:
        """Sample every agent's usage once (its memory peak: `Peaks`)."""
        table = self._table()
        for agent_id, slot in list(self.supervisor.slots.items()):
            self._usage(agent_id, slot, table)
        self.peaks.keep_only(self.supervisor.slots)

    async def sample_usage_forever(self, every: float = USAGE_SAMPLE_SECONDS) -> None:
        """`sample_usage` every `every` seconds (a task of the supervisor's)."""
        while True:
            await asyncio.sleep(every)
            self.sample_usage()

    def _rows(self) -> list[dict[str, Any]]:
        rows = []
        supervisor = self.supervisor
        table = self._table()  # one scan of /proc for every agent's usage
        for agent_id, slot in sorted(supervisor.slots.items()):
            status = slot.runner.status()
            group = slot.runner.cgroup
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
                    "sessions": sum(hub.count(agent_id) for hub in supervisor.hubs.values()),
                    "fenced": slot.fenced,
                    "sandbox": "none" if slot.sandbox is None else slot.sandbox.name,
                    "runner": slot.plan.runner,
                    "protocol_state": status.protocol_state,
                    "state_reason_code": status.state_reason_code,
                    "usage": self._usage(agent_id, slot, table),
                    # the agent's cgroup limits (cgroups.py); None: no backend, no limits
                    "limits": None if group is None else group.limits.as_json(),
                }
            )
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
        from mcphost.supervisor.logs import follow as follow_log
        from mcphost.supervisor.logs import tail

        if agent_id is None:
            from mcphost.supervisor import journal

            directory = os.path.join(self.supervisor.state_dir, LOGS)
            yield tail(directory, lines, journal.NAME)
            if follow:
                async for chunk in follow_log(directory, journal.NAME):
                    yield chunk
            return
        (slot,) = self._slots_for([agent_id])
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
        assert supervisor.reaper is not None and supervisor.records is not None
        execution = execs.spawn(
            argv,
            fds,
            cwd=slot.workspace.cwd,
            env=agent_env(supervisor.env, slot.plan, slot.home),
            creds=resolve_user(slot.plan.user),
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
