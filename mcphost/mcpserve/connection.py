"""One MCP session over a byte stream: the core that stdio and socket sessions share.

Owns: the framing, limits, own answers, backpressure and end of one session, whatever carries
its bytes (stdin/stdout in `mcphost.mcpserve.stdio`, a connected Unix socket in
`mcphost.mcpserve.stream`). Lines are split with a cap (`Limits.max_line_bytes`), parsed, and
handed to the SDK session (`mcphost.mcpserve.adapter.serve_streams`) as `SessionMessage`s; the
SDK's messages are serialised one at a time onto the session's `Wire`. The SDK owns every
JSON-RPC decision about a message it received (dispatch, handshake, eras, cancellation,
progress); this module answers only what never becomes a message:
- a line that is not JSON: -32700, without `id`;
- JSON that is not a JSON-RPC message the SDK's model accepts: -32600 (-32602 when only
  `params` is not an object), under the request's id when it is a string or an integer, else
  without `id` (MCP's schema makes it optional on errors and never `null`, while the SDK's
  `JSONRPCError` would write `null`); a response or notification that does not validate is
  dropped (a notification is never answered);
- a second request under an id still being served: -32600 (the SDK would otherwise lose track
  of the first; like the SDK, "7" and 7 are the same id here);
- a line over the cap: -32600 with `data.code = message_too_large`, under its own id when a
  bounded scan of its first `ID_SCAN_BYTES` finds a top-level string or integer `id`; the rest
  of the line is discarded as it streams, never kept.
Each bad line gets exactly one answer.

Backpressure, per session (a process serving many sessions is bounded session by session): at
most `max_active_calls` tool calls and `max_active_other` other requests are with the SDK at
once (handed over, not yet answered, nor cancelled), holding at most `max_held_bytes` of request
lines; further lines wait, unparsed, in arrival order. When `max_queued` lines (or
`max_held_bytes` bytes) wait, the source is no longer read (`pause_reading`) until the queue is
half empty again. A session may also hold a share of a byte budget shared with other sessions
(`mcphost.mcpserve.budget`; the supervisor's: one per agent): every request byte it holds (the
line being read, lines waiting, the line being parsed, requests owed) is counted there, and the
source is not read while the budget is spent (asked after every line and after a read that ends
inside one). The wire is written one message at a time, each waiting for the carrier to
take the previous one, so an unread peer stalls the SDK's writers, then its handlers, then the
reading of the source.

End (`serve_connection`): EOF lets requests already handed over finish for `eof_grace`, then
ends the session; the owner's `stop` event ends it at once, and answers already produced get
`stop_grace` to reach the wire. Closing the carrier and the surface is the caller's.

Must never: write anything to the wire but JSON-RPC messages; block the loop on a write;
dispatch a request itself; import the SDK at module import time (stdio imports this module
before it reads stdin, and the SDK only after).
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import json
import re
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mcphost import events

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp.shared.message import SessionMessage

    from mcphost.mcpserve.budget import Share
    from mcphost.surface import Surface

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602

MAX_LINE_BYTES = 64 * 1024 * 1024
ID_SCAN_BYTES = 64 * 1024  # how much of an over-cap line is searched for its request id
MAX_ACTIVE_CALLS = 64  # tool calls with the SDK at once; later lines wait
MAX_ACTIVE_OTHER = 16  # other requests (tools/list, ping, ...) with the SDK at once
MAX_QUEUED = 1024  # lines waiting before the source is paused
MAX_HELD_BYTES = 2 * MAX_LINE_BYTES  # request bytes waiting, and with the SDK, before pausing
EOF_GRACE_SECONDS = 2.0
STOP_GRACE_SECONDS = 2.0  # after a stop: time for the SDK's closing answers to be written


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one session. The defaults are the standalone host's."""

    max_line_bytes: int = MAX_LINE_BYTES
    max_active_calls: int = MAX_ACTIVE_CALLS
    max_active_other: int = MAX_ACTIVE_OTHER
    max_queued: int = MAX_QUEUED
    max_held_bytes: int = MAX_HELD_BYTES
    eof_grace: float = EOF_GRACE_SECONDS
    stop_grace: float = STOP_GRACE_SECONDS


class Wire(Protocol):
    """The outgoing half of a session: one message at a time, never blocking the loop.

    `send` returns once the carrier has taken the message (or at once when `closed`); a send
    after the peer went away sets `closed` and drops the message.
    """

    closed: bool

    async def send(self, message: Mapping[str, Any] | Callable[[], bytes]) -> None: ...


def _dumps(message: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    except UnicodeEncodeError:  # a lone surrogate (e.g. echoed from input): escape it as \uXXXX
        return json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


def _is_request_id(value: Any) -> bool:
    """MCP's RequestId: a string or an integer (never null, a bool, a float or a container)."""
    return isinstance(value, (str, int)) and not isinstance(value, bool)


class LineReader(asyncio.Protocol):
    """Incoming half: splits the byte stream into lines, enforcing the cap `max_line`.

    After each line, and after each read that ends inside a line, it asks `saturated()`; if
    so it stops splitting, keeps the rest of the current read (at most one read's worth) and
    pauses the source until `resume()` (which asks again first). `on_partial` gets the change in
    size of the line being read (kept until its newline). `on_overlong` gets the first
    `ID_SCAN_BYTES` of a line over the cap; the rest of that line is skipped as it arrives,
    never stored.
    """

    def __init__(
        self,
        on_line: Callable[[bytes], None],
        on_overlong: Callable[[bytes], None],
        saturated: Callable[[], bool] = lambda: False,
        *,
        max_line: int = MAX_LINE_BYTES,
        on_partial: Callable[[int], None] = lambda delta: None,
    ) -> None:
        self._max_line = max_line
        self._buf = bytearray()
        self._held = b""
        self._discarding = False
        self._paused = False
        self._eof_pending = False
        self._transport: asyncio.ReadTransport | None = None
        self._on_line = on_line
        self._on_overlong = on_overlong
        self._saturated = saturated
        self._on_partial = on_partial
        self.eof = asyncio.Event()
        self.room = threading.Event()  # set while a reading thread may read the next chunk
        self.room.set()

    @property
    def paused(self) -> bool:
        return self._paused

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.ReadTransport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self.feed(data)

    def feed(self, data: bytes) -> None:
        if self._held:
            data, self._held = self._held + data, b""
        self._consume(data)
        if not self._paused:
            self.room.set()

    def _consume(self, data: bytes) -> None:
        start = 0
        while not self._paused:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            self._end_line(data, start, nl)
            start = nl + 1
            if self._saturated():
                self._pause()
        rest = data[start:] if start else data
        if self._paused:
            self._held = rest
            return
        if self._discarding or not rest:
            return
        self._buf += rest
        self._on_partial(len(rest))
        if len(self._buf) > self._max_line:
            prefix = bytes(self._buf[:ID_SCAN_BYTES])
            self._drop_partial()
            self._discarding = True
            self._on_overlong(prefix)
        elif self._saturated():  # stopped inside a line: the rest of it waits in the source
            self._pause()

    def _drop_partial(self) -> None:
        size = len(self._buf)
        self._buf = bytearray()
        if size:
            self._on_partial(-size)

    def _end_line(self, data: bytes, start: int, nl: int) -> None:
        if self._discarding:
            self._discarding = False
            return
        if len(self._buf) + (nl - start) > self._max_line:
            head = bytes(self._buf[:ID_SCAN_BYTES])
            prefix = head + data[start : min(nl, start + ID_SCAN_BYTES - len(head))]
            self._drop_partial()
            self._on_overlong(prefix)
            return
        if self._buf:
            line = bytes(self._buf) + data[start:nl]
            self._drop_partial()
        else:
            line = data[start:nl]
        if line.strip():
            self._on_line(line)

    def _pause(self) -> None:
        self._paused = True
        self.room.clear()
        if self._transport is not None:
            self._transport.pause_reading()

    def resume(self) -> None:
        """There is room again: split what was held back, then read on (unless it filled up)."""
        if not self._paused or self._saturated():
            return
        self._paused = False
        held, self._held = self._held, b""
        self._consume(held)
        if self._paused:
            return
        if self._eof_pending:
            self._finish()
            return
        if self._transport is not None:
            self._transport.resume_reading()
        self.room.set()

    def eof_received(self) -> bool:
        if self._paused:
            self._eof_pending = True
        else:
            self._finish()
        return False

    def _finish(self) -> None:
        line = bytes(self._buf)
        self._drop_partial()
        if line.strip() and not self._discarding:
            self._on_line(line)
        self.eof.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._eof_pending:
            self.eof.set()


# the C string scanner json.loads uses (strict: control characters refused); typeshed omits it
scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")
_SCALAR_END = re.compile(r"[\s,}\]]")
_STRUCTURE = re.compile(r'["{}\[\]]')
_WHITESPACE = re.compile(r"[ \t\r\n]*")
_NO_ID: Any = object()


def _skip_ws(text: str, pos: int) -> int:
    match = _WHITESPACE.match(text, pos)
    return match.end() if match else pos


def _id_value(text: str, pos: int) -> tuple[Any, int]:
    """A string or integer id starting at `pos`, or `_NO_ID` (another type, or cut off)."""
    if text[pos] == '"':
        return scanstring(text, pos + 1)  # ValueError when cut off
    match = _INTEGER.match(text, pos)
    if match is None:
        return _NO_ID, pos
    after = match.end()
    if not _SCALAR_END.match(text, after):  # cut off, or a float / an exponent follows
        return _NO_ID, pos
    return int(match.group()), after  # over 4300 digits: ValueError


def _skip_value(text: str, pos: int) -> int:
    """The position after the JSON value at `pos`, or -1 if the text ends inside it."""
    if text[pos] == '"':
        return scanstring(text, pos + 1)[1]
    if text[pos] not in "{[":
        match = _SCALAR_END.search(text, pos)
        return match.start() if match else -1
    depth = 0
    while match := _STRUCTURE.search(text, pos):
        pos = match.end()
        char = match.group()
        if char == '"':
            pos = scanstring(text, pos)[1]
        elif char in "{[":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return pos
    return -1


def recover_request_id(prefix: bytes) -> str | int | None:
    """The top-level `id` of a JSON object, read from the first bytes of its too-long line.

    Bounded: looks at most at `ID_SCAN_BYTES`, never recurses, and keeps nothing but the id.
    Returns None unless the object's top level, read up to where the prefix ends, has exactly
    one `id` member whose value is a string or an integer, and no `result` or `error` member
    (a response is not ours to answer).
    """
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(prefix[:ID_SCAN_BYTES])
    except UnicodeDecodeError:
        return None
    text = text.removeprefix("\ufeff")
    end = len(text)
    found = _NO_ID
    pos = _skip_ws(text, 0)
    if not text.startswith("{", pos):
        return None
    pos += 1
    try:
        while (pos := _skip_ws(text, pos)) < end and text[pos] != "}":
            if text[pos] != '"':
                return None
            key, pos = scanstring(text, pos + 1)
            pos = _skip_ws(text, pos)
            if pos >= end:
                break
            if text[pos] != ":":
                return None
            pos = _skip_ws(text, pos + 1)
            if pos >= end:
                break
            if key in ("result", "error"):
                return None
            if key == "id":
                if found is not _NO_ID:
                    return None  # a duplicate: a parser would take the last one
                found, pos = _id_value(text, pos)
                if found is _NO_ID:
                    return None
            else:
                pos = _skip_value(text, pos)
                if pos < 0:
                    break
            pos = _skip_ws(text, pos)
            if pos >= end or text[pos] == "}":
                break
            if text[pos] != ",":
                return None
            pos += 1
    except ValueError:  # a string cut off where the prefix ends, or malformed, or a huge int
        pass
    return None if found is _NO_ID else found


_OVERLONG = object()


class _Owed:
    """A request handed to the SDK and not yet answered: its lane and the bytes it holds."""

    __slots__ = ("calls", "size")

    def __init__(self, calls: bool, size: int) -> None:
        self.calls = calls
        self.size = size


class LineTransport:
    """Lines in, `SessionMessage`s to the SDK; the SDK's messages out; flow control between.

    With a `share` of a byte budget (`mcphost.mcpserve.budget`), every request byte the session
    holds (the line being read, lines waiting, the line being parsed, requests with the SDK) is
    counted there too, and the source is not read while the budget says so.
    """

    def __init__(
        self, wire: Wire, limits: Limits | None = None, share: Share | None = None
    ) -> None:
        self.wire = wire
        self.limits = limits = limits or Limits()
        self._share = share
        self._partial = 0  # bytes of the line being read
        self._parsing = 0  # bytes of the line taken from the queue, not yet owed or dropped
        if share is not None:
            loop = asyncio.get_running_loop()
            share.wake = lambda: loop.call_soon(self.on_room)
        self.on_room: Callable[[], None] = lambda: None
        self.on_first_answer: Callable[[], None] = lambda: None
        self._lines: deque[tuple[Any, bytes]] = deque()
        self._queued_bytes = 0
        self._arrived = asyncio.Event()
        self._eof = False
        self._owed: dict[Any, _Owed] = {}
        self._active_calls = 0
        self._active_other = 0
        self._owed_bytes = 0
        self._settled = asyncio.Event()
        self._answered_once = False
        self.feed_scope: Any = None

    # -- from the line reader (synchronous callbacks) -------------------------------------
    def on_line(self, line: bytes) -> None:
        self._push(None, line)

    def on_overlong(self, prefix: bytes) -> None:
        self._push(_OVERLONG, prefix)

    def on_partial(self, delta: int) -> None:
        self._partial += delta
        self._count()

    def _count(self) -> None:
        """Tell the budget what this session holds now."""
        if self._share is not None:
            held = self._queued_bytes + self._parsing + self._owed_bytes + self._partial
            self._share.set(held, self._partial > 0)

    def on_eof(self) -> None:
        self._eof = True
        self._arrived.set()

    def _push(self, kind: Any, data: bytes) -> None:
        self._lines.append((kind, data))
        self._queued_bytes += len(data)
        self._count()
        self._arrived.set()

    def saturated(self) -> bool:
        """True when the source should not be read: too many lines or bytes wait, or the
        budget this session shares is spent."""
        limits = self.limits
        return (
            len(self._lines) >= limits.max_queued
            or self._queued_bytes >= limits.max_held_bytes
            or (self._share is not None and self._share.blocks())
        )

    # -- feeding the SDK ------------------------------------------------------------------
    async def feed(self, sdk: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        """Hand every line to the SDK in arrival order, within the limits; end at EOF."""
        import anyio
        from mcp.shared.message import SessionMessage

        async with sdk:
            with anyio.CancelScope() as self.feed_scope:
                while True:
                    if not self._lines:
                        if self._eof:
                            break
                        self._arrived.clear()
                        await self._arrived.wait()
                        continue
                    kind, data = self._lines.popleft()
                    self._queued_bytes -= len(data)
                    self._parsing = len(data)
                    if len(self._lines) <= self.limits.max_queued // 2 and (
                        self._queued_bytes <= self.limits.max_held_bytes // 2
                    ):
                        self.on_room()
                    try:
                        if kind is _OVERLONG:
                            await self._refuse_overlong(data)
                            continue
                        message = await self._parse(data)
                        if message is not None:
                            await sdk.send(SessionMessage(message))
                    finally:
                        self._parsing = 0
                        self._count()
                # EOF: what was handed over may finish (briefly) before the session ends
                with anyio.move_on_after(self.limits.eof_grace):
                    while self._owed:
                        self._settled.clear()
                        await self._settled.wait()

    async def _parse(self, line: bytes) -> Any:
        """The SDK message for `line`, or None after answering (or dropping) it ourselves."""
        try:
            obj = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # deep nesting recurses
            await self._error(None, PARSE_ERROR, "Parse error", str(exc)[:200])
            return None
        if not isinstance(obj, dict):
            await self._error(None, INVALID_REQUEST, "Invalid Request", "expected a JSON object")
            return None
        method = obj.get("method")
        request_id = obj.get("id")
        valid_id = _is_request_id(request_id)
        if not isinstance(method, str):
            if "id" not in obj or "result" in obj or "error" in obj:
                return self._validate(obj)  # a response (or noise): the SDK's, or dropped
            await self._error(request_id if valid_id else None, INVALID_REQUEST, "Invalid Request")
            return None
        if "id" not in obj:
            return self._validate(obj)  # a notification: never answered, even when malformed
        if not valid_id:
            await self._error(
                None, INVALID_REQUEST, "Invalid Request", "id must be a string or integer"
            )
            return None
        params = obj.get("params")
        if params is not None and not isinstance(params, dict):
            await self._error(request_id, INVALID_PARAMS, "params must be an object")
            return None
        message = self._validate(obj)
        if message is None:
            await self._error(request_id, INVALID_REQUEST, "Invalid Request", _why_invalid(obj))
            return None
        if method == "subscriptions/listen":
            return message  # a stream open for the session's life: neither counted nor awaited
        key = _correlation_key(request_id)
        if key in self._owed:
            await self._error(request_id, INVALID_REQUEST, "duplicate request id")
            return None
        await self._admit(key, method == "tools/call", len(line))
        return message

    def _validate(self, obj: dict[str, Any]) -> Any:
        import mcp_types
        from pydantic import ValidationError

        try:
            message = mcp_types.jsonrpc_message_adapter.validate_python(obj, by_name=False)
        except (ValidationError, ValueError, RecursionError):
            return None
        method = obj.get("method")
        if method == "notifications/cancelled" and "id" not in obj:
            params = obj.get("params")
            target = params.get("requestId") if isinstance(params, dict) else None
            if _is_request_id(target):
                self._release(_correlation_key(target))  # a cancelled request is never answered
        return message

    async def _admit(self, request_id: Any, calls: bool, size: int) -> None:
        """Wait for room in the request's lane (and for bytes), then count it as owed."""
        while True:
            active = self._active_calls if calls else self._active_other
            limits = self.limits
            limit = limits.max_active_calls if calls else limits.max_active_other
            fits = not self._owed or self._owed_bytes + size <= limits.max_held_bytes
            if active < limit and fits:
                break
            self._settled.clear()
            await self._settled.wait()
        self._owed[request_id] = _Owed(calls, size)
        self._owed_bytes += size
        self._parsing = 0  # the line's bytes are owed now
        if calls:
            self._active_calls += 1
        else:
            self._active_other += 1

    def _release(self, request_id: Any) -> None:
        owed = self._owed.pop(request_id, None)
        if owed is None:
            return
        self._owed_bytes -= owed.size
        if owed.calls:
            self._active_calls -= 1
        else:
            self._active_other -= 1
        self._count()
        self._settled.set()

    async def _refuse_overlong(self, prefix: bytes) -> None:
        request_id = recover_request_id(prefix)
        cap = self.limits.max_line_bytes
        events.emit(
            "mcp.wire.line_too_long",
            level="warning",
            limit_bytes=cap,
            id_recovered=request_id is not None,
        )
        await self._error(
            request_id,
            INVALID_REQUEST,
            f"message exceeds {cap} bytes and was discarded",
            {
                "code": "message_too_large",
                "message": f"one JSON-RPC message may be at most {cap} bytes; "
                "this one was discarded unread. Send less per call (for file contents, use "
                "the file tools, which stream from the workspace).",
                "details": {"limit_bytes": cap},
            },
        )

    async def _error(self, request_id: Any, code: int, message: str, data: Any = None) -> None:
        """An error reply of our own; `request_id` None (unreadable) leaves `id` out."""
        reply: dict[str, Any] = {"jsonrpc": "2.0"}
        if request_id is not None:
            reply["id"] = request_id
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        reply["error"] = error
        await self.wire.send(reply)

    # -- the SDK's messages out -----------------------------------------------------------
    async def write(self, sdk: MemoryObjectReceiveStream[SessionMessage]) -> None:
        from mcp_types import JSONRPCError, JSONRPCResponse

        async with sdk:
            async for item in sdk:
                message = item.message
                await self.wire.send(functools.partial(_encode, message))
                if isinstance(message, JSONRPCResponse | JSONRPCError):
                    if message.id is not None:
                        self._release(_correlation_key(message.id))
                    if not self._answered_once:
                        self._answered_once = True
                        self.on_first_answer()


def _encode(message: Any) -> bytes:
    """One SDK message as a line; an error without a readable id leaves `id` out."""
    if getattr(message, "error", None) is not None and message.id is None:
        body = message.model_dump(by_alias=True, mode="json", exclude_unset=True)
        body.pop("id", None)
        return _dumps(body)
    try:
        return message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
    except ValueError:  # a lone surrogate (e.g. echoed from input): escape it as \uXXXX
        body = message.model_dump(by_alias=True, mode="python", exclude_unset=True)
        return (
            json.dumps(body, ensure_ascii=True, separators=(",", ":"), default=str).encode() + b"\n"
        )


def _correlation_key(request_id: Any) -> Any:
    """The id as the SDK correlates it ("7" and 7 are one request), so our count matches."""
    from mcp.shared.dispatcher import coerce_request_id

    return coerce_request_id(request_id)


def _why_invalid(obj: dict[str, Any]) -> str:
    if obj.get("jsonrpc") != "2.0":
        return 'jsonrpc must be "2.0"'
    return "not a JSON-RPC request MCP accepts"


async def serve_connection(
    surface: Surface,
    transport: LineTransport,
    reader: LineReader,
    *,
    stop: asyncio.Event,
    stop_reason: Callable[[], str] = lambda: "stop",
) -> str:
    """Serve one session of `surface` until the source's EOF or `stop`; return why it ended.

    The caller has built `reader` on `transport`'s callbacks and is already feeding it (the SDK
    is imported here, after the source is being read). EOF ("eof"): requests already handed
    over finish within the EOF grace. `stop` (`stop_reason()`): the session ends at once; the
    SDK's closing answers get the stop grace to reach the wire. A surface's optional `warm_up()`
    runs after the first answer is on the wire. Neither the wire nor the surface is closed here.
    """
    limits = transport.limits
    warm_up = getattr(surface, "warm_up", None)
    if callable(warm_up):
        transport.on_first_answer = warm_up
    eof_seen = asyncio.ensure_future(reader.eof.wait())
    eof_seen.add_done_callback(lambda _: transport.on_eof())

    import anyio
    from mcp.shared.message import SessionMessage

    from mcphost.mcpserve.adapter import serve_streams

    to_sdk, sdk_in = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    sdk_out, from_sdk = anyio.create_memory_object_stream[SessionMessage](0)
    served = asyncio.Event()
    written = asyncio.Event()
    ended = "eof"
    try:
        async with anyio.create_task_group() as tg:

            async def guard() -> None:
                nonlocal ended
                waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(served.wait())}
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waiters:
                        waiter.cancel()
                if not served.is_set():
                    ended = stop_reason()
                    events.emit("mcp.shutdown", level="debug", reason=ended)
                    if transport.feed_scope is not None:
                        transport.feed_scope.cancel()  # ends the session now, no EOF grace
                    with anyio.move_on_after(limits.stop_grace):
                        await served.wait()
                with anyio.move_on_after(limits.stop_grace):  # the last answers reach the wire
                    await written.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(guard)
            tg.start_soon(transport.feed, to_sdk)

            async def write() -> None:
                try:
                    await transport.write(from_sdk)
                finally:
                    written.set()

            tg.start_soon(write)
            await serve_streams(surface, sdk_in, sdk_out)
            if not stop.is_set():
                events.emit("mcp.shutdown", level="debug", reason="eof")
            served.set()
    finally:
        eof_seen.cancel()
    return ended
