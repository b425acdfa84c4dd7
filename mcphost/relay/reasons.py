"""The relay's reason codes of its members and their choices: one table, by name, once (as the
supervisor's refusals.py is for its refusals).

Owns: the wire spelling of every reason code an ACP member, a member's host or the choices queue
gives (acp.md §2-§6), whatever module raises or reports it:
- a member's state (`list`'s `state_reason_code`, a host's startup failure, the supervisor's
  `ctl status`): `ACP_INITIALIZE_FAILED`, `ACP_SESSION_LOAD_FAILED`, `ACP_SESSION_NEW_FAILED`,
  `ACP_MISSING_CAPABILITY` (permanent: no restart can mend it), `ACP_WORKER_UNAVAILABLE`,
  `ACP_FLOOD` (past a bound of the connection, SECURITY.md X10), `TRANSPORT_UNAVAILABLE` (the
  member cannot be reached now), `STARTUP_FAILED` (its process could not be started; also a
  bundle with none ready, and a failed `up`), `SHUTDOWN_FAILED` (a failed `down`);
- a permission choice's resolution (`choices.resolved` `reason_code`, `choices_pick`'s
  refusals): `CHOICES_QUEUE_FULL`, `CHOICE_ALREADY_RESOLVED`, `CHOICE_CANCELLED` (the agent
  ended its turn without it, or the relay shut down), `CHOICE_INVALIDATED_BY_RESPAWN` (the
  agent exited mid-turn);
- why look's snapshot of an ACP member is stale (`stale_reason_code`): `STALE_UNAVAILABLE`,
  `STALE_RECOVERING`, `STALE_INITIALIZING`, `STALE_PRIME_TIMEOUT`.

The rest of the relay's codes (a request's `validation_*`, identity, delivery outcomes) are
still raised where they are checked. tests/relay/test_reasons.py pins each spelling and checks
that no module under mcphost/ writes one of these codes in place.

Must never: import anything (the relay's modules and the supervisor's runners all read it).
"""

from __future__ import annotations

# -- a member's state ------------------------------------------------------------------------
ACP_INITIALIZE_FAILED = "runtime_acp_initialize_failed"
ACP_SESSION_LOAD_FAILED = "runtime_acp_session_load_failed"
ACP_SESSION_NEW_FAILED = "runtime_acp_session_new_failed"
ACP_MISSING_CAPABILITY = "validation_missing_acp_capability"
ACP_WORKER_UNAVAILABLE = "runtime_acp_worker_unavailable"
ACP_FLOOD = "runtime_acp_flood"
TRANSPORT_UNAVAILABLE = "transport_unavailable"
STARTUP_FAILED = "runtime_startup_failed"
SHUTDOWN_FAILED = "runtime_shutdown_failed"

MEMBER = (
    ACP_INITIALIZE_FAILED,
    ACP_SESSION_LOAD_FAILED,
    ACP_SESSION_NEW_FAILED,
    ACP_MISSING_CAPABILITY,
    ACP_WORKER_UNAVAILABLE,
    ACP_FLOOD,
    TRANSPORT_UNAVAILABLE,
    STARTUP_FAILED,
    SHUTDOWN_FAILED,
)
PERMANENT = frozenset({ACP_MISSING_CAPABILITY})  # no restart of the agent can mend it

# -- a permission choice's resolution --------------------------------------------------------
CHOICES_QUEUE_FULL = "runtime_choices_queue_full"
CHOICE_ALREADY_RESOLVED = "runtime_choices_request_already_resolved"
CHOICE_CANCELLED = "runtime_choices_request_cancelled"
CHOICE_INVALIDATED_BY_RESPAWN = "runtime_choices_request_invalidated_by_respawn"

CHOICES = (
    CHOICES_QUEUE_FULL,
    CHOICE_ALREADY_RESOLVED,
    CHOICE_CANCELLED,
    CHOICE_INVALIDATED_BY_RESPAWN,
)

# -- why look's snapshot of an ACP member is stale -------------------------------------------
STALE_UNAVAILABLE = "acp_worker_unavailable"
STALE_RECOVERING = "acp_worker_recovering"
STALE_INITIALIZING = "acp_worker_initializing"
STALE_PRIME_TIMEOUT = "acp_snapshot_prime_timeout"

STALE = (STALE_UNAVAILABLE, STALE_RECOVERING, STALE_INITIALIZING, STALE_PRIME_TIMEOUT)

CODES = (*MEMBER, *CHOICES, *STALE)
"""Every code of the table, once."""
