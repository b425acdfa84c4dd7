"""The control socket's blocking client: what `mcphost ctl` (and the demo, and tests) use.

Owns: connecting to `<state>/control.sock` (`NotRunning` when nothing answers there), one request
(`request`), a log stream (`stream_logs`), and `ExecClient` (the request line sent with our
stdin, stdout and stderr by `SCM_RIGHTS`, signals forwarded until the command's exit). The wire
is `control.protocol`; a refusal comes back as its `ControlError`.

Must never: import asyncio, logging or anything of the server (an operator tool starts fast:
asyncio alone costs more than the rest of `ctl`), or keep a descriptor it opened past the call.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any

from mcphost.supervisor import refusals as R
from mcphost.supervisor.control.protocol import MAX_REPLY_LINE, ControlError, decode, encode


class NotRunning(Exception):
    """No supervisor answers at the socket (missing, stale or refused). `path` names it."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


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
                raise ControlError.row(R.REPLY_CUT)
            yield decode(line, R.REPLY_NOT_JSON, R.REPLY_NOT_OBJECT)


def _refusal_from(message: dict[str, Any]) -> ControlError:
    error = message.get("error")
    if not isinstance(error, dict):
        return ControlError.row(R.REPLY_NO_ERROR)
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
    raise ControlError.row(R.REPLY_NONE)


def stream_logs(
    path: str, agent: str | None, *, lines: int, follow: bool, timeout: float | None = 120.0
) -> Iterator[str]:
    """Yield the agent's log text (`agent` None: the supervisor's own log) chunk by chunk; ends
    at the server's `end` (or, following, when the caller stops iterating, which closes the
    connection)."""
    sock = _connect(path, None if follow else timeout)
    whose = {"agent": agent} if agent is not None else {"supervisor": True}
    try:
        sock.sendall(encode({"op": "logs", **whose, "lines": lines, "follow": follow}))
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
    raise ControlError.row(R.REPLY_NO_END)


class ExecClient:
    """`ctl exec`'s side (blocking): send the request with our stdin, stdout and stderr, then
    `wait()` for the command's exit code while `signal()` forwards signals to it.

    `signal` may be called from a signal handler while `wait` blocks (same thread): before the
    `started` line it only queues (the server reads nothing after the request until it has
    answered), afterwards it sends one line.
    """

    def __init__(self, path: str, agent: str, argv: list[str], fds: tuple[int, ...] = (0, 1, 2)):
        self.path = path
        self.started: dict[str, Any] | None = None
        self._pending: list[str] = []
        self._sock = _connect(path, None)
        request = encode({"op": "exec", "agent": agent, "argv": argv})
        opened = [_usable_fd(fd) for fd in fds]
        try:
            socket.send_fds(self._sock, [request], [fd for fd, _ in opened])
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before reading (busy, forbidden_peer): the answer is there to read
        except BaseException:
            self._sock.close()
            raise
        finally:
            for fd, ours in opened:
                if ours:
                    os.close(fd)

    def signal(self, name: str) -> None:
        self._pending.append(name)
        self._flush()

    def _flush(self) -> None:
        while self.started is not None and self._pending:
            name = self._pending.pop(0)
            with contextlib.suppress(OSError):
                self._sock.sendall(encode({"op": "signal", "signal": name}))

    def wait(self) -> int:
        """The command's exit as `os.waitstatus_to_exitcode` gives it (negative: a signal);
        `ControlError` for a refusal, or when the supervisor went away before the exit."""
        try:
            for message in _read_messages(self._sock):
                if message.get("ok") is not True:
                    raise _refusal_from(message)
                if isinstance(message.get("started"), dict):
                    self.started = message["started"]
                    self._flush()
                    continue
                end = message.get("exit")
                if isinstance(end, dict) and isinstance(end.get("code"), int):
                    return int(end["code"])
                raise ControlError.row(R.REPLY_UNEXPECTED)
        finally:
            self._sock.close()
        raise ControlError.row(R.SUPERVISOR_GONE)


def _usable_fd(fd: int) -> tuple[int, bool]:
    """`fd` when it is open; otherwise a fresh /dev/null (ours to close) in its place."""
    try:
        os.fstat(fd)
        return fd, False
    except OSError:
        return os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC), True
