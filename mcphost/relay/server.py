"""RelayServer: agentmux's relay wire protocol (reference §2) on one Unix socket.

Owns: the listening socket at `path` (its parent must exist, be a directory owned by this user and
writable by no one else; mode 0600 set before the socket listens; a stale socket file is replaced
only when nothing listens on it, anything else there is refused: `mcphost.unixsock`), the live
connections (one asyncio task each, plus one writer task each), the identity claim registry and the
connection cap. Per connection (§2.1, §2.2):
1. over `max_connections` live connections: one `runtime_connection_limit_reached` error frame,
   then close;
2. the hello must arrive within `pre_hello_timeout` (2 s) of the accept, or the connection is
   closed: one deadline from the accept, which no frame before the hello extends; a request
   before hello is answered `validation_missing_hello` (it stays open until that deadline);
3. hello -> `authenticate(hello, peer_cred)` (the kernel's `SO_PEERCRED` / `SO_PEERPIDFD`
   through `mcphost.peer`; the pidfd is closed here once `authenticate` returns) ->
   `hello_ack`, or one error frame without `request_id` and close. A principal already claimed
   by a live connection is `runtime_identity_claim_conflict` (§2.2's exact message and
   details); a claim whose connection is closing is reclaimed (`relay.stream.stale_claim_
   reclaimed`);
4. requests are served one at a time, in order (§2.1): `handle(principal, request)` returns
   the response body (`{"kind": ...}`) or raises `RelayError`; exactly one response frame per
   request, echoing its `request_id` (omitted when it had none). Anything else a handler raises
   is `internal_unexpected_failure` to the client and a traceback in the event log only;
5. a line that fails to parse (or is longer than `wire.MAX_FRAME_BYTES`) is answered with the
   parse failure, then the connection closes; so does a second hello.
No read timeout after hello (§2.1). Every frame goes through the connection's writer, which
gives each write `write_timeout` (5 s) to drain: a client that does not read is torn down
(`relay.connection.write_timeout`). Closing after a last frame shuts the write side, then
reads and discards the client's input for up to `LINGER_SECONDS` (1 MiB at most), so
unread input does not turn the client's EOF into a reset that could hide the last frame.

Memory per connection is bounded: the read buffer (asyncio pauses reading at twice the 1 MiB
line limit), one response at a time (the next request is read only once the previous response
is written), at most `EVENT_BACKLOG` queued events (more are dropped: events are best effort),
and the transport's write buffer (drained before each next frame). At the 512-connection cap
that is a few GiB only if every client sends megabyte lines; real frames are small.

`revoke(principal_id, code, message)` writes that error frame to the principal's live
connections and closes them (PSK rotation, §3.3); `send_event` queues an event frame for a
principal's connections; `live_principals` lists who is connected; `aclose` stops listening,
closes every connection and unlinks the socket (only if it is still the file this server bound).
`inscribe` (inscriptions.py; default: the event log only) takes the connection records of §5:
`relay.stream.stale_claim_reclaimed`, `relay.connection.write_timeout`,
`relay.connection.identity_revoked_teardown`.

Must never: take identity from anything but `authenticate` (which sees the kernel's
credentials), log an identity token or a request body, answer a request before its
connection's hello, let one connection's failure reach another or the accept loop, or
process two requests of one connection at once.

Why hand-written: no library speaks agentmux's relay protocol; asyncio streams carry it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import stat
import traceback
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, cast

from mcphost import events, unixsock
from mcphost.agentmux import wire
from mcphost.agentmux.wire import Hello, Principal, RelayError, Request
from mcphost.peer import PeerCred, peer_credentials
from mcphost.relay.inscriptions import Inscribe, RelayInscriptions

Authenticate = Callable[[Hello, PeerCred | None], Principal]
Handle = Callable[[Principal, Request], Awaitable[dict[str, Any]]]

BACKLOG = 128
EVENT_BACKLOG = 64
LINGER_SECONDS = 1.0
LINGER_BYTES = 1 << 20

CLAIM_CONFLICT_MESSAGE = "stream identity is already claimed by a live connection"
CLAIM_CONFLICT_REASON = "existing identity owner is still live"
MISSING_HELLO_MESSAGE = "hello is required before any request on a relay connection"
UNEXPECTED_MESSAGE = "the relay failed unexpectedly; its event log has the details"


class RelayBindError(Exception):
    """The relay socket cannot be bound: the path is in use, not a socket, or its directory
    is missing or not private to this user."""


class _Conn:
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


class RelayServer:
    """The relay socket and its connections."""

    def __init__(
        self,
        path: str,
        *,
        authenticate: Authenticate,
        handle: Handle,
        pre_hello_timeout: float = 2.0,
        write_timeout: float = 5.0,
        max_connections: int = 512,
        inscribe: Inscribe | None = None,
    ) -> None:
        self.path = path
        self._inscribe: Inscribe = inscribe if inscribe is not None else RelayInscriptions(None)
        self._authenticate = authenticate
        self._handle = handle
        self.pre_hello_timeout = pre_hello_timeout
        self.write_timeout = write_timeout
        self.max_connections = max_connections
        self._server: asyncio.AbstractServer | None = None
        self._listening: unixsock.Listening | None = None
        self._conns: set[_Conn] = set()
        self._claims: dict[str, _Conn] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._closing = False

    # -- the socket -------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind `path` (0600 before it listens) and serve in the background."""
        self._listening = listening = _bind(self.path)
        try:
            self._server = await asyncio.start_unix_server(
                self._accepted, sock=listening.sock, limit=wire.MAX_FRAME_BYTES, backlog=BACKLOG
            )
        except BaseException:
            listening.close()
            raise
        events.emit("relay.server.listening", level="debug", path=self.path)

    async def aclose(self) -> None:
        """Stop listening, close every connection (in-flight handlers are cancelled), unlink."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        if self._listening is not None:
            self._listening.unlink()  # only while it is still the socket file bound here
        for conn in list(self._conns):
            conn.abort()
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), self.write_timeout)
            self._server = None

    # -- the registry -----------------------------------------------------------------------
    def connections(self, principal_id: str | None = None) -> int:
        """Live connections (of `principal_id`, when given; hello'd or not when None)."""
        return sum(
            1
            for c in self._conns
            if c.live
            and (
                principal_id is None or (c.principal is not None and c.principal.id == principal_id)
            )
        )

    def live_principals(self) -> list[str]:
        """The principal ids with a live hello'd connection, sorted (for `list` readiness)."""
        return sorted({c.principal.id for c in self._conns if c.principal is not None and c.live})

    def claimed(self, principal_id: str) -> bool:
        """Whether a live connection holds `principal_id`'s identity claim."""
        owner = self._claims.get(principal_id)
        return owner is not None and owner.live

    def revoke(self, principal_id: str, code: str, message: str) -> int:
        """Write `{code, message}` as an error frame to the principal's live connections and
        close them; how many. Their claim is released at once, so a reconnect is not refused."""
        frame = wire.encode(wire.error_response(None, RelayError(code, message)))
        hit = [c for c in self._conns if c.principal is not None and c.principal.id == principal_id]
        count = 0
        for conn in hit:
            if self._claims.get(principal_id) is conn:
                del self._claims[principal_id]
            if conn.closing:
                continue
            conn.finish(frame)
            count += 1
            self._inscribe(
                "relay.connection.identity_revoked_teardown",
                connection_id=conn.id,
                principal_id=principal_id,
                code=code,
            )
        return count

    def send_event(self, principal_id: str, frame: dict[str, Any]) -> int:
        """Queue an event frame (`wire.event(...)`) to the principal's live connections, best
        effort: a connection with `EVENT_BACKLOG` events unwritten misses it. How many got it."""
        try:
            data = wire.encode(frame)
        except ValueError:
            events.emit("relay.event.unencodable", level="error", principal_id=principal_id)
            return 0
        count = 0
        for conn in list(self._conns):
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
        return count

    # -- one connection ---------------------------------------------------------------------
    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(next(self._ids), reader, writer)
        conn.writer_task = asyncio.ensure_future(self._write_loop(conn))
        if self._closing:
            conn.abort()
        elif sum(1 for c in self._conns if not c.closing) >= self.max_connections:
            events.emit(
                "relay.connection.limit_reached",
                level="warning",
                max_connections=self.max_connections,
            )
            limit = RelayError(
                "runtime_connection_limit_reached",
                "relay connection limit reached",
                {"max_connections": self.max_connections},
            )
            conn.finish(wire.encode(wire.error_response(None, limit)))
        else:
            self._conns.add(conn)
        try:
            await self._read_loop(conn)
        finally:
            conn.reading_done.set()
            self._conns.discard(conn)
            if conn.principal is not None and self._claims.get(conn.principal.id) is conn:
                del self._claims[conn.principal.id]
            conn.finish()
            try:
                await conn.writer_task
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _read_loop(self, conn: _Conn) -> None:
        discarded = 0
        loop = asyncio.get_running_loop()
        hello_deadline = loop.time() + self.pre_hello_timeout  # from the accept, never extended
        while True:
            try:
                if conn.principal is None and not conn.closing:
                    left = hello_deadline - loop.time()
                    if left <= 0:
                        raise TimeoutError
                    line = await asyncio.wait_for(conn.reader.readline(), left)
                else:
                    line = await conn.reader.readline()
            except TimeoutError:
                events.emit(
                    "relay.connection.pre_hello_timeout", level="debug", connection_id=conn.id
                )
                return
            except ValueError:  # a line over the limit (asyncio dropped it)
                if not conn.closing:
                    too_long = RelayError(
                        "validation_invalid_arguments",
                        wire.PARSE_FAILED,
                        {"cause": f"frame longer than {wire.MAX_FRAME_BYTES} bytes"},
                    )
                    conn.finish(wire.encode(wire.error_response(None, too_long)))
                discarded += wire.MAX_FRAME_BYTES
                if discarded > LINGER_BYTES:
                    return
                continue
            except OSError:
                return
            if not line:
                return
            if conn.closing:  # lingering: read and drop until EOF, a bound, or the writer closes
                discarded += len(line)
                if discarded > LINGER_BYTES:
                    return
                continue
            if not line.endswith(b"\n"):
                return  # EOF in the middle of a frame
            await self._on_line(conn, line)

    async def _on_line(self, conn: _Conn, line: bytes) -> None:
        try:
            frame = wire.parse_frame(line)
        except RelayError as err:
            if conn.principal is None and err.code != "validation_invalid_arguments":
                self._refused(conn, err)
            conn.finish(wire.encode(wire.error_response(None, err)))
            return
        if isinstance(frame, Hello):
            if conn.principal is not None:
                again = RelayError(
                    "validation_invalid_arguments",
                    wire.PARSE_FAILED,
                    {"cause": "a second hello on a connection that completed its hello"},
                )
                conn.finish(wire.encode(wire.error_response(None, again)))
                return
            await self._hello(conn, frame)
            return
        if conn.principal is None:
            missing = RelayError("validation_missing_hello", MISSING_HELLO_MESSAGE)
            await conn.send(wire.encode(wire.error_response(frame.request_id, missing)))
            return
        body = await self._run(conn.principal, frame)
        try:
            data = wire.encode(wire.response(frame.request_id, body))
        except ValueError as exc:
            events.emit(
                "relay.request.unencodable_response",
                level="error",
                operation=frame.operation,
                principal_id=conn.principal.id,
                error=str(exc),
            )
            data = wire.encode(wire.response(frame.request_id, _unexpected()))
        await conn.send(data)  # the next request is read once this is written

    async def _hello(self, conn: _Conn, hello: Hello) -> None:
        try:
            principal = self._authenticate_peer(conn, hello)
            if principal.id != hello.principal_id:
                events.emit(
                    "relay.hello.principal_mismatch",
                    level="error",
                    connection_id=conn.id,
                    claimed=hello.principal_id,
                    authenticated=principal.id,
                )
                raise RelayError("internal_unexpected_failure", UNEXPECTED_MESSAGE)
        except RelayError as err:
            self._refused(conn, err)
            conn.finish(wire.encode(wire.error_response(None, err)))
            return
        owner = self._claims.get(principal.id)
        if owner is not None and owner is not conn:
            if owner.live:
                conflict = RelayError(
                    "runtime_identity_claim_conflict",
                    CLAIM_CONFLICT_MESSAGE,
                    {"principal_id": principal.id, "reason": CLAIM_CONFLICT_REASON},
                )
                self._refused(conn, conflict)
                conn.finish(wire.encode(wire.error_response(None, conflict)))
                return
            self._inscribe(
                "relay.stream.stale_claim_reclaimed",
                connection_id=conn.id,
                stale_connection_id=owner.id,
                principal_id=principal.id,
            )
        self._claims[principal.id] = conn
        conn.principal = principal
        events.emit(
            "relay.connection.hello",
            level="debug",
            connection_id=conn.id,
            principal_id=principal.id,
            kind=principal.kind,
            verified=principal.verified,
        )
        await conn.send(wire.encode(wire.hello_ack(principal.id)))

    def _authenticate_peer(self, conn: _Conn, hello: Hello) -> Principal:
        """`authenticate(hello, the kernel's credentials)`, closing any pidfd afterwards."""
        cred: PeerCred | None = None
        sock = conn.writer.get_extra_info("socket")
        try:
            if sock is not None:
                with contextlib.suppress(OSError):
                    cred = peer_credentials(cast(socket.socket, sock))
            try:
                return self._authenticate(hello, cred)
            except RelayError:
                raise
            except Exception:
                events.emit(
                    "relay.hello.unexpected_failure",
                    level="error",
                    connection_id=conn.id,
                    traceback=traceback.format_exc(),
                )
                raise RelayError("internal_unexpected_failure", UNEXPECTED_MESSAGE) from None
        finally:
            if cred is not None and cred.pidfd is not None:
                with contextlib.suppress(OSError):
                    os.close(cred.pidfd)

    def _refused(self, conn: _Conn, err: RelayError) -> None:
        events.emit("relay.hello.refused", level="warning", connection_id=conn.id, code=err.code)

    async def _run(self, principal: Principal, request: Request) -> dict[str, Any]:
        try:
            body = await self._handle(principal, request)
        except RelayError as err:
            return {"kind": "error", "error": err.wire()}
        except Exception:
            events.emit(
                "relay.request.unexpected_failure",
                level="error",
                operation=request.operation,
                principal_id=principal.id,
                traceback=traceback.format_exc(),
            )
            return _unexpected()
        if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
            events.emit(
                "relay.request.bad_response",
                level="error",
                operation=request.operation,
                principal_id=principal.id,
                type=type(body).__name__,
            )
            return _unexpected()
        return body

    async def _write_loop(self, conn: _Conn) -> None:
        """Write the outbox in order, each frame drained within `write_timeout`; after a last
        frame shut the write side and linger; on any failure abort. Closes the transport."""
        try:
            while True:
                if not conn.outbox:
                    conn.wake.clear()
                    if conn.writer.is_closing():
                        return
                    await conn.wake.wait()
                    continue
                data, done, last = conn.outbox.popleft()
                if done is None and not last:
                    conn.queued_events -= 1
                if data:
                    conn.writer.write(data)
                    try:
                        await asyncio.wait_for(conn.writer.drain(), self.write_timeout)
                    except TimeoutError:
                        self._inscribe(
                            "relay.connection.write_timeout",
                            level="warning",
                            connection_id=conn.id,
                            principal_id=conn.principal.id if conn.principal else None,
                            timeout=self.write_timeout,
                        )
                        conn.abort()
                        return
                if done is not None and not done.done():
                    done.set_result(None)
                if last:
                    if conn.writer.can_write_eof():
                        conn.writer.write_eof()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(conn.reading_done.wait(), LINGER_SECONDS)
                    return
        except (OSError, RuntimeError):
            conn.abort()
        finally:
            conn.closing = True
            for _, done, _ in conn.outbox:
                if done is not None and not done.done():
                    done.set_result(None)
            conn.outbox.clear()
            conn.writer.close()


def _unexpected() -> dict[str, Any]:
    return {
        "kind": "error",
        "error": {"code": "internal_unexpected_failure", "message": UNEXPECTED_MESSAGE},
    }


def _bind(path: str) -> unixsock.Listening:
    """A listening socket at `path`, mode 0600 before it listens, in a directory private to us."""
    parent = os.path.dirname(path) or "."
    try:
        info = os.stat(parent)
    except OSError as exc:
        raise RelayBindError(f"the relay socket's directory {parent} is missing: {exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise RelayBindError(f"{parent} is not a directory")
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise RelayBindError(
            f"{parent} must be owned by this user and writable by no one else "
            f"(owner {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o})"
        )
    try:
        return unixsock.listen(path, mode=0o600, backlog=BACKLOG)
    except unixsock.SocketPathError as exc:
        if exc.reason == unixsock.NOT_A_SOCKET:
            raise RelayBindError(f"{path} exists and is not a socket") from None
        if exc.reason == unixsock.IN_USE:
            raise RelayBindError(
                f"another process is serving {path}; is a relay already running?"
            ) from None
        raise RelayBindError(f"cannot bind the relay socket {path}: {exc}") from None
    except OSError as exc:
        raise RelayBindError(f"cannot bind the relay socket {path}: {exc}") from exc
