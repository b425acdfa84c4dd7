"""Serve one `Surface` over stdio: the process around one session of the shared core.

Owns: the process side of `mcphost host` and `mcphost relay-tools`. The session itself (line
framing with the 64 MiB cap, request-id recovery for over-long lines, the -32700/-32600 answers,
backpressure, EOF grace and stop) is `mcphost.mcpserve.connection`, shared with the supervisor's
socket sessions (`mcphost.mcpserve.stream`); this module gives it stdin and stdout:
- the protocol stream is moved off fd 1 at start (the wire gets a private duplicate, fd 1
  points at stderr), so a stray `print` can never corrupt JSON-RPC;
- stdout is written one message at a time through an asyncio pipe transport, waiting for the
  pipe to take it (a regular file gets plain writes), so an unread stdout stalls the SDK's
  writers, then its handlers, then the reading of stdin;
- stdin is read by the event loop when it is a pipe or a socket, else (a regular file,
  /dev/null, a terminal) by a thread, one chunk at a time, only while the reader has room;
- stdin EOF lets requests already handed over finish for `EOF_GRACE_SECONDS`, then ends the
  session; SIGTERM, SIGINT, SIGHUP or a vanished parent end it at once. Either way the process
  exits 0 (`run`, skipping the interpreter's teardown). The SDK is imported after stdin is
  being read, and a surface's optional `warm_up()` runs after the first answer (the
  `initialize` reply) is on the wire.

Must never: write anything to the wire but JSON-RPC messages; block the loop on a write;
dispatch a request itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from mcphost import events
from mcphost.mcpserve.connection import (
    EOF_GRACE_SECONDS,
    ID_SCAN_BYTES,
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_ACTIVE_CALLS,
    MAX_ACTIVE_OTHER,
    MAX_HELD_BYTES,
    MAX_QUEUED,
    PARSE_ERROR,
    STOP_GRACE_SECONDS,
    Limits,
    LineReader,
    LineTransport,
    _dumps,
    _encode,
    recover_request_id,
    serve_connection,
)

if TYPE_CHECKING:
    from mcphost.surface import Surface

__all__ = [
    "EOF_GRACE_SECONDS",
    "ID_SCAN_BYTES",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_ACTIVE_CALLS",
    "MAX_ACTIVE_OTHER",
    "MAX_HELD_BYTES",
    "MAX_LINE_BYTES",
    "MAX_QUEUED",
    "PARSE_ERROR",
    "STOP_GRACE_SECONDS",
    "StdioTransport",
    "_dumps",
    "_encode",
    "recover_request_id",
    "run",
    "serve_stdio",
]

MAX_LINE_BYTES = 64 * 1024 * 1024  # stdin's line cap (the core's default; read when serving)
PARENT_POLL_SECONDS = 1.0
StdioTransport = LineTransport  # the core's transport under its historical name


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

    async def send(self, message: Mapping[str, Any] | Callable[[], bytes]) -> None:
        """Write one message: a JSON-RPC object, or a function that serialises one."""
        async with self._turn:
            if self.closed:
                return
            data = message() if callable(message) else _dumps(message)
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


class _LineReader(LineReader):
    """stdin's line reader: the core's `LineReader` capped at this module's `MAX_LINE_BYTES`."""

    def __init__(
        self,
        on_line: Callable[[bytes], None],
        on_overlong: Callable[[bytes], None],
        saturated: Callable[[], bool] = lambda: False,
    ) -> None:
        super().__init__(on_line, on_overlong, saturated, max_line=MAX_LINE_BYTES)


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
    """Serve `surface` on stdin/stdout until EOF, SIGTERM, SIGINT, SIGHUP or the parent's death."""
    loop = asyncio.get_running_loop()
    wire = _Wire(_take_over_stdout())
    await wire.open()
    transport = LineTransport(wire, Limits(max_line_bytes=MAX_LINE_BYTES))
    reader = _LineReader(transport.on_line, transport.on_overlong, transport.saturated)
    transport.on_room = reader.resume
    stop = asyncio.Event()
    reason = "eof"

    def request_stop(signame: str) -> None:
        nonlocal reason
        reason = signame
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, request_stop, sig.name)
    await _read_stdin(reader)
    watchdog = asyncio.ensure_future(_watch_parent(stop))
    try:
        await serve_connection(
            surface,
            transport,
            reader,
            stop=stop,
            stop_reason=lambda: "parent_gone" if reason == "eof" else reason,
        )
    finally:
        watchdog.cancel()
        with contextlib.suppress(Exception):
            await surface.aclose()
        await wire.aclose()


def run(surface_factory: Callable[[], Surface]) -> NoReturn:
    """Build the surface inside a fresh event loop, serve it, and exit the process with 0."""

    async def main() -> None:
        await serve_stdio(surface_factory())

    asyncio.run(main())
    # Skip the interpreter's teardown: with the SDK's ~600 modules loaded it costs about a
    # second of the client's shutdown wait, and nothing is left to flush but our own streams
    # (both end on stderr by now).
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)
