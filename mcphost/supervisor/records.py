"""The state file's record of every process the supervisor runs, so a crash leaves none behind.

Owns: `ProcessRecords` over the `StateStore`: ending what a crashed supervisor left running
(`end_leftovers`, at start-up, before anything is spawned: `kernel.end_leftovers`), recording
every process started (agents, `ctl exec` commands: `started`) or adopted (escapees reparented to
us, the child subreaper, looked for every `ADOPTION_SCAN_SECONDS`: `watch_adopted`) while it
runs, and forgetting those gone with their whole process group (`prune`). A start prunes only
once the records doubled since the last prune (`PRUNE_FLOOR` at least): pruning reads every
record's /proc entry, and doing so at each of a fleet's N spawns read N²/2 of them
(tests/supervisor/test_records.py::test_a_fleet_s_spawns_prune_a_linear_number_of_times).

The look for escapees costs what there is to find, not the fleet: our children are listed from
`/proc/self/task/*/children` (one small file per thread of ours), and a child's stat is read only
when the Reaper (kernel.py) does not watch it already, that is never for an agent, a `ctl exec`
command or a tmux client we spawned (each watched from its spawn), nor for an escapee once
adopted: an adopted process is watched by the Reaper from then on (it is our child: `waitpid` on
SIGCHLD, no /proc read), and its exit forgets its record at once (`supervisor.adopted_exited`).
When to look: at once after the Reaper reaped a child (`Reaper.on_reap`: an agent's leader or a
tmux client that exited leaves its orphans with us at that moment), and every
`ADOPTION_SCAN_SECONDS` without a cgroup backend, `CONTAINED_SCAN_SECONDS` with one. Why a
period at all: nothing tells a subreaper that a process was reparented to it (a deeper
descendant's parent died), so the list is looked at; the period bounds how long such an escapee
goes unrecorded (a crash in that window leaves it behind, unless its agent's cgroup holds it:
with a backend every agent's tree is in its group, which the next start-up empties,
cgroups.py `prepare`, so the record only adds the SIGTERM before the SIGKILL, and the period
can be long).

Must never: end a process that is not recorded (the record's start time and process group must
still match: `kernel.end_leftovers`), or let a failed write stop a spawn (the process runs
anyway; the failure is an event).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sqlite3

from mcphost import events, procfs
from mcphost.supervisor.confine import kernel
from mcphost.supervisor.state import ProcessRecord, StateStore

# How often the supervisor looks for children it did not spawn (escapees reparented to it) to
# record them: a crash within this long after an escape leaves that escapee unrecorded.
ADOPTION_SCAN_SECONDS = 1.0
# A start prunes the records once they number at least twice what the last prune left, and this.
PRUNE_FLOOR = 64
# ... when every agent is in a cgroup of its own (its group holds its escapees meanwhile).
CONTAINED_SCAN_SECONDS = 10.0


class ProcessRecords:
    """The processes recorded in `store` (module doc)."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self._recorded: set[tuple[int, int]] = set()  # (pid, starttime) in the state file
        self._prune_at = PRUNE_FLOOR  # records that make a start prune (`started`)

    async def end_leftovers(self, grace: float) -> None:
        """End every recorded process still running (SIGTERM, SIGKILL after the fleet's longest
        `stop_grace`): a supervisor that was killed could not stop its agents, their escapees or
        what ignored the parent-death signal."""
        records = self.store.processes()
        if records:
            ended = await kernel.end_leftovers(records, grace)
            if ended:
                events.emit("supervisor.leftovers_ended", level="warning", pids=ended)
            self.prune()
        self._recorded = {(r.pid, r.starttime) for r in self.store.processes()}

    def record(self, stat: procfs.ProcStat, agent_id: str | None, kind: str) -> None:
        """Remember a process we started or adopted (committed), for `end_leftovers`."""
        if (stat.pid, stat.starttime) in self._recorded:
            return
        record = ProcessRecord(stat.pid, stat.starttime, stat.pgrp, stat.session, agent_id, kind)
        try:
            self.store.record_process(record)
        except sqlite3.Error as exc:  # the process runs anyway; a crash would leave it behind
            events.emit("supervisor.record_failed", level="error", pid=stat.pid, error=str(exc))
            return
        self._recorded.add((stat.pid, stat.starttime))

    def started(self, pid: int, starttime: int, agent_id: str, kind: str) -> None:
        """Record a process we just started (an agent, a `ctl exec` command) while it runs."""
        stat = procfs.read_stat(pid)
        if stat is not None and stat.starttime == starttime:
            self.record(stat, agent_id, kind)
            if len(self._recorded) >= self._prune_at:
                self.prune()

    def prune(self) -> None:
        """Forget the recorded processes that are gone with their whole process group."""
        try:
            gone = [
                (r.pid, r.starttime) for r in self.store.processes() if not kernel.still_running(r)
            ]
            self.store.forget_processes(gone)
        except sqlite3.Error as exc:
            events.emit("supervisor.record_failed", level="error", error=str(exc))
            return
        self._recorded.difference_update(gone)
        self._prune_at = max(PRUNE_FLOOR, 2 * len(self._recorded))

    async def watch_adopted(self, reaper: kernel.Reaper, every: float) -> None:
        """Adopt every child we did not spawn, after each reap and every `every` seconds
        (module doc)."""
        wake = asyncio.Event()
        reaper.on_reap = wake.set
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), every)
                wake.clear()
                try:
                    self.adopt(reaper)
                except OSError as exc:  # /proc unreadable for a moment: look again next time
                    events.emit("supervisor.adoption_scan_failed", level="warning", error=str(exc))
        finally:
            reaper.on_reap = None

    def adopt(self, reaper: kernel.Reaper) -> list[int]:
        """Record, and have `reaper` watch, each child of ours nobody watches (an escapee
        reparented to us, the subreaper); the pids adopted. Raises `OSError` when /proc
        cannot be read."""
        own_session = os.getsid(0)
        adopted = []
        for pid in procfs.own_children():
            if reaper.watching(pid):  # spawned by us, or adopted already: nothing to read
                continue
            stat = procfs.read_stat(pid)
            # Our own session: a helper we run (the tmux CLI); agents and what escaped
            # them are always in another session.
            if stat is None or stat.session == own_session:
                continue
            try:
                exit_status = reaper.watch(pid)
            except ChildProcessError:  # it exited and was reaped since the list was read
                continue
            self.record(stat, None, "adopted")
            events.emit("supervisor.process_adopted", pid=pid, session=stat.session)
            exit_status.add_done_callback(functools.partial(self._adopted_exited, pid))
            adopted.append(pid)
        if adopted:
            self.prune()
        return adopted

    def _adopted_exited(self, pid: int, exit_status: asyncio.Future[int]) -> None:
        """An adopted process was reaped: say so, and forget what is gone with it."""
        if exit_status.cancelled():
            return
        events.emit(
            "supervisor.adopted_exited",
            pid=pid,
            exit=kernel.describe_status(exit_status.result()),
        )
        self.prune()
