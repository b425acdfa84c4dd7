"""A tiny standard-library HTTP client for the reference center: Unix socket or pinned TLS.

Owns: one-shot requests over `http.client` to a Unix socket path or to TCP+TLS where the
only trust anchor is the leaf-certificate pin (checked after the handshake, before any HTTP
byte is written, so a wrong pin never sees the token).
Must never: verify by CA or hostname instead of the pin, or pull in aiohttp (fixtures stay cheap).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any

from mcphost.admin.pinning import format_pin, leaf_digest, parse_pin


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def error(self) -> str | None:
        """The error code of a JSON error envelope, else None."""
        data = self.json() if self.body[:1] == b"{" else None
        return data.get("error") if isinstance(data, dict) else None


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 30.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


class PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, pin: str, timeout: float = 30.0) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the pin below is the only trust anchor
        super().__init__(host, port, timeout=timeout, context=ctx)
        self.pin = parse_pin(pin)

    def connect(self) -> None:
        super().connect()
        assert isinstance(self.sock, ssl.SSLSocket)
        der = self.sock.getpeercert(binary_form=True)
        got = leaf_digest(der or b"")
        if got != self.pin:
            self.close()
            raise ssl.SSLError(
                f"fingerprint mismatch: got {format_pin(got)}, expected {format_pin(self.pin)}"
            )


def request(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes | dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    hdrs = {"Accept": "application/json", **(headers or {})}
    payload: bytes | None
    if isinstance(body, dict):
        payload = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    else:
        payload = body
    try:
        conn.request(method, path, body=payload, headers=hdrs)
        resp = conn.getresponse()
        return Reply(resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()})
    finally:
        conn.close()
