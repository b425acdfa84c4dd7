"""Pinning against a raw TLS server that records every application byte it receives.

The server is a few lines of `ssl` + `socket`: it completes the TLS handshake with whatever
certificate it is told to present, then records the decrypted bytes the client sends. The
promise under test: a connection whose leaf certificate matches no pin carries zero
application bytes (so the bearer token never leaves), a pin set survives a rotation, an expired
or not-yet-valid pinned certificate is refused as `admin_tls_error` before any byte is sent, and
nothing hangs. "Fast" is proved by the code, not by a stopwatch: a refusal at the handshake is
`admin_pin_mismatch` / `admin_tls_error`, while waiting would end as `admin_timeout`.
"""

from __future__ import annotations

import datetime
import hashlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import trustme

from mcphost.admin.pinning import format_pin
from tests.hardening.conftest import RawHost, host_env

# deep (make test-slow): TLS pins: rotation, expiry, stalled handshakes.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(120)]

TOKEN = "acat_pinning-secret-8f3a1c"
REPLY = b'{"tasks": []}'


@dataclass
class Connection:
    handshake: bool = False
    received: bytearray = field(default_factory=bytearray)


class RecordingTLSServer:
    """Accepts TLS on 127.0.0.1, presents `self.cert`, records what each connection sends."""

    def __init__(self, cert: trustme.LeafCert | None, *, speak_tls: bool = True) -> None:
        self.cert = cert
        self.speak_tls = speak_tls
        self.stall = False
        self.connections: list[Connection] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        assert self.cert is not None
        self.cert.configure_cert(ctx)
        return ctx

    def _accept(self) -> None:
        while not self._stop:
            try:
                raw, _ = self._sock.accept()
            except OSError:
                return
            conn = Connection()
            self.connections.append(conn)
            threading.Thread(target=self._serve, args=(raw, conn), daemon=True).start()

    def _serve(self, raw: socket.socket, conn: Connection) -> None:
        raw.settimeout(15)
        try:
            if self.stall:
                time.sleep(12)  # accept TCP, never answer the ClientHello
                return
            if not self.speak_tls:
                conn.received += raw.recv(65536)
                raw.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                return
            tls = self._context().wrap_socket(raw, server_side=True)
            conn.handshake = True
            while b"\r\n\r\n" not in conn.received:
                chunk = tls.recv(65536)
                if not chunk:
                    return
                conn.received += chunk
            head, _, body = bytes(conn.received).partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            while len(body) < length:
                chunk = tls.recv(65536)
                if not chunk:
                    return
                conn.received += chunk
                body += chunk
            tls.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(REPLY)}\r\n\r\n".encode()
                + REPLY
            )
            tls.close()
        except (OSError, ssl.SSLError):
            return
        finally:
            raw.close()

    def app_bytes(self) -> int:
        return sum(len(c.received) for c in self.connections if c.handshake)

    def close(self) -> None:
        self._stop = True
        self._sock.close()


def pin_of(cert: trustme.LeafCert) -> str:
    der = ssl.PEM_cert_to_DER_cert(cert.cert_chain_pems[0].bytes().decode())
    return format_pin(hashlib.sha256(der).digest())


@pytest.fixture(scope="module")
def certs() -> dict[str, trustme.LeafCert]:
    ca = trustme.CA()
    now = datetime.datetime.now(datetime.UTC)
    return {
        "a": ca.issue_cert("127.0.0.1"),
        "b": ca.issue_cert("127.0.0.1"),
        "other": ca.issue_cert("127.0.0.1"),
        "expired": ca.issue_cert(
            "127.0.0.1",
            not_before=now - datetime.timedelta(days=30),
            not_after=now - datetime.timedelta(days=1),
        ),
        "not_yet_valid": ca.issue_cert(
            "127.0.0.1",
            not_before=now + datetime.timedelta(days=1),
            not_after=now + datetime.timedelta(days=30),
        ),
    }


@pytest.fixture(scope="module")
def tls_server(certs: dict[str, trustme.LeafCert]) -> Iterator[RecordingTLSServer]:
    """One recording server for the module, so that hosts bound to its port can be shared."""
    running = RecordingTLSServer(certs["a"])
    yield running
    running.close()


@pytest.fixture
def server(
    tls_server: RecordingTLSServer, certs: dict[str, trustme.LeafCert]
) -> RecordingTLSServer:
    """The module's server as a new one would be: presenting `a`, answering the handshake, no
    connection recorded (a connection an earlier test left open records into a list dropped
    here)."""
    tls_server.cert = certs["a"]
    tls_server.stall = False
    tls_server.speak_tls = True
    tls_server.connections = []
    return tls_server


@pytest.fixture(scope="module")
def pinned_to_a(
    tls_server: RecordingTLSServer, certs: dict[str, trustme.LeafCert]
) -> Iterator[RawHost]:
    """One host pinned to `a` alone for the tests that need only that pin and their own
    server behaviour (an unpinned certificate, a stalled handshake, plain HTTP): each reads
    its own call's answer and its own connections, so a fresh host would prove nothing more.
    It must exit 0 on stdin EOF, and the token must appear nowhere in all it wrote."""
    with pinned_host(tls_server.port, pin_of(certs["a"])) as host:
        yield host
        assert host.close() == 0
        assert TOKEN.encode() not in host.all_output()


def pinned_host(port: int, pins: str) -> RawHost:
    binding = {
        "AC_MCP_AGENT_ID": "agent-1",
        "AC_MCP_ADMIN_URL": f"tcp://127.0.0.1:{port}",
        "AC_MCP_WORKER_TOKEN": TOKEN,
        "AC_MCP_SERVER_FINGERPRINT": pins,
    }
    host = RawHost(host_env(binding, MCPHOST_CALL_TIMEOUT_SECONDS="5"))
    host.initialize()
    return host


def timed_call(host: RawHost, tool: str = "get_my_work") -> tuple[bool, dict, float]:
    started = time.monotonic()
    is_error, result = host.call(tool, {}, timeout=20)
    return is_error, result, time.monotonic() - started


def test_wrong_pin_sends_zero_application_bytes(
    server: RecordingTLSServer, certs: dict[str, trustme.LeafCert], pinned_to_a: RawHost
) -> None:
    host = pinned_to_a
    server.cert = certs["other"]
    for _ in range(3):  # also on retries of a read-only call
        is_error, result, _ = timed_call(host)
        assert is_error and result["error"] == "admin_pin_mismatch", result
        assert result["details"]["received"] == pin_of(certs["other"])
    assert any(c.handshake for c in server.connections), "the TLS handshake did happen"
    assert server.app_bytes() == 0, "no HTTP byte may reach an unpinned peer"


def test_pin_set_survives_rotation_and_refuses_the_next_unknown_cert(
    server: RecordingTLSServer, certs: dict[str, trustme.LeafCert]
) -> None:
    with pinned_host(server.port, f"{pin_of(certs['a'])},{pin_of(certs['b']).lower()}") as host:
        is_error, result, _ = timed_call(host)
        assert not is_error and result == {"tasks": []}, result
        sent = bytes(server.connections[-1].received)
        assert f"Bearer {TOKEN}".encode() in sent and b'"agent_id":"agent-1"' in sent

        server.cert = certs["b"]  # the center rotates; the operator had pinned both
        is_error, result, _ = timed_call(host)
        assert not is_error and result == {"tasks": []}, result
        assert server.connections[-1].handshake and server.connections[-1].received

        server.cert = certs["other"]  # an unpinned certificate appears
        before = len(server.connections)
        is_error, result, _ = timed_call(host)
        assert is_error and result["error"] == "admin_pin_mismatch"
        assert sum(len(c.received) for c in server.connections[before:]) == 0
        assert host.close() == 0


def test_expired_certificate_matching_the_pin_is_a_tls_error(
    server: RecordingTLSServer, certs: dict[str, trustme.LeafCert]
) -> None:
    server.cert = certs["expired"]
    with pinned_host(server.port, pin_of(certs["expired"])) as host:
        is_error, result, _ = timed_call(host)
        assert is_error and result["error"] == "admin_tls_error", result
        assert result["details"]["reason"] == "certificate_expired"
        assert server.app_bytes() == 0
        assert host.close() == 0


def test_not_yet_valid_certificate_matching_the_pin_is_a_tls_error(
    server: RecordingTLSServer, certs: dict[str, trustme.LeafCert]
) -> None:
    server.cert = certs["not_yet_valid"]
    with pinned_host(server.port, pin_of(certs["not_yet_valid"])) as host:
        is_error, result, _ = timed_call(host)
        assert is_error and result["error"] == "admin_tls_error", result
        assert result["details"]["reason"] == "certificate_not_yet_valid"
        assert "not valid yet" in result["message"] and "nothing was sent" in result["message"]
        assert any(c.handshake for c in server.connections)
        assert server.app_bytes() == 0, "no HTTP byte may reach a not-yet-valid certificate"
        assert host.close() == 0
        assert TOKEN.encode() not in host.all_output()


def test_a_peer_that_never_finishes_the_handshake_times_out(
    server: RecordingTLSServer, pinned_to_a: RawHost
) -> None:
    server.stall = True
    host = pinned_to_a
    is_error, result, _ = timed_call(host)
    assert is_error and result["error"] == "admin_timeout", result  # not the peer's 12 s
    host.alive()


def test_a_plain_http_peer_on_the_tls_port_gets_no_token(
    server: RecordingTLSServer, pinned_to_a: RawHost
) -> None:
    plain = server
    plain.speak_tls = False
    host = pinned_to_a
    is_error, result, _ = timed_call(host)
    assert is_error and result["error"] in ("admin_tls_error", "admin_unavailable"), result
    received = b"".join(bytes(c.received) for c in plain.connections)
    assert received and TOKEN.encode() not in received  # only a ClientHello
