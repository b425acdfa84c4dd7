"""Serve one `Surface` over a connected stream socket, exactly as stdio serves it.

Owns: the socket side of one supervisor session. The session is the shared core
(`mcphost.mcpserve.connection`: the 64 MiB line cap, request-id recovery, the -32700/-32600
answers, backpressure, EOF grace and stop), so a pump attached over a Unix socket sees the bytes
a standalone host would write on stdout. This module gives the core its carrier:
- reading: the core's `LineReader` is the protocol of an asyncio socket transport; while the
  session is saturated (its own bounds, or the byte budget it shares with its peer's other
  sessions, `mcphost.mcpserve.budget`) the reader pauses the transport (`pause_reading`), so
  the kernel's socket buffers, not this process, hold what a flooding client sends;
- writing (`SocketWire`): one message at a time through the same transport; a sender waits
  until the transport's buffer is below its high-water mark (`pause_writing` /
  `resume_writing`), so a client that stops reading stalls the SDK's writers, then its
  handlers, then the reading of its own requests, and never grows a buffer;
- a half-close from the peer (the pump's `shutdown(SHUT_WR)` at its stdin EOF) is the core's
  EOF: requests already handed over finish within the EOF grace and their answers are still
  written; the owner's `stop` ends the session at once (answers already produced get the stop
  grace);
- at the end the socket is closed: what is buffered gets the stop grace to leave, then the
  connection is aborted.

Must never: read or write the socket outside the session (the attach handshake before it is
the caller's, `mcphost.supervisor.serving.sessions`), close the surface (its owner does), or import the
SDK at module import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from mcphost.mcpserve.connection import Limits, LineReader, LineTransport, _dumps, serve_connection

if TYPE_CHECKING:
    from mcphost.mcpserve.budget import Share
    from mcphost.surface import Surface


class SocketWire:
    """The outgoing half over an asyncio socket transport, one message at a time."""

    def __init__(self) -> None:
        self._transport: asyncio.WriteTransport | None = None
        self._turn = asyncio.Lock()
        self._writable = asyncio.Event()
        self._writable.set()
        self.lost = asyncio.Event()
        self.closed = False

    # -- from the protocol ----------------------------------------------------------------
    def attach(self, transport: asyncio.WriteTransport) -> None:
        self._transport = transport

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self) -> None:
        self.closed = True
        self.lost.set()
        self._writable.set()  # wake a waiting sender: it finds the wire closed

    # -- for the session --------------------------------------------------------------------
    async def send(self, message: Mapping[str, Any] | Callable[[], bytes]) -> None:
        """Write one message: a JSON-RPC object, or a function that serialises one."""
        async with self._turn:
            if self.closed or self._transport is None:
                return
            await self._writable.wait()  # the previous message has left our buffer
            if self.closed or self._transport.is_closing():
                self.closed = True
                return
            data = message() if callable(message) else _dumps(message)
            try:
                self._transport.write(data)
            except (ConnectionError, OSError, RuntimeError):
                self.closed = True
                return
            await self._writable.wait()  # and this one too, down to the high-water mark

    async def aclose(self, grace: float) -> None:
        """Close the socket: buffered bytes get `grace` seconds to leave, then it is aborted."""
        self.closed = True
        transport = self._transport
        if transport is None:
            return
        if not transport.is_closing():
            transport.close()
        try:
            await asyncio.wait_for(self.lost.wait(), grace)
        except TimeoutError:
            transport.abort()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.lost.wait(), grace)


class _SocketProtocol(LineReader):
    """The core's line reader as a socket protocol; write flow control goes to the wire."""

    def __init__(self, transport: LineTransport, wire: SocketWire, max_line: int) -> None:
        super().__init__(
            transport.on_line,
            transport.on_overlong,
            transport.saturated,
            max_line=max_line,
            on_partial=transport.on_partial,
        )
        self._wire = wire

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert isinstance(transport, asyncio.WriteTransport)
        self._wire.attach(transport)

    def pause_writing(self) -> None:
        self._wire.pause_writing()

    def resume_writing(self) -> None:
        self._wire.resume_writing()

    def eof_received(self) -> bool:
        super().eof_received()
        return True  # a half-close: the answers still go out on our half

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._wire.connection_lost()


async def serve_socket(
    surface: Surface,
    sock: socket.socket,
    *,
    stop: asyncio.Event,
    limits: Limits | None = None,
    share: Share | None = None,
) -> str:
    """Serve one session of `surface` on the connected `sock` until EOF or `stop`; close `sock`.

    Returns why the session ended: "eof" (the peer half-closed or went away) or "stop". The
    surface is left open for its owner to close, and `share` (this session's part of a byte
    budget shared with other sessions) for its owner to close.
    """
    limits = limits or Limits()
    loop = asyncio.get_running_loop()
    wire = SocketWire()
    transport = LineTransport(wire, limits, share)
    reader = _SocketProtocol(transport, wire, limits.max_line_bytes)
    transport.on_room = reader.resume
    try:
        await loop.connect_accepted_socket(lambda: reader, sock)
    except BaseException:
        sock.close()
        raise
    try:
        return await serve_connection(surface, transport, reader, stop=stop)
    finally:
        await wire.aclose(limits.stop_grace)
