"""The relay's live connections: one registry, built before the server and the behaviour and
handed to both (`RelayServer(registry=...)`, `RelayBehaviour(connections=...)`).

Owns: `Conn` (one client connection: its streams, its principal once hello'd, its bounded
outbox of frames and at most `EVENT_BACKLOG` unwritten events), the set of connections, the set
of in-process sessions (`locals`: the server's `LocalSession`s, seen here as `Local`), and the
identity claims of both (`claims`: principal id -> the connection or session holding it;
`claim` gives one, `runtime_identity_claim_conflict` while another live holder has it, a stale
holder's is reclaimed; `release` frees it), and what the behaviour asks of them: `revoke` (an
error frame to a principal's live connections, then close; a session's claim is released: PSK
rotation, §3.3), `send_event` (an event frame, best effort; a session's `on_event` gets it),
`live_principals`, `count`, `claimed`. The server adds and removes connections
and sessions (server.py); the records of §5 it makes here go through `inscribe`
(`relay.stream.stale_claim_reclaimed`, `relay.connection.identity_revoked_teardown`).

Must never: read or write a socket itself (a `Conn`'s writer task in server.py does), decide
identity (that is `RelayBehaviour.authenticate` through the server's hello, or `admit` for an
in-process session), or import the server or the behaviour's modules, which both stand on it
(import-linter, pyproject.toml).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from mcphost import events
from mcphost.agentmux import wire
from mcphost.agentmux.wire import Principal, RelayError
from mcphost.relay.inscriptions import Inscribe, RelayInscriptions

EVENT_BACKLOG = 64

CLAIM_CONFLICT_MESSAGE = "stream identity is already claimed by a live connection"
CLAIM_CONFLICT_REASON = "existing identity owner is still live"


class Conn:
    """One client connection: its streams, its principal once hello'd, and its outbox."""

    def __init__(self, cid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.id = cid
        self.reader = reader
        self.writer = writer
        self.principal: Principal | None = None
        # (bytes, a future resolved once written or None for an event, close after it)
        self.outbox: deque[tuple[bytes, asyncio.Future[None] | None, bool]] = deque()
        self.queued_events = 0
        self.wake = asyncio.Event()
        self.closing = False  # a last frame is queued, or teardown began: nothing more is sent
        self.reading_done = asyncio.Event()
        self.writer_task: asyncio.Task[None] | None = None

    @property
    def live(self) -> bool:
        return not self.closing and not self.writer.is_closing()

    def send(self, data: bytes) -> asyncio.Future[None]:
        """Queue a frame; the future resolves once it is written (or the connection is gone)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.closing:
            done.set_result(None)
            return done
        self.outbox.append((data, done, False))
        self.wake.set()
        return done

    def send_event(self, data: bytes) -> bool:
        if self.closing or self.queued_events >= EVENT_BACKLOG:
            return False
        self.queued_events += 1
        self.outbox.append((data, None, False))
        self.wake.set()
        return True

    def finish(self, data: bytes = b"") -> None:
        """Write `data` (if any) after what is queued, then close. Idempotent."""
        if self.closing:
            return
        self.closing = True
        self.outbox.append((data, None, True))
        self.wake.set()

    def abort(self) -> None:
        self.closing = True
        transport = self.writer.transport
        with contextlib.suppress(Exception):
            transport.abort()
        self.wake.set()


class Local(Protocol):
    """An in-process session as the registry sees it (`server.LocalSession`)."""

    id: int
    principal_id: str
    principal: Principal | None  # while it holds the claim
    on_event: Callable[[dict[str, Any]], None]

    @property
    def live(self) -> bool: ...

    def revoked(self) -> None: ...  # release the claim; the next request claims it afresh

    def close(self) -> None: ...  # release the claim for good


class Connections:
    """The live connections, the in-process sessions, and their identity claims."""

    def __init__(self, inscribe: Inscribe | None = None) -> None:
        self._inscribe: Inscribe = inscribe if inscribe is not None else RelayInscriptions(None)
        self.conns: set[Conn] = set()
        self.locals: set[Local] = set()
        self.claims: dict[str, Conn | Local] = {}

    def count(self, principal_id: str | None = None) -> int:
        """Live connections (of `principal_id`, when given; hello'd or not when None)."""
        return sum(
            1
            for c in self.conns
            if c.live
            and (
                principal_id is None or (c.principal is not None and c.principal.id == principal_id)
            )
        )

    def live_principals(self) -> list[str]:
        """The principal ids with a live hello'd connection or claiming in-process session,
        sorted (for `list` readiness)."""
        holders: list[Conn | Local] = [*self.conns, *self.locals]
        return sorted({h.principal.id for h in holders if h.principal is not None and h.live})

    def claimed(self, principal_id: str) -> bool:
        """Whether a live connection or in-process session holds `principal_id`'s claim."""
        owner = self.claims.get(principal_id)
        return owner is not None and owner.live

    def claim(self, holder: Conn | Local, principal: Principal) -> None:
        """Give `holder` the principal's identity claim; `runtime_identity_claim_conflict` while
        another live holder has it (a stale one is reclaimed)."""
        owner = self.claims.get(principal.id)
        if owner is not None and owner is not holder:
            if owner.live:
                raise RelayError(
                    "runtime_identity_claim_conflict",
                    CLAIM_CONFLICT_MESSAGE,
                    {"principal_id": principal.id, "reason": CLAIM_CONFLICT_REASON},
                )
            self._inscribe(
                "relay.stream.stale_claim_reclaimed",
                connection_id=holder.id,
                stale_connection_id=owner.id,
                principal_id=principal.id,
            )
        self.claims[principal.id] = holder

    def release(self, holder: Conn | Local, principal_id: str) -> None:
        """Free the principal's claim if `holder` has it."""
        if self.claims.get(principal_id) is holder:
            del self.claims[principal_id]

    def revoke(self, principal_id: str, code: str, message: str) -> int:
        """Write `{code, message}` as an error frame to the principal's live connections and
        close them, and release its in-process sessions' claim (their next request claims it
        afresh, as a reconnect); how many. The claim is released at once, so a reconnect is
        not refused."""
        frame = wire.encode(wire.error_response(None, RelayError(code, message)))
        hit = [c for c in self.conns if c.principal is not None and c.principal.id == principal_id]
        count = 0
        for conn in hit:
            self.release(conn, principal_id)
            if conn.closing:
                continue
            conn.finish(frame)
            count += 1
            self._teardown(conn.id, principal_id, code)
        for session in [s for s in self.locals if s.live and s.principal_id == principal_id]:
            session.revoked()
            count += 1
            self._teardown(session.id, principal_id, code)
        return count

    def _teardown(self, holder_id: int, principal_id: str, code: str) -> None:
        self._inscribe(
            "relay.connection.identity_revoked_teardown",
            connection_id=holder_id,
            principal_id=principal_id,
            code=code,
        )

    def send_event(self, principal_id: str, frame: dict[str, Any]) -> int:
        """Queue an event frame (`wire.event(...)`) to the principal's live connections, best
        effort: a connection with `EVENT_BACKLOG` events unwritten misses it; hand it to its
        live in-process sessions' `on_event`. How many got it."""
        try:
            data = wire.encode(frame)
        except ValueError:
            events.emit("relay.event.unencodable", level="error", principal_id=principal_id)
            return 0
        count = 0
        for conn in list(self.conns):
            if conn.principal is None or conn.principal.id != principal_id or not conn.live:
                continue
            if conn.send_event(data):
                count += 1
            else:
                events.emit(
                    "relay.connection.event_dropped",
                    level="warning",
                    connection_id=conn.id,
                    principal_id=principal_id,
                )
        for session in list(self.locals):
            if session.live and session.principal_id == principal_id:
                session.on_event(frame)
                count += 1
        return count
