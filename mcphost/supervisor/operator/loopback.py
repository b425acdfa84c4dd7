"""One listener for the operator's read-only HTTP endpoints: the fleet page and `/metrics`.

Owns: binding an aiohttp application to a `Listen` (`mcphost.supervisor.values`: a loopback
address or a Unix socket, bound through `mcphost.unixsock`; the one form `[page] listen` and
`[metrics] listen` share), its own accept loop, and every guard and bound on what arrives there:
- who: the owner uid of each connection, from the kernel (`peer.tcp_owner_uid` on TCP,
  `SO_PEERCRED` on a Unix socket), never from what it sends; a connection whose owner is one of
  the agents' own uids (`agent_uids()`, the supervisor's one callable) is closed at once
  (`agent_peer`), as is one whose owner cannot be found (`peer_unknown`: fail closed);
- how many: `CONNECTIONS_PER_LISTENER` open at once, and `CONNECTIONS_PER_PEER` per owner uid;
  past a bound a connection is closed at once, never queued (`listener_full`, `peer_full`);
- how long: the request head must arrive within `HEAD_SECONDS` and the reply be taken within
  `REPLY_SECONDS`, or the connection is aborted; every response closes its connection (no
  keep-alive: nothing idles);
- streams: a handler that holds its response open (the page's server-sent events: `stream`)
  is let off `REPLY_SECONDS` only within its own bounds, `STREAMS_PER_LISTENER` and
  `STREAMS_PER_PEER` per owner uid (past one: 429, `stream_listener_full` / `stream_peer_full`),
  and learns when its connection ended (a future) without writing to it;
- which `Host`: the one guard against DNS rebinding, `Listen.answers` of the address bound (on
  TCP its own address or `localhost` at its port, 403 otherwise: a web page elsewhere that
  rebinds its name to 127.0.0.1 gets nothing; on a Unix socket any, no browser reaches one);
- what it logs: refusals and accept failures (EMFILE...) through `events.emit_limited`, at most
  one line per kind every `LOG_EVERY_SECONDS`, carrying the count left out.

Must never: queue a connection past a bound, serve a connection before its owner is known, let a
half-sent request or an idle connection hold a descriptor past its deadline, log per connection,
bind anything but a loopback address or a Unix socket, or be imported unless `[page]` or
`[metrics]` is set (it imports aiohttp's server side).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import struct
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from mcphost import events, peer
from mcphost.events import RateLimit
from mcphost.supervisor.values import LISTENER_FULL, PEER_FULL, Bounds, Listen

if TYPE_CHECKING:
    from mcphost.unixsock import Listening

CONNECTIONS_PER_LISTENER = 64  # open at once on one listener; more are closed at once
CONNECTIONS_PER_PEER = 16  # open at once by one owner uid on one listener
STREAMS_PER_LISTENER = 16  # responses held open at once on one listener (`stream`)
STREAMS_PER_PEER = 4  # held open at once by one owner uid on one listener
HEAD_SECONDS = 5.0  # from accept to a complete request head
REPLY_SECONDS = 30.0  # from the head to the reply taken (a client that does not read)
BACKLOG = 128
ACCEPT_RETRY_SECONDS = 0.5  # after a failed accept (EMFILE, ENFILE...): never spin
LOG_EVERY_SECONDS = events.LOG_EVERY_SECONDS  # at most one line per kind (reason, accept)

# Why a connection was closed at once (the `reason` of `supervisor.listener_refused`).
AGENT_PEER = "agent_peer"
PEER_UNKNOWN = "peer_unknown"
STREAM_LISTENER_FULL = "stream_listener_full"
STREAM_PEER_FULL = "stream_peer_full"
_STREAM_REASONS = {LISTENER_FULL: STREAM_LISTENER_FULL, PEER_FULL: STREAM_PEER_FULL}

AgentUids = Callable[[], frozenset[int]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def no_agents() -> frozenset[int]:
    return frozenset()


def refusal(uid: int | None, agent_uids: frozenset[int], bounds: Bounds) -> tuple[str | None, int]:
    """Whether a connection of owner `uid` is refused (its reason, or None: admitted and
    counted) (pure)."""
    if uid is None:
        return PEER_UNKNOWN, -1
    if uid in agent_uids:
        return AGENT_PEER, uid
    return bounds.admit(uid), uid


@dataclass(eq=False)
class _Conn:
    uid: int
    timer: asyncio.TimerHandle | None = None
    head: bool = False
    ended: bool = False
    gone: asyncio.Future[None] | None = None  # set when the connection ends, for a stream


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one admitted connection, told when it ends (the bound's count)."""

    def __init__(self, inner: asyncio.Protocol, ended: Callable[[], None]) -> None:
        self.inner = inner
        self.ended = ended

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self.inner.connection_lost(exc)
        finally:
            self.ended()


@dataclass(eq=False)
class LoopbackServer:
    """`app` served at `listen` under the module's guards; `name` names it in the log
    (`page`, `metrics`). `start()` binds (raises `OSError`, a Unix socket's path refused too) and
    sets `bound`, the address listened at (port 0 replaced by the one the kernel chose);
    `aclose()` ends it and every connection."""

    app: web.Application
    listen: Listen
    name: str
    agent_uids: AgentUids = no_agents
    unix_mode: int = 0o660
    bounds: Bounds = field(
        default_factory=lambda: Bounds(CONNECTIONS_PER_LISTENER, CONNECTIONS_PER_PEER)
    )
    streams: Bounds = field(default_factory=lambda: Bounds(STREAMS_PER_LISTENER, STREAMS_PER_PEER))
    bound: Listen | None = None  # set by `start`: `listen`, with the port bound on TCP
    refused: dict[str, int] = field(default_factory=dict)  # refusals by reason (tests)
    _runner: web.AppRunner | None = None
    _sock: socket.socket | None = None
    _listening: Listening | None = None
    _accepting: asyncio.Task[None] | None = None
    _open: dict[Any, _Conn] = field(default_factory=dict)
    _logs: dict[str, RateLimit] = field(default_factory=dict)

    async def start(self) -> None:
        from mcphost import unixsock

        self.app.middlewares.insert(0, self._guard)
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            if self.listen.path is not None:
                self._listening = unixsock.listen(
                    self.listen.path, mode=self.unix_mode, backlog=BACKLOG
                )
                self._sock = self._listening.sock
            else:
                self._sock = _bind(self.listen)
        except unixsock.SocketPathError as exc:  # a live socket, not a socket...: one kind
            await runner.cleanup()
            raise OSError(str(exc)) from None
        except BaseException:
            await runner.cleanup()
            raise
        self._sock.setblocking(False)
        self._runner = runner
        self.bound = self.listen
        if self.listen.path is None:
            host, port = self._sock.getsockname()[:2]
            self.bound = Listen(host=host, port=port)
        self._accepting = asyncio.get_running_loop().create_task(self._accept(runner.server))

    async def aclose(self) -> None:
        accepting, self._accepting = self._accepting, None
        if accepting is not None:
            accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await accepting
        if self._listening is not None:
            self._listening.close()
            self._listening = None
        elif self._sock is not None:
            self._sock.close()
        self._sock = None
        for conn in self._open.values():
            if conn.timer is not None:
                conn.timer.cancel()
        runner, self._runner = self._runner, None
        if runner is not None:
            with contextlib.suppress(Exception):  # shutdown goes on whatever aiohttp says
                await runner.cleanup()

    # -- accepting -------------------------------------------------------------------------
    async def _accept(self, server: Any) -> None:
        loop = asyncio.get_running_loop()
        listener = self._sock
        assert listener is not None
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue
            except OSError as exc:
                name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                self._log("accept", "supervisor.listener_accept_failed", errno=name)
                await asyncio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            try:
                uid = self._owner(conn)
                reason, uid = refusal(uid, self.agent_uids(), self.bounds)
            except Exception as exc:  # the agents' uids could not be told: fail closed
                _drop(conn)
                self._log("failed", "supervisor.listener_failed", error=type(exc).__name__)
                continue
            if reason is not None:
                _drop(conn)
                self.refused[reason] = self.refused.get(reason, 0) + 1
                self._log(reason, "supervisor.listener_refused", reason=reason, uid=uid)
                continue
            await self._serve(loop, server, conn, uid)

    def _owner(self, conn: socket.socket) -> int | None:
        try:
            if conn.family == socket.AF_UNIX:
                return peer.peer_uid(conn)
            return peer.tcp_owner_uid(conn.getpeername()[:2], conn.getsockname()[:2])
        except OSError:
            return None

    async def _serve(
        self, loop: asyncio.AbstractEventLoop, server: Any, conn: socket.socket, uid: int
    ) -> None:
        record = _Conn(uid)
        transport: asyncio.BaseTransport | None = None

        def ended() -> None:
            record.ended = True
            if record.timer is not None:
                record.timer.cancel()
            if record.gone is not None and not record.gone.done():
                record.gone.set_result(None)
            self._open.pop(transport, None)
            self.bounds.release(uid)

        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: _Counted(server(), ended), sock=conn
            )
        except OSError:
            self.bounds.release(uid)
            _drop(conn)
            return
        if record.ended or transport.is_closing():
            return
        self._open[transport] = record
        record.timer = loop.call_later(HEAD_SECONDS, _abort, transport)

    def _log(self, kind: str, event: str, **fields: Any) -> None:
        limit = self._logs.setdefault(kind, RateLimit(1, LOG_EVERY_SECONDS))
        events.emit_limited(limit, event, "warning", listener=self.name, **fields)

    # -- a response held open ---------------------------------------------------------------
    @contextlib.contextmanager
    def stream(self, request: web.Request) -> Iterator[asyncio.Future[None]]:
        """Hold `request`'s connection open past `REPLY_SECONDS`, counted in `streams`; yields
        a future resolved when the connection ends (the client left: nothing need be written
        to learn it). Raises 429 (`Retry-After`) past `STREAMS_PER_LISTENER` or
        `STREAMS_PER_PEER`: the connection is closed then, as every refused one."""
        record = self._open.get(request.transport)
        if record is None or record.ended:  # it ended between the head and here
            raise web.HTTPServiceUnavailable(text="the connection ended\n")
        reason = self.streams.admit(record.uid)
        if reason is not None:
            reason = _STREAM_REASONS[reason]
            self.refused[reason] = self.refused.get(reason, 0) + 1
            self._log(reason, "supervisor.listener_refused", reason=reason, uid=record.uid)
            raise web.HTTPTooManyRequests(
                text=f"too many streams open ({reason}): close another tab\n",
                headers={"Retry-After": "30"},
            )
        if record.timer is not None:
            record.timer.cancel()
            record.timer = None
        record.gone = asyncio.get_running_loop().create_future()
        try:
            yield record.gone
        finally:
            self.streams.release(record.uid)

    # -- each request ----------------------------------------------------------------------
    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        record = self._open.get(request.transport)
        if record is not None and not record.head:
            record.head = True
            if record.timer is not None:
                record.timer.cancel()
            record.timer = asyncio.get_running_loop().call_later(
                REPLY_SECONDS, _abort, request.transport
            )
        try:
            if self.bound is None or not self.bound.answers(request.headers.get("Host")):
                raise web.HTTPForbidden(
                    text="this endpoint answers its own loopback address only\n"
                )
            response = await handler(request)
        except web.HTTPException as exc:
            exc.force_close()  # one request per connection: no keep-alive, nothing idles
            raise
        response.force_close()
        return response


def _bind(listen: Listen) -> socket.socket:
    """A listening TCP socket on the loopback `listen` (close-on-exec, SO_REUSEADDR)."""
    assert listen.host is not None and listen.port is not None
    family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((listen.host, listen.port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets


def _drop(conn: socket.socket) -> None:
    """Close a refused connection at once (a reset: nothing lingers on our side)."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    conn.close()


def _abort(transport: Any) -> None:
    transport.abort()
