"""Serve one `Surface` over stdio: newline-delimited JSON-RPC 2.0, MCP handshake era.

Owns: framing (our own buffer, with a line cap), dispatch, per-call tasks, cancellation,
progress and list-changed notifications, and the process lifecycle (stdin EOF, SIGTERM,
SIGINT, a vanished parent: each ends the server with exit 0).

The protocol stream is moved off fd 1 at start: the wire gets a private duplicate and fd 1 is
pointed at stderr, so a stray `print` can never corrupt JSON-RPC.

Must never: write anything to the wire but JSON-RPC messages; block the loop on a write.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
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
    CallContext,
    RpcError,
    Surface,
)

MAX_LINE_BYTES = 64 * 1024 * 1024
EOF_GRACE_SECONDS = 0.8
PARENT_POLL_SECONDS = 1.0


def _dumps(message: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    except UnicodeEncodeError:  # a lone surrogate (e.g. echoed from input): escape it as \uXXXX
        return json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


class _Wire:
    """The outgoing half: serialises messages onto the private protocol fd without blocking."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._writer: asyncio.StreamWriter | None = None
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
    """Incoming half: splits the byte stream into lines, enforcing `MAX_LINE_BYTES`."""

    def __init__(self, on_line: Callable[[bytes], None], on_overlong: Callable[[], None]) -> None:
        self._buf = bytearray()
        self._discarding = False
        self._on_line = on_line
        self._on_overlong = on_overlong
        self.eof = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        self.feed(data)

    def feed(self, data: bytes) -> None:
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            chunk = data[start:nl]
            if self._discarding:
                self._discarding = False
            else:
                self._buf += chunk
                line, self._buf = bytes(self._buf), bytearray()
                if line.strip():
                    self._on_line(line)
            start = nl + 1
        if not self._discarding:
            self._buf += data[start:]
            if len(self._buf) > MAX_LINE_BYTES:
                self._buf = bytearray()
                self._discarding = True
                self._on_overlong()

    def eof_received(self) -> bool:
        if self._buf.strip() and not self._discarding:
            self._on_line(bytes(self._buf))
        self._buf = bytearray()
        self.eof.set()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof.set()


class StdioServer:
    """Dispatches JSON-RPC requests to a surface; one task per tool call."""

    def __init__(self, surface: Surface, wire: _Wire) -> None:
        self.surface = surface
        self.wire = wire
        self.inflight: dict[Any, asyncio.Task[None]] = {}
        self.protocol_version = LATEST_HANDSHAKE_VERSION
        self._background: set[asyncio.Task[None]] = set()

    # -- incoming -------------------------------------------------------------------------
    def on_line(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # deep nesting recurses
            self._spawn(self._error(None, PARSE_ERROR, "Parse error", str(exc)[:200]))
            return
        if not isinstance(message, dict):
            self._spawn(
                self._error(None, INVALID_REQUEST, "Invalid Request", "expected a JSON object")
            )
            return
        method = message.get("method")
        has_id = "id" in message
        request_id = message.get("id")
        valid_id = isinstance(request_id, (str, int)) and not isinstance(request_id, bool)
        if not isinstance(method, str):
            if not has_id or "result" in message or "error" in message:
                return  # a response to a request we never send, or noise: ignore
            # echo the id only if it is one; a NaN or an object id would corrupt the answer
            answer_id = request_id if valid_id else None
            self._spawn(self._error(answer_id, INVALID_REQUEST, "Invalid Request"))
            return
        if not has_id:
            self._on_notification(method, message.get("params"))
            return
        if not valid_id:
            self._spawn(
                self._error(
                    None, INVALID_REQUEST, "Invalid Request", "id must be a string or integer"
                )
            )
            return
        params = message.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            self._spawn(self._error(request_id, INVALID_PARAMS, "params must be an object"))
            return
        if method == "tools/call":
            if request_id in self.inflight:
                self._spawn(self._error(request_id, INVALID_REQUEST, "duplicate request id"))
                return
            task = asyncio.ensure_future(self._call_tool(request_id, params))
            self.inflight[request_id] = task
            task.add_done_callback(self._forget(request_id))
            return
        self._spawn(self._answer_simple(request_id, method, params))

    def _forget(self, request_id: Any) -> Callable[[asyncio.Task[None]], None]:
        def forget(task: asyncio.Task[None]) -> None:
            if self.inflight.get(request_id) is task:
                del self.inflight[request_id]

        return forget

    def on_overlong(self) -> None:
        events.emit("mcp.wire.line_too_long", level="warning", limit_bytes=MAX_LINE_BYTES)
        self._spawn(
            self._error(
                None,
                INVALID_REQUEST,
                f"message exceeds {MAX_LINE_BYTES} bytes and was discarded",
            )
        )

    def _on_notification(self, method: str, params: Any) -> None:
        if method == "notifications/cancelled" and isinstance(params, dict):
            target = params.get("requestId")
            if isinstance(target, bool) or not isinstance(target, (str, int)):
                return  # not a request id (an unhashable one would even raise here)
            task = self.inflight.pop(target, None)
            if task is not None:
                task.cancel()
                events.emit("mcp.call.cancelled", level="debug", request_id=params.get("requestId"))

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
        await self._send(
            {"jsonrpc": "2.0", "id": request_id, "error": RpcError(code, message, data).wire()}
        )

    async def _send(self, message: Mapping[str, Any]) -> None:
        await self.wire.send(message)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self, grace: float) -> None:
        """Let in-flight calls finish for up to `grace` seconds, then cancel the rest."""
        pending = [t for t in self.inflight.values() if not t.done()]
        if pending and grace > 0:
            await asyncio.wait(pending, timeout=grace)
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
    # thread.

    def pump() -> None:
        while chunk := stdin.read(1 << 16):
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
    reader = _LineReader(server.on_line, server.on_overlong)
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
