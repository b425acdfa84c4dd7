"""SessionHub: one attach socket of one surface, one MCP session per connected pump.

Owns: the listening Unix socket at `path` (bound by `mcphost.unixsock`: a stale socket file is
replaced only when nothing listens on it, any other file there is refused, the mode is set before
it listens), the attach handshake and the registry of live sessions. Per connection, before
reading a byte from it:
1. the peer's kernel credentials (`mcphost.peer.peer_credentials`; the pidfd is
   closed here once `identify` has used it);
2. `identify(cred)` -> `Attached(agent_id, generation)`, or `Refused(code, message)`;
3. `surface_for(attached)` -> the agent's `Surface` (it may refuse too);
4. the status line, `ok <agent_id> <generation>\\n` or `refused <code> <message>\\n` (one line,
   at most `STATUS_LINE_MAX` bytes; a refused connection is then closed, and logged at a
   bounded rate: `REFUSED_LOG_BURST` lines per `REFUSED_LOG_WINDOW`, then one line with the
   count of those not logged);
5. the session: `mcphost.mcpserve.stream.serve_socket`, the standalone host's framing and
   backpressure, bounded per session (`SESSION_LIMITS`: the standalone host's, with 16 MiB of
   request lines held instead of 128) and per agent: every session of one agent holds a share
   of the agent's byte budget (`AGENT_HELD_BYTES` of request bytes read and not yet answered,
   `mcphost.mcpserve.budget`), and while it is spent no session of that agent is read; then
   the socket is closed, the share given back and `surface.aclose()`.
The protocol is pinned in docs/supervisor-internals.md ("Attach handshake"); every refusal's
code and message is a row of `mcphost.supervisor.refusals` (`Refused` is defined there).

The budgets are per agent across every generation; the supervisor hands both its hubs (center
and relay) one `Budgets`, so the budget spans both surfaces. One agent can so make this process
hold at most `AGENT_HELD_BYTES`, plus one line in progress (the 64 MiB line cap), plus one socket
read (256 KiB) per session, of its request bytes, whatever it opens.

A session is in the registry from the moment it is identified, so `close_where` (an older
generation's sessions, when an agent is respawned) also reaches one still in its handshake.
`close_where` ends sessions at once (the answers already produced get the stop grace);
`aclose` stops listening, unlinks the socket and ends every session.

Must never: take identity from the peer's bytes, environment or arguments (only from the kernel,
through `identify`); let one session's failure reach another or the accept loop (a crash is an
event, the other sessions carry on); block the loop beyond the synchronous `identify` and
`surface_for` (reading /proc, opening a workspace); or import the SDK before a session starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import socket
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mcphost import events, unixsock
from mcphost.events import RateLimit
from mcphost.mcpserve.budget import Budgets
from mcphost.mcpserve.connection import MAX_HELD_BYTES, Limits
from mcphost.supervisor import refusals as R
from mcphost.supervisor.refusals import Refused

if TYPE_CHECKING:
    from mcphost.peer import PeerCred
    from mcphost.surface import Surface

STATUS_LINE_MAX = 1024  # the pump reads at most this much before it moves any byte
BACKLOG = 128
ACCEPT_RETRY_SECONDS = 0.1  # after a failed accept (EMFILE, ENFILE, ENOBUFS): retry soon
_CODE = re.compile(r"[^a-z0-9_]")
SESSION_HELD_BYTES = 16 * 1024 * 1024  # request lines one session holds before it is not read
SESSION_LIMITS = Limits(max_held_bytes=SESSION_HELD_BYTES)
AGENT_HELD_BYTES = 64 * 1024 * 1024  # request bytes one agent's sessions hold, all together
# Refused connections logged per hub: at most this many lines per window; the rest are counted
# and reported as one `supervisor.session.refused_suppressed` line when the window ends (any
# local user can connect to a 0666 socket as fast as it likes).
REFUSED_LOG_BURST = 20
REFUSED_LOG_WINDOW = 5.0


assert SESSION_HELD_BYTES < AGENT_HELD_BYTES < MAX_HELD_BYTES


@dataclass(frozen=True, slots=True)
class Attached:
    """Who a connection belongs to: the agent, and the generation of its process tree."""

    agent_id: str
    generation: int


class HubError(Exception):
    """The attach socket cannot be bound (`path` is in use, or not a socket)."""


@dataclass(eq=False)
class _Session:
    attached: Attached
    pid: int
    stop: asyncio.Event = field(default_factory=asyncio.Event)


def status_line(*words: str) -> bytes:
    """One handshake line: the words, each on one line, spaced once, cut to `STATUS_LINE_MAX`."""
    text = " ".join("".join(c if c.isprintable() else " " for c in w) for w in words)
    data = " ".join(text.split()).encode("utf-8", "replace")[: STATUS_LINE_MAX - 1]
    return data.decode("utf-8", "ignore").encode() + b"\n"


class SessionHub:
    """The attach socket of one surface and the sessions served through it."""

    def __init__(
        self,
        path: str,
        *,
        identify: Callable[[PeerCred], Attached],
        surface_for: Callable[[Attached], Surface],
        mode: int = 0o600,
        limits: Limits = SESSION_LIMITS,
        budgets: Budgets | None = None,
    ) -> None:
        """`budgets`: the agents' byte budgets, shared with another hub to span both surfaces
        (by default this hub's own, `AGENT_HELD_BYTES` per agent)."""
        self.path = path
        self.mode = mode
        self._identify = identify
        self._surface_for = surface_for
        self._limits = limits
        self.budgets = budgets if budgets is not None else Budgets(AGENT_HELD_BYTES)
        self._listening: unixsock.Listening | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._sessions: set[_Session] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._refusals = RateLimit(REFUSED_LOG_BURST, REFUSED_LOG_WINDOW)
        self._accept_failures = RateLimit(1, events.LOG_EVERY_SECONDS)  # EMFILE...: one line
        self._suppressed_report: asyncio.TimerHandle | None = None

    # -- the socket -----------------------------------------------------------------------
    async def start(self) -> None:
        """Bind `path` (mode `mode`), listen, and accept in the background."""
        try:
            listening = unixsock.listen(self.path, mode=self.mode, backlog=BACKLOG)
        except unixsock.SocketPathError as exc:
            raise HubError(_refusal(exc)) from None
        self._listening = listening
        self._accepting = asyncio.ensure_future(self._accept(listening.sock))
        events.emit("supervisor.hub.listening", level="debug", path=self.path)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:
                events.emit_limited(
                    self._accept_failures,
                    "supervisor.hub.accept_failed",
                    path=self.path,
                    errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
                )
                await asyncio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            task = asyncio.ensure_future(self._serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # -- one connection -------------------------------------------------------------------
    async def _serve(self, conn: socket.socket) -> None:
        session: _Session | None = None
        surface: Surface | None = None
        try:
            conn.setblocking(False)
            try:
                attached, pid = self._who(conn)
                session = _Session(attached, pid)
                self._sessions.add(session)  # no await since identify: close_where sees it
                surface = self._build(attached)
            except Refused as refusal:
                self._refuse(conn, refusal, session)
                return
            if session.stop.is_set() or self._closing:
                self._refuse(conn, Refused.row(R.SESSION_CLOSED), session)
                return
            if not _send_now(conn, status_line("ok", attached.agent_id, str(attached.generation))):
                return
            events.emit(
                "supervisor.session.started",
                path=self.path,
                agent_id=attached.agent_id,
                generation=attached.generation,
                pid=pid,
            )
            from mcphost.mcpserve.stream import serve_socket

            share = self.budgets.share(attached.agent_id)
            try:
                reason = await serve_socket(
                    surface, conn, stop=session.stop, limits=self._limits, share=share
                )
            finally:
                share.close()
            events.emit(
                "supervisor.session.ended",
                path=self.path,
                agent_id=attached.agent_id,
                generation=attached.generation,
                reason=reason,
            )
        except Exception as exc:
            events.emit(
                "supervisor.session.crashed",
                level="error",
                path=self.path,
                agent_id=session.attached.agent_id if session else None,
                exception=type(exc).__name__,
                traceback=traceback.format_exc(limit=8),
            )
        finally:
            if session is not None:
                self._sessions.discard(session)
            conn.close()
            if surface is not None:
                try:
                    await surface.aclose()
                except Exception as exc:
                    events.emit(
                        "supervisor.session.close_failed",
                        level="warning",
                        path=self.path,
                        exception=type(exc).__name__,
                    )

    def _who(self, conn: socket.socket) -> tuple[Attached, int]:
        """The connection's agent, from the kernel's word only; raises Refused."""
        from mcphost.peer import peer_credentials

        try:
            cred = peer_credentials(conn)
        except OSError:
            raise Refused.row(R.PEER_UNREADABLE) from None
        try:
            failed = Refused.row(R.IDENTIFY_FAILED)
            with self._hook("supervisor.identify_failed", failed, pid=cred.pid):
                return self._identify(cred), cred.pid
        finally:
            if cred.pidfd is not None:
                with contextlib.suppress(OSError):
                    os.close(cred.pidfd)

    def _build(self, attached: Attached) -> Surface:
        agent = attached.agent_id
        failed = Refused.row(R.SURFACE_FAILED, agent=agent)
        with self._hook("supervisor.surface_failed", failed, agent_id=agent):
            return self._surface_for(attached)

    @contextlib.contextmanager
    def _hook(self, event: str, failed: Refused, **fields: object) -> Iterator[None]:
        """Run a hook (`identify`, `surface_for`): its own Refused passes unchanged; any other
        failure is the error `event` (with `fields` and a traceback) and the refusal `failed`."""
        try:
            yield
        except Refused:
            raise
        except Exception as exc:
            events.emit(
                event,
                level="error",
                path=self.path,
                **fields,
                exception=type(exc).__name__,
                traceback=traceback.format_exc(limit=8),
            )
            raise failed from None

    def _refuse(self, conn: socket.socket, refusal: Refused, session: _Session | None) -> None:
        code = _CODE.sub("_", refusal.code.lower()) or "refused"
        loop = asyncio.get_running_loop()
        if self._refusals.admit(loop.time()):
            events.emit(
                "supervisor.session.refused",
                level="warning",
                path=self.path,
                code=code,
                agent_id=session.attached.agent_id if session else None,
                pid=session.pid if session else None,
            )
        elif self._suppressed_report is None:
            self._suppressed_report = loop.call_at(
                self._refusals.window_ends(), self._report_suppressed
            )
        _send_now(conn, status_line("refused", code, refusal.message))
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_WR)
        _discard_unread(conn)  # unread bytes would turn the close into a reset, losing the line

    def _report_suppressed(self) -> None:
        """The refusals not logged in the window that just ended, as one line."""
        self._suppressed_report = None
        count = self._refusals.take_suppressed()
        if count:
            events.emit(
                "supervisor.session.refused_suppressed",
                level="warning",
                path=self.path,
                suppressed=count,
                window_seconds=self._refusals.window,
            )

    # -- the registry ---------------------------------------------------------------------
    def counts(self) -> Counter[str]:
        """Live sessions (identified, not being closed) per agent, in one pass."""
        return Counter(s.attached.agent_id for s in self._sessions if not s.stop.is_set())

    def count(self, agent_id: str) -> int:
        """Live sessions of `agent_id`."""
        return self.counts()[agent_id]

    def close_where(self, pred: Callable[[Attached], bool]) -> int:
        """End every live session whose `Attached` satisfies `pred` at once; how many."""
        hit = [s for s in self._sessions if not s.stop.is_set() and pred(s.attached)]
        for session in hit:
            session.stop.set()
        return len(hit)

    async def aclose(self) -> None:
        """Stop listening, unlink the socket, end every session and wait for them to close."""
        self._closing = True
        if self._suppressed_report is not None:
            self._suppressed_report.cancel()
            self._report_suppressed()
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
        if self._listening is not None:
            self._listening.close()  # unlinks the socket file only while it is the one bound here
            self._listening = None
        for session in list(self._sessions):
            session.stop.set()
        tasks = set(self._tasks)
        if tasks:
            grace = self._limits.stop_grace * 4 + 1
            _, pending = await asyncio.wait(tasks, timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _refusal(exc: unixsock.SocketPathError) -> str:
    """The hub's message for a path `mcphost.unixsock` will not bind."""
    path = exc.path
    if exc.reason == unixsock.NOT_A_SOCKET:
        return f"{path} exists and is not a socket; remove it or choose another --state"
    if exc.reason == unixsock.IN_USE:
        return f"another process is serving {path}; is a supervisor already running?"
    return f"{exc}; it was left alone"


def _send_now(conn: socket.socket, data: bytes) -> bool:
    """Write a handshake line on a fresh connection: its empty send buffer takes it whole.

    False when the peer has gone (or, never seen on AF_UNIX, the buffer took only a part).
    """
    try:
        return conn.send(data) == len(data)
    except OSError:
        return False


def _discard_unread(conn: socket.socket) -> None:
    for _ in range(16):
        try:
            if not conn.recv(1 << 16):
                return
        except OSError:  # nothing more waiting (EAGAIN), or gone
            return
