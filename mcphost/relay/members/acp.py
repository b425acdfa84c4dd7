"""The ACP member: a bundle member driven over the Agent Client Protocol (acp.md §2-§5).

Owns: `KIND` (the ACP `MemberKind`: a member whose coder has a `[coders.acp]` section; look
default 50 entries, offsets, and a per-bundle `ChoicesQueue`), `AcpEndpoint` (what the host
hands over: a live view of the member's current `AcpSession`, None between runs, and the state
to report then) and `AcpMember`:
- readiness: the session's state (ready as the ACP states say, acp/states.py: `available` and
  `busy`, as agentmux counts them), else the host's (`recovering` while it restarts the agent, with the last reason code);
- delivery: once the session is `available` (no turn runs), the batch is one `session/prompt`
  whose text is the envelopes; `delivered` once its frame is written (the turn then runs; how
  it ends changes no outcome, acp.md §3); a write that failed is `submission_unknown`
  (`transport_unavailable`); a member whose host says it is stopped is `not_submitted`;
- raww: the text verbatim, as its own prompt turn;
- choices: before each turn the session's chooser is the bundle's queue, correlated with the
  turn's head message id; when the turn ends, what it raised and is still pending is resolved
  cancelled: `runtime_choices_request_invalidated_by_respawn` when the agent exited (it is
  restarted by its policy), `runtime_choices_request_cancelled` when it ended the turn itself;
- look: the session's structured entries (`structured_entries_v1`), windowed by `lines` and
  `offset`, with freshness and the stale reason codes (entries.py `freshness`), after at most
  the prime wait (750 ms) while the session initializes.

Waiting for the session polls every `poll_ms` (the relay's), as agentmux's writer polls
readiness; there is no turn timeout (agentmux retired it), so a member waits for its agent's
turn to end or its restart.

Must never: start, signal or restart a process (the host does), send `session/cancel`, or import
the relay's operations or `mcphost.supervisor`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mcphost.agentmux.bundlefile import Bundle, Session
from mcphost.agentmux.wire import RelayError
from mcphost.relay import reasons as R
from mcphost.relay.acp import states as S
from mcphost.relay.acp.choices import PENDING_MAX_DEFAULT, ChoicesQueue
from mcphost.relay.acp.entries import freshness
from mcphost.relay.acp.session import AcpSession
from mcphost.relay.members.port import (
    Batch,
    ChoiceRecord,
    Choices,
    ChoicesFactory,
    MemberContext,
    Readiness,
    Snapshot,
)
from mcphost.relay.outcome import UNREACHABLE, Delivery

TRANSPORT = "acp"
DEFAULT_LOOK_LINES = 50
PRIME_WAIT_SECONDS = 0.75


class AcpEndpoint(Protocol):
    """What the host hands over for an ACP member (the supervisor's `AcpRunner` is one): the
    live session (None between runs), the state to report without one (`recovering` while the
    agent restarts, `unavailable` when it will not) and its reason code, and whether the member
    is stopped for good (nothing will start it again by itself)."""

    @property
    def session(self) -> AcpSession | None: ...

    def idle_state(self) -> tuple[str, str | None]: ...

    @property
    def stopped(self) -> bool: ...


def _queue(
    pending_max: int = PENDING_MAX_DEFAULT,
    on_requested: ChoiceRecord | None = None,
    on_resolved: ChoiceRecord | None = None,
) -> Choices:
    return ChoicesQueue(pending_max, on_requested=on_requested, on_resolved=on_resolved)


@dataclass(eq=False)
class AcpMember:
    """One ACP member bound to its endpoint; `target` is its principal id."""

    endpoint: AcpEndpoint
    target: str
    context: MemberContext
    transport: str = TRANSPORT

    def readiness(self) -> Readiness:
        session = self.endpoint.session
        if session is None:
            state, code = self.endpoint.idle_state()
            return Readiness(False, state, code)
        return Readiness(S.ready(session.state), session.state, session.state_reason_code)

    async def _available(self) -> AcpSession | None:
        """The session once it takes a turn; None when the host says the member is stopped."""
        while True:
            session = self.endpoint.session
            if session is not None and session.state == S.AVAILABLE:
                return session
            if self.endpoint.stopped:
                return None
            if session is not None and session.state == S.BUSY:
                await session.turn_done.wait()
                continue
            await asyncio.sleep(self.context.poll_ms / 1000)

    async def _turn(self, session: AcpSession, text: str, head: str | None) -> Delivery:
        queue = self.context.choices
        if isinstance(queue, ChoicesQueue):
            target = self.target

            async def chooser(params: dict[str, Any], acp_id: int | str | None) -> dict[str, Any]:
                return await queue.ask(target, head, params, acp_id)

            session.chooser = chooser
        try:
            written = await session.prompt(text)
        except RelayError as err:
            return Delivery("submission_unknown", err.code, err.message)
        if not written:
            return Delivery(
                "not_submitted", R.ACP_WORKER_UNAVAILABLE, "the agent could not take the turn"
            )
        if queue is not None:
            task = asyncio.get_running_loop().create_task(self._turn_ended(session, queue))
            _TURN_WATCHERS.add(task)
            task.add_done_callback(_TURN_WATCHERS.discard)
        return Delivery("delivered", None, None)

    async def _turn_ended(self, session: AcpSession, queue: Choices) -> None:
        """Once the turn ends, the choices it raised that are still pending can never be
        answered: the agent cancelled its turn, or exited (and is restarted by its policy)."""
        await session.turn_done.wait()
        if session.state == S.UNAVAILABLE:
            queue.invalidate(
                self.target,
                R.CHOICE_INVALIDATED_BY_RESPAWN,
                "the agent exited mid-turn; it is restarted per its policy",
            )
        else:
            queue.invalidate(self.target, R.CHOICE_CANCELLED, "the agent ended its turn without it")

    async def deliver(self, take: Callable[[], Batch]) -> Delivery:
        session = await self._available()
        batch = take()
        if session is None:
            return Delivery("not_submitted", UNREACHABLE, "the target was stopped")
        head = batch.message_ids[0] if batch.message_ids else None
        return await self._turn(session, batch.text, head)

    async def write_raw(self, text: str, no_enter: bool) -> Delivery:
        session = await self._available()
        if session is None:
            return Delivery("not_submitted", UNREACHABLE, "the target was stopped")
        return await self._turn(session, text, None)

    async def look(self, lines: int, offset: int) -> Snapshot:
        session = self.endpoint.session
        waited = False
        if session is not None and session.state == S.INITIALIZING:
            deadline = time.monotonic() + PRIME_WAIT_SECONDS
            while session.state == S.INITIALIZING and time.monotonic() < deadline:
                await asyncio.sleep(min(0.025, self.context.poll_ms / 1000))
            waited = session.state == S.INITIALIZING
        if session is None:
            entries: list[dict[str, Any]] = []
            total = 0
            state: str | None = self.endpoint.idle_state()[0]
        else:
            entries, total = session.entries.window(lines, offset)
            state = session.state
        fresh, reason, source = freshness(state, total, waited)
        fields: dict[str, Any] = {
            "snapshot_format": "structured_entries_v1",
            "snapshot_entries": entries,
            "entries_total": total,
            "returned_entries_count": len(entries),
            "freshness": fresh,
            "snapshot_source": source,
        }
        if reason is not None:
            fields["stale_reason_code"] = reason
        if session is not None and session.last_frame_at is not None:
            fields["snapshot_age_ms"] = int((time.monotonic() - session.last_frame_at) * 1000)
        return Snapshot(fields, len(entries))


# the watchers of turns in flight (a task must be referenced until it ends)
_TURN_WATCHERS: set[asyncio.Task[None]] = set()


class AcpKind:
    """The ACP `MemberKind` (module doc)."""

    transport = TRANSPORT
    default_look_lines = DEFAULT_LOOK_LINES
    supports_offset = True
    choices_queue: ChoicesFactory | None = staticmethod(_queue)

    def accepts(self, bundle: Bundle, session: Session) -> bool:
        coder = bundle.coder_for(session)
        return session.transport == TRANSPORT and coder is not None and coder.transport == "acp"

    def bind(
        self, bundle: Bundle, session: Session, endpoint: object, context: MemberContext
    ) -> AcpMember | None:
        if not hasattr(endpoint, "idle_state") or not hasattr(endpoint, "session"):
            return None
        return AcpMember(endpoint, session.principal_id(bundle.id), context)  # type: ignore[arg-type]


KIND = AcpKind()
