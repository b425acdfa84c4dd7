"""RelayServer: agentmux's relay wire protocol (reference §2) on one Unix socket.

Owns: the listening socket at `path` (its parent must exist, be a directory owned by this user and
writable by no one else; mode 0600 set before the socket listens; a stale socket file is replaced
only when nothing listens on it, anything else there is refused: `mcphost.unixsock`), serving the
connections (one asyncio task each, plus one writer task each; who they are and their identity
claims are `registry`, a `connections.Connections` shared with the behaviour) and the
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

`revoke`, `send_event`, `live_principals`, `connections` and `claimed` are
the registry's (connections.py); `aclose` stops listening, closes every connection and
in-process session and unlinks the socket (only if it is still the file this server bound).
`inscribe` (inscriptions.py; default: the event log only) takes the connection records of §5:
`relay.stream.stale_claim_reclaimed`, `relay.connection.write_timeout`,
`relay.connection.identity_revoked_teardown`.

In-process sessions (`local_session`, `LocalSession`): for a host running the relay in its own
process, a principal it established itself (the supervisor: the agent its attach hub identified
by the kernel) is served without socket, JSON or hello; `admit` checks only that the principal
exists; the session holds the principal's claim in the registry as a connection does, and is
revoked and sent events there (docs/relay-internals.md).

Must never: take identity from anything but `authenticate` (which sees the kernel's
credentials) or, for an in-process session, the host's word checked by `admit`; log an
identity token or a request body, answer a request before its connection's hello, let one
connection's failure reach another or the accept loop, or process two requests of one
connection (or one in-process session) at once.

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
from collections.abc import Awaitable, Callable
from typing import Any, cast

from mcphost import events, unixsock
from mcphost.agentmux import wire
from mcphost.agentmux.operations import WireRequest
from mcphost.agentmux.wire import Hello, Principal, RelayError, Request
from mcphost.peer import PeerCred, peer_credentials
from mcphost.relay.connections import CLAIM_CONFLICT_MESSAGE as CLAIM_CONFLICT_MESSAGE
from mcphost.relay.connections import Conn, Connections
from mcphost.relay.inscriptions import Inscribe, RelayInscriptions

Authenticate = Callable[[Hello, PeerCred | None], Principal]
Admit = Callable[[str], Principal]
OnEvent = Callable[[dict[str, Any]], None]
Handle = Callable[[Principal, Request], Awaitable[dict[str, Any]]]

BACKLOG = 128
LINGER_SECONDS = 1.0
LINGER_BYTES = 1 << 20

MISSING_HELLO_MESSAGE = "hello is required before any request on a relay connection"
UNEXPECTED_MESSAGE = "the relay failed unexpectedly; its event log has the details"


class RelayBindError(Exception):
    """The relay socket cannot be bound: the path is in use, not a socket, or its directory
    is missing or not private to this user."""


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
        admit: Admit | None = None,
        registry: Connections | None = None,
    ) -> None:
        self.path = path
        self._inscribe: Inscribe = inscribe if inscribe is not None else RelayInscriptions(None)
        self.registry = registry if registry is not None else Connections(self._inscribe)
        self._authenticate = authenticate
        self._admit = admit
        self._handle = handle
        self.pre_hello_timeout = pre_hello_timeout
        self.write_timeout = write_timeout
        self.max_connections = max_connections
        self._server: asyncio.AbstractServer | None = None
        self._listening: unixsock.Listening | None = None
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
        for conn in list(self.registry.conns):
            conn.abort()
        for session in list(self.registry.locals):
            session.close()
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), self.write_timeout)
            self._server = None

    # -- the registry (connections.py) ----------------------------------------------------
    def connections(self, principal_id: str | None = None) -> int:
        """Live socket connections (of `principal_id`, when given; hello'd or not when None).
        In-process sessions are not connections."""
        return self.registry.count(principal_id)

    def live_principals(self) -> list[str]:
        return self.registry.live_principals()

    def claimed(self, principal_id: str) -> bool:
        return self.registry.claimed(principal_id)

    def revoke(self, principal_id: str, code: str, message: str) -> int:
        return self.registry.revoke(principal_id, code, message)

    def send_event(self, principal_id: str, frame: dict[str, Any]) -> int:
        return self.registry.send_event(principal_id, frame)

    # -- in-process sessions ----------------------------------------------------------------
    def local_session(self, principal_id: str, on_event: OnEvent | None = None) -> LocalSession:
        """An in-process session speaking as `principal_id`, which the host established (the
        kernel vouched for it before this call): no socket, no hello, no credential. The
        server's `admit` checks only that the principal exists (a member of a configured
        bundle); the session claims the identity at its first request (module doc)."""
        if self._admit is None:
            raise RuntimeError("this relay server was built without `admit`")
        session = LocalSession(self, next(self._ids), principal_id, on_event)
        self.registry.locals.add(session)
        return session

    def _admit_local(self, principal_id: str) -> Principal:
        assert self._admit is not None
        try:
            return self._admit(principal_id)
        except RelayError:
            raise
        except Exception:
            events.emit(
                "relay.session.unexpected_failure",
                level="error",
                principal_id=principal_id,
                traceback=traceback.format_exc(),
            )
            raise RelayError("internal_unexpected_failure", UNEXPECTED_MESSAGE) from None

    # -- one connection ---------------------------------------------------------------------
    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(next(self._ids), reader, writer)
        conn.writer_task = asyncio.ensure_future(self._write_loop(conn))
        if self._closing:
            conn.abort()
        elif sum(1 for c in self.registry.conns if not c.closing) >= self.max_connections:
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
            self.registry.conns.add(conn)
        try:
            await self._read_loop(conn)
        finally:
            conn.reading_done.set()
            self.registry.conns.discard(conn)
            if conn.principal is not None:
                self.registry.release(conn, conn.principal.id)
            conn.finish()
            try:
                await conn.writer_task
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _read_loop(self, conn: Conn) -> None:
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

    async def _on_line(self, conn: Conn, line: bytes) -> None:
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

    async def _hello(self, conn: Conn, hello: Hello) -> None:
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
            self.registry.claim(conn, principal)
        except RelayError as err:  # refused, or the identity is claimed by a live connection
            self._refused(conn, err)
            conn.finish(wire.encode(wire.error_response(None, err)))
            return
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

    def _authenticate_peer(self, conn: Conn, hello: Hello) -> Principal:
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

    def _refused(self, conn: Conn, err: RelayError) -> None:
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

    async def _write_loop(self, conn: Conn) -> None:
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


class LocalSession:
    """One in-process relay session (`RelayServer.local_session`): what a hello'd connection is,
    without the socket. Its first request (and the first after a revocation) admits the
    principal and takes its identity claim (`runtime_identity_claim_conflict` while a live
    socket connection holds it); `close` releases the claim. Requests are served by the
    server's `_run`, one at a time and in order, from the operation's model the caller built
    (`WireRequest.request`), or a dict (checked as a decoded request frame is:
    `wire.parse_request`); the response body comes back as the
    object the behaviour built, never encoded."""

    def __init__(
        self, server: RelayServer, cid: int, principal_id: str, on_event: OnEvent | None
    ) -> None:
        self.id = cid
        self.principal_id = principal_id
        self.principal: Principal | None = None  # set while it holds the identity claim
        self.on_event: OnEvent = on_event if on_event is not None else _drop_event
        self.closing = False
        self._server = server
        self._turn = asyncio.Lock()

    @property
    def live(self) -> bool:
        return not self.closing and self.principal is not None

    async def request(
        self, body: dict[str, Any] | WireRequest, namespace: str | None = None
    ) -> dict[str, Any]:
        """The response body for `body` in `namespace`: the operation's model (handed to the
        behaviour as it is: `WireRequest.request`), or a dict (`{"operation": ..., ...}`, checked
        as a decoded frame is); raises RelayError where a socket client's hello or frame would
        be refused."""
        async with self._turn:
            if self.closing:
                raise RelayError("internal_unexpected_failure", "the relay session is closed")
            request = _local_request(body, namespace)
            principal = self.principal
            if principal is None:
                principal = self._server._admit_local(self.principal_id)
                self._server.registry.claim(self, principal)
                self.principal = principal
                events.emit(
                    "relay.session.claimed",
                    level="debug",
                    connection_id=self.id,
                    principal_id=principal.id,
                )
            return await self._server._run(principal, request)

    def revoked(self) -> None:
        """The identity was revoked: release the claim; the next request claims it afresh."""
        if self.principal is not None:
            self._server.registry.release(self, self.principal.id)
            self.principal = None

    def close(self) -> None:
        """Release the claim for good; a later request is refused."""
        self.revoked()
        self.closing = True
        self._server.registry.locals.discard(self)


def _drop_event(frame: dict[str, Any]) -> None:
    pass


def _local_request(body: dict[str, Any] | WireRequest, namespace: str | None) -> Request:
    if isinstance(body, WireRequest):
        return body.request(namespace)
    frame: dict[str, Any] = {"frame": "request", "request": body}
    if namespace is not None:
        frame["namespace"] = namespace
    return wire.parse_request(frame)


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
