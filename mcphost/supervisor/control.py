"""The control socket: `mcphost ctl`'s way into a running supervisor (server and client).

Owns: `ControlServer` (the Unix socket `<state>/control.sock`, its lock, its mode and the peer
check), the wire protocol below, `ControlHandler` (what the supervisor implements), `ControlError`
(a refusal with a stable code), and the blocking client `request` / `stream` that `mcphost ctl`
uses.

Protocol: one connection, one request. The client sends one JSON line (at most `MAX_LINE` bytes
including the newline)

    {"op": "status" | "start" | "stop" | "restart" | "reload" | "logs",
     "agent": "<id>",        start, stop, restart, logs: required; otherwise refused
     "lines": N,             logs only: 0..MAX_LOG_LINES, default 50
     "follow": bool}         logs only: default false

and the server answers JSON lines, then closes:

    {"ok": true, "result": <JSON>}                                     every op but logs
    {"ok": false, "error": {"code": "...", "message": "...", "details": {...}}}
    {"log": "<text chunk>"} ... {"ok": true, "end": true}              logs (an error may end it)

With `follow`, the log lines keep coming until the client closes (or half-closes) its side; the
server then stops reading the log. Codes are stable: `bad_request`, `unknown_op`,
`request_too_large`, `forbidden_peer`, `busy`, `internal`, plus whatever the handler raises
(`unknown_agent`, `reload_failed`, ...).

Access: the socket is bound under the state directory, chmod 0600 *before* `listen()` (until
then a connect is refused, so the umask never matters), and every connection's `SO_PEERCRED`
uid must be the supervisor's own effective uid or root (`forbidden_peer` otherwise), so a
socket whose mode was loosened still serves no one else. A second server on the same path is
refused (`ControlInUse`): an exclusive `flock` on `<path>.lock`, held for the server's life,
settles a race between two supervisors starting at once, and a live listener found at the path
(a supervisor without the lock) is never unlinked. A stale socket file is replaced; anything
else at the path is refused, never deleted.

Bounds: `MAX_CONNECTIONS` connections at once (more get `busy`), `REQUEST_TIMEOUT` to send the
request line, and replies written with a small write buffer and `drain()`: a client that does
not read stalls only its own connection (the handler's log iterator is not pulled) and is
dropped after `STALL_TIMEOUT`.

asyncio is imported inside the server's methods, not at module import: `mcphost ctl` imports
this module for the client and must start fast (an operator tool; asyncio alone costs more than
the rest of `ctl`).

Must never: serve a peer of another uid (except root), unlink a socket something listens on,
hold more than one request line per connection in memory, or put a traceback on the wire.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import json
import os
import socket
import stat
import struct
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

MAX_LINE = 64 * 1024  # a request line, newline included
MAX_REPLY_LINE = 64 * 1024 * 1024  # what the client accepts per reply line (status of a big fleet)
MAX_LOG_LINES = 100_000
DEFAULT_LOG_LINES = 50
MAX_AGENT_CHARS = 256
LOG_CHUNK = 16 * 1024  # bytes of log text per {"log": ...} line
MAX_CONNECTIONS = 32
REQUEST_TIMEOUT = 10.0
STALL_TIMEOUT = 30.0
WRITE_BUFFER_HIGH = 64 * 1024

OPS = ("status", "start", "stop", "restart", "reload", "logs")
_AGENT_OPS = frozenset({"start", "stop", "restart", "logs"})
_FIELDS = {
    "status": frozenset({"op"}),
    "reload": frozenset({"op"}),
    "start": frozenset({"op", "agent"}),
    "stop": frozenset({"op", "agent"}),
    "restart": frozenset({"op", "agent"}),
    "logs": frozenset({"op", "agent", "lines", "follow"}),
}


class ControlError(Exception):
    """A refusal on the control socket: a stable snake_case `code`, a `message` that says what
    to do, and JSON `details`. The handler raises it; the client raises it for `ok: false`."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = dict(details or {})

    def wire(self) -> dict[str, Any]:
        return {
            "ok": False,
            "error": {"code": self.code, "message": self.message, "details": self.details},
        }


class ControlInUse(ControlError):
    """Another supervisor (or something else) already serves this control socket."""


class NotRunning(Exception):
    """No supervisor answers at the socket (missing, stale or refused). `path` names it."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class ControlHandler(Protocol):
    """What the supervisor offers the control socket. Results must be JSON-serialisable."""

    async def status(self) -> Any: ...
    async def start(self, agent: str) -> Any: ...
    async def stop(self, agent: str) -> Any: ...
    async def restart(self, agent: str) -> Any: ...
    async def reload(self) -> Any: ...
    def logs(self, agent: str, lines: int, follow: bool) -> AsyncIterator[bytes]: ...


# -- the request grammar (pure) ----------------------------------------------------------------


def parse_request(line: bytes) -> dict[str, Any]:
    """One request line -> `{"op", "agent"?, "lines"?, "follow"?}` with defaults; `ControlError`
    (`bad_request`, `unknown_op`) naming what is wrong. Values are never echoed beyond 80 chars."""
    try:
        body = json.loads(line)
    except (ValueError, RecursionError):
        raise ControlError("bad_request", "the request is not one JSON line") from None
    if not isinstance(body, dict):
        raise ControlError("bad_request", "the request must be a JSON object")
    op = body.get("op")
    if not isinstance(op, str):
        raise ControlError("bad_request", 'the request needs "op" (a string)', {"ops": list(OPS)})
    if op not in _FIELDS:
        raise ControlError(
            "unknown_op",
            f"unknown op {_short(op)}; expected one of {', '.join(OPS)}",
            {"ops": list(OPS)},
        )
    unknown = sorted(str(k)[:80] for k in set(body) - _FIELDS[op])
    if unknown:
        raise ControlError(
            "bad_request",
            f"{op} takes no field(s) {', '.join(unknown)}",
            {"allowed": sorted(_FIELDS[op])},
        )
    out: dict[str, Any] = {"op": op}
    if op in _AGENT_OPS:
        agent = body.get("agent")
        if not isinstance(agent, str) or not agent:
            raise ControlError("bad_request", f'{op} needs "agent" (a non-empty string)')
        if len(agent) > MAX_AGENT_CHARS or not agent.isprintable():
            raise ControlError(
                "bad_request",
                f'"agent" must be at most {MAX_AGENT_CHARS} printable characters',
            )
        out["agent"] = agent
    if op == "logs":
        lines = body.get("lines", DEFAULT_LOG_LINES)
        if isinstance(lines, bool) or not isinstance(lines, int):
            raise ControlError("bad_request", '"lines" must be an integer')
        if not 0 <= lines <= MAX_LOG_LINES:
            raise ControlError("bad_request", f'"lines" must be from 0 to {MAX_LOG_LINES}')
        follow = body.get("follow", False)
        if not isinstance(follow, bool):
            raise ControlError("bad_request", '"follow" must be true or false')
        out["lines"], out["follow"] = lines, follow
    return out


def _short(value: str) -> str:
    return repr(value[:80] + ("…" if len(value) > 80 else ""))


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def peer_uid(sock: socket.socket) -> int:
    """The connected peer's uid from `SO_PEERCRED` (Linux: struct ucred {pid, uid, gid})."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


def peer_allowed(uid: int, owner: int) -> bool:
    """Only the supervisor's own uid, or root, may use its control socket."""
    return uid in (owner, 0)


def _log_error(text: str, *args: object, exc: BaseException | None = None) -> None:
    import logging  # lazily: `mcphost ctl` never logs, and logging costs it ~10 ms

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


# -- the server ----------------------------------------------------------------------------------


class ControlServer:
    """Serve `handler` on the Unix socket `path`. `await start()`, later `await aclose()`."""

    def __init__(self, path: str | os.PathLike[str], handler: ControlHandler) -> None:
        self.path = os.fspath(path)
        self.handler = handler
        self.owner = os.geteuid()
        self._lock_fd: int | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._identity: tuple[int, int] | None = None

    # -- start and stop ----------------------------------------------------------------------

    async def start(self) -> None:
        import asyncio

        self._lock()
        try:
            sock = self._bind()
        except BaseException:
            self._unlock()
            raise
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, sock=sock, limit=MAX_LINE + 1
            )
        except BaseException:
            sock.close()
            self._remove_socket()
            self._unlock()
            raise

    async def aclose(self) -> None:
        """Stop accepting, end every connection (a follow included), remove the socket file."""
        import asyncio

        if self._server is not None:
            self._server.close()
            self._server = None
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._remove_socket()
        self._unlock()

    async def __aenter__(self) -> ControlServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _lock(self) -> None:
        import fcntl

        lock_path = self.path + ".lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ControlInUse(
                "control_in_use",
                f"another supervisor already runs on this state directory (it holds {lock_path}); "
                "stop it first, or give this one another --state",
                {"path": self.path, "lock": lock_path},
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock; the file stays (harmless, reused)
            self._lock_fd = None

    def _bind(self) -> socket.socket:
        self._clear_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.path)
            # not listening yet: a connect is refused whatever the umask made the mode
            os.chmod(self.path, 0o600)
            st = os.lstat(self.path)
            if not stat.S_ISSOCK(st.st_mode) or st.st_uid != self.owner:
                raise ControlError(
                    "control_in_use",
                    f"{self.path} changed under us while binding; check who can write its directory",
                    {"path": self.path},
                )
            self._identity = (st.st_dev, st.st_ino)
            sock.listen(MAX_CONNECTIONS)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    def _clear_stale(self) -> None:
        """Unlink a stale socket file at the path; refuse a live listener or a non-socket."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise ControlInUse(
                "control_in_use",
                f"{self.path} exists and is not a socket; it was left alone. Remove it, or give "
                "the supervisor another --state",
                {"path": self.path},
            )
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(2.0)
        try:
            probe.connect(self.path)
        except (ConnectionRefusedError, FileNotFoundError):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # stale: nobody listens (we hold the lock)
            return
        except OSError as exc:
            raise ControlInUse(
                "control_in_use",
                f"{self.path} exists and cannot be probed ({errno.errorcode.get(exc.errno or 0, exc)}); "
                "it was left alone",
                {"path": self.path},
            ) from None
        finally:
            probe.close()
        raise ControlInUse(
            "control_in_use",
            f"something already listens on {self.path} (another supervisor?); stop it first, or "
            "give this one another --state",
            {"path": self.path},
        )

    def _remove_socket(self) -> None:
        """Unlink the socket file only if it is still the one we bound."""
        if self._identity is None:
            return
        try:
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self._identity:
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        self._identity = None

    # -- one connection ----------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import asyncio

        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        try:
            await self._exchange(reader, writer)
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
            self._tasks.discard(task)
            writer.transport.abort()  # a no-op once closed; drops an unread reply otherwise

    async def _send(self, writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
        import asyncio

        writer.write(encode(message))
        async with asyncio.timeout(STALL_TIMEOUT):
            await writer.drain()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import asyncio

        sock = writer.get_extra_info("socket")
        uid = peer_uid(sock) if sock is not None else -1
        if not peer_allowed(uid, self.owner):
            await self._send(
                writer,
                ControlError(
                    "forbidden_peer",
                    f"uid {uid} may not use this supervisor's control socket; run `mcphost ctl` "
                    f"as uid {self.owner} or root",
                    {"peer_uid": uid, "supervisor_uid": self.owner},
                ).wire(),
            )
            return
        if len(self._tasks) > MAX_CONNECTIONS:
            await self._send(
                writer,
                ControlError(
                    "busy",
                    f"the supervisor is serving {MAX_CONNECTIONS} control connections; retry",
                ).wire(),
            )
            return
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                line = await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            await self._send(
                writer,
                ControlError(
                    "request_too_large",
                    f"a control request is one JSON line of at most {MAX_LINE} bytes",
                    {"limit_bytes": MAX_LINE},
                ).wire(),
            )
            return
        except asyncio.IncompleteReadError as exc:
            if not exc.partial.strip():
                return  # connected and left: a probe
            line = exc.partial  # no newline, but the client half-closed: take what it sent
        if len(line) > MAX_LINE:
            await self._send(
                writer,
                ControlError(
                    "request_too_large",
                    f"a control request is one JSON line of at most {MAX_LINE} bytes",
                    {"limit_bytes": MAX_LINE},
                ).wire(),
            )
            return
        try:
            request = parse_request(line)
        except ControlError as exc:
            await self._send(writer, exc.wire())
            return
        if request["op"] == "logs":
            await self._logs(reader, writer, request)
            return
        try:
            result = await self._call(request)
            reply = {"ok": True, "result": result}
            encode(reply)  # not JSON-serialisable -> internal, below
        except Exception as exc:
            reply = self._refusal(exc, request["op"]).wire()
        await self._send(writer, reply)

    async def _call(self, request: dict[str, Any]) -> Any:
        op, handler = request["op"], self.handler
        if op == "status":
            return await handler.status()
        if op == "reload":
            return await handler.reload()
        method = {"start": handler.start, "stop": handler.stop, "restart": handler.restart}[op]
        return await method(request["agent"])

    def _refusal(self, exc: Exception, op: str) -> ControlError:
        refusal = _as_refusal(exc)
        if refusal is not None:
            return refusal
        _log_error("control %s failed", op, exc=exc)
        return ControlError(
            "internal",
            f"the supervisor failed to {op} ({type(exc).__name__}); see its log",
            {"op": op},
        )

    async def _logs(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: dict[str, Any]
    ) -> None:
        import asyncio

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


# -- the client (blocking, stdlib only: `mcphost ctl`) -------------------------------------------


def _connect(path: str, timeout: float | None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except FileNotFoundError:
        sock.close()
        raise NotRunning(path, "no such socket") from None
    except ConnectionRefusedError:
        sock.close()
        raise NotRunning(path, "connection refused (a stale socket)") from None
    except BaseException:
        sock.close()
        raise
    return sock


def _send_request(sock: socket.socket, body: dict[str, Any]) -> None:
    """Send the request line; a server that refused before reading it (busy, forbidden_peer)
    may have closed already: its answer is still there to read."""
    try:
        sock.sendall(encode(body))
    except (BrokenPipeError, ConnectionResetError):
        pass


def _read_messages(sock: socket.socket) -> Iterator[dict[str, Any]]:
    with sock.makefile("rb") as stream:
        while True:
            try:
                line = stream.readline(MAX_REPLY_LINE + 1)
            except ConnectionResetError:
                line = b""
            if not line:
                return
            if len(line) > MAX_REPLY_LINE or not line.endswith(b"\n"):
                raise ControlError(
                    "protocol_error", "the supervisor's reply line is cut or too long"
                )
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):
                raise ControlError("protocol_error", "the supervisor's reply is not JSON") from None
            if not isinstance(message, dict):
                raise ControlError("protocol_error", "the supervisor's reply is not an object")
            yield message


def _refusal_from(message: dict[str, Any]) -> ControlError:
    error = message.get("error")
    if not isinstance(error, dict):
        return ControlError("protocol_error", "the supervisor refused without saying why")
    details = error.get("details")
    return ControlError(
        str(error.get("code") or "protocol_error"),
        str(error.get("message") or "(no message)"),
        details if isinstance(details, dict) else None,
    )


def request(path: str, op: str, *, timeout: float | None = 120.0, **fields: Any) -> Any:
    """Send one request, return its `result`; `ControlError` for a refusal, `NotRunning` when
    nothing answers at `path`, `PermissionError` when the socket's mode shuts us out."""
    sock = _connect(path, timeout)
    try:
        _send_request(sock, {"op": op, **fields})
        for message in _read_messages(sock):
            if message.get("ok") is True and "result" in message:
                return message["result"]
            raise _refusal_from(message)
    finally:
        sock.close()
    raise ControlError("protocol_error", "the supervisor closed the connection without answering")


def stream_logs(
    path: str, agent: str, *, lines: int, follow: bool, timeout: float | None = 120.0
) -> Iterator[str]:
    """Yield the agent's log text chunk by chunk; ends at the server's `end` (or, following,
    when the caller stops iterating, which closes the connection)."""
    sock = _connect(path, None if follow else timeout)
    try:
        sock.sendall(encode({"op": "logs", "agent": agent, "lines": lines, "follow": follow}))
        for message in _read_messages(sock):
            text = message.get("log")
            if isinstance(text, str):
                yield text
                continue
            if message.get("ok") is True and message.get("end") is True:
                return
            raise _refusal_from(message)
    finally:
        sock.close()
    raise ControlError("protocol_error", "the supervisor closed the log stream without an end")
