"""The one long-lived relay connection, multiplexed by `request_id`.

Owns: connecting to the relay's Unix socket (deep paths go through
`/proc/self/fd/<dirfd>/relay.sock` to dodge the `sun_path` limit: `mcphost.unixsock.address`), the Hello handshake
(2 s ack timeout; `runtime_identity_claim_conflict` retried every 50 ms for up to 1 s, then
reported as itself), framing (newline-delimited JSON), and matching responses to waiting calls.

When: as seed 000 says, the stream is Hello-registered when the server is built
(`register_now=True`, which `mcphost relay-tools` passes): a background task connects and sends
Hello at once, so serving never waits for the relay. If that fails (the relay is down, or refuses
the Hello), nothing is reported then and the stream stays unconnected: a call that was waiting on
that first Hello gets its failure, and every later call connects afresh, as a call after any
transport failure does (so `list principals` still synthesizes the down home bundle). Without
`register_now` (or outside a running loop) the stream connects on the first call.

Concurrency: unlike upstream (one call at a time behind a mutex), any number of calls share the
connection at once. Each call registers a future under a fresh `request_id`, writes one frame and
waits up to the request timeout (5 s); a single reader task resolves futures as response frames
arrive, in whatever order the relay answers. A late answer to a call that timed out or was
cancelled is dropped. Stream events are counted and reported through `on_events`, never surfaced.

Failure policy: a transport failure fails every call waiting on that connection (classified with a
Rust `ErrorKind` name) and discards the connection; the next call reconnects. A request is
written exactly once and never replayed, because it may already have executed on the relay.

Sharing (`SharedStream`): the relay allows one live connection per principal, so several
sessions speaking as one principal (the supervisor's relay tools sessions of one agent
generation) share one `RelayStream` through `StreamHandle`s instead of each claiming the identity.
A Hello still refused as `runtime_identity_claim_conflict` after the retries is reported as that
code (`errors.claim_conflict`), not as a timeout. After `aclose` a stream never reconnects.

Must never: replay a request, log or echo the identity token, or raise anything to callers but
`RelayIOError` (transport) or `ToolFailure` (a relay error during Hello, or one addressed to the
whole connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

from mcphost import unixsock
from mcphost.agentmux.operations import WireRequest
from mcphost.agentmux.wire import SCHEMA_VERSION, RelayError
from mcphost.relaytools.errors import (
    ClaimConflict,
    RelayIOError,
    ToolFailure,
    claim_conflict,
    from_relay_error,
    io_kind,
)

READ_LIMIT = 64 * 1024 * 1024
# a request body: the operation's model (what the relay tools send), or a dict (a raw body)
Body = dict[str, Any] | WireRequest


def new_request_id() -> str:
    """A random UUIDv4 string, without importing `uuid`."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def encode(frame: dict[str, Any]) -> bytes:
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


async def _open_unix(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    with unixsock.address(path) as where:  # a long path: through its directory's fd
        return await asyncio.open_unix_connection(where, limit=READ_LIMIT)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.pending: dict[str, asyncio.Future[Any]] = {}
        self.closed = False
        self.task: asyncio.Task[None] | None = None

    def fail_all(self, exc: BaseException) -> None:
        self.closed = True
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self.pending.clear()
        with contextlib.suppress(Exception):
            self.writer.close()


class _CountsEvents:
    """Events the relay addresses to the principal, counted (the tools never show them) and
    reported through `on_events` once per loop turn, however many arrived in it."""

    _on_events: Callable[[int], None] | None
    _unreported_events: int
    events_ignored: int

    def _count_event(self) -> None:
        self.events_ignored += 1
        self._unreported_events += 1
        if self._unreported_events == 1:
            asyncio.get_running_loop().call_soon(self._report_events)

    def _report_events(self) -> None:
        count, self._unreported_events = self._unreported_events, 0
        if count and self._on_events is not None:
            self._on_events(count)


class RelayStream(_CountsEvents):
    """A self-healing, multiplexed client connection to the relay, opened at `register()` or
    on the first call."""

    def __init__(
        self,
        socket_path: str,
        principal_id: str,
        token: Callable[[], str],
        *,
        hello_timeout: float = 2.0,
        request_timeout: float = 5.0,
        claim_retry: float = 1.0,
        on_events: Callable[[int], None] | None = None,
        on_note: Callable[..., None] | None = None,
        register_now: bool = False,
    ) -> None:
        self.socket_path = socket_path
        self.principal_id = principal_id
        self._token = token
        self.hello_timeout = hello_timeout
        self.request_timeout = request_timeout
        self.claim_retry = claim_retry
        self._on_events = on_events
        self._on_note = on_note
        self._conn: _Connection | None = None
        self._lock = asyncio.Lock()
        self._unreported_events = 0
        self.events_ignored = 0
        self._registering: asyncio.Task[None] | None = None
        self._register_failure: RelayIOError | ToolFailure | None = None
        self._closed = False
        if register_now:
            self.register()

    @property
    def closed(self) -> bool:
        """Whether `aclose` ran (a closed stream never connects again)."""
        return self._closed

    def register(self) -> None:
        """Connect and send Hello now, in the background (seed 000: Hello-registered at server
        construction). Never raises: a failure is kept for a call already waiting on it."""
        if self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: the first call connects
        if self._registering is None or self._registering.done():
            self._registering = loop.create_task(self._register())

    async def _register(self) -> None:
        self._register_failure = None
        try:
            await self._open()
        except (RelayIOError, ToolFailure) as exc:
            self._register_failure = exc
        except Exception:  # anything else: the next call connects and reports for itself
            pass

    # -- public ---------------------------------------------------------------------------

    async def request(self, body: Body, namespace: str | None = None) -> Any:
        """Send one relay request (a model is sent as its `wire()` body); return the raw
        `response` object the relay answered with."""
        conn = await self._ensure()
        request_id = new_request_id()
        frame: dict[str, Any] = {"frame": "request", "request_id": request_id}
        if namespace is not None:
            frame["namespace"] = namespace
        frame["request"] = body.wire() if isinstance(body, WireRequest) else body
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        conn.pending[request_id] = fut
        try:
            try:
                conn.writer.write(encode(frame))
                await conn.writer.drain()
            except (OSError, RuntimeError) as exc:
                failure = RelayIOError(io_kind(exc), f"writing to relay failed: {exc}")
                conn.fail_all(failure)
                raise failure from exc
            try:
                return await asyncio.wait_for(fut, self.request_timeout)
            except TimeoutError:
                raise RelayIOError(
                    "TimedOut", f"no relay response within {self.request_timeout:g} s"
                ) from None
        finally:
            conn.pending.pop(request_id, None)

    async def aclose(self) -> None:
        """Close the connection for good: later calls fail (`ConnectionAborted`), none reconnects."""
        self._closed = True
        registering, self._registering = self._registering, None
        if registering is not None and not registering.done():
            registering.cancel()
            with contextlib.suppress(BaseException):
                await registering
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.fail_all(RelayIOError("ConnectionAborted", "relay stream closed"))
        if conn.task is not None:
            conn.task.cancel()
            with contextlib.suppress(BaseException):
                await conn.task

    # -- connection -----------------------------------------------------------------------

    async def _ensure(self) -> _Connection:
        if self._closed:
            raise RelayIOError("ConnectionAborted", "relay stream closed")
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        registering = self._registering
        if registering is not None and not registering.done():
            # the Hello sent when the server was built is in flight: its outcome is ours too
            await asyncio.shield(registering)
            conn = self._conn
            if conn is not None and not conn.closed:
                return conn
            if self._register_failure is not None:
                raise self._register_failure
        return await self._open()

    async def _open(self) -> _Connection:
        async with self._lock:
            conn = self._conn
            if conn is not None and not conn.closed:
                return conn
            if self._closed:
                raise RelayIOError("ConnectionAborted", "relay stream closed")
            conn = await self._connect()
            conn.task = asyncio.ensure_future(self._read_loop(conn))
            self._conn = conn
            return conn

    async def _connect(self) -> _Connection:
        deadline = time.monotonic() + self.claim_retry
        while True:
            try:
                reader, writer = await _open_unix(self.socket_path)
            except OSError as exc:
                raise RelayIOError(
                    io_kind(exc), f"connecting to {self.socket_path}: {exc}"
                ) from exc
            conn = _Connection(reader, writer)
            try:
                ack = await self._hello(conn)
            except BaseException:
                conn.fail_all(RelayIOError("ConnectionAborted", "hello failed"))
                raise
            if ack is None:
                return conn
            conn.fail_all(RelayIOError("ConnectionAborted", "identity claim conflict"))
            if time.monotonic() >= deadline:
                raise claim_conflict(self.principal_id, self.claim_retry, ack)
            await asyncio.sleep(0.05)

    async def _hello(self, conn: _Connection) -> ClaimConflict | None:
        """None when acknowledged; the conflict failure when the identity is claimed."""
        hello = {
            "frame": "hello",
            "schema_version": SCHEMA_VERSION,
            "principal_id": self.principal_id,
            "identity_token": self._token(),
        }
        try:
            conn.writer.write(encode(hello))
            await conn.writer.drain()
            line = await asyncio.wait_for(conn.reader.readline(), self.hello_timeout)
        except TimeoutError:
            raise RelayIOError(
                "TimedOut", f"relay did not acknowledge hello within {self.hello_timeout:g} s"
            ) from None
        except (OSError, ValueError, asyncio.LimitOverrunError) as exc:
            raise RelayIOError(io_kind(exc), f"relay hello failed: {exc}") from exc
        if not line:
            raise RelayIOError("UnexpectedEof", "relay closed the connection during hello")
        try:
            frame = json.loads(line)
        except ValueError:
            raise RelayIOError("InvalidData", "relay answered hello with a non-JSON line") from None
        if not isinstance(frame, dict):
            raise RelayIOError("InvalidData", "relay answered hello with a non-object")
        if frame.get("frame") == "hello_ack":
            if frame.get("schema_version") != SCHEMA_VERSION or (
                frame.get("principal_id") not in (None, self.principal_id)
            ):
                raise RelayIOError(
                    "InvalidData",
                    f"relay hello_ack does not match (schema_version "
                    f"{frame.get('schema_version')!r}, principal {frame.get('principal_id')!r})",
                )
            return None
        response = frame.get("response") if frame.get("frame") == "response" else None
        if isinstance(response, dict) and response.get("kind") == "error":
            failure = from_relay_error(response.get("error"))
            if isinstance(failure, ClaimConflict):
                return failure
            raise failure
        raise RelayIOError("InvalidData", f"relay answered hello with frame {frame.get('frame')!r}")

    async def _read_loop(self, conn: _Connection) -> None:
        failure: BaseException = RelayIOError("UnexpectedEof", "relay closed the connection")
        try:
            while True:
                line = await conn.reader.readline()
                if not line:
                    break
                if not line.endswith(b"\n"):
                    break  # EOF in the middle of a frame
                self._dispatch(conn, line)
        except asyncio.CancelledError:
            failure = RelayIOError("ConnectionAborted", "relay stream closed")
            raise
        except (OSError, ValueError, asyncio.LimitOverrunError) as exc:
            failure = RelayIOError(io_kind(exc), f"reading from relay failed: {exc}")
        finally:
            conn.fail_all(failure)

    def _dispatch(self, conn: _Connection, line: bytes) -> None:
        try:
            frame = json.loads(line)
        except ValueError:
            self._note("mcp.tool.stream.invalid_frame", length=len(line))
            return
        if not isinstance(frame, dict):
            return
        kind = frame.get("frame")
        if kind == "event":
            self._count_event()
            return
        if kind != "response":
            self._note("mcp.tool.stream.unknown_frame", frame=str(kind))
            return
        request_id = frame.get("request_id")
        if request_id is None:
            # addressed to the connection (revocation, a parse complaint): every waiter gets it
            response = frame.get("response")
            error = response.get("error") if isinstance(response, dict) else None
            conn.fail_all(from_relay_error(error))
            return
        fut = conn.pending.pop(str(request_id), None)
        if fut is not None and not fut.done():
            fut.set_result(frame.get("response"))

    def _note(self, event: str, **details: Any) -> None:
        if self._on_note is not None:
            self._on_note(event, **details)


class LocalRelay(Protocol):
    """An in-process relay session (the relay's `LocalSession`): one request's response body,
    a `RelayError` where a socket client's hello or frame would be refused; `close` ends it."""

    async def request(self, body: Body, namespace: str | None = None) -> dict[str, Any]: ...

    def close(self) -> None: ...


class InProcessStream(_CountsEvents):
    """The relay tools' stream onto an in-process relay session, for a host that runs the
    relay itself (the supervisor): what `RelayStream` is without the socket, the JSON and the
    hello. `open_session(on_event)` gives the session (its principal is the one the host
    established); each call hands the request to it as it is (the operation's model: no dict,
    no JSON) and returns the response body it built. The same contract as `RelayStream.request`: a call waits up to `request_timeout`
    (`TimedOut`; the request goes on, as one written to a socket would); a claim conflict is
    retried every 50 ms for `claim_retry` before the request runs, then reported as
    `errors.claim_conflict`; any other refusal is the relay's error (`from_relay_error`).
    Events the relay addresses to the principal are counted and reported through `on_events`.
    After `aclose` (which closes the session) every call fails with `ConnectionAborted`."""

    def __init__(
        self,
        open_session: Callable[[Callable[[dict[str, Any]], None]], LocalRelay],
        principal_id: str,
        *,
        request_timeout: float = 5.0,
        claim_retry: float = 1.0,
        on_events: Callable[[int], None] | None = None,
    ) -> None:
        self.principal_id = principal_id
        self.request_timeout = request_timeout
        self.claim_retry = claim_retry
        self._on_events = on_events
        self._unreported_events = 0
        self.events_ignored = 0
        self._closed = False
        self._session = open_session(self._on_event)

    @property
    def closed(self) -> bool:
        return self._closed

    async def request(self, body: Body, namespace: str | None = None) -> Any:
        deadline = time.monotonic() + self.claim_retry
        while True:
            if self._closed:
                raise RelayIOError("ConnectionAborted", "relay stream closed")
            call = asyncio.ensure_future(self._session.request(body, namespace))
            try:
                return await asyncio.wait_for(asyncio.shield(call), self.request_timeout)
            except TimeoutError:
                raise RelayIOError(
                    "TimedOut", f"no relay response within {self.request_timeout:g} s"
                ) from None
            except RelayError as err:
                failure = from_relay_error(err.wire())
            if not isinstance(failure, ClaimConflict):
                raise failure
            if time.monotonic() >= deadline:
                raise claim_conflict(self.principal_id, self.claim_retry, failure)
            await asyncio.sleep(0.05)

    async def aclose(self) -> None:
        self._closed = True
        self._session.close()

    def _on_event(self, frame: dict[str, Any]) -> None:
        self._count_event()


class Stream(Protocol):
    """What `SharedStream` shares: a `RelayStream` or an `InProcessStream`."""

    @property
    def closed(self) -> bool: ...

    async def request(self, body: Body, namespace: str | None = None) -> Any: ...

    async def aclose(self) -> None: ...


OpenStream = Callable[[Callable[[int], None], Callable[..., None]], Stream]


class SharedStream:
    """One stream (`RelayStream`, `InProcessStream`) behind the handles of several sessions that
    speak as one principal.

    The relay allows one live connection per principal, so the supervisor gives all relay tools
    sessions of an agent generation one of these: each session's surface gets a `StreamHandle`,
    calls are multiplexed by `request_id` on the one connection (which reconnects after a drop,
    as any `RelayStream` does). The stream is closed with the last handle, or at once by
    `aclose` (the generation ended, the agent left the fleet); a closed share never reconnects:
    every later call fails with `ConnectionAborted`. Stream events and notes go to the newest
    open handle's callbacks (every session of the agent writes the same inscription log).
    """

    def __init__(self, open_stream: OpenStream) -> None:
        self._handles: list[StreamHandle] = []
        self.stream = open_stream(self._on_events, self._on_note)

    @property
    def closed(self) -> bool:
        return self.stream.closed

    def handle(
        self, on_events: Callable[[int], None], on_note: Callable[..., None]
    ) -> StreamHandle:
        handle = StreamHandle(self, on_events, on_note)
        self._handles.append(handle)
        return handle

    async def detach(self, handle: StreamHandle) -> None:
        if handle in self._handles:
            self._handles.remove(handle)
        if not self._handles:
            await self.aclose()

    async def aclose(self) -> None:
        await self.stream.aclose()

    def _on_events(self, count: int) -> None:
        if self._handles:
            self._handles[-1].on_events(count)

    def _on_note(self, event: str, **details: Any) -> None:
        if self._handles:
            self._handles[-1].on_note(event, **details)


class StreamHandle:
    """One session's view of a `SharedStream`: its calls go over the shared connection; closing
    it detaches the session (the last one out closes the stream)."""

    def __init__(
        self, share: SharedStream, on_events: Callable[[int], None], on_note: Callable[..., None]
    ) -> None:
        self.share = share
        self.on_events = on_events
        self.on_note = on_note

    async def request(self, body: Body, namespace: str | None = None) -> Any:
        return await self.share.stream.request(body, namespace)

    async def aclose(self) -> None:
        await self.share.detach(self)
