"""HttpHub: MCP's streamable HTTP on the loopback, for the clients that speak it (no pump).

Owns: one TCP listener on 127.0.0.1 (a port the kernel picks; `url(surface)` names each
surface's endpoint, `/mcp/center` and `/mcp/relay`), its own accept loop, the registry of
every HTTP session, and every guard and bound on what arrives there:
- who, per connection and before a byte of it is read: its owner uid, from the kernel
  (`peer.tcp_owner_uid`: `NETLINK_SOCK_DIAG`, else `/proc/net/tcp`), never from what it sends;
  a connection whose owner is not the uid of an agent this hub serves (`serves(uid)`), or
  cannot be found, is reset at once (`not_an_agent`, `peer_unknown`) and the HTTP layer never
  sees it;
- who, per request: `identify(surface, uid)` -> `Attached(agent_id, generation)`, the agent
  whose own uid it is at its current generation, or `Refused` (403 with the refusal's code);
  a request naming a session (`Mcp-Session-Id`) is served only when that session is the same
  agent's at the same generation and surface (404 `session_closed` otherwise: a session id
  another uid learnt is worth nothing to it, and an older generation's session is gone);
- how many: `CONNECTIONS_PER_LISTENER` and `CONNECTIONS_PER_PEER` open at once
  (`values.Bounds`, past a bound a connection is reset, never queued); sessions per agent and
  surface (`identify` counts the pumps' and these together); `REQUESTS_PER_AGENT` requests in
  flight per agent (429 `too_many_requests`); a request body of at most `BODY_MAX` bytes (413
  `request_too_large`, read no further), and every agent's request bodies in flight count
  against its byte budget (`mcpserve.budget`, the pumps' `Budgets`: one per agent across both
  transports and surfaces; a request that finds it spent gets 503 `budget_spent`);
- how long: a connection idle `IDLE_SECONDS` between requests is closed (uvicorn's keep-alive
  timeout), a request head is at most `HEAD_MAX` bytes, and a session no request has used for
  `SESSION_IDLE_SECONDS` ends (the SDK transport's `idle_timeout`);
- which `Host`: the SDK transport's DNS-rebinding guard, given this listener's own address.

The HTTP and MCP layers are libraries: uvicorn's h11 protocol parses HTTP (one protocol object
per accepted connection, built as uvicorn's own server builds it), and each session is the SDK's
`StreamableHTTPServerTransport`, whose streams `mcpserve.adapter.serve_streams` serves with the
agent's `Surface`, the very surface a pump's session gets (same catalog, same identity, same
generation). `close_where` ends sessions at once (an older generation's, an agent that left),
as `SessionHub.close_where` does for the pumps.

Must never: take identity from a request's bytes (a header, a path, a session id); serve a
connection before its owner is known; bind anything but the loopback; or load uvicorn and the
SDK's HTTP transport before it starts (`start`, called when an agent of the fleet first asks for
HTTP, `mcp_transport = "http"`): the pump's and the standalone host's paths never load them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import secrets
import socket
import struct
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mcphost import events, peer
from mcphost.events import RateLimit
from mcphost.mcpserve.budget import Budgets
from mcphost.supervisor import refusals as R
from mcphost.supervisor.refusals import Refused
from mcphost.supervisor.serving.sessions import Attached
from mcphost.supervisor.values import Bounds

if TYPE_CHECKING:
    from mcp.server.streamable_http import StreamableHTTPServerTransport

    from mcphost.surface import Surface

HOST = "127.0.0.1"
PATH_PREFIX = "/mcp/"
CONNECTIONS_PER_LISTENER = 8192  # open at once (a thousand agents, a few each); more are reset
CONNECTIONS_PER_PEER = 16  # open at once by one owner uid (a client holds two or three)
REQUESTS_PER_AGENT = 64  # HTTP requests of one agent being served at once (the pumps' calls)
BODY_MAX = 16 * 1024 * 1024  # one request body (a pump session holds 16 MiB of lines)
HEAD_MAX = 64 * 1024  # one request head
IDLE_SECONDS = 60.0  # a connection with no request in progress, before it is closed
SESSION_IDLE_SECONDS = 3600.0  # a session no request has used, before it ends
BACKLOG = 128
ACCEPT_RETRY_SECONDS = 0.1
NOT_AN_AGENT = "not_an_agent"
PEER_UNKNOWN = "peer_unknown"
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets


@dataclass(eq=False)
class _Session:
    """One HTTP session: its agent and generation, its surface, the SDK transport."""

    sid: str
    surface_name: str
    attached: Attached
    transport: StreamableHTTPServerTransport
    surface: Surface
    task: asyncio.Task[None] | None = None
    ended: bool = False


@dataclass(eq=False)
class _Agent:
    in_flight: int = 0


@dataclass
class HttpHub:
    """The loopback listener of every HTTP session (module doc). `identify(surface, uid)` and
    `surface_for(surface, attached)` are the supervisor's (surfaces.py); `serves(uid)`: is
    `uid` the own uid of an agent that may use HTTP (checked at accept)."""

    identify: Callable[[str, int], Attached]
    surface_for: Callable[[str, Attached], Surface]
    serves: Callable[[int], bool]
    budgets: Budgets
    bounds: Bounds = field(
        default_factory=lambda: Bounds(CONNECTIONS_PER_LISTENER, CONNECTIONS_PER_PEER)
    )
    port: int = 0  # set by `start`
    refused: Counter[str] = field(default_factory=Counter)  # by reason (the log, tests)
    _sock: socket.socket | None = None
    _accepting: asyncio.Task[None] | None = None
    _owners: dict[tuple[str, int], int] = field(default_factory=dict)  # client addr -> uid
    _sessions: dict[str, _Session] = field(default_factory=dict)
    _agents: dict[str, _Agent] = field(default_factory=dict)
    _protocol: Callable[[], asyncio.Protocol] | None = None
    _logs: dict[str, RateLimit] = field(default_factory=dict)
    _closing: bool = False

    @property
    def started(self) -> bool:
        """Is it listening (`start` ran, `aclose` did not)?"""
        return self._sock is not None

    def url(self, surface: str) -> str:
        return f"http://{HOST}:{self.port}{PATH_PREFIX}{surface}"

    # -- the listener ---------------------------------------------------------------------
    async def start(self) -> None:
        """Bind a free loopback port and accept in the background (raises OSError)."""
        import uvicorn
        from uvicorn.server import ServerState

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((HOST, 0))
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app,
            http="h11",
            interface="asgi3",
            lifespan="off",
            # never: X-Forwarded-For would rewrite the scope's client, which names the owner
            proxy_headers=False,
            log_config=None,
            access_log=False,
            timeout_keep_alive=int(IDLE_SECONDS),
            h11_max_incomplete_event_size=HEAD_MAX,
            server_header=False,
        )
        config.load()
        state = ServerState()
        protocol_class = config.http_protocol_class
        self._protocol = lambda: protocol_class(  # type: ignore[call-arg]
            config=config, server_state=state, app_state={}
        )
        self._accepting = asyncio.get_running_loop().create_task(self._accept(sock))
        events.emit("supervisor.http.listening", url=self.url(""))

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, addr = await loop.sock_accept(listener)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue
            except OSError as exc:
                name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                self._log("accept", "supervisor.http.accept_failed", errno=name)
                await asyncio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            client = (addr[0], addr[1])
            try:
                uid = peer.tcp_owner_uid(client, conn.getsockname()[:2])
                reason = self._admit(uid)
            except Exception as exc:  # the owner could not be told: fail closed
                uid, reason = None, type(exc).__name__
            if reason is not None:
                _drop(conn)
                self.refused[reason] += 1
                self._log(reason, "supervisor.http.refused", reason=reason, uid=uid)
                continue
            assert uid is not None
            await self._serve(loop, conn, client, uid)

    def _admit(self, uid: int | None) -> str | None:
        """Why a connection of owner `uid` is refused, or None (then it is counted)."""
        if uid is None:
            return PEER_UNKNOWN
        if not self.serves(uid):
            return NOT_AN_AGENT
        return self.bounds.admit(uid)

    async def _serve(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: socket.socket,
        client: tuple[str, int],
        uid: int,
    ) -> None:
        assert self._protocol is not None
        self._owners[client] = uid
        done = False

        def ended() -> None:
            nonlocal done
            if not done:
                done = True
                self._owners.pop(client, None)
                self.bounds.release(uid)

        try:
            await loop.connect_accepted_socket(lambda: _Counted(self._protocol(), ended), sock=conn)  # type: ignore[misc]
        except OSError:
            ended()
            _drop(conn)

    def _log(self, kind: str, event: str, **fields: Any) -> None:
        limit = self._logs.setdefault(kind, RateLimit(1, events.LOG_EVERY_SECONDS))
        events.emit_limited(limit, event, "warning", **fields)

    # -- each request (ASGI) --------------------------------------------------------------
    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        client = scope.get("client")
        uid = self._owners.get((client[0], client[1])) if client else None
        if uid is None:  # never: every connection served here was admitted with its owner
            await _reply(send, 403, R.HTTP_UNKNOWN_PEER.code, R.HTTP_UNKNOWN_PEER.message())
            return
        path: str = scope.get("path", "")
        surface = path[len(PATH_PREFIX) :] if path.startswith(PATH_PREFIX) else ""
        if surface not in ("center", "relay"):
            await _reply(send, 404, R.HTTP_NO_PATH.code, R.HTTP_NO_PATH.message(path=path[:80]))
            return
        try:
            if self._closing:
                raise Refused.row(R.STOPPING)
            attached = self.identify(surface, uid)
        except Refused as refusal:
            self._log(refusal.code, "supervisor.http.request_refused", code=refusal.code, uid=uid)
            await _reply(send, 403, refusal.code, refusal.message)
            return
        except Exception as exc:
            self._crash("supervisor.identify_failed", exc, uid=uid)
            await _reply(send, 500, R.IDENTIFY_FAILED.code, R.IDENTIFY_FAILED.message())
            return
        headers = dict(scope.get("headers") or ())
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > BODY_MAX):
            await _reply(send, 413, R.HTTP_TOO_LARGE.code, R.HTTP_TOO_LARGE.message(limit=BODY_MAX))
            return
        agent = self._agents.setdefault(attached.agent_id, _Agent())
        if agent.in_flight >= REQUESTS_PER_AGENT:
            await _reply(
                send, 429, R.HTTP_TOO_MANY.code, R.HTTP_TOO_MANY.message(limit=REQUESTS_PER_AGENT)
            )
            return
        share = self.budgets.share(attached.agent_id)
        agent.in_flight += 1
        try:
            if share.blocks():
                await _reply(send, 503, R.HTTP_BUDGET.code, R.HTTP_BUDGET.message())
                return
            await self._handle(scope, receive, send, surface, attached, headers, share)
        finally:
            share.close()
            agent.in_flight -= 1
            if not agent.in_flight:
                self._agents.pop(attached.agent_id, None)

    async def _handle(
        self,
        scope: dict[str, Any],
        receive: Any,
        send: Any,
        surface: str,
        attached: Attached,
        headers: dict[bytes, bytes],
        share: Any,
    ) -> None:
        sid = headers.get(b"mcp-session-id", b"").decode("latin-1")
        if sid:
            session = self._sessions.get(sid)
            if (
                session is None
                or session.ended
                or session.surface_name != surface
                or session.attached != attached
            ):
                await _reply(send, 404, R.HTTP_SESSION_GONE.code, R.HTTP_SESSION_GONE.message())
                return
        elif scope.get("method") != "POST":
            await _reply(send, 400, R.HTTP_NO_SESSION.code, R.HTTP_NO_SESSION.message())
            return
        else:
            try:
                session = await self._open(surface, attached)
            except Refused as refusal:
                await _reply(send, 403, refusal.code, refusal.message)
                return
        held = 0
        cut = False

        async def counted() -> Any:
            nonlocal held, cut
            message = await receive()
            if message.get("type") == "http.request":
                held += len(message.get("body", b""))
                share.set(held, message.get("more_body", False))
                if held > BODY_MAX:  # a chunked body past the bound: read no further
                    cut = True
                    return {"type": "http.disconnect"}
            return message

        await session.transport.handle_request(scope, counted, send)
        if cut:
            self._log("too_large", "supervisor.http.body_cut", agent_id=attached.agent_id)

    async def _open(self, surface: str, attached: Attached) -> _Session:
        """A new session of `attached` on `surface`: its surface built, its SDK transport
        connected and served in a task of its own; raises `Refused`."""
        from mcp.server.streamable_http import StreamableHTTPServerTransport
        from mcp.server.transport_security import TransportSecuritySettings

        surface_obj = self.surface_for(surface, attached)
        hosts = [f"{HOST}:{self.port}", f"localhost:{self.port}"]
        transport = StreamableHTTPServerTransport(
            secrets.token_hex(16),
            security_settings=TransportSecuritySettings(
                allowed_hosts=hosts, allowed_origins=[f"http://{h}" for h in hosts]
            ),
            idle_timeout=SESSION_IDLE_SECONDS,
        )
        assert transport.mcp_session_id is not None
        session = _Session(transport.mcp_session_id, surface, attached, transport, surface_obj)
        self._sessions[session.sid] = session
        ready = asyncio.Event()
        session.task = asyncio.ensure_future(self._run(session, ready))
        await ready.wait()
        events.emit(
            "supervisor.session.started",
            transport="http",
            surface=surface,
            agent_id=attached.agent_id,
            generation=attached.generation,
        )
        return session

    async def _run(self, session: _Session, ready: asyncio.Event) -> None:
        from mcphost.mcpserve.adapter import serve_streams

        reason = "closed"
        try:
            async with session.transport.connect() as (read_stream, write_stream):
                ready.set()
                scope = session.transport.idle_scope
                with scope if scope is not None else contextlib.nullcontext():
                    await serve_streams(session.surface, read_stream, write_stream)
                if scope is not None and scope.cancelled_caught:
                    reason = "idle"
        except asyncio.CancelledError:
            reason = "stopped"
        except Exception as exc:
            reason = "crashed"
            self._crash("supervisor.session.crashed", exc, agent_id=session.attached.agent_id)
        finally:
            ready.set()
            session.ended = True
            self._sessions.pop(session.sid, None)
            with contextlib.suppress(Exception):
                await session.transport.terminate()
            try:
                await session.surface.aclose()
            except Exception as exc:
                events.emit(
                    "supervisor.session.close_failed",
                    level="warning",
                    transport="http",
                    exception=type(exc).__name__,
                )
            events.emit(
                "supervisor.session.ended",
                transport="http",
                surface=session.surface_name,
                agent_id=session.attached.agent_id,
                generation=session.attached.generation,
                reason=reason,
            )

    def _crash(self, event: str, exc: BaseException, **fields: Any) -> None:
        events.emit(
            event,
            level="error",
            transport="http",
            **fields,
            exception=type(exc).__name__,
            traceback=traceback.format_exc(limit=8),
        )

    # -- the registry ---------------------------------------------------------------------
    def count(self, agent_id: str, surface: str) -> int:
        """Live HTTP sessions of `agent_id` on `surface`."""
        return sum(
            1
            for s in self._sessions.values()
            if not s.ended and s.surface_name == surface and s.attached.agent_id == agent_id
        )

    def counts(self) -> Counter[str]:
        """Live HTTP sessions per agent (both surfaces)."""
        return Counter(s.attached.agent_id for s in self._sessions.values() if not s.ended)

    def close_where(self, pred: Callable[[Attached], bool]) -> int:
        """End every live session whose `Attached` satisfies `pred` at once; how many."""
        hit = [s for s in self._sessions.values() if not s.ended and pred(s.attached)]
        for session in hit:
            session.ended = True
            if session.task is not None:
                session.task.cancel()
        return len(hit)

    async def aclose(self) -> None:
        """Stop accepting, end every session, close the listener."""
        self._closing = True
        accepting, self._accepting = self._accepting, None
        if accepting is not None:
            accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await accepting
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        tasks = [s.task for s in self._sessions.values() if s.task is not None]
        self.close_where(lambda _: True)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


class _Counted(asyncio.Protocol):
    """uvicorn's protocol for one admitted connection, told when it ends (the bounds' count)."""

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


async def _reply(send: Any, status: int, code: str, message: str) -> None:
    """A refusal as JSON: `{"error": {"code", "message"}}` (the connection kept alive, as any
    other answer: uvicorn closes it when the body was left unread)."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _drop(conn: socket.socket) -> None:
    """Close a refused connection at once (a reset: nothing lingers on our side)."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    conn.close()
