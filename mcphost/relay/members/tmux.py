"""The tmux member: a bundle member whose agent runs in a pane of its bundle's tmux server.

Owns: `KIND` (the tmux `MemberKind`: a member whose coder has a `[coders.tmux]` section; look
default 120 lines, no offset, no choices), `TmuxEndpoint` (what the host hands over for such a
member: the bundle's `TmuxServer` and the member's session name) and `TmuxMember`: readiness (the
pane exists while the host says its process runs, so the host's readiness is the member's),
delivery through the coder's readiness gate and one bracketed paste and submit
(`panes.deliver`), raww (`panes.raw_write`), and look (`TmuxServer.capture`: `snapshot_format`
"lines").

Must never: call tmux but through `TmuxServer` and `panes`, decide what is delivered (the relay's
delivery workers take the batch), or import the relay's operations or `mcphost.supervisor`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from mcphost.agentmux.bundlefile import Bundle, Session, TmuxCoder
from mcphost.relay import panes
from mcphost.relay import tmux as tm
from mcphost.relay.members.port import (
    Batch,
    ChoicesFactory,
    MemberContext,
    Readiness,
    Snapshot,
    unavailable,
)
from mcphost.relay.outcome import UNREACHABLE, Delivery

TRANSPORT = "tmux"


class TmuxEndpoint(NamedTuple):
    """A tmux member's endpoint: its bundle's tmux server and the member's session name."""

    server: tm.TmuxServer
    session: str


def gate(coder: TmuxCoder, context: MemberContext) -> panes.Gate:
    """The coder's readiness gate (coders.toml `prompt-regex` etc.) with the relay's timing."""
    return panes.Gate(
        quiet_ms=context.quiet_ms,
        prompt_regex=coder.prompt_regex,
        inspect_lines=coder.prompt_inspect_lines,
        idle_column=coder.prompt_idle_column,
        timeout_ms=coder.readiness_timeout_ms,
        prime_timeout_ms=coder.prime_timeout_ms,
        poll_ms=context.poll_ms,
    )


@dataclass(frozen=True, slots=True)
class TmuxMember:
    """One pane: `endpoint` and its coder's `gate`; `target` is its principal id."""

    endpoint: TmuxEndpoint
    gate: panes.Gate
    target: str
    transport: str = TRANSPORT

    def readiness(self) -> Readiness:
        return Readiness(True)

    async def deliver(self, take: Callable[[], Batch]) -> Delivery:
        server, name = self.endpoint
        return await panes.deliver(server, name, self.gate, lambda: take().text)

    async def write_raw(self, text: str, no_enter: bool) -> Delivery:
        server, name = self.endpoint
        try:
            return await panes.raw_write(server, name, text, no_enter)
        except tm.TmuxError as exc:
            return Delivery("not_submitted", UNREACHABLE, exc.message)

    async def look(self, lines: int, offset: int) -> Snapshot:
        server, name = self.endpoint
        try:
            snapshot = await server.capture(name, lines)
        except tm.NoSuchSession:
            raise unavailable(self.target, "the target session is not running") from None
        except tm.TmuxError as exc:
            raise unavailable(self.target, exc.message) from None
        return Snapshot({"snapshot_format": "lines", "snapshot_lines": snapshot}, len(snapshot))


class TmuxKind:
    """The tmux `MemberKind` (module doc)."""

    transport = TRANSPORT
    default_look_lines = tm.DEFAULT_LOOK_LINES
    supports_offset = False
    choices_queue: ChoicesFactory | None = None

    def accepts(self, bundle: Bundle, session: Session) -> bool:
        coder = bundle.coder_for(session)
        return session.transport == TRANSPORT and coder is not None and coder.tmux is not None

    def bind(
        self, bundle: Bundle, session: Session, endpoint: object, context: MemberContext
    ) -> TmuxMember | None:
        coder = bundle.coder_for(session)
        if not isinstance(endpoint, TmuxEndpoint) or coder is None or coder.tmux is None:
            return None
        return TmuxMember(endpoint, gate(coder.tmux, context), session.principal_id(bundle.id))


KIND = TmuxKind()
