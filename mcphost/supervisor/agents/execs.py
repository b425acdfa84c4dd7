"""A command an operator runs *as an agent* (`mcphost ctl exec AGENT -- CMD ...`).

Owns: spawning the command (the operator's stdin, stdout and stderr as 0/1/2, the agent's
environment, its workspace as cwd, its user, its cgroup (cgroups.py), its fence (fence.py: the agent's own, so the
command sees and reaches exactly what the agent does), its own session and process group, the
parent-death signal), watching its exit through the `Reaper` (the spawn and the watch are
`procs.spawn`, mcphost/procs.py, as for an agent), signalling its process group, and
ending that group (SIGTERM, SIGKILL after the grace) when asked or once its leader exited.

The supervisor registers `(pid, starttime)` as an identity root of the agent at the agent's
current generation (so the pumps the command launches are served as that agent), drops it when
the command exits, and calls `end()` when the agent gets a new generation or stops.

Must never: wait for the child any other way than through the Reaper (the Popen object is kept
only so it never polls: `procs.spawn` sets its returncode from the Reaper's status), yield
between `Popen` returning and `watch`, or give the command anything the agent itself would not
get.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mcphost import procs
from mcphost.events import emit
from mcphost.supervisor.confine.kernel import (
    Credentials,
    Reaper,
    child_setup,
    end_group,
    group_alive,
    killpg_quietly,
    proc_starttime,
)

if TYPE_CHECKING:
    from mcphost.supervisor.confine.cgroups import AgentGroup
    from mcphost.supervisor.confine.fence import Fence

# The grace between SIGTERM and SIGKILL when the group is ended (the agent's stop_grace).
DEFAULT_GRACE = 5.0


class ExecFailed(Exception):
    """The command could not be started; `code`/`message` as the control socket shows them."""

    def __init__(self, message: str, *, missing: bool) -> None:
        super().__init__(message)
        self.code = "exec_failed"
        self.message = message
        self.details = {"not_found": missing}


class Execution:
    """One exec'd command: leader `pid`, its process group, its exit (raw wait status)."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        exit_status: asyncio.Future[int],
        *,
        agent_id: str,
        generation: int,
        grace: float,
    ) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.starttime = proc_starttime(proc.pid) or 0  # an unreaped child always has a stat
        self.exit = exit_status
        self.agent_id = agent_id
        self.generation = generation
        self.grace = grace
        self._ending: asyncio.Task[None] | None = None
        exit_status.add_done_callback(self._exited)

    @property
    def root(self) -> tuple[int, int]:
        return (self.pid, self.starttime)

    def describe(self) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "generation": self.generation, "pid": self.pid}

    async def wait(self) -> int:
        return os.waitstatus_to_exitcode(await asyncio.shield(self.exit))

    def send_signal(self, sig: int) -> None:
        killpg_quietly(self.pid, sig)

    def end(self) -> None:
        """SIGTERM the group now; SIGKILL whatever is left of it after `grace`."""
        if self._ending is None or self._ending.done():
            self._ending = asyncio.ensure_future(self._end())

    def _exited(self, future: asyncio.Future[int]) -> None:
        if not future.cancelled():
            emit(
                "supervisor.exec_exited",
                agent_id=self.agent_id,
                generation=self.generation,
                pid=self.pid,
                exit=os.waitstatus_to_exitcode(future.result()),
            )
        if group_alive(self.pid):
            self.end()  # what the command left behind in its group goes with it

    async def _end(self) -> None:
        if await end_group(self.pid, self.exit, self.grace):
            emit("supervisor.exec_killed", agent_id=self.agent_id, pgid=self.pid)


def spawn(
    argv: Sequence[str],
    fds: Sequence[int],
    *,
    cwd: str,
    env: dict[str, str],
    creds: Credentials | None,
    fence: Fence | None = None,
    reaper: Reaper,
    agent_id: str,
    generation: int,
    grace: float = DEFAULT_GRACE,
    group: AgentGroup | None = None,
) -> Execution:
    """Start `argv` with `fds` as stdin/stdout/stderr; no `await`, so the caller registers the
    identity root before the command can attach. `group`: the agent's cgroup (cgroups.py),
    which the command enters before exec, as the agent did. `ExecFailed` when it cannot be
    run."""
    stdin, stdout, stderr = fds
    try:
        placement = group.ensure() if group is not None else ()
        setup = child_setup(
            list(argv), cwd=cwd, env=env, creds=creds, fence=fence, cgroup=placement
        )
        child = procs.spawn(
            setup.argv,
            cwd=setup.cwd,
            env=env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            new_session=True,
            preexec=setup.preexec,
            watch=reaper.watch,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        missing = isinstance(exc, FileNotFoundError)
        raise ExecFailed(procs.spawn_failure_reason(argv[0], exc), missing=missing) from None
    execution = Execution(
        child.proc, child.exit, agent_id=agent_id, generation=generation, grace=grace
    )
    emit(
        "supervisor.exec_spawned",
        agent_id=agent_id,
        generation=generation,
        pid=child.pid,
        argv0=argv[0],
    )
    return execution

    return True
