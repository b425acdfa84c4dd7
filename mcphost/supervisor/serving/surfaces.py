"""The surfaces: what one agent's session is served, on each attach hub.

Owns: each hub's `identify` (`identifier`: the kernel's word through `Identities.vouch`, then
this surface's bounds: at most `MAX_SESSIONS_PER_AGENT` sessions per agent, relay tools only for
an agent with a bundle) and `surface_for` (`factory`): the center tools (`HostSurface`, on the
supervisor's one shared admin client, the file tools rooted at a duplicate of the held
workspace, the agent's id and generation, and the `on_center_call` it is given, told of every
call's tool, outcome and time: the metrics) and the relay tools (`RelayToolsSurface`); the
one relay connection each agent generation's relay tools sessions share (the relay allows one
per principal: opened with the first session, closed with the last, when the generation ends
or when the agent leaves); closing the sessions of a generation that ended (`close_older`) or
of an agent that left (`forget`); and a call the center refused as `stale_generation`
(`_center_failed`): shown in `ctl status` and handed to reconciliation, which replaces that
generation.

Must never: take an identity from anything but `Identities.vouch` (never the peer's bytes,
environment or arguments), give a session the token (the shared client holds it: a session's
binding carries an empty secret), open the agent's workspace by its path (the agent owns it),
or start, stop or restart an agent itself (reconciliation does, under the agent's lock).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from mcphost import events, peer
from mcphost.supervisor import refusals as R
from mcphost.supervisor.refusals import Refused
from mcphost.supervisor.serving.sessions import Attached

if TYPE_CHECKING:
    from mcphost.errors import ToolFailure
    from mcphost.relaytools.stream import SharedStream
    from mcphost.supervisor.agents.relayhost import RelayHost
    from mcphost.supervisor.center.generations import Generations
    from mcphost.supervisor.center.link import Center
    from mcphost.supervisor.identity import Identities
    from mcphost.supervisor.plan import Fleet
    from mcphost.supervisor.reconcile import Slot
    from mcphost.supervisor.serving.sessions import SessionHub
    from mcphost.supervisor.serving.streamable import HttpHub
    from mcphost.surface import Surface

CENTER, RELAY = "center", "relay"  # the two attach hubs: `<state>/run/<name>.sock`
# Sessions one agent may hold open per surface: a real client opens one or two; the cap keeps a
# runaway agent from holding the supervisor's memory (each session is bounded on its own).
MAX_SESSIONS_PER_AGENT = 32


class Supervised(Protocol):
    """What the surfaces read of the supervisor (`supervisor.Supervisor`): never imported, so
    the orchestrator stays above this module."""

    @property
    def fleet(self) -> Fleet: ...
    @property
    def slots(self) -> Mapping[str, Slot]: ...
    @property
    def hubs(self) -> Mapping[str, SessionHub]: ...
    @property
    def http(self) -> HttpHub: ...
    @property
    def identities(self) -> Identities: ...
    @property
    def generations(self) -> Generations: ...
    @property
    def stopping(self) -> asyncio.Event: ...
    @property
    def center(self) -> Center: ...
    @property
    def relay(self) -> RelayHost: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    def spawn(self, coro: Awaitable[Any]) -> None: ...


class Surfaces:
    """The sessions' surfaces, and the relay connections they share (module doc).
    `replace_fenced(slot, generation)`: reconciliation's replacement of a fenced generation;
    `on_center_call(agent, tool, outcome, seconds)`: told of every center call's end (the
    metrics; None: nobody listens)."""

    def __init__(
        self,
        supervisor: Supervised,
        *,
        replace_fenced: Callable[[Slot, int], Awaitable[None]],
        on_center_call: Callable[[str, str, str, float], None] | None = None,
    ) -> None:
        self.supervisor = supervisor
        self._replace_fenced = replace_fenced
        self._on_center_call = on_center_call
        # per agent: (generation, the relay connection its relay tools sessions share)
        self._relay_shares: dict[str, tuple[int, SharedStream]] = {}
        self._calls: dict[str, list[int]] = {}  # per agent: [center calls, of which failed]

    def center_calls(self, agent_id: str) -> tuple[int, int]:
        """`(calls, errors)`: the agent's center tool calls answered, and those that failed
        (any outcome but `ok`), since it joined the fleet (or the supervisor started)."""
        calls, errors = self._calls.get(agent_id, (0, 0))
        return calls, errors

    def _call_done(self, agent_id: str, tool: str, outcome: str, seconds: float) -> None:
        """A center call of `agent_id` ended (`HostSurface.on_done`): counted for `ctl status`,
        and told to the metrics when they are on."""
        counts = self._calls.setdefault(agent_id, [0, 0])
        counts[0] += 1
        counts[1] += outcome != "ok"
        observe = self._on_center_call
        if observe is not None:
            observe(agent_id, tool, outcome, seconds)

    # -- the hubs' two hooks --------------------------------------------------------------
    def identifier(self, surface: str) -> Callable[[peer.PeerCred], Attached]:
        """The hub's `identify`: the kernel's word (`Identities.vouch`), then this surface's
        bounds (sessions per agent, relay tools only for an agent with a bundle)."""
        supervisor = self.supervisor

        def identify(cred: peer.PeerCred) -> Attached:
            if supervisor.stopping.is_set():
                raise Refused.row(R.STOPPING)
            agent_id, generation = supervisor.identities.vouch(cred, self._uid_of)
            slot = supervisor.slots[agent_id]  # vouch found it, and nothing awaited since
            if self._sessions(surface, agent_id) >= MAX_SESSIONS_PER_AGENT:
                raise Refused.row(R.TOO_MANY_SESSIONS, agent=agent_id, limit=MAX_SESSIONS_PER_AGENT)
            if surface == RELAY and slot.plan.bundle is None:
                raise Refused.row(R.NO_BUNDLE, agent=agent_id)
            return Attached(agent_id=agent_id, generation=generation)

        return identify

    def _sessions(self, surface: str, agent_id: str) -> int:
        """The agent's live sessions on `surface`, over its pumps and over HTTP together."""
        pumped = self.supervisor.hubs[surface].count(agent_id)
        return pumped + self.supervisor.http.count(agent_id, surface)

    def http_agent(self, uid: int) -> str:
        """The one agent that may use HTTP whose own uid `uid` is; `Refused` otherwise
        (`not_an_http_agent`; `uid_shared` where agents share it, or share it with this
        supervisor: a uid that names no single agent names none)."""
        supervisor = self.supervisor
        sharing = sorted(a for a, slot in supervisor.slots.items() if slot.uid == uid)
        if not sharing:
            raise Refused.row(R.HTTP_NOT_HTTP, uid=uid)
        if len(sharing) > 1 or uid == os.geteuid():
            raise Refused.row(R.HTTP_UID_SHARED, uid=uid, agents=", ".join(sharing[:8]))
        if supervisor.slots[sharing[0]].plan.mcp_transport != "http":
            raise Refused.row(R.HTTP_NOT_HTTP, uid=uid)
        return sharing[0]

    def serves_http(self, uid: int) -> bool:
        """Is `uid` the own uid of an agent that may use HTTP (the HTTP listener's accept)?"""
        try:
            self.http_agent(uid)
        except Refused:
            return False
        return True

    def identify_http(self, surface: str, uid: int) -> Attached:
        """An HTTP request's agent, at its current generation, from the kernel's word on the
        connection's owner (`uid`), then this surface's bounds, as `identifier`'s."""
        supervisor = self.supervisor
        if supervisor.stopping.is_set():
            raise Refused.row(R.STOPPING)
        agent_id = self.http_agent(uid)
        slot = supervisor.slots[agent_id]
        status = slot.runner.status()
        if status.pid is None or status.generation is None:  # not running: nothing to serve
            raise Refused.row(R.SESSION_CLOSED)
        if surface == RELAY and slot.plan.bundle is None:
            raise Refused.row(R.NO_BUNDLE, agent=agent_id)
        return Attached(agent_id=agent_id, generation=status.generation)

    def http_factory(self, surface: str, attached: Attached) -> Surface:
        """The HTTP hub's `surface_for`: the same surfaces a pump's session gets, once the
        agent's sessions on `surface` are under their bound."""
        if self._sessions(surface, attached.agent_id) >= MAX_SESSIONS_PER_AGENT:
            raise Refused.row(
                R.TOO_MANY_SESSIONS, agent=attached.agent_id, limit=MAX_SESSIONS_PER_AGENT
            )
        return self.factory(surface)(attached)

    def _hubs(self) -> list[SessionHub | HttpHub]:
        return [*self.supervisor.hubs.values(), self.supervisor.http]

    def factory(self, surface: str) -> Callable[[Attached], Surface]:
        """The hub's `surface_for`: the center tools or the relay tools of one session."""

        def build(attached: Attached) -> Surface:
            slot = self.supervisor.slots[attached.agent_id]
            if surface == CENTER:
                return self._center_surface(slot, attached.generation)
            return self._relay_surface(slot, attached.generation)

        return build

    def _uid_of(self, agent_id: str) -> int | None:
        """The uid agent `agent_id` runs as; None when it is not in the fleet (identity.py)."""
        slot = self.supervisor.slots.get(agent_id)
        return None if slot is None else slot.uid

    # -- the center tools -----------------------------------------------------------------
    def _center_surface(self, slot: Slot, generation: int) -> Surface:
        """The center tools for one session; the file tools' root is a duplicate of the held
        workspace (never `agent_root` reopened by path: the agent owns that path)."""
        from mcphost.binding import AgentBinding, Secret
        from mcphost.host.server import HostSurface
        from mcphost.host.workspace import HeldRoot

        supervisor = self.supervisor
        center = supervisor.fleet.center
        binding = AgentBinding(
            agent_id=slot.plan.agent_id,
            target=center.admin_url,
            pins=center.pins,
            token=Secret(""),  # the shared client holds it (center/link.py), never a session
            token_file=None,
            agent_root=slot.home.workspace,
            runtime_socket=center.runtime_socket,
            tier_tools=slot.plan.tier_tools,
            generation=generation,
        )
        agent_id = slot.plan.agent_id
        workspace = HeldRoot(binding, slot.workspace.dup())
        return HostSurface(
            binding,
            admin=supervisor.center.admin,
            runtime=supervisor.center.runtime,
            workspace=workspace,
            on_failure=lambda failure: self._center_failed(agent_id, generation, failure),
            on_done=partial(self._call_done, agent_id),
        )

    def _center_failed(self, agent_id: str, generation: int, failure: ToolFailure) -> None:
        """A call of `agent_id`'s session (of `generation`) failed: if the center fenced that
        generation and it is the agent's current one, show it and have it replaced."""
        from mcphost.errors import StaleGeneration
        from mcphost.supervisor.center.generations import is_generation

        if not isinstance(failure, StaleGeneration):
            return
        supervisor = self.supervisor
        current = failure.details.get("current_generation")
        if not is_generation(current):
            current = None  # a center that does not say: the next local generation is tried
        else:
            supervisor.generations.saw(agent_id, current)
        slot = supervisor.slots.get(agent_id)
        if slot is None or slot.runner.status().generation != generation:
            return  # gone, or a newer local spawn exists: its sessions are closed anyway
        if slot.fenced is not None and slot.fenced["generation"] == generation:
            return  # already being replaced
        slot.fenced = {
            "code": failure.code,
            "generation": generation,
            "center_generation": current,
            "at": time.time(),
        }
        events.emit(
            "supervisor.agent_fenced",
            level="warning",
            agent_id=agent_id,
            generation=generation,
            center_generation=current,
        )
        supervisor.spawn(self._replace_fenced(slot, generation))

    # -- the relay tools ------------------------------------------------------------------
    def _relay_surface(self, slot: Slot, generation: int) -> Surface:
        """The relay tools for one session of `slot`'s agent. All sessions of one agent
        generation share one relay session (the relay allows one per principal; in process
        when we serve the relay, relayhost.py): opened with the first, closed with the last, or
        when the generation ends or the agent leaves (`_close_relay`)."""
        from mcphost.relaytools import layout as layout_mod
        from mcphost.relaytools.stream import SharedStream, StreamHandle
        from mcphost.relaytools.surface import RelayToolsSurface

        relay = self.supervisor.relay
        agent_id = slot.plan.agent_id
        layout = layout_mod.resolve(
            bundle_flag=slot.plan.bundle,
            session_flag=agent_id,
            env=relay.tools_env(self.supervisor.env),
            cwd=slot.home.workspace,
        )

        def handle(
            layout: layout_mod.Layout,
            on_events: Callable[[int], None],
            on_note: Callable[..., None],
        ) -> StreamHandle:
            current = self._relay_shares.get(agent_id)
            if current is None or current[0] != generation or current[1].closed:
                self._close_relay(agent_id, None)
                share = SharedStream(lambda events, note: relay.tools_stream(layout, events, note))
                current = self._relay_shares[agent_id] = (generation, share)
            return current[1].handle(on_events, on_note)

        return RelayToolsSurface(layout, handle)

    def _close_relay(self, agent_id: str, below: int | None) -> None:
        """Close the agent's shared relay connection of a generation below `below` (None: any)."""
        current = self._relay_shares.get(agent_id)
        if current is not None and (below is None or current[0] < below):
            del self._relay_shares[agent_id]
            self.supervisor.spawn(current[1].aclose())

    # -- sessions that end ----------------------------------------------------------------
    def close_older(self, agent_id: str, generation: int) -> None:
        """End every session (and the shared relay connection) of the agent's generations
        below `generation`."""
        self._close_relay(agent_id, generation)
        closed = sum(
            hub.close_where(lambda a: a.agent_id == agent_id and a.generation < generation)
            for hub in self._hubs()
        )
        if closed:
            events.emit(
                "supervisor.sessions_closed",
                agent_id=agent_id,
                below_generation=generation,
                sessions=closed,
            )

    def forget(self, agent_id: str) -> None:
        """End every session of an agent that left the fleet (or was replaced)."""
        for hub in self._hubs():
            hub.close_where(lambda a: a.agent_id == agent_id)
        self._close_relay(agent_id, None)
        self._calls.pop(agent_id, None)

    async def aclose(self) -> None:
        """Close every shared relay connection (at shutdown, after the hubs)."""
        shares, self._relay_shares = self._relay_shares, {}
        await asyncio.gather(*(share.aclose() for _, share in shares.values()))
