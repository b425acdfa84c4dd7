"""The control socket's server: `mcphost ctl`'s way into a running supervisor.

Owns: `ControlServer` (the Unix socket `<state>/control.sock`, its lock, its mode and the peer
check, one request per connection on the wire of `control.protocol`), `ControlHandler` (what
the supervisor implements: `operations.Operations`), `ControlInUse` and the lock (`take_lock`).
The blocking client is `control.client`; every refusal's code and message is a row of
`mcphost.supervisor.refusals`.

Exec: the server reads the first message with `recvmsg` on the raw socket (a stream transport
would drop the descriptors), hands the three descriptors to `ControlHandler.exec` (which spawns
the command with them as 0/1/2) and closes its copies. A line that arrived together with the
request is refused as `bad_request`. When the client's side closes first (it was killed, or it
hung up), the server ends the command's process group (`Execution.end`): a dead `ctl` leaves
nothing running. Passing descriptors to any other op is refused (`bad_request`).

Access: the socket is bound under the state directory (by `mcphost.unixsock`), chmod 0600 *before*
`listen()` (until then a connect is refused, so the umask never matters), and every connection's
`SO_PEERCRED` uid must be the supervisor's own effective uid or root (`forbidden_peer` otherwise),
so a socket whose mode was loosened still serves no one else; the supervisor's server also
refuses every peer that descends from the supervisor (`refuse_descendants`): behind the fence,
which hides the socket, a second wall against an agent's tree. A second server on the same path is
refused (`ControlInUse`): an exclusive `flock` on `<path>.lock` (`take_lock`; the holder writes
its pid into the file, so a refused process names it), held for the server's life (the
supervisor takes it before it touches anything else in its state directory and hands the server
`locked=True`), settles a race between two supervisors starting at once, and a live listener
found at the path (a supervisor without the lock) is never unlinked. A stale socket file is
replaced; anything else at the path is refused, never deleted.

Bounds: `MAX_CONNECTIONS` connections at once (more get `busy`), `REQUEST_TIMEOUT` to send the
request line, and replies written with a small write buffer and `drain()`: a client that does
not read stalls only its own connection (the handler's log iterator is not pulled) and is
dropped after `STALL_TIMEOUT`. An accept that fails for want of descriptors is retried after
0.1 s and logged at most once per `events.LOG_EVERY_SECONDS` (`supervisor.control.accept_failed`,
with the count left out).

Must never: serve a peer of another uid (except root), unlink a socket something listens on,
hold more than one request line per connection in memory, put a traceback on the wire, keep a
received file descriptor open past the request, or let an exec'd command outlive its client's
connection.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import errno
import logging
import os
import socket
import struct
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from mcphost import events
from mcphost.peer import descends_from
from mcphost.supervisor import refusals as R
from mcphost.supervisor.control.protocol import (
    EXEC_FDS,
    LOG_CHUNK,
    MAX_LINE,
    ControlError,
    encode,
    parse_request,
    parse_signal,
)

if TYPE_CHECKING:
    from mcphost.unixsock import Listening, SocketPathError

MAX_CONNECTIONS = 32
REQUEST_TIMEOUT = 10.0
STALL_TIMEOUT = 30.0
WRITE_BUFFER_HIGH = 64 * 1024

MAX_FDS = 8  # descriptors read with the first message (more are closed, and refused)


class ControlInUse(ControlError):
    """Another supervisor (or something else) already serves this control socket."""


class Execution(Protocol):
    """A command the handler spawned for `exec`: its own process group, led by `pid`."""

    @property
    def pid(self) -> int: ...
    def describe(self) -> dict[str, Any]: ...  # JSON for the `started` line
    async def wait(self) -> int: ...  # its exit as os.waitstatus_to_exitcode gives it
    def send_signal(self, sig: int) -> None: ...  # to the process group
    def end(self) -> None: ...  # SIGTERM the group, SIGKILL after a grace; idempotent


class ControlHandler(Protocol):
    """What the supervisor offers the control socket. Results must be JSON-serialisable."""

    async def status(self) -> Any: ...
    # start, stop, restart: each of `agents` (one or more), every one checked before any is
    # acted on; one result per agent, in order
    async def start(self, agents: list[str]) -> list[Any]: ...
    async def stop(self, agents: list[str]) -> list[Any]: ...
    async def restart(self, agents: list[str]) -> list[Any]: ...
    async def reload(self, dry_run: bool = False) -> Any: ...
    def logs(self, agent: str | None, lines: int, follow: bool) -> AsyncIterator[bytes]: ...

    def exec(self, agent: str, argv: list[str], fds: list[int]) -> Execution:
        """Spawn `argv` as `agent` with `fds` as its stdin, stdout, stderr (the handler dup2s
        them in the child; the server closes them after this returns or raises)."""
        ...


def peer_uid(sock: socket.socket) -> int:
    """The connected peer's uid from `SO_PEERCRED` (Linux: struct ucred {pid, uid, gid})."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


def peer_pid(sock: socket.socket) -> int:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", raw)[0])


def peer_allowed(uid: int, owner: int) -> bool:
    """Only the supervisor's own uid, or root, may use its control socket."""
    return uid in (owner, 0)


def _log_error(text: str, *args: object, exc: BaseException | None = None) -> None:
    logging.getLogger("mcphost.supervisor.control").error(text, *args, exc_info=exc)


def _as_refusal(exc: BaseException) -> ControlError | None:
    """A handler exception that carries a stable code: ours, or any with str `code`/`message`."""
    if isinstance(exc, ControlError):
        return exc
    code, message = getattr(exc, "code", None), getattr(exc, "message", None)
    if isinstance(code, str) and isinstance(message, str):
        details = getattr(exc, "details", None)
        return ControlError(code, message, details if isinstance(details, dict) else None)
    return None


# -- the lock ------------------------------------------------------------------------------------


def lock_path(socket_path: str) -> str:
    """The lock file of the control socket at `socket_path`: one supervisor per state directory."""
    return socket_path + ".lock"


def take_lock(socket_path: str) -> int:
    """Hold the exclusive `flock` on `<socket_path>.lock` (0600, created if missing, never
    through a symlink); the descriptor holds it until closed. Our pid is written into the file
    so a refused process can name the holder. Raises `ControlInUse` (details: `path`, `lock`,
    `pid` of the holder when it wrote one) when another process holds it."""
    import fcntl

    path = lock_path(socket_path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder_pid(fd)
        os.close(fd)
        who = f"another supervisor (pid {holder})" if holder else "another supervisor"
        raise ControlInUse.row(
            R.LOCK_HELD, {"path": socket_path, "lock": path, "pid": holder}, who=who, lock=path
        ) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # the pid is a courtesy for the next one refused; the lock is what counts
    return fd


def _holder_pid(fd: int) -> int | None:
    """The pid the lock's holder wrote, or None (not written yet, or not a pid)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and len(text) < 12 else None


# -- the server ----------------------------------------------------------------------------------


class ControlServer:
    """Serve `handler` on the Unix socket `path`. `await start()`, later `await aclose()`."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        handler: ControlHandler,
        *,
        locked: bool = False,
        refuse_descendants: bool = False,
    ) -> None:
        """`locked`: the caller already holds `<path>.lock` (`take_lock`) for the server's life
        (the supervisor takes it before it touches its state directory); else `start()` takes
        it and `aclose()` releases it. `refuse_descendants`: refuse every peer that descends from
        this process (the supervisor: an agent's tree, or an escapee reparented to it)."""
        self.path = os.fspath(path)
        self.handler = handler
        self.owner = os.geteuid()
        self.refuse_descendants = refuse_descendants
        self._locked_by_caller = locked
        self._lock_fd: int | None = None
        self._listening: Listening | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._accept_failures = events.RateLimit(1, events.LOG_EVERY_SECONDS)  # EMFILE...
        self._tasks: set[asyncio.Task[None]] = set()

    # -- start and stop ----------------------------------------------------------------------

    async def start(self) -> None:
        self._lock()
        try:
            self._listening = self._bind()
        except BaseException:
            self._unlock()
            raise
        sock = self._listening.sock
        self._accepting = asyncio.get_running_loop().create_task(self._accept_loop(sock))

    async def aclose(self) -> None:
        """Stop accepting, end every connection (a follow included), remove the socket file."""
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
        listening, self._listening = self._listening, None
        if listening is not None:
            listening.sock.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if listening is not None:
            listening.unlink()  # only while it is still the socket file we bound
        self._unlock()

    async def __aenter__(self) -> ControlServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _lock(self) -> None:
        if not self._locked_by_caller:
            self._lock_fd = take_lock(self.path)

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock; the file stays (harmless, reused)
            self._lock_fd = None

    def _bind(self) -> Listening:
        """Listen at the path (mode 0600 before listen; we hold the lock, so a socket nobody
        listens on is stale and replaced); refuse a live listener, a non-socket, a changed file."""
        from mcphost import unixsock

        def ours(st: os.stat_result) -> None:
            if st.st_uid != self.owner:
                raise unixsock.SocketPathError(self.path, unixsock.REPLACED)

        try:
            return unixsock.listen(self.path, mode=0o600, backlog=MAX_CONNECTIONS, check=ours)
        except unixsock.SocketPathError as exc:
            raise self._refusal_of(exc) from None

    def _refusal_of(self, exc: SocketPathError) -> ControlError:
        from mcphost import unixsock

        details = {"path": self.path}
        if exc.reason == unixsock.NOT_A_SOCKET:
            return ControlInUse.row(R.NOT_A_SOCKET, details, path=self.path)
        if exc.reason == unixsock.IN_USE:
            return ControlInUse.row(R.LISTENED_ON, details, path=self.path)
        if exc.reason == unixsock.UNPROBEABLE:
            return ControlInUse.row(R.UNPROBEABLE, details, path=self.path, errname=exc.errname)
        return ControlError.row(R.CHANGED_WHILE_BINDING, details, path=self.path)

    # -- one connection ----------------------------------------------------------------------

    async def _accept_loop(self, listener: socket.socket) -> None:
        """Accept raw sockets: the first message may carry file descriptors, which only
        `recvmsg` sees (a stream transport would read, and so drop, them)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except (ConnectionAbortedError, InterruptedError):
                continue
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    events.emit_limited(
                        self._accept_failures,
                        "supervisor.control.accept_failed",
                        errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
                    )
                    await asyncio.sleep(0.1)  # out of descriptors: back off, do not spin
                    continue
                raise
            task = loop.create_task(self._serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        writer: asyncio.StreamWriter | None = None
        fds: list[int] = []
        try:
            first = await self._admit(conn)
            if first is None:
                return
            line, fds, leftover, eof = first
            reader, writer = await _streams(conn, leftover, eof)
            writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
            await self._exchange(reader, writer, line, fds, leftover)
            writer.close()  # flush what is buffered, then close
            async with asyncio.timeout(STALL_TIMEOUT):
                await writer.wait_closed()
        except (ConnectionError, TimeoutError):
            pass  # the client went away, or stopped reading; nothing to tell anyone
        except asyncio.CancelledError:
            pass  # aclose()
        except Exception as exc:
            _log_error("control connection failed", exc=exc)
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._tasks.discard(task)  # now, not in a later callback: the count is exact
            _close_fds(fds)
            if writer is not None:
                writer.transport.abort()  # a no-op once closed; drops an unread reply otherwise
            else:
                conn.close()

    async def _send_raw(self, conn: socket.socket, message: dict[str, Any]) -> None:
        async with asyncio.timeout(STALL_TIMEOUT):
            await asyncio.get_running_loop().sock_sendall(conn, encode(message))

    async def _admit(self, conn: socket.socket) -> tuple[bytes, list[int], bytes, bool] | None:
        """Check the peer, read the first message (the request line and any descriptors).
        None when the connection was refused (and told so) or left without asking."""
        uid = peer_uid(conn)
        if not peer_allowed(uid, self.owner):
            await self._send_raw(
                conn,
                ControlError.row(
                    R.FORBIDDEN_PEER,
                    {"peer_uid": uid, "supervisor_uid": self.owner},
                    uid=uid,
                    owner=self.owner,
                ).wire(),
            )
            return None
        if self.refuse_descendants and descends_from(peer_pid(conn), os.getpid()):
            await self._send_raw(
                conn,
                ControlError.row(R.FLEET_PEER, {"peer_pid": peer_pid(conn)}).wire(),
            )
            return None
        if len(self._tasks) > MAX_CONNECTIONS:
            await self._send_raw(
                conn,
                ControlError.row(R.BUSY, limit=MAX_CONNECTIONS).wire(),
            )
            return None
        fds: list[int] = []
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                data, eof = await _recv_first_line(conn, fds)
        except BaseException:
            _close_fds(fds)
            raise
        end = data.find(b"\n")
        line, leftover = (data, b"") if end < 0 else (data[: end + 1], data[end + 1 :])
        if len(line) > MAX_LINE or (end < 0 and not eof):
            _close_fds(fds)
            await self._send_raw(
                conn,
                ControlError.row(R.TOO_LARGE, {"limit_bytes": MAX_LINE}, limit=MAX_LINE).wire(),
            )
            return None
        if not line.strip() and eof:
            _close_fds(fds)
            return None  # connected and left: a probe
        return line, fds, leftover, eof

    async def _send(self, writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
        writer.write(encode(message))
        async with asyncio.timeout(STALL_TIMEOUT):
            await writer.drain()

    async def _exchange(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        line: bytes,
        fds: list[int],
        leftover: bytes,
    ) -> None:
        try:
            request = parse_request(line)
            self._check_fds(request["op"], fds, leftover)
        except ControlError as exc:
            await self._send(writer, exc.wire())
            return
        if request["op"] == "logs":
            await self._logs(reader, writer, request)
            return
        if request["op"] == "exec":
            await self._exec(reader, writer, request, fds)
            return
        try:
            result = await self._call(request)
            reply = {"ok": True, "result": result}
            encode(reply)  # not JSON-serialisable -> internal, below
        except Exception as exc:
            reply = self._refusal(exc, request["op"]).wire()
        await self._send(writer, reply)

    @staticmethod
    def _check_fds(op: str, fds: list[int], leftover: bytes) -> None:
        if op != "exec":
            if fds:
                raise ControlError.row(R.FDS_NOT_EXEC, op=op)
            return
        if len(fds) != EXEC_FDS:
            raise ControlError.row(R.FDS_COUNT, expected=EXEC_FDS, got=len(fds))
        if leftover:
            raise ControlError.row(R.EXEC_EARLY)

    async def _call(self, request: dict[str, Any]) -> Any:
        op, handler = request["op"], self.handler
        if op == "status":
            return await handler.status()
        if op == "reload":
            return await handler.reload(dry_run=request.get("dry_run", False))
        method = {"start": handler.start, "stop": handler.stop, "restart": handler.restart}[op]
        results = await method(request["agents"])
        # one "agent" asked: its result as it is; "agents": the list
        return results[0] if "agent" in request else {"agents": results}

    def _refusal(self, exc: Exception, op: str) -> ControlError:
        refusal = _as_refusal(exc)
        if refusal is not None:
            return refusal
        _log_error("control %s failed", op, exc=exc)
        return ControlError.row(R.INTERNAL, {"op": op}, op=op, exception=type(exc).__name__)

    async def _exec(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: dict[str, Any],
        fds: list[int],
    ) -> None:
        try:
            execution = self.handler.exec(request["agent"], request["argv"], list(fds))
        except Exception as exc:
            await self._send(writer, self._refusal(exc, "exec").wire())
            return
        finally:
            _close_fds(fds)  # the child has its own copies now (or never will)
        code: int | None = None
        try:
            await self._send(writer, {"ok": True, "started": execution.describe()})
            code = await self._exec_wait(reader, execution)
            if code is not None:
                await self._send(writer, {"ok": True, "exit": _exit_message(code)})
        finally:
            if code is None:
                execution.end()  # the client is gone (or we are closing): end the command

    async def _exec_wait(self, reader: asyncio.StreamReader, execution: Execution) -> int | None:
        """Forward the client's signals until the command exits (its code) or the client's side
        closes (None)."""
        exited = asyncio.ensure_future(execution.wait())
        try:
            while True:
                line_task = asyncio.ensure_future(reader.readline())
                try:
                    await asyncio.wait({exited, line_task}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not line_task.done():
                        line_task.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await line_task
                if line_task.done() and not line_task.cancelled():
                    try:
                        line = line_task.result()
                    except (ValueError, ConnectionError, asyncio.LimitOverrunError):
                        line = b""  # an over-long line or a reset: treat as gone
                    if not line:
                        if exited.done():
                            return exited.result()
                        return None
                    sig = parse_signal(line)
                    if sig is not None:
                        execution.send_signal(sig)
                if exited.done():
                    return exited.result()
        finally:
            if not exited.done():
                exited.cancel()

    async def _logs(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: dict[str, Any]
    ) -> None:
        try:
            chunks = self.handler.logs(request["agent"], request["lines"], request["follow"])
        except Exception as exc:
            await self._send(writer, self._refusal(exc, "logs").wire())
            return
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        gone = asyncio.ensure_future(reader.read(1)) if request["follow"] else None
        step: asyncio.Future[bytes] | None = None
        try:
            while True:
                try:
                    if gone is None:
                        chunk = await anext(chunks)
                    else:
                        step = asyncio.ensure_future(anext(chunks))
                        await asyncio.wait({step, gone}, return_when=asyncio.FIRST_COMPLETED)
                        if not step.done():
                            return  # the client closed or wrote: a follow ends (finally)
                        chunk, step = step.result(), None
                except StopAsyncIteration:
                    break
                except Exception as exc:
                    await self._send(writer, self._refusal(exc, "logs").wire())
                    return
                for text in _log_texts(decoder.decode(bytes(chunk))):
                    await self._send(writer, {"log": text})
            tail = decoder.decode(b"", final=True)
            if tail:
                await self._send(writer, {"log": tail})
            await self._send(writer, {"ok": True, "end": True})
        finally:
            if gone is not None:
                gone.cancel()
            if step is not None and not step.done():
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await step
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()


def _log_texts(text: str) -> Iterator[str]:
    for start in range(0, len(text), LOG_CHUNK):
        yield text[start : start + LOG_CHUNK]


def _exit_message(code: int) -> dict[str, Any]:
    return {"code": code, "status": f"exit {code}" if code >= 0 else f"signal {-code}"}


def _close_fds(fds: list[int]) -> None:
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.pop())


def _fds_of(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    import array

    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            items = array.array("i")
            items.frombytes(data[: len(data) - (len(data) % items.itemsize)])
            fds.extend(items)
    return fds


async def _recv_first_line(conn: socket.socket, fds: list[int]) -> tuple[bytes, bool]:
    """Read until a newline, EOF or more than MAX_LINE bytes with `recvmsg` on the non-blocking
    socket; every descriptor that came along is appended to `fds` (the caller closes them).
    Returns (bytes read, whether EOF was seen)."""
    loop = asyncio.get_running_loop()
    data = bytearray()
    space = socket.CMSG_SPACE(MAX_FDS * 4)
    while b"\n" not in data and len(data) <= MAX_LINE:
        try:
            chunk, ancdata, flags, _ = conn.recvmsg(MAX_LINE + 1 - len(data), space)
        except (BlockingIOError, InterruptedError):
            ready = loop.create_future()
            loop.add_reader(conn.fileno(), ready.set_result, None)
            try:
                await ready
            finally:
                loop.remove_reader(conn.fileno())
            continue
        fds.extend(_fds_of(ancdata))
        if flags & socket.MSG_CTRUNC:
            fds.extend([-1] * (MAX_FDS + 1))  # more than we take: refused (closing -1 is a no-op)
        if not chunk:
            return bytes(data), True
        data += chunk
    return bytes(data), False


async def _streams(
    conn: socket.socket, leftover: bytes, eof: bool
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams on the rest of the connection; what was read past the first line comes first."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE + 1, loop=loop)
    if leftover:
        reader.feed_data(leftover)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock=conn)
    if eof:
        reader.feed_eof()
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return reader, writer
