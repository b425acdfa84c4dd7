"""`BoundedTransport`: an ACP agent's stdio as the SDK's message transport, with bounds (X10).

Owns: the framing of the agent's stdout and stdin (newline-delimited JSON-RPC, as the SDK's own
`NdjsonTransport` frames it) and the per-agent bounds the SDK does not keep. The SDK's
`Connection` (agent-client-protocol 0.12.1, `acp/connection.py`) starts a task per incoming
message (`_process_message` -> `TaskSupervisor.create`) and its `MessageSender`
(`acp/task/sender.py`) queues every outgoing frame on an unbounded `asyncio.Queue`, so an agent
that stops reading its stdin while it keeps sending requests grows its keeper without limit
(measured: 150,000 requests of ~280 bytes, 65 -> 721 MiB). The SDK accepts a message-level
`Transport` in place of the byte streams (`connect_to_agent(client, transport)`); this is one,
so the bounds sit at our edge and nothing of the SDK is patched.

The bounds (`Bounds`, one set per agent connection):
- `frame_bytes`: one frame from the agent at most (16 MiB: a `session/load` replay frame). The
  stream reader's own buffer stays small (`READ_BUFFER`: the pipe is paused beyond twice it), so
  what is buffered on read is one frame in the making plus that.
- `in_flight` / `in_flight_bytes`: requests from the agent whose reply is not yet handed back
  (and the bytes of their frames, which their handler tasks hold). At the bound the transport
  reads less: it reads no next frame until a reply frees a slot, so the agent's stdout pipe
  fills and the agent waits; its frames are never queued here. (One request alone may hold up
  to `frame_bytes`.)
- `write_queue` / `write_bytes`: our replies to the agent's requests waiting to be written to
  its stdin (the one being drained included; asyncio's pipe buffer holds at most its high-water
  mark beyond). An agent that stops reading its stdin while it keeps asking fills them: that is
  a protocol failure. Our own requests (bootstrap, one prompt at a time) are not counted: we
  bound them ourselves, and a large prompt must not make one reply look like a flood.
- `rate` / `burst`: a token bucket on the frames from the agent (requests, notifications,
  replies, and lines that are not JSON, each of which is logged), `rate` per second with
  `burst` at once, metered once the session is set up
  (`metered`: a `session/load` replays a whole history as notifications, bounded by the
  bootstrap's 30 s instead). Past it: a protocol failure.
Why these values: a well-behaved agent has at most one request in flight (a permission request
waits for a decision; the relay answers a second one cancelled at once, and `fs/*`/`terminal/*`
with method-not-found), so 32 is room, not a budget; what we write to an agent is a prompt (one
batch of envelopes, a few KiB; a `raww` at most 32 KiB) or a reply of ~100 bytes, so 64 replies
or 1 MiB waiting beyond the 64 KiB pipe and asyncio's 64 KiB buffer means the agent is not
reading; the real adapters stream tens to a few hundred updates a second, so 500 a second with
5000 at once leaves them far below. Together these hold one agent's cost to a few MiB
(`tests/supervisor/test_supervise_acp_flood.py`: two flooding agents, peak RSS growth < 64 MiB).
The receive side also yields to the event loop after every frame, so the handler task the SDK
starts for one frame runs before the next frame is read (a burst already in the pipe never
becomes thousands of tasks at once).

Past a failing bound the transport ends its side: `violation` holds what was exceeded, `on_flood`
is told (once), `receive` returns end-of-stream (the SDK then fails every request in flight with
ConnectionError), our own requests' sends raise ConnectionError and replies to the agent are
dropped. The session (`session.AcpSession`) turns that into state `unavailable`, reason code
`ACP_FLOOD` (`runtime_acp_flood`, reasons.py) and its respawn signal; the runner ends the agent's process group
and its restart policy brings it back.

Must never: import `mcphost.supervisor`, patch the SDK, buffer more than the bounds say, or
block the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mcphost import events
from mcphost.relay import reasons as R

READ_BUFFER = 64 << 10
"""The agent's stdout stream reader's limit (`asyncio.StreamReader(limit=...)`): it stops reading
the pipe beyond twice this. Frames longer than it are read in pieces up to `frame_bytes`."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """One ACP agent connection's bounds (module docstring); the defaults are X10's."""

    frame_bytes: int = 16 << 20
    in_flight: int = 32
    in_flight_bytes: int = 16 << 20
    write_queue: int = 64
    write_bytes: int = 1 << 20
    rate: float = 500.0
    burst: int = 5000


@dataclass(frozen=True, slots=True)
class Violation:
    """What an agent exceeded: the bound's name (a `Bounds` field), its limit, and the message
    for the operator (what happened and what to do)."""

    bound: str
    limit: float
    message: str


class BoundedTransport:
    """The SDK's `Transport` (send, receive, close) over an agent's stdout and stdin, bounded."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        bounds: Bounds | None = None,
        *,
        on_flood: Callable[[Violation], None] | None = None,
        where: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.bounds = bounds or Bounds()
        self.on_flood = on_flood
        self._where = dict(where or {})
        self._clock = clock
        self.violation: Violation | None = None
        self.metered = False  # the rate bound applies (the session sets it once bootstrapped)
        self._closed = False
        self._in_flight: dict[str, list[int]] = {}  # request id (as JSON) -> its frames' sizes
        self._held = 0  # bytes of the frames in flight
        self._count = 0  # requests in flight
        self._freed = asyncio.Event()
        self.paused = False  # reading no next frame until a request in flight is answered
        self._queued = 0  # replies waiting to be written, the one draining included
        self._queued_bytes = 0
        self._write_lock = asyncio.Lock()
        self._tokens = float(self.bounds.burst)
        self._refilled = clock()

    @property
    def in_flight(self) -> int:
        return self._count

    @property
    def queued(self) -> tuple[int, int]:
        """Replies and their bytes waiting to be written to the agent."""
        return self._queued, self._queued_bytes

    # -- the agent's stdout -------------------------------------------------------------------

    async def receive(self) -> dict[str, Any] | None:
        while not self._ended():
            await asyncio.sleep(0)  # the last frame's handler task starts before the next read
            frame = await self._frame()
            if frame is None or not self._take_token():
                return None
            try:
                message = json.loads(frame)
            except ValueError:
                events.emit("relay.acp.frame_not_json", level="warning", **self._where)
                continue
            if not isinstance(message, dict):
                continue
            request = "method" in message and "id" in message
            if request and not await self._admit(message["id"], len(frame)):
                return None
            return message
        return None

    async def _frame(self) -> bytes | None:
        """The next non-blank line (without its newline), or None at end of stream or past
        `frame_bytes` (then a violation)."""
        limit = self.bounds.frame_bytes
        chunks: list[bytes] = []
        size = 0
        while True:
            eof = False
            try:
                part = await self._reader.readuntil(b"\n")
            except asyncio.LimitOverrunError as exc:  # no newline within the reader's limit yet
                part = await self._reader.readexactly(exc.consumed)
                size += len(part)
                if size > limit:
                    self._exceed("frame_bytes", limit, f"a frame of more than {limit} bytes")
                    return None
                chunks.append(part)
                continue
            except asyncio.IncompleteReadError as exc:
                part, eof = exc.partial, True
            size += len(part)
            if size > limit + 1:  # the newline does not count
                self._exceed("frame_bytes", limit, f"a frame of more than {limit} bytes")
                return None
            chunks.append(part)
            frame = b"".join(chunks).strip()
            if frame:
                return frame
            if eof:
                return None
            chunks, size = [], 0

    def _take_token(self) -> bool:
        if not self.metered:
            return True
        now = self._clock()
        bounds = self.bounds
        self._tokens = min(bounds.burst, self._tokens + (now - self._refilled) * bounds.rate)
        self._refilled = now
        if self._tokens < 1:
            self._exceed(
                "rate",
                bounds.rate,
                f"more than {bounds.burst} frames at once, or more than {bounds.rate:g} a second",
            )
            return False
        self._tokens -= 1
        return True

    async def _admit(self, request_id: Any, size: int) -> bool:
        """Hold a slot for one request (`size`: its frame's bytes); while none is free, read
        nothing more. False once the transport ended."""
        bounds = self.bounds
        while self._count >= bounds.in_flight or (
            self._count and self._held + size > bounds.in_flight_bytes
        ):
            if self._ended():
                return False
            self._freed.clear()
            self.paused = True
            try:
                await self._freed.wait()
            finally:
                self.paused = False
        if self._ended():
            return False
        self._in_flight.setdefault(_key(request_id), []).append(size)
        self._count += 1
        self._held += size
        return True

    def _release(self, request_id: Any) -> None:
        sizes = self._in_flight.get(_key(request_id))
        if not sizes:
            return
        self._held -= sizes.pop(0)
        self._count -= 1
        if not sizes:
            del self._in_flight[_key(request_id)]
        self._freed.set()

    # -- the agent's stdin --------------------------------------------------------------------

    async def send(self, message: dict[str, Any]) -> None:
        ours = "method" in message  # a request or notification of ours, not a reply
        if not ours:
            self._release(message.get("id"))
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode("utf-8")
        if not ours and not self._ended():  # ours: one turn at a time, bounded by us
            bounds = self.bounds
            if self._queued >= bounds.write_queue:
                self._exceed(
                    "write_queue",
                    bounds.write_queue,
                    f"{self._queued} replies waiting for the agent to read its stdin",
                )
            elif self._queued and self._queued_bytes + len(data) > bounds.write_bytes:
                self._exceed(
                    "write_bytes",
                    bounds.write_bytes,
                    f"{self._queued_bytes + len(data)} bytes waiting for the agent to read "
                    "its stdin",
                )
        if self._ended():
            if ours:
                raise ConnectionError("the connection to the agent is closed")
            return  # a reply no one will read
        counted = 0 if ours else 1
        self._queued += counted
        self._queued_bytes += counted * len(data)
        try:
            async with self._write_lock:
                if self._ended():
                    if ours:
                        raise ConnectionError("the connection to the agent is closed")
                    return
                self._writer.write(data)
                await self._writer.drain()
        finally:
            self._queued -= counted
            self._queued_bytes -= counted * len(data)

    # -- the end ------------------------------------------------------------------------------

    async def close(self) -> None:
        """End this side (the SDK's `Connection.close`): readers and senders waiting here are
        released. After a violation, what waits in the pipe's buffer for the agent is dropped;
        closing the agent's stdin is the session's."""
        self._closed = True
        self._freed.set()
        if self.violation is not None:
            with contextlib.suppress(Exception):
                self._writer.transport.abort()

    def _ended(self) -> bool:
        return self._closed or self.violation is not None

    def _exceed(self, bound: str, limit: float, what: str) -> None:
        if self.violation is not None:
            return
        message = (
            f"the ACP agent exceeded its bound {bound} ({what}); its connection was ended "
            "and it is restarted by its restart policy: an agent must read its stdin and not "
            "flood requests or notifications; read its log (ctl logs) and fix or replace it"
        )
        self.violation = Violation(bound, limit, message)
        self._freed.set()
        events.emit(
            "relay.acp.flood",
            level="warning",
            **self._where,
            code=R.ACP_FLOOD,
            bound=bound,
            limit=limit,
            reason=what,
        )
        if self.on_flood is not None:
            self.on_flood(self.violation)


def _key(request_id: Any) -> str:
    return json.dumps(request_id, sort_keys=True, default=str)
