"""Serve one `Surface` over stdio: newline-delimited JSON-RPC 2.0, MCP handshake era.

Owns: framing (our own buffer, with a line cap), dispatch, per-call tasks, cancellation,
progress and list-changed notifications, backpressure, and the process lifecycle (stdin EOF,
SIGTERM, SIGINT, a vanished parent: each ends the server with exit 0).

Backpressure: a client that writes requests without reading the answers must not make the
process grow. At most `MAX_ACTIVE_CALLS` tool calls and `MAX_ACTIVE_ANSWERS` other answers are
worked on at once; further requests wait, parsed, in FIFO lanes. When `MAX_QUEUED` requests
wait (or the lines held reach `MAX_HELD_BYTES`), stdin is no longer read until the lanes are
half empty again. The wire writes one message at a time and waits for the pipe to take it, so
the bytes buffered for stdout stay at the transport's high-water mark plus one message.

Error replies to a request whose id cannot be read carry no `id` member (MCP's schema makes
it optional on errors and never `null`). A line over `MAX_LINE_BYTES` is answered under its own
id when a bounded scan of its first `ID_SCAN_BYTES` finds a top-level string or integer `id`;
the rest of the line is discarded without being kept.

The protocol stream is moved off fd 1 at start: the wire gets a private duplicate and fd 1 is
pointed at stderr, so a stray `print` can never corrupt JSON-RPC.

Must never: write anything to the wire but JSON-RPC messages; block the loop on a write.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
import json
import os
import re
import signal
import stat
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from mcphost import events
from mcphost.mcpwire.protocol import (
    HANDSHAKE_VERSIONS,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LATEST_HANDSHAKE_VERSION,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
)
from mcphost.surface import CallContext, RpcError, Surface

MAX_LINE_BYTES = 64 * 1024 * 1024
ID_SCAN_BYTES = 64 * 1024  # how much of an over-cap line is searched for its request id
MAX_ACTIVE_CALLS = 64  # tool calls running at once; more wait in their lane
MAX_ACTIVE_ANSWERS = 16  # other answers (tools/list, ping, errors, ...) being built or written
MAX_QUEUED = 1024  # requests waiting in the lanes before stdin is paused
MAX_HELD_BYTES = 2 * MAX_LINE_BYTES  # request bytes held (waiting or running) before pausing
EOF_GRACE_SECONDS = 0.8
PARENT_POLL_SECONDS = 1.0


def _dumps(message: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    except UnicodeEncodeError:  # a lone surrogate (e.g. echoed from input): escape it as \uXXXX
        return json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


def _is_request_id(value: Any) -> bool:
    """MCP's RequestId: a string or an integer (never null, a bool, a float or a container)."""
    return isinstance(value, (str, int)) and not isinstance(value, bool)


class _Wire:
    """The outgoing half: serialises messages onto the private protocol fd without blocking.

    One message at a time: a sender waits for the pipe to take the previous message before its
    own is serialised, so a client that stops reading holds up senders instead of growing a
    buffer.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._writer: asyncio.StreamWriter | None = None
        self._turn = asyncio.Lock()
        self.closed = False

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        pipe = os.fdopen(self._fd, "wb", buffering=0, closefd=False)
        try:
            transport, protocol = await loop.connect_write_pipe(
                asyncio.streams.FlowControlMixin, pipe
            )
        except ValueError:  # a regular file: plain blocking writes are fine there
            return
        self._writer = asyncio.StreamWriter(transport, protocol, None, loop)

    async def send(self, message: Mapping[str, Any]) -> None:
        async with self._turn:
            if self.closed:
                return
            data = _dumps(message)
            try:
                if self._writer is None:
                    os.write(self._fd, data)
                    return
                self._writer.write(data)
                await self._writer.drain()
            except (BrokenPipeError, ConnectionResetError, OSError):
                self.closed = True

    async def aclose(self) -> None:
        self.closed = True
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()


class _LineReader(asyncio.Protocol):
    """Incoming half: splits the byte stream into lines, enforcing `MAX_LINE_BYTES`.

    After each line it asks `saturated()`; if so it stops splitting, keeps the rest of the
    current read (at most one read's worth) and pauses the source until `resume()`.
    `on_overlong` gets the first `ID_SCAN_BYTES` of a line over the cap; the rest of that line
    is skipped as it arrives, never stored.
    """

    def __init__(
        self,
        on_line: Callable[[bytes], None],
        on_overlong: Callable[[bytes], None],
        saturated: Callable[[], bool] = lambda: False,
    ) -> None:
        self._buf = bytearray()
        self._held = b""
        self._discarding = False
        self._paused = False
        self._eof_pending = False
        self._transport: asyncio.ReadTransport | None = None
        self._on_line = on_line
        self._on_overlong = on_overlong
        self._saturated = saturated
        self.eof = asyncio.Event()
        self.room = threading.Event()  # set while a stdin pump thread may read the next chunk
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
        if len(self._buf) > MAX_LINE_BYTES:
            prefix = bytes(self._buf[:ID_SCAN_BYTES])
            self._buf = bytearray()
            self._discarding = True
            self._on_overlong(prefix)

    def _end_line(self, data: bytes, start: int, nl: int) -> None:
        if self._discarding:
            self._discarding = False
            return
        if len(self._buf) + (nl - start) > MAX_LINE_BYTES:
            head = bytes(self._buf[:ID_SCAN_BYTES])
            prefix = head + data[start : min(nl, start + ID_SCAN_BYTES - len(head))]
            self._buf = bytearray()
            self._on_overlong(prefix)
            return
        if self._buf:
            self._buf += data[start:nl]
            line, self._buf = bytes(self._buf), bytearray()
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
        if not self._paused:
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
        if self._buf.strip() and not self._discarding:
            self._on_line(bytes(self._buf))
        self._buf = bytearray()
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


@dataclass(eq=False, slots=True)
class _Job:
    """One request owed an answer: its coroutine, not yet started, and the bytes it holds."""

    run: Callable[[], Coroutine[Any, Any, None]]
    size: int
    call_id: Any = _NO_ID  # the request id of a tools/call (cancellable while it waits)
    cancelled: bool = False


@dataclass(eq=False, slots=True)
class _Lane:
    """At most `limit` jobs run at once; the rest wait their turn, first come first served."""

    limit: int
    active: int = 0
    waiting: deque[_Job] = field(default_factory=deque)


class StdioServer:
    """Dispatches JSON-RPC requests to a surface; one task per request, within the lanes' limits.

    `saturated()` tells the reader to stop reading; `on_room` is called when there is room
    again (set by `serve_stdio` to the reader's `resume`).
    """

    def __init__(self, surface: Surface, wire: _Wire) -> None:
        self.surface = surface
        self.wire = wire
        self.inflight: dict[Any, asyncio.Task[None]] = {}
        self.protocol_version = LATEST_HANDSHAKE_VERSION
        self.on_room: Callable[[], None] = lambda: None
        self._background: set[asyncio.Task[None]] = set()
        self._calls = _Lane(MAX_ACTIVE_CALLS)
        self._answers = _Lane(MAX_ACTIVE_ANSWERS)
        self._waiting_calls: dict[Any, _Job] = {}
        self._queued = 0
        self._held_bytes = 0
        self._closing = False
        self._idle = asyncio.Event()
        self._idle.set()

    # -- incoming -------------------------------------------------------------------------
    def on_line(self, line: bytes) -> None:
        if self._closing:
            return
        size = len(line)
        try:
            message = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # deep nesting recurses
            self._reply_error(size, None, PARSE_ERROR, "Parse error", str(exc)[:200])
            return
        if not isinstance(message, dict):
            self._reply_error(
                size, None, INVALID_REQUEST, "Invalid Request", "expected a JSON object"
            )
            return
        method = message.get("method")
        has_id = "id" in message
        request_id = message.get("id")
        valid_id = _is_request_id(request_id)
        if not isinstance(method, str):
            if not has_id or "result" in message or "error" in message:
                return  # a response to a request we never send, or noise: ignore
            # echo the id only if it is one; a NaN or an object id would corrupt the answer
            self._reply_error(
                size, request_id if valid_id else None, INVALID_REQUEST, "Invalid Request"
            )
            return
        if not has_id:
            self._on_notification(method, message.get("params"))
            return
        if not valid_id:
            self._reply_error(
                size, None, INVALID_REQUEST, "Invalid Request", "id must be a string or integer"
            )
            return
        params = message.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            self._reply_error(size, request_id, INVALID_PARAMS, "params must be an object")
            return
        if method == "tools/call":
            if request_id in self.inflight or request_id in self._waiting_calls:
                self._reply_error(size, request_id, INVALID_REQUEST, "duplicate request id")
                return
            run = functools.partial(self._call_tool, request_id, params)
            self._submit(self._calls, _Job(run, size, call_id=request_id))
            return
        run = functools.partial(self._answer_simple, request_id, method, params)
        self._submit(self._answers, _Job(run, size))

    def on_overlong(self, prefix: bytes) -> None:
        if self._closing:
            return
        request_id = recover_request_id(prefix)
        events.emit(
            "mcp.wire.line_too_long",
            level="warning",
            limit_bytes=MAX_LINE_BYTES,
            id_recovered=request_id is not None,
        )
        self._reply_error(
            len(prefix),
            request_id,
            INVALID_REQUEST,
            f"message exceeds {MAX_LINE_BYTES} bytes and was discarded",
            {
                "code": "message_too_large",
                "message": f"one JSON-RPC message may be at most {MAX_LINE_BYTES} bytes; "
                "this one was discarded unread. Send less per call (for file contents, use "
                "the file tools, which stream from the workspace).",
                "details": {"limit_bytes": MAX_LINE_BYTES},
            },
        )

    def _on_notification(self, method: str, params: Any) -> None:
        if method == "notifications/cancelled" and isinstance(params, dict):
            target = params.get("requestId")
            if not _is_request_id(target):
                return  # not a request id (an unhashable one would even raise here)
            task = self.inflight.pop(target, None)
            if task is not None:
                task.cancel()
            else:
                job = self._waiting_calls.pop(target, None)
                if job is None:
                    return
                job.cancelled = True  # it never starts; its lane skips it
                self._queued -= 1
                self._held_bytes -= job.size
                self._pump()
            events.emit("mcp.call.cancelled", level="debug", request_id=target)

    # -- flow control ---------------------------------------------------------------------
    def saturated(self) -> bool:
        """True when stdin should not be read: too many requests wait or too many bytes held."""
        return self._queued >= MAX_QUEUED or self._held_bytes >= MAX_HELD_BYTES

    def _reply_error(
        self, size: int, request_id: Any, code: int, message: str, data: Any = None
    ) -> None:
        run = functools.partial(self._error, request_id, code, message, data)
        self._submit(self._answers, _Job(run, size))

    def _submit(self, lane: _Lane, job: _Job) -> None:
        self._held_bytes += job.size
        self._idle.clear()
        if lane.active < lane.limit and not lane.waiting:
            self._start(lane, job)
            return
        lane.waiting.append(job)
        self._queued += 1
        if job.call_id is not _NO_ID:
            self._waiting_calls[job.call_id] = job
        if self.saturated():
            events.emit(
                "mcp.wire.backpressure",
                level="debug",
                queued=self._queued,
                held_bytes=self._held_bytes,
                active_calls=self._calls.active,
                active_answers=self._answers.active,
            )

    def _start(self, lane: _Lane, job: _Job) -> None:
        lane.active += 1
        task = asyncio.ensure_future(job.run())
        if job.call_id is not _NO_ID:
            self.inflight[job.call_id] = task
        else:
            self._background.add(task)
        task.add_done_callback(functools.partial(self._finished, lane, job))

    def _finished(self, lane: _Lane, job: _Job, task: asyncio.Task[None]) -> None:
        lane.active -= 1
        self._held_bytes -= job.size
        if job.call_id is not _NO_ID:
            if self.inflight.get(job.call_id) is task:
                del self.inflight[job.call_id]
        else:
            self._background.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            events.emit(
                "mcp.answer.unexpected_failure",
                level="error",
                exception=type(exc).__name__,
                traceback="".join(traceback.format_exception(exc, limit=8)),
            )
        self._pump()

    def _pump(self) -> None:
        """Start waiting jobs while their lane has room; tell the reader when there is room."""
        if not self._closing:
            for lane in (self._calls, self._answers):
                while lane.waiting and lane.active < lane.limit:
                    job = lane.waiting.popleft()
                    if job.cancelled:
                        continue
                    self._queued -= 1
                    if job.call_id is not _NO_ID:
                        self._waiting_calls.pop(job.call_id, None)
                    self._start(lane, job)
            if self._queued <= MAX_QUEUED // 2 and self._held_bytes <= MAX_HELD_BYTES // 2:
                self.on_room()
        if not (self._calls.active or self._answers.active or self._queued):
            self._idle.set()

    # -- answering ------------------------------------------------------------------------
    async def _answer_simple(self, request_id: Any, method: str, params: dict[str, Any]) -> None:
        if method == "initialize":
            requested = params.get("protocolVersion")
            self.protocol_version = (
                requested
                if isinstance(requested, str) and requested in HANDSHAKE_VERSIONS
                else LATEST_HANDSHAKE_VERSION
            )
            result: dict[str, Any] = {
                "protocolVersion": self.protocol_version,
                "capabilities": {"tools": {"listChanged": self.surface.list_changed}},
                "serverInfo": {"name": self.surface.name, "version": self.surface.version},
            }
            if self.surface.instructions:
                result["instructions"] = self.surface.instructions
            await self._result(request_id, result)
        elif method == "ping":
            await self._result(request_id, {})
        elif method == "tools/list":
            tools = [spec.wire() for spec in self.surface.list_tools()]
            await self._result(request_id, {"tools": tools})
        else:
            await self._error(request_id, METHOD_NOT_FOUND, "Method not found", method)

    async def _call_tool(self, request_id: Any, params: dict[str, Any]) -> None:
        name = params.get("name")
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            await self._error(
                request_id,
                INVALID_PARAMS,
                "tools/call needs params.name (string) and params.arguments (object)",
            )
            return
        meta = params.get("_meta")
        ctx = CallContext(
            request_id=request_id,
            progress_token=meta.get("progressToken") if isinstance(meta, dict) else None,
            send_notification=self._notify,
        )
        try:
            result = await self.surface.call_tool(name, arguments, ctx)
        except asyncio.CancelledError:
            raise
        except RpcError as err:
            await self._send({"jsonrpc": "2.0", "id": request_id, "error": err.wire()})
            return
        except Exception as exc:
            events.emit(
                "mcp.call.unexpected_failure",
                level="error",
                tool=name,
                exception=type(exc).__name__,
                traceback=traceback.format_exc(limit=8),
            )
            await self._error(
                request_id,
                INTERNAL_ERROR,
                "the tool failed unexpectedly; the error was logged on the server",
                {
                    "code": "internal_unexpected_failure",
                    "message": "the tool failed unexpectedly; the error was logged on the server",
                    "details": {"exception": type(exc).__name__},
                },
            )
            return
        await self._result(request_id, result.wire())

    async def _notify(self, method: str, params: dict[str, Any]) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params:
            message["params"] = params
        await self._send(message)

    async def _result(self, request_id: Any, result: dict[str, Any]) -> None:
        await self._send({"jsonrpc": "2.0", "id": request_id, "result": result})

    async def _error(self, request_id: Any, code: int, message: str, data: Any = None) -> None:
        """An error reply; `request_id` None (no id could be read) leaves the `id` member out."""
        reply: dict[str, Any] = {"jsonrpc": "2.0"}
        if request_id is not None:
            reply["id"] = request_id
        reply["error"] = RpcError(code, message, data).wire()
        await self._send(reply)

    async def _send(self, message: Mapping[str, Any]) -> None:
        await self.wire.send(message)

    async def drain(self, grace: float) -> None:
        """Let started and waiting requests finish for up to `grace` seconds, then cancel."""
        if grace > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace)
        self._closing = True
        for lane in (self._calls, self._answers):
            lane.waiting.clear()
        self._waiting_calls.clear()
        self._queued = 0
        for task in list(self.inflight.values()) + list(self._background):
            task.cancel()
        leftovers = list(self.inflight.values()) + list(self._background)
        if leftovers:
            await asyncio.wait(leftovers, timeout=0.5)


def _take_over_stdout() -> int:
    """Give the wire a private duplicate of fd 1 and point fd 1 at stderr."""
    wire_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout.flush()  # after the move: text printed before serving goes to stderr too
    return wire_fd


async def _read_stdin(reader: _LineReader) -> None:
    loop = asyncio.get_running_loop()
    stdin = os.fdopen(os.dup(0), "rb", buffering=0)
    mode = os.fstat(stdin.fileno()).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        await loop.connect_read_pipe(lambda: reader, stdin)
        return
    # A regular file, /dev/null or a terminal: epoll cannot watch some of these, so read in a
    # thread, one chunk at a time: the next read waits until the reader has room for it.

    def pump() -> None:
        while True:
            reader.room.wait()
            chunk = stdin.read(1 << 16)
            if not chunk:
                break
            reader.room.clear()  # set again by feed() (or by resume() after a pause)
            loop.call_soon_threadsafe(reader.feed, chunk)
        loop.call_soon_threadsafe(reader.eof_received)

    threading.Thread(target=pump, name="stdin-pump", daemon=True).start()


async def _watch_parent(stop: asyncio.Event) -> None:
    parent = os.getppid()
    while not stop.is_set():
        await asyncio.sleep(PARENT_POLL_SECONDS)
        if os.getppid() != parent:
            events.emit("mcp.parent_gone", level="warning", parent_pid=parent)
            stop.set()


async def serve_stdio(surface: Surface) -> None:
    """Serve `surface` on stdin/stdout until EOF, SIGTERM, SIGINT or the parent's death."""
    loop = asyncio.get_running_loop()
    wire = _Wire(_take_over_stdout())
    await wire.open()
    server = StdioServer(surface, wire)
    reader = _LineReader(server.on_line, server.on_overlong, server.saturated)
    server.on_room = reader.resume
    stop = asyncio.Event()
    reason = "eof"

    def request_stop(signame: str) -> None:
        nonlocal reason
        reason = signame
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, request_stop, sig.name)
    await _read_stdin(reader)
    eof_wait = asyncio.ensure_future(reader.eof.wait())
    stop_wait = asyncio.ensure_future(stop.wait())
    watchdog = asyncio.ensure_future(_watch_parent(stop))
    try:
        await asyncio.wait({eof_wait, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set() and reason == "eof":
            reason = "parent_gone"
        events.emit("mcp.shutdown", level="debug", reason=reason, inflight=len(server.inflight))
        await server.drain(EOF_GRACE_SECONDS if reason == "eof" else 0.0)
    finally:
        for task in (eof_wait, stop_wait, watchdog):
            task.cancel()
        with contextlib.suppress(Exception):
            await surface.aclose()
        await wire.aclose()


def run(surface_factory: Callable[[], Surface]) -> int:
    """Build the surface inside a fresh event loop, serve it, and return the exit code (0)."""

    async def main() -> None:
        await serve_stdio(surface_factory())

    asyncio.run(main())
    return 0
