"""The ACP member's states (acp.md §2): their wire spelling and which of them are ready.

Owns: the states an ACP member reports (`list`'s `state`, the supervisor's `ctl status`
`protocol_state`) and the one readiness rule (`ready`): `available` (it takes a turn now) and
`busy` (once its turn ends) are ready, as agentmux counts them. The session (session.py) moves
through `initializing`, `available`, `busy` and `unavailable`; `recovering` is its host's to
report while a new session is on its way (the supervisor's ACP runner restarts the agent).
Their reason codes are the relay's table's (mcphost/relay/reasons.py).

Must never: import anything of mcphost (the session, the member kind, look's freshness and the
supervisor's runner all read it).
"""

from __future__ import annotations

INITIALIZING = "initializing"
AVAILABLE = "available"
BUSY = "busy"
RECOVERING = "recovering"
UNAVAILABLE = "unavailable"

STATES = (INITIALIZING, AVAILABLE, BUSY, RECOVERING, UNAVAILABLE)
READY_STATES = (AVAILABLE, BUSY)


def ready(state: str | None) -> bool:
    """Whether an ACP member in `state` (None: no session) is ready: it takes a delivery now or
    once its current turn ends."""
    return state in READY_STATES
