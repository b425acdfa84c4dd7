"""The relay's bundle members behind one port (`port.py`), one module per kind of member.

Owns: the registry `KINDS` (transport name -> its `MemberKind`), the one place a kind is
registered: a new kind is its module plus one line here and in `Endpoint`; `Endpoint`, the
endpoints a host hands over, one type per kind (what the supervisor's runners answer when its
relay host asks them: `AgentRunner.endpoint`); and `member(...)`, the one way the relay reaches a
member: the kind of its transport, bound to the endpoint its host hands over
(`BundleHost.member_endpoint`). A transport with no kind here is refused by the relay with
`runtime_session_type_not_implemented` (`port.session_type_not_implemented`).

Kinds: `tmux` (tmux.py), `acp` (acp.py: Agent Client Protocol agents on stdio). No kind hosts
`pty` or `process` (the supervisor's `runner = "process"` agents: members that speak through
their relay tools, to which nothing can be delivered).

Must never: import the relay's operations or `mcphost.supervisor`, or start a process.
"""

from __future__ import annotations

from mcphost.agentmux.bundlefile import Bundle, Session
from mcphost.relay.hosting import BundleHost
from mcphost.relay.members import acp, tmux
from mcphost.relay.members.port import Member, MemberContext, MemberKind

KINDS: dict[str, MemberKind] = {
    tmux.TRANSPORT: tmux.KIND,
    acp.TRANSPORT: acp.KIND,
}
Endpoint = tmux.TmuxEndpoint | acp.AcpEndpoint
"""What a host hands over for a member, one type per kind (the kind's `bind` reads its own)."""


def kind_of(bundle: Bundle, session: Session) -> MemberKind | None:
    """The kind that hosts this configured member, None when no registered kind does."""
    kind = KINDS.get(session.transport)
    return kind if kind is not None and kind.accepts(bundle, session) else None


def hosted_kinds() -> str:
    """The registered transports, for a refusal's message ("tmux", "acp or tmux")."""
    names = sorted(KINDS)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def member(
    bundle: Bundle, session: Session, host: BundleHost, context: MemberContext
) -> Member | None:
    """The member bound to what its host hands over; None when no kind hosts it or the host has
    no endpoint for it now (not hosted, not running)."""
    kind = kind_of(bundle, session)
    if kind is None:
        return None
    endpoint = host.member_endpoint(bundle, session.id)
    return None if endpoint is None else kind.bind(bundle, session, endpoint, context)
