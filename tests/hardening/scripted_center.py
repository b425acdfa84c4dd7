"""A scripted HTTP/1.1 peer for hardening tests: real sockets, real TLS, answers you choose.

`ScriptedServer` listens on 127.0.0.1 (plain or TLS with a trustme certificate) or on a Unix
socket, reads each request (head plus a Content-Length body), records it, and answers with
whatever `respond(request)` returns, one request per connection (`Connection: close`). Every
accepted connection is counted, whether or not a request ever arrives, so a test can assert that
nothing at all reached an address.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import trustme


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Answer:
    status: int = 200
    body: bytes = b"{}"
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})


Responder = Callable[[Request], Answer]

_REASONS = {200: "OK", 301: "Moved", 302: "Found", 303: "See Other", 307: "Temporary", 308: "Perm"}


class ScriptedServer:
    """One listener; `connections` counts accepts, `requests` keeps what was read."""

    def __init__(
        self,
        respond: Responder,
        *,
        cert: trustme.LeafCert | None = None,
        unix_path: str | None = None,
    ) -> None:
        self.respond = respond
        self.cert = cert
        self.connections = 0
        self.received = bytearray()
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        if unix_path is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.bind(unix_path)
            self._sock.listen(256)
            self.port = 0
        else:
            self._sock = socket.create_server(("127.0.0.1", 0), backlog=256)
            self.port = self._sock.getsockname()[1]
        self.unix_path = unix_path
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(15)
        conn: socket.socket = raw
        try:
            if self.cert is not None:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                self.cert.configure_cert(ctx)
                conn = ctx.wrap_socket(raw, server_side=True)
            data = bytearray()
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
                with self._lock:
                    self.received += chunk
            head, _, body = bytes(data).partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _version = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                body += chunk
                with self._lock:
                    self.received += chunk
            request = Request(method, path, headers, body)
            with self._lock:
                self.requests.append(request)
            answer = self.respond(request)
            head_out = f"HTTP/1.1 {answer.status} {_REASONS.get(answer.status, 'X')}\r\n"
            for name, value in {
                **answer.headers,
                "Content-Length": str(len(answer.body)),
                "Connection": "close",
            }.items():
                head_out += f"{name}: {value}\r\n"
            conn.sendall(head_out.encode("latin-1") + b"\r\n" + answer.body)
        except (OSError, ssl.SSLError, ValueError):
            return
        finally:
            conn.close()

    def close(self) -> None:
        self._sock.close()
        if self.unix_path is not None:
            try:
                os.unlink(self.unix_path)
            except FileNotFoundError:
                pass
