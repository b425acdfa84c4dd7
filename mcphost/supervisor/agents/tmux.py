"""`TmuxRunner`: an agent whose process is a tmux pane (`runner = "tmux"`, and `"auto"` for an
interactive client without a command: fleet.py).

Owns: the agent's tmux session (named after the agent id, one window, one pane whose process
*is* the agent) on a `TmuxServer` (mcphost/relay/tmux.py): its bundle's (the relay host's, seen
through `TmuxServers`: this module never imports relayhost.py, which asks a runner for its
member endpoint, `TmuxEndpoint(server, session)`, instead of knowing its kind), or,
without a bundle, one of its own (`agent_server`: `<state>/tmux/<agent id>/tmux.sock`, 0700
directories; one server per agent, so a pane's `$TMUX` reaches no other agent's pane, and the
server ends with the agent's session). Nothing else: the
restart policy, backoff, intensity, generations, the state machine and the group stop are
`AgentRunner`'s (agents/runner.py), reused through its `_launch` / `_run_ended` seam.

Why a tmux pane and not a pty the supervisor holds: the interactive clients (Claude Code,
Codex) need a terminal that outlives nothing but themselves and that an operator can look at
and type into; tmux already hosts bundle members that way, `ctl logs` shows the screen
(`live_screen`, and the screen at each exit in the log), and restarts are `AgentRunner`'s.

One run: a new generation, `new_session(agent_id, argv, cwd=workspace, env=agent env)` -> the
pane's pid, registered with its start time as the agent's identity root through the same
`on_spawn` callback as a plain process. The tmux server daemonizes and, the supervisor being a
child subreaper, is reparented to the supervisor, so the pane and everything it starts (the
agent's pumps) descend from the pane process: the kernel-ancestry identity holds unchanged. The
exit is observed with a pidfd (`tmux.watch_exit`, which reads the status tmux recorded:
`remain-on-exit` keeps the dead pane), as a raw wait status so `AgentRunner` treats it exactly as
a child's. After each run the pane's last lines are appended to the agent's `RotatingLog` (what
`ctl logs` shows for a tmux agent: the screen at each exit, then `live_screen`, the running
pane's screen captured on demand), then the session is killed. `stop()` is `AgentRunner.stop` (SIGTERM to the pane's
process group, SIGKILL after `stop_grace`), then the session is killed, and the bundle's tmux
server when no owned session is left on it (a server of the agent's own: always).

The spawn awaits the tmux CLI (a plain process's `Popen` does not), so the pane would run
before `on_spawn` registers it, and a pump it started in that window would be refused
(`not_in_fleet`). So the pane starts *gated*: its command is `python3 -I -S gate.py <fifo>
argv...` (mcphost/gate.py `main`), which blocks reading one line from a FIFO under the bundle's runtime
directory (0700): the agent's fenced command (`Fence.message`: bubblewrap around the agent's
argv, which drops `TMUX`/`TMUX_PANE`: the agent never reaches a tmux server), or `{}` with
`sandbox = "none"`; the pane enters the fence exactly as a process agent's child does, then
`execvp`s it (same pid, same start time: the registered root holds). The runner holds the FIFO open read-write from before
`new-session` until the run ends, and writes the line right after `on_spawn`: the agent runs
only once it is known. EOF instead of the line (the runner gave up) ends the gate with status 1;
a fence that cannot be built, with 126; an argv that cannot be exec'd, with 127.

A fenced pane starts in `/`, and bubblewrap sets its working directory inside the fence: the
workspace directory the supervisor holds, by the path the kernel gives that descriptor now
(never through a symlink the agent planted), resolved again in the fenced view: the tmux server
never opens a path the agent controls. An unfenced pane starts in the
workspace path (`sandbox = "none"` agents reach everything their uid can anyway).

Must never: run a shell, pass the environment in an argv, kill a session it does not own (the
`TmuxServer` refuses), or decide restarts itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Mapping
from typing import Protocol

from mcphost import fsutil, gate, procs
from mcphost.events import emit
from mcphost.gate import NO_FENCE, with_cgroup, with_switch
from mcphost.relay import tmux as tm
from mcphost.relay.members.tmux import TmuxEndpoint
from mcphost.supervisor.agents.runner import AgentRunner, Collaborators, HomeDirs, Plan, _Run
from mcphost.supervisor.confine.kernel import proc_starttime, switch_of
from mcphost.supervisor.plan import AgentPlan

CAPTURE_LINES = 1000
DEAD_PANE = "Pane is dead"  # tmux's last line of a dead pane it keeps (remain-on-exit)
# The gate is mcphost/gate.py run as a script (stdlib only, so `-I -S` is enough): see `main`.
GATE = os.path.abspath(gate.__file__)
UNKNOWN_STATUS = 255 << 8  # tmux recorded no status (the session vanished): "exit 255"
TMUX_DIR = "tmux"  # <state>/tmux/<agent id>/: the tmux servers of agents without a bundle


class AgentTmuxServer(tm.TmuxServer):
    """The tmux server of one agent without a bundle, under `<state>/tmux/` (0700, ours)."""

    def prepare_runtime_dir(self) -> None:
        parent = os.path.dirname(self.runtime_dir)
        try:
            fsutil.private_dir(parent)
        except fsutil.NotPrivate:
            raise tm.TmuxError(
                "security_foreign_owned",
                f"{parent} is not a directory owned by the supervisor's user (symlink?)",
            ) from None
        super().prepare_runtime_dir()


def agent_server(
    state_dir: str, agent_id: str, env: Mapping[str, str], watch: tm.Watch | None
) -> tm.TmuxServer:
    """The tmux server of `agent_id`, which has no bundle: `<state>/tmux/<agent id>/tmux.sock`.
    Without tmux on the supervisor's PATH each spawn fails naming the missing program."""
    runtime = os.path.join(state_dir, TMUX_DIR, tm.check_session_name(agent_id))
    return AgentTmuxServer(runtime, tmux=tm.program(env), watch=watch)


def wait_status(code: int | None) -> int:
    """tmux's exit code (-N: signal N; None: unknown) as a raw `waitpid` status."""
    if code is None:
        return UNKNOWN_STATUS
    if code < 0:
        return (-code) & 0x7F
    return (code & 0xFF) << 8


class TmuxServers(Protocol):
    """What a tmux runner reads of the relay host: its bundle's tmux server."""

    def tmux_server(self, bundle: str) -> tm.TmuxServer: ...


class Site(Protocol):
    """What a tmux runner reads of the supervisor when it is built (`TmuxRunner.hosted`)."""

    @property
    def state_dir(self) -> str: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def relay(self) -> TmuxServers | None: ...


class TmuxRunner(AgentRunner):
    """Runs one agent as a tmux session of `server` (its bundle's). Event loop thread only."""

    @classmethod
    def hosted(
        cls, plan: AgentPlan, home: HomeDirs, given: Collaborators, site: Site
    ) -> AgentRunner:
        """A pane of its bundle's tmux server (the relay's), or of a server of its own."""
        if plan.bundle is not None and site.relay is not None:
            server = site.relay.tmux_server(plan.bundle)
        else:
            server = agent_server(site.state_dir, plan.agent_id, site.env, given.reaper.watch)
        return cls(plan, home, given, server=server)

    def __init__(
        self, plan: Plan, home: HomeDirs, given: Collaborators, *, server: tm.TmuxServer
    ) -> None:
        super().__init__(plan, home, given)
        self.server = server
        self.session = tm.check_session_name(plan.agent_id)
        # tmux takes only POSIX-shaped names (a `BASH_FUNC_x%%` export cannot be passed on).
        self._pane_env = {k: v for k, v in given.env.items() if tm.ENV_NAME.fullmatch(k)}
        self._watchers: set[asyncio.Task[None]] = set()
        self._gate: int | None = None  # our read-write end of the pane's gate FIFO
        self._gate_path = os.path.join(self.server.runtime_dir, f"{self.session}.gate")

    async def _launch(self) -> _Run | None:
        await self._reserve_generation()
        generation = self._new_generation()
        # fenced: the command bubblewrap runs (its working directory set inside), and the
        # pane starts in "/": the tmux server never opens a path the agent controls
        message, cwd = NO_FENCE, os.fspath(self.home.workspace)
        if self._fence is not None:
            try:  # refused as a process agent's spawn is: its program, named in one line
                held = self._cwd  # the held workspace (/proc/self/fd/N), or its path
                message, cwd = self._fence.message(list(self._argv), self._pane_env, held), "/"
            except OSError as exc:
                self._spawn_failed(generation, procs.spawn_failure_reason(self._argv[0], exc))
                return None
        try:
            message = with_cgroup(message, self.enter_group())  # the gate enters it first
            # then becomes the agent's user, unless the fence's bubblewrap switches inside
            outside = self._fence is None or self._fence.switch_outside
            message = with_switch(message, switch_of(self._creds) if outside else None)
            await self._kill_session()  # a leftover of an earlier run or supervisor
            gated = [sys.executable, "-I", "-S", GATE, self._open_gate(), *self._argv]
            pid = await self.server.new_session(self.session, gated, cwd=cwd, env=self._pane_env)
        except (tm.TmuxError, OSError, ValueError) as exc:
            self._close_gate()
            why = exc.message if isinstance(exc, tm.TmuxError) else str(exc)
            self._spawn_failed(generation, f"cannot start tmux session {self.session!r}: {why}")
            return None
        starttime = proc_starttime(pid)
        loop = asyncio.get_running_loop()
        exit_future: asyncio.Future[int] = loop.create_future()
        watcher = loop.create_task(self._watch(pid, exit_future), name=f"pane:{self.agent_id}")
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        run = _Run(None, pid, generation, exit_future, loop.time())
        self._register(run, starttime)
        self._release_gate(message)  # registered (or killed, if on_spawn failed): now it may run
        return run

    def _open_gate(self) -> str:
        """A fresh FIFO, held open read-write (never blocks; keeps a written byte until the
        pane reads it, however late it opens the FIFO); its path."""
        self._close_gate()
        self.server.prepare_runtime_dir()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._gate_path)
        os.mkfifo(self._gate_path, 0o600)
        self._gate = os.open(self._gate_path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        return self._gate_path

    def _release_gate(self, message: bytes) -> None:
        """Hand the pane its fenced command (or `{}`: none) as one line: it enters, then execs."""
        if self._gate is not None:
            with contextlib.suppress(OSError):
                os.write(self._gate, message)

    def _close_gate(self) -> None:
        if self._gate is not None:
            os.close(self._gate)
            self._gate = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._gate_path)

    async def _watch(self, pid: int, done: asyncio.Future[int]) -> None:
        try:
            code = await tm.watch_exit(self.server, self.session, pid)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # tmux failed to answer: the pidfd still says when it ended
            emit("supervisor.pane_watch_failed", agent_id=self.agent_id, error=repr(exc))
            await _pid_gone(pid)
            code = None
        if not done.done():
            done.set_result(wait_status(code))

    async def _run_ended(self, run: _Run) -> None:
        """Keep the pane's last screen in the agent's log, then kill the (dead) session."""
        self._close_gate()
        try:
            lines = await self._screen(CAPTURE_LINES)
        except tm.TmuxError:
            lines = []
        if lines:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            text = (
                f"--- tmux pane of {self.agent_id}, generation {run.generation}, at exit "
                f"({stamp}) ---\n" + "\n".join(lines) + "\n"
            )
            try:
                self._ensure_log().write(text.encode("utf-8", "replace"))
            except OSError as exc:
                emit("supervisor.log_write_failed", level="error", error=str(exc))
        await self._kill_session()

    async def _screen(self, lines: int) -> list[str]:
        """The pane's last `lines` lines as an operator reads them: a line the pane wrapped is
        one line (words are never cut at its width), and the blank screen between the agent's
        last words and tmux's "Pane is dead" line of a dead pane is dropped, so a short
        capture shows the error, not the blank rows under it."""
        screen = await self.server.capture(self.session, CAPTURE_LINES, joined=True)
        if screen and screen[-1].startswith(DEAD_PANE):
            end = len(screen) - 1
            while end and not screen[end - 1].strip():
                end -= 1
            screen = [*screen[:end], screen[-1]]
        return screen[-lines:]

    async def live_screen(self, lines: int = CAPTURE_LINES) -> bytes:
        """The running pane's last `lines` lines (at most 1000) under a header, for `ctl logs`;
        empty when the agent is not running."""
        status = self.status()
        if not status.running:
            return b""
        try:
            screen = await self._screen(max(1, min(lines, CAPTURE_LINES)))
        except tm.TmuxError:
            return b""
        header = f"--- tmux pane of {self.agent_id}, generation {status.generation}, now ---\n"
        return (header + "".join(line + "\n" for line in screen)).encode("utf-8", "replace")

    def endpoint(self) -> TmuxEndpoint:
        """The tmux member's endpoint: the pane's server (its bundle's) and session."""
        return TmuxEndpoint(self.server, self.session)

    async def _kill_session(self) -> None:
        with contextlib.suppress(tm.TmuxError):
            await self.server.kill_session(self.session, grace=self.plan.stop_grace)

    async def stop(self) -> None:
        """`AgentRunner.stop`, then the session, then the tmux server if it hosts no one else."""
        await super().stop()
        await self._kill_session()
        with contextlib.suppress(tm.TmuxError):
            if await self.server.kill_server():
                emit("supervisor.tmux_server_stopped", socket=self.server.socket_path)

    async def aclose(self) -> None:
        await super().aclose()
        self._close_gate()
        for task in list(self._watchers):
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)


async def _pid_gone(pid: int) -> None:
    """Wait until process `pid` exited (pidfd); at once if it is gone already."""
    fd = procs.open_pidfd(pid)
    if fd is None:
        return
    try:
        await procs.wait_pidfd(fd, None)
    finally:
        os.close(fd)
