"""What the relay asks of its host: `BundleHost` (implemented by the supervisor) and `MemberHealth`.

Owns: the hosting contract and the hook types the relay is wired with (`SocketTrust`, `Bundles`:
the host's in-memory bundle layer; the live connections are `connections.Connections`, shared
with the server). The relay never starts or stops a process itself; `up` / `down` ask the host.

Must never: import `mcphost.supervisor` (the supervisor implements this) or do I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from mcphost.agentmux.bundlefile import Bundle
from mcphost.peer import PeerCred


@dataclass(frozen=True, slots=True)
class MemberHealth:
    """What `BundleHost.member_state` may report besides readiness (all optional).

    `stopped`: the member is not running and nothing will start it again by itself (an
    operator's stop, `down`, or restarts given up), so a `send` or `raww` to it is refused at
    admission (`delivery_target_fail_stopped`) instead of waiting to fail."""

    startup_failure_count: int = 0
    recent_startup_failures: tuple[dict[str, Any], ...] = ()
    stopped: bool = False


class BundleHost(Protocol):
    """What the supervisor implements so the relay can host bundles (one per relay).

    - `hosted(bundle)`: whether the bundle's hosting intent is "run" (after `up`, or autostart),
      whatever its members' current state.
    - `up(bundle)`: start every member of the bundle (a tmux member: a session of the bundle's
      tmux server; restarted by the supervisor like a plain process) and return once they are
      started (not necessarily ready); raise to report a failure (the transition is `failed`).
    - `down(bundle)`: stop every member (and the bundle's tmux server); return once they are gone.
    - `member_endpoint(bundle, session_id)`: what the member's kind reaches it through
      (`members.port`: a tmux member's `members.tmux.TmuxEndpoint(server, session name)`; an
      ACP member's client session), or None while the member is not hosted. The relay binds it
      to the member's kind (`members.member`) for look, send, raww and `list`'s readiness.
    - `member_state(bundle, session_id)`: `(ready, MemberHealth)`; ready means the member's
      session exists and its process runs (the relay's §1.3 readiness); the health carries the
      member's startup failure count and recent failure records (`{session_id, transport, code,
      reason, timestamp, sequence, details?}`) and whether it is stopped. Cheap and
      synchronous: called for every member on each `list`, and for each target of a send.
    `bundle` is always the relay's freshly read `bundles.Bundle` (use `bundle.id`).
    """

    def hosted(self, bundle: Bundle) -> bool: ...

    async def up(self, bundle: Bundle) -> None: ...

    async def down(self, bundle: Bundle) -> None: ...

    def member_endpoint(self, bundle: Bundle, session_id: str) -> object | None: ...

    def member_state(self, bundle: Bundle, session_id: str) -> tuple[bool, MemberHealth]: ...


SocketTrust = Callable[[str, PeerCred | None], bool]
# The host's in-memory configuration layer: bundles by id, read before the file layers (the
# supervisor's fleet bundles; a file of the same id in any layer is shadowed).
Bundles = Callable[[], Mapping[str, Bundle]]
