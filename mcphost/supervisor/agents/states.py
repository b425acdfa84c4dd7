"""An agent's states: what its runner reports of it, and the rules read from them.

Owns: `AgentState` (`ctl status`'s `state`: starting, running, backoff, failed, stopping,
stopped) with its two rules, `active` (the runner runs the agent, or will by itself: starting,
running or in backoff) and `ended` (nothing starts it again by itself: stopped, or failed; the
relay's `MemberHealth.stopped`); and `AgentStatus`, one runner's report, with `running` (the
agent's process exists). A runner that speaks a protocol with its agent reports the protocol's own
state and its reason code beside (`protocol_state`, `state_reason_code`): an ACP agent's, whose
states and readiness are the relay's (mcphost/relay/acp/states.py) and whose codes are the relay's
table (mcphost/relay/reasons.py). Whether an agent is ready as a relay member is its runner's to
say (`AgentRunner.ready`: its process runs; an ACP agent's session also takes turns).

Must never: import a runner or anything of mcphost (every runner, the relay host and the
operator's status read it).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class AgentState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"

    @property
    def active(self) -> bool:
        """The runner runs the agent, or will by itself (its restart policy's backoff)."""
        return self in (AgentState.STARTING, AgentState.RUNNING, AgentState.BACKOFF)

    @property
    def ended(self) -> bool:
        """Nothing starts the agent again by itself (stopped, or failed for good)."""
        return self in (AgentState.STOPPED, AgentState.FAILED)


@dataclass(frozen=True, slots=True)
class AgentStatus:
    agent_id: str
    state: AgentState
    pid: int | None
    generation: int | None
    restarts: int  # automatic restarts since this runner was created
    started_at: float | None  # wall clock of the current run; None when not running
    last_exit: str | None  # "exit 1", "signal 9"; None before the first exit or a failed spawn
    last_reason: str | None
    # a runner that speaks a protocol with its agent (agents/acp.py): the protocol's own state
    # (an ACP agent's: mcphost/relay/acp/states.py) and its reason code (mcphost/relay/reasons.py)
    protocol_state: str | None = None
    state_reason_code: str | None = None

    @property
    def running(self) -> bool:
        """The agent's process exists (running, with a pid)."""
        return self.state == AgentState.RUNNING and self.pid is not None
