"""`AcpRunner`: an agent driven over the Agent Client Protocol (`runner = "acp"`, plan.py).

Owns: the ACP agent's stdio and its ACP session for the agent's life. One run: a new
generation, the agent spawned like any process agent (fenced, its own session and process
group, `on_spawn` before anything can attach) but with three pipes: its stdin and stdout carry
ACP's newline-delimited JSON-RPC (`mcphost.relay.acp.session.AcpSession`, the client side, over
`mcphost.relay.acp.transport.BoundedTransport`: the per-agent bounds of SECURITY.md X10; the
stdout reader's own buffer is `transport.READ_BUFFER`, a frame is read in pieces up to its bound), its
stderr goes to its `RotatingLog` (what `ctl logs` shows). Then the handshake, as its own task:
`initialize`, then `session/load` with the session id this runner persisted for the agent when
the agent offers `loadSession`, else `session/new`; both carry the agent's MCP servers (its own
attach entries: the center host and the relay tools through the pump, so the kernel identifies
them as the agent's; never a token). The id is persisted (`{"schema_version": 2,
"acp_session_id": ...}`, 0600, in the supervisor's state directory, never the agent's home,
which the agent could rewrite) for the next spawn.

Failures keep agentmux's codes (reference acp.md §2, §6) as the state reason:
`runtime_acp_initialize_failed`, `runtime_acp_session_new_failed`,
`runtime_acp_session_load_failed` (no fallback to a new session: a load that fails is reported,
and the next spawn tries again), `runtime_startup_failed` (the id could not be persisted, or the
agent could not be spawned at all). The runner then ends the agent's
process group and the restart policy decides, with backoff and a new generation, as for every
agent (`AgentRunner`); `validation_missing_acp_capability` (no prompt support) is permanent: the
agent is `failed` at once, since no restart can mend it. Once bootstrapped, a session that
raises its respawn signal (the agent's stdout closed mid-turn or found closed at a prompt, a
write to its stdin failed, or the agent exceeded a bound of its connection, `runtime_acp_flood`:
it can take no turn any more, though its process may live on) has
the runner end the agent's process group the same way, so the policy restarts it. The ACP state
(initializing, available, busy, recovering, unavailable) and its reason code are in `status()`,
so `ctl status` and the relay's `list` show them.

The relay reaches the session through the host (relayhost.py) as the member's endpoint:
`session` is the live `AcpSession`, None between runs. The runner closes it when its run ends,
which ends a turn in flight and hands the pending choices of the agent back cancelled (the
relay's ACP member, `mcphost/relay/members/acp.py`, invalidates them with a reason).

Must never: give the agent a token, a socket of the supervisor's or an environment variable the
plan did not (its MCP servers are attach entries), read the persisted id from anywhere the agent
can write, or decide restarts itself beyond the one permanent failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from mcphost import fsutil
from mcphost.agentmux.wire import RelayError
from mcphost.events import emit
from mcphost.relay import reasons as R
from mcphost.relay.acp import states as S
from mcphost.relay.acp.session import AcpSession
from mcphost.relay.acp.transport import READ_BUFFER
from mcphost.relay.members.acp import AcpEndpoint
from mcphost.supervisor.agents.runner import (
    AgentRunner,
    Collaborators,
    HomeDirs,
    Plan,
    _LogPipe,
    _Run,
)
from mcphost.supervisor.agents.states import AgentStatus
from mcphost.supervisor.confine.kernel import killpg_quietly
from mcphost.supervisor.plan import AgentPlan

ACP_DIR = "acp"  # <state>/acp/<agent id>.json: each ACP agent's persisted session id

SESSION_SCHEMA = 2

OnSession = Callable[["AcpRunner", AcpSession | None], None]


class Site(Protocol):
    """What an ACP runner reads of the supervisor when it is built (`AcpRunner.hosted`)."""

    @property
    def state_dir(self) -> str: ...


def read_session_id(path: str) -> str | None:
    """The persisted ACP session id at `path`, or None; a file that does not parse, or of
    another schema, is removed and treated as absent (agentmux's rule)."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(1 << 16))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        data = None
    value = data.get("acp_session_id") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("schema_version") != SESSION_SCHEMA:
        value = None
    if not isinstance(value, str) or not value:
        try:
            os.unlink(path)
        except OSError:
            pass
        return None
    return value


def write_session_id(path: str, session_id: str) -> None:
    """Persist `session_id` at `path` (0600, atomically, its directory 0700)."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    body = json.dumps({"schema_version": SESSION_SCHEMA, "acp_session_id": session_id})
    fsutil.write_atomic(path, body.encode(), 0o600)


class AcpRunner(AgentRunner):
    """Runs one ACP agent under its plan (see the module docstring)."""

    STDIO = (subprocess.PIPE, subprocess.PIPE, subprocess.PIPE)

    @classmethod
    def hosted(
        cls, plan: AgentPlan, home: HomeDirs, given: Collaborators, site: Site
    ) -> AgentRunner:
        """An ACP agent with its own attach entries as its MCP servers and its session id kept
        under `<state>/acp/`."""
        from configgen.clients import acp_servers
        from mcphost.supervisor.agents.homes import attach_config
        from mcphost.supervisor.agents.reach import attach_points

        servers = acp_servers(attach_config(plan, attach_points(site.state_dir)))
        held = given.cwd

        def workspace() -> str:  # the held workspace, where it is now (the fence binds it there)
            if held is not None and held.startswith("/proc/self/fd/"):
                return os.readlink(held)
            return os.path.realpath(os.fspath(home.workspace))

        return cls(
            plan,
            home,
            given,
            session_file=os.path.join(site.state_dir, ACP_DIR, plan.agent_id + ".json"),
            mcp_servers=servers,
            workspace=workspace,
            target_session=f"{plan.agent_id}@{plan.bundle}" if plan.bundle else None,
        )

    def __init__(
        self,
        plan: Plan,
        home: HomeDirs,
        given: Collaborators,
        *,
        session_file: str,
        mcp_servers: Sequence[dict[str, Any]],
        workspace: Callable[[], str],
        target_session: str | None = None,
    ) -> None:
        """`session_file`: where the ACP session id persists (the supervisor's state);
        `mcp_servers`: the agent's own MCP servers in ACP's shape (configgen.acp_servers);
        `workspace`: the agent's working directory as the agent sees it (ACP's `cwd`)."""
        super().__init__(plan, home, given)
        self.session_file = session_file
        self._mcp_servers = [dict(server) for server in mcp_servers]
        self._workspace = workspace
        self.target_session = target_session  # `<agent>@<bundle>`, the relay's name for it
        self.session: AcpSession | None = None
        self.on_session: OnSession | None = None  # told when a session comes or goes (none: the
        # relay host reads `session` through its endpoint; tests watch the hand-overs here)
        self._handshake: asyncio.Task[None] | None = None
        self._failure: tuple[str, str] | None = None  # (code, message) of this run's handshake
        self._lost: tuple[str, str] | None = None  # (code, reason): the connection failed after
        self._reason_code: str | None = None

    # -- status ----------------------------------------------------------------------------
    def status(self) -> AgentStatus:
        base = super().status()
        session = self.session
        state = session.state if session is not None else None
        code = session.state_reason_code if session is not None else self._reason_code
        if state is None and self._reason_code is not None:
            state = S.UNAVAILABLE
        return dataclasses.replace(base, protocol_state=state, state_reason_code=code)

    # -- the relay's endpoint (relay/members/acp.py AcpEndpoint) ----------------------------
    def endpoint(self) -> AcpEndpoint:
        """The ACP member's endpoint: this runner (its live `session`, `idle_state`, `stopped`)."""
        return self

    def ready(self) -> bool:
        """Its process runs and its ACP session takes turns (or is in one)."""
        status = self.status()
        return status.running and S.ready(status.protocol_state)

    def idle_state(self) -> tuple[str, str | None]:
        """The ACP state to report while there is no session: `recovering` while the policy
        restarts the agent, `unavailable` once nothing will; with the last reason code."""
        if self.status().state.active:
            return S.RECOVERING, self._reason_code
        return S.UNAVAILABLE, self._reason_code or R.ACP_WORKER_UNAVAILABLE

    @property
    def stopped(self) -> bool:
        """Nothing will start the agent again by itself (stopped, or failed for good)."""
        return self.status().state.ended

    # -- one run ---------------------------------------------------------------------------
    async def _attach_output(self, run: _Run) -> None:
        proc = run.proc
        if proc is None or proc.stdout is None or proc.stdin is None or proc.stderr is None:
            return
        loop = asyncio.get_running_loop()
        log = self._ensure_log()
        err, _ = await loop.connect_read_pipe(
            lambda: _LogPipe(log, self._pipes.discard), proc.stderr
        )
        self._pipes.add(err)
        # a small read buffer: the transport reads a frame up to its bound in pieces
        reader = asyncio.StreamReader(limit=READ_BUFFER)
        out, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), proc.stdout
        )
        self._pipes.add(out)
        # the stdlib's flow control for a write pipe: what `StreamWriter.drain` waits on (and
        # raises ConnectionResetError from, once the agent's stdin is closed)
        protocol = asyncio.streams.FlowControlMixin()
        inp, _ = await loop.connect_write_pipe(lambda: protocol, proc.stdin)
        self._pipes.add(inp)
        writer = asyncio.StreamWriter(inp, protocol, None, loop)
        self._failure = self._lost = None
        self._reason_code = None
        session = AcpSession(reader, writer, target_session=self.target_session)
        session.on_state = lambda state, code: self._on_state(run, session, state, code)
        self.session = session
        self._notify(session)
        self._handshake = loop.create_task(
            self._bootstrap(run, session), name=f"acp-handshake:{self.agent_id}"
        )

    def _on_state(self, run: _Run, session: AcpSession, state: str, code: str | None) -> None:
        """The session's respawn signal once it is bootstrapped (its stdout closed mid-turn, a
        write to its stdin failed, or its stdout was found closed at a prompt): the agent can
        take no turn any more, though its process may live on, so its process group is ended
        and the restart policy brings it back. A failed handshake is `_handshake_failed`'s."""
        handshake = self._handshake
        if (
            state != S.UNAVAILABLE
            or not session.needs_respawn
            or session is not self.session
            or handshake is None
            or not handshake.done()
            or self._lost is not None
            or run.exit.done()
            or not self._want  # being stopped: the connection closes with the process
        ):
            return
        self._lost = (
            code or R.ACP_WORKER_UNAVAILABLE,
            session.state_reason or "the connection failed",
        )
        self._reason_code = code
        emit(
            "supervisor.acp_connection_lost",
            level="warning",
            agent_id=self.agent_id,
            generation=run.generation,
            code=self._lost[0],
            reason=self._lost[1],
        )
        killpg_quietly(run.pid, signal.SIGTERM)

    async def _bootstrap(self, run: _Run, session: AcpSession) -> None:
        load = read_session_id(self.session_file)
        try:
            session_id = await session.bootstrap(
                cwd=self._workspace(), mcp_servers=self._mcp_servers, resume_session_id=load
            )
            write_session_id(self.session_file, session_id)
        except RelayError as exc:
            self._handshake_failed(run, exc.code, exc.message)
            return
        except OSError as exc:
            self._handshake_failed(run, R.STARTUP_FAILED, f"cannot persist: {exc}")
            return
        emit(
            "supervisor.acp_ready",
            agent_id=self.agent_id,
            generation=run.generation,
            loaded=load is not None and load == session_id,
        )

    def _handshake_failed(self, run: _Run, code: str, message: str) -> None:
        self._failure = (code, message)
        self._reason_code = code
        emit(
            "supervisor.acp_handshake_failed",
            level="error",
            agent_id=self.agent_id,
            generation=run.generation,
            code=code,
            reason=message,
        )
        if not run.exit.done():
            killpg_quietly(run.pid, signal.SIGTERM)

    def _spawn_failed(self, generation: int, reason: str) -> None:
        self._reason_code = R.STARTUP_FAILED  # no process, so no session: acp.md's code for it
        super()._spawn_failed(generation, reason)

    def _exit_reason(self, code: int, stopped_by_us: bool) -> str:
        if self._failure is not None and not stopped_by_us:
            failure_code, message = self._failure
            return f"{failure_code}: {message}"
        reason = super()._exit_reason(code, stopped_by_us)
        if self._lost is not None and not stopped_by_us:
            lost_code, why = self._lost
            return f"{reason}, after its ACP connection failed ({lost_code}: {why})"
        return reason

    def _given_up(self) -> str | None:
        exhausted = super()._given_up()
        if exhausted is not None:
            return exhausted
        if self._failure is not None and self._failure[0] in R.PERMANENT:
            return f"{self._failure[0]}: {self._failure[1]} (no restart can mend it)"
        return None

    async def _run_ended(self, run: _Run) -> None:
        task, self._handshake = self._handshake, None
        if task is not None and not task.done():
            task.cancel()
        session, self.session = self.session, None
        if session is not None:
            await session.close()
            if not self._want:  # stopped: nothing failed, whatever the closing pipes said
                self._reason_code = R.ACP_WORKER_UNAVAILABLE
            elif self._reason_code is None:
                self._reason_code = session.state_reason_code
        self._notify(None)

    def _notify(self, session: AcpSession | None) -> None:
        if self.on_session is not None:
            try:
                self.on_session(self, session)
            except Exception as exc:
                emit("supervisor.on_session_failed", level="error", error=repr(exc))
